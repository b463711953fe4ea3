//! Plans for readers that stream the shards themselves: Ray Data's read tasks (one per shard,
//! in other processes and on other hosts) and any Arrow Flight client given the endpoints.
//!
//! The request is planned on every server ([`PushdownClient::plan`]: one endpoint per shard,
//! located on the servers that hold it); a pipeline runs whole at the servers. What the
//! reader asks on top of it (the columns it keeps, a predicate on them) becomes part of the
//! servers' query, so unused columns and filtered rows never cross the link.

use arrow_flight::FlightInfo;
use pushdown_planner::{Pipeline, Step};
use pushdown_protocol::{CodecInputs, Compression, LinkKnown, Profiled, Query, ScanRequest, choose_codec};

use crate::client::PushdownClient;
use crate::connect::ConnectOptions;
use crate::error::{ClientError, Result};
use crate::loader::LoaderSource;

/// What a reader narrows the source to: the output columns it keeps (`None`: all) and a SQL
/// boolean expression over them (`None`: every row).
#[derive(Debug, Clone, Default)]
pub struct Narrowing {
    pub columns: Option<Vec<String>>,
    pub predicate: Option<String>,
}

/// `source` narrowed and planned on every server, streamed with `forced` or else
/// [`choose_codec`]'s codec for readers whose link nobody knows (the servers measure it):
/// the endpoints carry tickets any Flight client redeems at any of their locations.
pub async fn plan_for_readers(
    client: &PushdownClient,
    source: &LoaderSource,
    narrowing: &Narrowing,
    forced: Option<Compression>,
) -> Result<FlightInfo> {
    let query = match source {
        LoaderSource::Sql(sql) => Query::Sql(narrowed_sql(sql, narrowing)),
        LoaderSource::Pipeline(pipeline) => {
            let pipeline = narrowed_pipeline(pipeline, narrowing);
            let schema = client.dataset_schema(&pipeline.dataset).await?;
            let plan = pushdown_planner::plan(&pipeline, &schema)?;
            if let Some(step) = plan.client_steps.first() {
                return Err(ClientError::Invalid(format!(
                    "pipeline step `{step}` runs in a trainer, not at the servers: a reader of \
                     shards shuffles, batches and augments itself (Ray Data: random_shuffle, \
                     iter_batches, map_batches); leave it out of this pipeline"
                )));
            }
            Query::Fragment(plan.fragment)
        }
    };
    let mut request = ScanRequest::new(query);
    request.compression = choose_codec(CodecInputs {
        forced,
        link: LinkKnown::Unknown,
        profiled: Profiled::No,
    });
    client.plan(&request).await
}

/// [`plan_for_readers`] from a caller with no runtime (the Python binding): connects to
/// `servers`, plans, and returns the plan with its runtime shut down.
pub fn plan_for_readers_blocking(
    servers: &[String],
    connect: ConnectOptions,
    source: &LoaderSource,
    narrowing: &Narrowing,
    forced: Option<Compression>,
) -> Result<FlightInfo> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClientError::io("starting the planning runtime", e))?;
    runtime.block_on(async {
        let client = PushdownClient::connect_with(servers, connect).await?;
        plan_for_readers(&client, source, narrowing, forced).await
    })
}

/// `sql` narrowed: the reader's columns and predicate over the query's own output.
fn narrowed_sql(sql: &str, narrowing: &Narrowing) -> String {
    if narrowing.columns.is_none() && narrowing.predicate.is_none() {
        return sql.to_owned();
    }
    let columns = narrowing.columns.as_ref().map_or_else(
        || "*".to_owned(),
        |columns| columns.iter().map(|c| quoted(c)).collect::<Vec<_>>().join(", "),
    );
    let body = sql.trim().trim_end_matches(';');
    let mut out = format!("SELECT {columns} FROM ({body}) AS pushdown_read");
    if let Some(predicate) = &narrowing.predicate {
        out.push_str(&format!(" WHERE {predicate}"));
    }
    out
}

/// `pipeline` with the reader's predicate and then its columns as its last steps.
fn narrowed_pipeline(pipeline: &Pipeline, narrowing: &Narrowing) -> Pipeline {
    let mut out = pipeline.clone();
    if let Some(predicate) = &narrowing.predicate {
        out = out.step(Step::Filter {
            expr: predicate.clone(),
        });
    }
    if let Some(columns) = &narrowing.columns {
        out = out.step(Step::Select {
            columns: columns.clone(),
        });
    }
    out
}

/// A SQL identifier, quoted (names keep their case and may hold any character).
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_is_narrowed_around_the_query() {
        let none = Narrowing::default();
        assert_eq!(narrowed_sql("SELECT a FROM t", &none), "SELECT a FROM t");
        let both = Narrowing {
            columns: Some(vec!["label".into(), "odd \"name\"".into()]),
            predicate: Some("label < 5".into()),
        };
        assert_eq!(
            narrowed_sql("SELECT label, x FROM t;", &both),
            "SELECT \"label\", \"odd \"\"name\"\"\" FROM (SELECT label, x FROM t) AS pushdown_read \
             WHERE label < 5"
        );
        let filter_only = Narrowing {
            columns: None,
            predicate: Some("x IS NULL".into()),
        };
        assert_eq!(
            narrowed_sql("SELECT x FROM t", &filter_only),
            "SELECT * FROM (SELECT x FROM t) AS pushdown_read WHERE x IS NULL"
        );
    }

    #[test]
    fn a_pipeline_ends_with_the_readers_filter_then_columns() {
        let pipeline = Pipeline::new("images").select(["image", "label"]);
        let narrowing = Narrowing {
            columns: Some(vec!["label".into()]),
            predicate: Some("label < 5".into()),
        };
        let out = narrowed_pipeline(&pipeline, &narrowing);
        let steps = out.steps();
        assert_eq!(steps.len(), 3);
        assert!(matches!(&steps[1], Step::Filter { expr } if expr == "label < 5"));
        assert!(matches!(&steps[2], Step::Select { columns } if columns == &["label".to_owned()]));
    }
}
