//! Prepared statements as SQL clients hold them: a statement's text and its bound
//! parameters, each a typed SQL literal substituted into the parsed statement, never into
//! its text. Handles are stateless: the client's bytes, checked again on every use like any
//! ticket, so nothing is kept per client and closing is free.

use arrow::array::RecordBatch;
use bytes::Bytes;
use datafusion::common::ScalarValue;
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, Value as SqlValue, visit_expressions_mut};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::error::{Result, ServerError};

/// A prepared statement as its handle carries it: the query (placeholders numbered `$1`…)
/// and the values bound to them, if any, each as a SQL literal of its type.
///
/// A handle is the client's bytes, so its values are SQL text like any other the client
/// could send: the bound statement is checked as a whole (read-only, grants, size, depth)
/// when it is planned. Values are never Arrow IPC inside a handle: arrow-rs's IPC stream
/// reader allocates whatever body length a message claims (a mutated handle asked for
/// 7 EB and aborted the process, found by the mutation test in tests/tests/security.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedStatement {
    pub sql: String,
    pub params: Option<Vec<String>>,
}

/// The first bytes of every handle.
const HANDLE_MAGIC: &[u8] = b"pushdown-prepared-2\0";

/// The largest handle accepted (the query's own cap applies once it is bound).
const MAX_HANDLE_BYTES: usize = 1 << 20;

/// The most parameters a statement binds.
const MAX_PARAMS: usize = 4096;

impl PreparedStatement {
    /// Binds the one row of `params` (column `i` is `$i+1`) as typed literals.
    pub fn bind(sql: String, params: &RecordBatch) -> Result<Self> {
        if params.num_rows() != 1 {
            return Err(ServerError::BadQuery(format!(
                "a query binds one row of parameters, got {}; run it once per row",
                params.num_rows()
            )));
        }
        if params.num_columns() > MAX_PARAMS {
            return Err(ServerError::BadQuery(format!(
                "more than {MAX_PARAMS} parameters"
            )));
        }
        let literals = params
            .columns()
            .iter()
            .map(|column| literal(&ScalarValue::try_from_array(column, 0)?))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            sql,
            params: Some(literals),
        })
    }

    pub fn encode(&self) -> Bytes {
        let mut out = HANDLE_MAGIC.to_vec();
        let mut put = |text: &str| {
            out.extend_from_slice(&(text.len() as u64).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        };
        put(&self.sql);
        for p in self.params.iter().flatten() {
            put(p);
        }
        out.into()
    }

    /// A handle from a client: any bytes at all, so every length is checked.
    pub fn decode(handle: &[u8]) -> Result<Self> {
        let bad = |why: &str| {
            ServerError::BadRequest(format!("not a prepared statement handle of this server: {why}"))
        };
        if handle.len() > MAX_HANDLE_BYTES {
            return Err(bad("too long"));
        }
        let mut rest = handle
            .strip_prefix(HANDLE_MAGIC)
            .ok_or_else(|| bad("unknown format"))?;
        let mut texts = Vec::new();
        while !rest.is_empty() {
            if texts.len() > MAX_PARAMS {
                return Err(bad("too many parameters"));
            }
            let (len, after) = rest.split_at_checked(8).ok_or_else(|| bad("truncated"))?;
            let len = u64::from_le_bytes(len.try_into().map_err(|_| bad("truncated"))?);
            let len = usize::try_from(len).map_err(|_| bad("bad length"))?;
            let (text, after) = after.split_at_checked(len).ok_or_else(|| bad("truncated"))?;
            texts.push(
                std::str::from_utf8(text)
                    .map_err(|_| bad("not UTF-8"))?
                    .to_owned(),
            );
            rest = after;
        }
        let mut texts = texts.into_iter();
        let sql = texts.next().ok_or_else(|| bad("no query"))?;
        let params: Vec<String> = texts.collect();
        Ok(Self {
            sql,
            params: (!params.is_empty()).then_some(params),
        })
    }

    /// The query with its parameters substituted, ready to plan like any SQL text.
    pub fn bound_sql(&self) -> Result<String> {
        rewrite_placeholders(&self.sql, |n| {
            let Some(params) = &self.params else {
                return Err(ServerError::BadQuery(format!("parameter ${n} is not bound")));
            };
            let text = params.get(n - 1).ok_or_else(|| {
                ServerError::BadQuery(format!(
                    "parameter ${n} is not bound: {} parameters were given",
                    params.len()
                ))
            })?;
            Parser::new(&GenericDialect {})
                .with_recursion_limit(crate::allow::SQL_RECURSION_LIMIT)
                .try_with_sql(text)
                .and_then(|mut p| p.parse_expr())
                .map(Some)
                .map_err(|e| ServerError::bad_syntax(format!("parameter ${n}"), e))
        })
    }
}

fn parser_error(e: impl std::fmt::Display) -> ServerError {
    ServerError::BadQuery(e.to_string())
}

