//! The SQL allow-list: one read-only query over the catalog, nothing else, within the
//! server's size and nesting caps. A query is parsed and checked here once, into a
//! [`CheckedQuery`] that planning takes to the end: the text is never parsed again for the
//! same request. The views and the planner both ask.

use std::ops::ControlFlow;

use datafusion::execution::SessionState;
use datafusion::execution::context::SessionContext;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, Statement as SqlStatement, Visit, Visitor};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use pushdown_protocol::Query;

use crate::error::{Result, ServerError};

/// The catalog and schema every dataset and view is a table of, as SQL clients see them
/// (`pushdown.public.images` is `images`).
pub const CATALOG: &str = "pushdown";
pub const SCHEMA: &str = "public";

/// Parser nesting depth (DataFusion's default, set deliberately).
pub const SQL_RECURSION_LIMIT: usize = 50;

/// Deepest expression tree accepted. The parser builds a flat chain (`a OR b OR …`, `1+1+…`)
/// without recursion, but DataFusion's planning recurses on it (a 2,000-term chain
/// overflowed a 2 MiB stack in a debug build), so trees deeper than this are refused first.
pub const MAX_EXPR_DEPTH: usize = 256;

/// What the allow-list found in a query that passed it (within the size and depth caps, one
/// read-only statement or a fragment): the names (datasets and views) it reads, and SQL's
/// parsed statement. Grants are the engine's to check on these names; planning takes the
/// query itself from its request (placement may drop a fragment's ops, which changes neither
/// its names nor its predicate) and SQL's statement from here.
#[derive(Debug, Clone)]
pub struct CheckedQuery {
    /// SQL's one statement, parsed once; `None` for a fragment (its predicate is an
    /// expression DataFusion parses against the dataset's schema).
    statement: Option<DfStatement>,
    names: Vec<String>,
}

impl CheckedQuery {
    /// The datasets and views the query names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub(crate) fn statement(&self) -> Option<&DfStatement> {
        self.statement.as_ref()
    }
}

/// Checks `query` against the allow-list, parsing it with `state`'s parser (its dialect and
/// recursion limit): text over `max_bytes` is refused before it is parsed.
pub fn check(state: &SessionState, query: &Query, max_bytes: usize) -> Result<CheckedQuery> {
    let (what, len) = match query {
        Query::Sql(sql) => ("SQL text", sql.len()),
        Query::Fragment(f) => ("predicate", f.predicate.as_ref().map_or(0, String::len)),
    };
    if len > max_bytes {
        return Err(ServerError::BadQuery(format!(
            "{what} of {len} bytes is over this server's limit of {max_bytes} bytes"
        )));
    }
    match query {
        Query::Fragment(f) => {
            if let Some(p) = &f.predicate {
                let expr = Parser::new(&GenericDialect {})
                    .with_recursion_limit(SQL_RECURSION_LIMIT)
                    .try_with_sql(p)
                    .and_then(|mut parser| parser.parse_expr())
                    .map_err(|e| ServerError::bad_syntax(format!("predicate `{p}`"), e))?;
                refuse_deep(expr.visit(&mut Depth(0)))?;
            }
            Ok(CheckedQuery {
                statement: None,
                names: vec![f.dataset.clone()],
            })
        }
        Query::Sql(sql) => {
            let statement = one_query(state, sql)?;
            let names = table_names(state, &statement)?;
            Ok(CheckedQuery {
                statement: Some(statement),
                names,
            })
        }
    }
}

/// `sql` parsed: one read-only query whose expressions nest no deeper than the cap.
fn one_query(state: &SessionState, sql: &str) -> Result<DfStatement> {
    let dialect = state.config().options().sql_parser.dialect;
    let statement = state.sql_to_statement(sql, &dialect).map_err(|e| match e {
        e @ datafusion::error::DataFusionError::SQL(..) => {
            ServerError::BadQuery(crate::error::query_message(e.find_root()))
        }
        other => ServerError::from(other),
    })?;
    let mut statement = statement;
    let DfStatement::Statement(inner) = &mut statement else {
        return Err(not_a_query(&statement));
    };
    if !matches!(**inner, SqlStatement::Query(_)) {
        return Err(not_a_query(&statement));
    }
    refuse_deep(inner.visit(&mut Depth(0)))?;
    lists_as_op_literals(inner);
    Ok(statement)
}

