//! Which columns a SQL filter expression reads, found with `sqlparser` (no query engine).

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use sqlparser::ast::{Expr, visit_expressions};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;

/// The columns `expr` reads, in first-seen order. Unquoted identifiers are lower-cased, as
/// the server's SQL engine normalizes them. Subqueries are rejected: a fragment's predicate
/// must be evaluable one row at a time.
pub fn columns_read(expr: &str) -> Result<Vec<String>, String> {
    let dialect = GenericDialect {};
    let parsed = Parser::new(&dialect)
        .try_with_sql(expr)
        .and_then(|mut p| {
            let e = p.parse_expr()?;
            p.expect_token(&sqlparser::tokenizer::Token::EOF)?;
            Ok(e)
        })
        .map_err(|e| e.to_string())?;
    let mut seen = BTreeSet::new();
    let mut columns = Vec::new();
    let mut add = |name: String| {
        if seen.insert(name.clone()) {
            columns.push(name);
        }
    };
    let flow = visit_expressions(&parsed, |e| {
        match e {
            Expr::Identifier(ident) => add(normalize(ident)),
            Expr::CompoundIdentifier(parts) => {
                if let Some(last) = parts.last() {
                    add(normalize(last));
                }
            }
            Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. } => {
                return ControlFlow::Break("subqueries are not allowed in a row filter".to_string());
            }
            _ => {}
        }
        ControlFlow::Continue(())
    });
    match flow {
        ControlFlow::Break(reason) => Err(reason),
        ControlFlow::Continue(()) => Ok(columns),
    }
}

fn normalize(ident: &sqlparser::ast::Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

#[cfg(test)]
mod tests {
    use super::columns_read;

    #[test]
    fn finds_columns() {
        assert_eq!(
            columns_read("label < 10 AND \"Split\" = 'train'").unwrap(),
            vec!["label", "Split"]
        );
        assert_eq!(
            columns_read("lower(CAPTION) LIKE '%cat%' OR label IN (1, 2)").unwrap(),
            vec!["caption", "label"]
        );
        assert_eq!(columns_read("t.x > 1").unwrap(), vec!["x"]);
    }

    #[test]
    fn rejects_bad_expressions() {
        assert!(columns_read("label <").is_err());
        assert!(columns_read("label < 1) OR (1 = 1").is_err());
        assert!(
            columns_read("label IN (SELECT 1)")
                .unwrap_err()
                .contains("subqueries")
        );
    }
}