/// `sql` with its placeholders rewritten: `?` become `$1`, `$2`, … in order, and each `$n`
/// is replaced by what `value(n)` gives (kept when it gives `None`). Works on the parsed
/// statement, never on the text.
pub fn rewrite_placeholders(
    sql: &str,
    mut value: impl FnMut(usize) -> Result<Option<SqlExpr>>,
) -> Result<String> {
    let mut statements = Parser::new(&GenericDialect {})
        .with_recursion_limit(crate::allow::SQL_RECURSION_LIMIT)
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_statements())
        .map_err(parser_error)?;
    let [statement] = statements.as_mut_slice() else {
        return Err(ServerError::NotReadOnly(format!(
            "a prepared statement is one query, got {} statements",
            statements.len()
        )));
    };
    let mut next = 0usize;
    let mut failure = None;
    let _ = visit_expressions_mut(statement, |expr| {
        if let SqlExpr::Value(v) = expr
            && let SqlValue::Placeholder(p) = &v.value
        {
            let n = if p == "?" {
                next += 1;
                Ok(next)
            } else {
                p.strip_prefix('$')
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| ServerError::BadQuery(format!("placeholder `{p}`: use $1, $2, … or ?")))
            };
            match n.and_then(|n| Ok((n, value(n)?))) {
                Ok((_, Some(replacement))) => *expr = replacement,
                Ok((n, None)) => v.value = SqlValue::Placeholder(format!("${n}")),
                Err(e) => {
                    failure = Some(e);
                    return std::ops::ControlFlow::Break(());
                }
            }
        }
        std::ops::ControlFlow::Continue(())
    });
    match failure {
        Some(e) => Err(e),
        None => Ok(statement.to_string()),
    }
}

/// A parameter's value as a SQL literal of its type.
fn literal(value: &ScalarValue) -> Result<String> {
    use ScalarValue as S;
    let quoted = |text: String| format!("'{}'", text.replace('\'', "''"));
    let text = match value {
        v if v.is_null() => "NULL".to_owned(),
        S::Boolean(Some(b)) => b.to_string().to_ascii_uppercase(),
        S::Int8(_)
        | S::Int16(_)
        | S::Int32(_)
        | S::Int64(_)
        | S::UInt8(_)
        | S::UInt16(_)
        | S::UInt32(_)
        | S::UInt64(_) => value.to_string(),
        S::Float32(Some(x)) => float(f64::from(*x), "REAL"),
        S::Float64(Some(x)) => float(*x, "DOUBLE"),
        S::Utf8(Some(s)) | S::LargeUtf8(Some(s)) | S::Utf8View(Some(s)) => quoted(s.clone()),
        S::Date32(_) | S::Date64(_) => format!("CAST({} AS DATE)", quoted(value.to_string())),
        S::TimestampSecond(_, None)
        | S::TimestampMillisecond(_, None)
        | S::TimestampMicrosecond(_, None)
        | S::TimestampNanosecond(_, None) => format!("CAST({} AS TIMESTAMP)", quoted(value.to_string())),
        S::Decimal128(_, p, s) => format!("CAST({} AS DECIMAL({p},{s}))", quoted(value.to_string())),
        other => {
            return Err(ServerError::BadQuery(format!(
                "parameters of type {} are not supported; bind a string and CAST it",
                other.data_type()
            )));
        }
    };
    Ok(text)
}

fn float(x: f64, ty: &str) -> String {
    if x.is_finite() {
        // `{:?}` keeps a decimal point or exponent, so the literal stays a float.
        format!("CAST({x:?} AS {ty})")
    } else if x.is_nan() {
        format!("CAST('NaN' AS {ty})")
    } else if x > 0.0 {
        format!("CAST('inf' AS {ty})")
    } else {
        format!("CAST('-inf' AS {ty})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow::array::{Float64Array, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    fn one_row(columns: Vec<arrow::array::ArrayRef>) -> RecordBatch {
        let fields: Vec<Field> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(format!("${}", i + 1), c.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    #[test]
    fn question_marks_become_numbered_placeholders() {
        let sql = rewrite_placeholders("SELECT a FROM t WHERE b < ? AND c = ?", |_| Ok(None)).unwrap();
        assert_eq!(sql, "SELECT a FROM t WHERE b < $1 AND c = $2");
    }

    #[test]
    fn parameters_are_substituted_as_typed_literals_not_text() {
        let params = one_row(vec![
            Arc::new(Int64Array::from(vec![-5])),
            Arc::new(StringArray::from(vec!["it's'; DROP TABLE t; --"])),
            Arc::new(Float64Array::from(vec![f64::NAN])),
        ]);
        let p = PreparedStatement::bind(
            "SELECT a FROM t WHERE b < $1 AND s = $2 AND x <> $3".into(),
            &params,
        )
        .unwrap();
        let round = PreparedStatement::decode(&p.encode()).unwrap();
        assert_eq!(round, p);
        assert_eq!(
            round.bound_sql().unwrap(),
            "SELECT a FROM t WHERE b < -5 AND s = 'it''s''; DROP TABLE t; --' AND x <> CAST('NaN' AS DOUBLE)"
        );
    }

    #[test]
    fn missing_parameters_and_bad_handles_are_named() {
        let unbound = PreparedStatement::bind(
            "SELECT $2".into(),
            &one_row(vec![Arc::new(Int64Array::from(vec![1]))]),
        )
        .unwrap();
        assert!(
            unbound
                .bound_sql()
                .unwrap_err()
                .to_string()
                .contains("$2 is not bound")
        );
        for handle in [&b""[..], b"garbage", &HANDLE_MAGIC[..5]] {
            let e = PreparedStatement::decode(handle).unwrap_err().to_string();
            assert!(e.contains("not a prepared statement handle"), "{e}");
        }
        let mut long = HANDLE_MAGIC.to_vec();
        long.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(PreparedStatement::decode(&long).is_err());
    }
}