/// An op's list parameter written as an array of numbers (`normalize(px, [0.485, 0.456,
/// 0.406], …)`) becomes the text literal ops read a list from (`'[0.485, 0.456, 0.406]'`):
/// an array is a function call to DataFusion, and an op's parameters must be literals.
fn lists_as_op_literals(statement: &mut SqlStatement) {
    use datafusion::sql::sqlparser::ast::{FunctionArg, FunctionArgExpr, FunctionArguments, Value};
    let _ = datafusion::sql::sqlparser::ast::visit_expressions_mut(statement, |expr| {
        if let SqlExpr::Function(f) = expr
            && pushdown_ops::lookup(&f.name.to_string().to_lowercase()).is_some()
            && let FunctionArguments::List(list) = &mut f.args
        {
            for arg in &mut list.args {
                if let FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) = arg
                    && let SqlExpr::Array(array) = e
                    && let Some(numbers) = array.elem.iter().map(number).collect::<Option<Vec<String>>>()
                {
                    let text = format!("[{}]", numbers.join(", "));
                    *e = SqlExpr::Value(Value::SingleQuotedString(text).into());
                }
            }
        }
        ControlFlow::<()>::Continue(())
    });
}

/// A numeric literal (signed) as written.
fn number(expr: &SqlExpr) -> Option<String> {
    use datafusion::sql::sqlparser::ast::{UnaryOperator, Value};
    match expr {
        SqlExpr::Value(v) => match &v.value {
            Value::Number(n, _) => Some(n.clone()),
            _ => None,
        },
        SqlExpr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => number(expr).map(|n| format!("-{n}")),
        _ => None,
    }
}

fn not_a_query(statement: &DfStatement) -> ServerError {
    let kind = statement.to_string();
    let kind: String = kind.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    ServerError::NotReadOnly(format!("`{kind} …` is not a SELECT query"))
}

/// The datasets (and views) `statement` reads, by their catalog names.
fn table_names(state: &SessionState, statement: &DfStatement) -> Result<Vec<String>> {
    let refs = state.resolve_table_references(statement)?;
    Ok(refs
        .into_iter()
        .map(|r| match (r.catalog(), r.schema()) {
            (None, None) | (None, Some(SCHEMA)) | (Some(CATALOG), Some(SCHEMA)) => r.table().to_owned(),
            // Other qualified names never name a dataset: report them whole.
            _ => r.to_string(),
        })
        .collect())
}

/// Counts expression nesting; stops as soon as it passes [`MAX_EXPR_DEPTH`], so the walk
/// never recurses deeper itself.
struct Depth(usize);

impl Visitor for Depth {
    type Break = ();

    fn pre_visit_expr(&mut self, _: &SqlExpr) -> ControlFlow<()> {
        self.0 += 1;
        if self.0 > MAX_EXPR_DEPTH {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    fn post_visit_expr(&mut self, _: &SqlExpr) -> ControlFlow<()> {
        self.0 -= 1;
        ControlFlow::Continue(())
    }
}

fn refuse_deep(walk: ControlFlow<()>) -> Result<()> {
    if walk.is_break() {
        return Err(ServerError::BadQuery(format!(
            "expressions nest deeper than {MAX_EXPR_DEPTH} levels (a long chain of AND/OR or \
             arithmetic?): use IN lists or split the query"
        )));
    }
    Ok(())
}

/// A view's SQL checked as a query is (without the request size cap: the operator wrote it).
pub fn check_view(sql: &str) -> Result<CheckedQuery> {
    let state = SessionContext::new().state();
    check(&state, &Query::Sql(sql.to_owned()), usize::MAX)
}
