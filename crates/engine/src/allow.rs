//! The SQL allow-list: one read-only query over the catalog, nothing else. What a query
//! names is found here, before anything is planned; the views and the planner both ask.

use datafusion::execution::context::SessionContext;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use pushdown_protocol::Query;

use crate::error::{Result, ServerError};

/// The catalog and schema every dataset and view is a table of, as SQL clients see them
/// (`pushdown.public.images` is `images`).
pub const CATALOG: &str = "pushdown";
pub const SCHEMA: &str = "public";

/// The names a view's SQL reads, or why it is not one read-only query.
pub fn referenced_names(sql: &str) -> Result<Vec<String>> {
    referenced_datasets(&SessionContext::new().state(), &Query::Sql(sql.to_owned()))
}

/// Refuses anything but one read-only query; returns the datasets (and views) it names.
pub fn referenced_datasets(
    state: &datafusion::execution::SessionState,
    query: &Query,
) -> Result<Vec<String>> {
    match query {
        Query::Fragment(f) => Ok(vec![f.dataset.clone()]),
        Query::Sql(sql) => {
            let dialect = state.config().options().sql_parser.dialect;
            let statement = state.sql_to_statement(sql, &dialect).map_err(|e| match e {
                e @ datafusion::error::DataFusionError::SQL(..) => {
                    ServerError::BadQuery(e.find_root().message().into_owned())
                }
                other => ServerError::from(other),
            })?;
            let is_query =
                matches!(&statement, DfStatement::Statement(s) if matches!(**s, SqlStatement::Query(_)));
            if !is_query {
                let kind = statement.to_string();
                let kind: String = kind.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
                return Err(ServerError::NotReadOnly(format!(
                    "`{kind} …` is not a SELECT query"
                )));
            }
            let refs = state.resolve_table_references(&statement)?;
            Ok(refs
                .into_iter()
                .map(|r| match (r.catalog(), r.schema()) {
                    (None, None) | (None, Some(SCHEMA)) | (Some(CATALOG), Some(SCHEMA)) => {
                        r.table().to_owned()
                    }
                    // Other qualified names never name a dataset: report them whole.
                    _ => r.to_string(),
                })
                .collect())
        }
    }
}
