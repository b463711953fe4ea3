//! Filters made of cheap comparisons, evaluated a conjunct at a time over the whole batch.
//!
//! DataFusion evaluates `a AND b AND c` as a left-deep tree of `BinaryExpr`s. When the
//! prefix keeps at most 20% of a batch's rows, it filters the batch, evaluates the next
//! conjunct on the survivors and scatters the result back to full length ("pre-selection").
//! That pays when the next conjunct is expensive (a UDF, a regex); for a column compared with
//! a literal it costs far more than it saves: on TPC-H Q6's filter, pre-selection and its
//! scatter cost the server several times the CPU of the comparisons themselves (`perf`, one
//! core; see `benches/RESULTS.md`, "Scan: the server against DuckDB").
//! The threshold looks at the accumulated prefix, not at what is left to evaluate
//! (apache/datafusion#25035, open).
//!
//! [`FlatConjunctions`] rewrites, after every other optimizer rule, the predicate of each
//! `FilterExec` whose conjuncts are all such comparisons into an [`AllOf`]: each conjunct over
//! the whole batch, combined with Kleene `AND` (the same three-valued result), stopping early
//! once no row can pass. Pruning is not affected: the scan's predicate was taken from the
//! original expression before this rule runs.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, BooleanArray};
use datafusion::arrow::compute::kernels::boolean::and_kleene;
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Result, internal_err};
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CastExpr, Column, IsNotNullExpr, IsNullExpr, Literal,
};
use datafusion::physical_expr::utils::split_conjunction;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};

/// A conjunction of boolean expressions, each evaluated over the whole batch.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct AllOf {
    conjuncts: Vec<Arc<dyn PhysicalExpr>>,
}

impl AllOf {
    pub fn new(conjuncts: Vec<Arc<dyn PhysicalExpr>>) -> Self {
        Self { conjuncts }
    }
}

impl fmt::Display for AllOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "all_of(")?;
        for (i, c) in self.conjuncts.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{c}")?;
        }
        write!(f, ")")
    }
}

impl PhysicalExpr for AllOf {
    fn data_type(&self, _input_schema: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        for c in &self.conjuncts {
            if c.nullable(input_schema)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let rows = batch.num_rows();
        let mut all: Option<BooleanArray> = None;
        for c in &self.conjuncts {
            let value = c.evaluate(batch)?.into_array(rows)?;
            let Some(value) = value.as_boolean_opt() else {
                return internal_err!("all_of: {c} gave {}, not booleans", value.data_type());
            };
            let next = match &all {
                None => value.clone(),
                Some(so_far) => and_kleene(so_far, value)?,
            };
            // `false AND x` is false whatever x is: once every row is false, stop.
            let settled = next.true_count() == 0 && next.null_count() == 0;
            all = Some(next);
            if settled {
                break;
            }
        }
        match all {
            Some(all) => Ok(ColumnarValue::Array(Arc::new(all))),
            None => internal_err!("all_of with no conjuncts"),
        }
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        self.conjuncts.iter().collect()
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(Arc::new(Self::new(children)))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.conjuncts.iter().enumerate() {
            if i > 0 {
                write!(f, " AND ")?;
            }
            write!(f, "(")?;
            c.fmt_sql(f)?;
            write!(f, ")")?;
        }
        Ok(())
    }
}

/// Rewrites filters of two or more cheap conjuncts into [`AllOf`]; see the module docs.
#[derive(Debug, Default)]
pub struct FlatConjunctions;

impl PhysicalOptimizerRule for FlatConjunctions {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(filter) = node.downcast_ref::<FilterExec>() else {
                return Ok(Transformed::no(node));
            };
            let conjuncts = split_conjunction(filter.predicate());
            if conjuncts.len() < 2 || !conjuncts.iter().all(|c| is_cheap(c.as_ref())) {
                return Ok(Transformed::no(node));
            }
            let all_of = Arc::new(AllOf::new(conjuncts.into_iter().cloned().collect()));
            let rebuilt = FilterExecBuilder::from(filter).with_predicate(all_of).build()?;
            Ok(Transformed::yes(Arc::new(rebuilt) as Arc<dyn ExecutionPlan>))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "flat_conjunctions"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A comparison of a column (perhaps cast) with a literal, or a null test of a column: a
/// vectorised kernel over the batch, cheaper than filtering the batch to skip it.
fn is_cheap(expr: &dyn PhysicalExpr) -> bool {
    if let Some(b) = expr.downcast_ref::<BinaryExpr>() {
        let comparison = matches!(
            b.op(),
            Operator::Eq
                | Operator::NotEq
                | Operator::Lt
                | Operator::LtEq
                | Operator::Gt
                | Operator::GtEq
                | Operator::IsDistinctFrom
                | Operator::IsNotDistinctFrom
        );
        let (l, r) = (b.left().as_ref(), b.right().as_ref());
        return comparison && ((is_column(l) && is_literal(r)) || (is_literal(l) && is_column(r)));
    }
    if let Some(n) = expr.downcast_ref::<IsNullExpr>() {
        return is_column(n.arg().as_ref());
    }
    if let Some(n) = expr.downcast_ref::<IsNotNullExpr>() {
        return is_column(n.arg().as_ref());
    }
    false
}

fn is_column(expr: &dyn PhysicalExpr) -> bool {
    expr.is::<Column>()
        || expr
            .downcast_ref::<CastExpr>()
            .is_some_and(|c| is_column(c.expr().as_ref()))
}

fn is_literal(expr: &dyn PhysicalExpr) -> bool {
    expr.is::<Literal>()
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{ArrayRef, Float64Array, Int32Array, StringArray};
    use datafusion::arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::{binary, col, lit};
    use rand::{Rng, SeedableRng};

    use super::*;

    fn batch(rows: usize, seed: u64) -> RecordBatch {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut maybe = |p: f64| rng.random::<f64>() >= p;
        let a: Int32Array = (0..rows).map(|i| maybe(0.1).then_some((i % 97) as i32)).collect();
        let b: Float64Array = (0..rows)
            .map(|i| maybe(0.1).then_some([f64::NAN, -0.0, 0.0, 1.5, -3.0, f64::INFINITY][i % 6]))
            .collect();
        let s: StringArray = (0..rows)
            .map(|i| maybe(0.2).then(|| ["", "x", "é"][i % 3]))
            .collect();
        let schema = Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
        ]);
        let columns: Vec<ArrayRef> = vec![Arc::new(a), Arc::new(b), Arc::new(s)];
        RecordBatch::try_new(Arc::new(schema), columns).unwrap()
    }

