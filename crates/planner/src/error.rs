//! Why a pipeline cannot be planned.

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("pipeline file: {0}")]
    Format(String),
    #[error("step {index} ({step}): unknown column `{column}`; available: {available}")]
    UnknownColumn {
        index: usize,
        step: String,
        column: String,
        available: String,
    },
    #[error("step {index} ({step}): invalid filter expression: {reason}")]
    BadExpression {
        index: usize,
        step: String,
        reason: String,
    },
    #[error("step {index} ({step}): {reason}")]
    Unsupported {
        index: usize,
        step: String,
        reason: String,
    },
}
