//! A query (a fragment or SQL) as a DataFusion `DataFrame`, ops registered as UDFs.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::common::{DFSchema, TableReference};
use datafusion::execution::FunctionRegistry;
use datafusion::execution::context::{SQLOptions, SessionContext};
use datafusion::logical_expr::Expr;
use datafusion::prelude::DataFrame;
use pushdown_protocol::{Fragment, OpCall, Query, Value};

use crate::allow::CheckedQuery;
use crate::catalog::Dataset;
use crate::error::{Result, ServerError};
use crate::udf::OpLimits;

use super::plan::is_row_wise_expr;

/// Registers every op as a UDF (a random one to be refused by name) whose resources
/// (tokenizers) come from the datasets, `default` being the one a call that names none uses.
pub fn register_ops(
    ctx: &SessionContext,
    datasets: &BTreeMap<String, Arc<Dataset>>,
    default: Option<String>,
    limits: &OpLimits,
) {
    let default = limits.tokenizer.clone().or(default);
    let resources = Arc::new(crate::udf::DatasetResources::new(
        datasets.clone(),
        default,
        Arc::clone(&limits.tokenizers),
    ));
    for udf in crate::udf::udfs(resources, limits.clone()) {
        ctx.register_udf(udf);
    }
}

/// `query` (a fragment or SQL) as a DataFrame over the tables registered in `ctx`, parsed
/// here (for callers outside a request: the baselines, tests).
pub async fn dataframe(ctx: &SessionContext, query: &Query) -> Result<DataFrame> {
    let checked = crate::allow::check(&ctx.state(), query, usize::MAX)?;
    checked_dataframe(ctx, query, &checked).await
}

/// `query`, as `checked` (its check) found it, as a DataFrame over the tables registered in
/// `ctx`: SQL's statement planned as parsed, read-only (no DDL, DML or statements even past
/// the allow-list).
pub async fn checked_dataframe(
    ctx: &SessionContext,
    query: &Query,
    checked: &CheckedQuery,
) -> Result<DataFrame> {
    match (query, checked.statement()) {
        (Query::Fragment(f), _) => fragment_dataframe(ctx, f).await,
        (Query::Sql(_), Some(statement)) => {
            let options = SQLOptions::new()
                .with_allow_ddl(false)
                .with_allow_dml(false)
                .with_allow_statements(false);
            let plan = ctx.state().statement_to_plan(statement.clone()).await?;
            options.verify_plan(&plan)?;
            Ok(ctx.execute_logical_plan(plan).await?)
        }
        (Query::Sql(_), None) => Err(ServerError::Internal(
            "SQL planned without its checked statement".into(),
        )),
    }
}

pub(super) async fn fragment_dataframe(ctx: &SessionContext, f: &Fragment) -> Result<DataFrame> {
    let mut df = ctx.table(TableReference::bare(f.dataset.as_str())).await?;
    if let Some(predicate) = &f.predicate {
        let expr = df
            .parse_sql_expr(predicate)
            .map_err(|e| ServerError::bad_part(format!("predicate `{predicate}`"), e))?;
        if !is_row_wise_expr(&expr) {
            return Err(ServerError::BadQuery(format!(
                "predicate `{predicate}` must be evaluable one row at a time (no subqueries or aggregates)"
            )));
        }
        df = df.filter(expr)?;
    }
    for call in &f.ops {
        let expr = op_expr(ctx, call, df.schema())?;
        df = df.with_column(&call.output, expr)?;
    }
    if !f.columns.is_empty() {
        let columns: Vec<&str> = f.columns.iter().map(String::as_str).collect();
        df = df.select_columns(&columns)?;
    }
    Ok(df)
}

/// A fragment's op call as an expression: `op(column, literal, …)`.
pub(super) fn op_expr(ctx: &SessionContext, call: &OpCall, schema: &DFSchema) -> Result<Expr> {
    let op = pushdown_ops::lookup(&call.op)
        .filter(|op| op.is_deterministic())
        .ok_or_else(|| {
            let known: Vec<&str> = pushdown_ops::registry()
                .iter()
                .filter(|op| op.is_deterministic())
                .map(|op| op.name())
                .collect();
            ServerError::BadQuery(format!(
                "unknown server op `{}`; ops: {}",
                call.op,
                known.join(", ")
            ))
        })?;
    let udf = ctx
        .udf(op.name())
        .map_err(|e| ServerError::failed(format!("op `{}` is not registered", op.name()), e))?;
    // A column of that name, or a struct's field (`image.bytes`, `image['bytes']`).
    let input = if schema.has_column_with_unqualified_name(&call.input) {
        datafusion::prelude::ident(&call.input)
    } else {
        let path = pushdown_ops::input_path(&call.input);
        let (root, fields) = path.split_first().unwrap_or((&call.input, &[]));
        fields.iter().fold(datafusion::prelude::ident(root), |e, f| {
            datafusion::functions::core::expr_fn::get_field(e, f.as_str())
        })
    };
    let args = std::iter::once(input)
        .chain(call.params.iter().map(|p| match p {
            Value::Int(i) => datafusion::prelude::lit(*i),
            Value::Float(x) => datafusion::prelude::lit(*x),
            Value::Text(t) => datafusion::prelude::lit(t.as_str()),
            Value::List(_) => datafusion::prelude::lit(p.text()),
        }))
        .collect();
    Ok(udf.call(args))
}