    /// `AllOf` gives exactly what DataFusion's own `AND` chain gives (nulls included), on
    /// prefixes that keep most rows, a few, and none.
    #[test]
    fn all_of_agrees_with_the_and_chain() {
        for seed in 0..8 {
            let batch = batch(4096 + seed as usize * 37, seed);
            let schema = batch.schema();
            let cmp = |c: &str, op: Operator, v: datafusion::scalar::ScalarValue| {
                binary(col(c, &schema).unwrap(), op, lit(v), &schema).unwrap()
            };
            let chains: Vec<Vec<Arc<dyn PhysicalExpr>>> = vec![
                vec![
                    cmp("a", Operator::Lt, 90i32.into()),
                    cmp("b", Operator::Gt, 0.0f64.into()),
                ],
                vec![
                    cmp("a", Operator::Lt, 5i32.into()),
                    cmp("b", Operator::LtEq, 1.5f64.into()),
                    cmp("s", Operator::Eq, "x".into()),
                ],
                vec![
                    cmp("a", Operator::Gt, 1000i32.into()),
                    cmp("b", Operator::NotEq, 0.0f64.into()),
                ],
                vec![
                    Arc::new(IsNotNullExpr::new(col("s", &schema).unwrap())),
                    cmp("a", Operator::GtEq, 3i32.into()),
                    cmp("b", Operator::IsDistinctFrom, f64::NAN.into()),
                ],
            ];
            for chain in chains {
                let tree = chain
                    .iter()
                    .cloned()
                    .reduce(|l, r| binary(l, Operator::And, r, &schema).unwrap())
                    .unwrap();
                let want = tree
                    .evaluate(&batch)
                    .unwrap()
                    .into_array(batch.num_rows())
                    .unwrap();
                let got = AllOf::new(chain)
                    .evaluate(&batch)
                    .unwrap()
                    .into_array(batch.num_rows())
                    .unwrap();
                assert_eq!(got.as_boolean(), want.as_boolean(), "seed {seed}: {tree}");
            }
        }
    }

    #[test]
    fn only_cheap_comparisons_are_flattened() {
        let batch = batch(16, 1);
        let schema = batch.schema();
        let a_lt = binary(col("a", &schema).unwrap(), Operator::Lt, lit(5i32), &schema).unwrap();
        let b_gt = binary(col("b", &schema).unwrap(), Operator::Gt, lit(0.0f64), &schema).unwrap();
        let a_plus_b = binary(
            col("a", &schema).unwrap(),
            Operator::Lt,
            binary(col("a", &schema).unwrap(), Operator::Plus, lit(1i32), &schema).unwrap(),
            &schema,
        )
        .unwrap();
        assert!(is_cheap(a_lt.as_ref()) && is_cheap(b_gt.as_ref()));
        assert!(!is_cheap(a_plus_b.as_ref()), "column against an expression");
        let source: Arc<dyn ExecutionPlan> =
            datafusion::datasource::memory::MemorySourceConfig::try_new_exec(
                &[vec![batch.clone()]],
                Arc::clone(&schema),
                None,
            )
            .unwrap();
        let plan_for = |predicate| -> Arc<dyn ExecutionPlan> {
            let filter = FilterExec::try_new(predicate, Arc::clone(&source)).unwrap();
            FlatConjunctions
                .optimize(Arc::new(filter), &ConfigOptions::default())
                .unwrap()
        };
        let predicate_of = |plan: &Arc<dyn ExecutionPlan>| {
            Arc::clone(plan.downcast_ref::<FilterExec>().unwrap().predicate())
        };
        let both = binary(Arc::clone(&a_lt), Operator::And, Arc::clone(&b_gt), &schema).unwrap();
        assert!(predicate_of(&plan_for(both)).is::<AllOf>());
        let mixed = binary(Arc::clone(&a_lt), Operator::And, a_plus_b, &schema).unwrap();
        assert!(predicate_of(&plan_for(mixed)).is::<BinaryExpr>());
        assert!(predicate_of(&plan_for(a_lt)).is::<BinaryExpr>(), "one conjunct");
    }
}
