//! Differential tests: the server's answer to seeded projection + filter queries over
//! edge-case data equals DataFusion's local evaluation of the same query on the same files.

use pushdown_protocol::{FilterPushdown, Fragment, Query, ScanRequest};
use pushdown_tests::{Fixture, rows, small_shards, sorted_rows, write_edge_cases};
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const COLUMNS: [&str; 9] = ["id", "i", "f", "s", "cat", "ts", "d", "l", "b"];

fn atom(rng: &mut ChaCha8Rng) -> String {
    let words = ["", "a", "abc", "héllo", "日本語", "🦀 crab", "zz"];
    match rng.random_range(0..18) {
        0 => format!("id < {}", rng.random_range(0..800)),
        1 => format!(
            "id BETWEEN {} AND {}",
            rng.random_range(0..400),
            rng.random_range(300..800)
        ),
        2 => format!("i > {}", rng.random_range(-60..60)),
        3 => "i IS NULL".into(),
        4 => format!(
            "i IN ({}, {}, {})",
            rng.random_range(-50..50),
            rng.random_range(-50..50),
            rng.random_range(-50..50)
        ),
        5 => format!("f < {:.2}", rng.random_range(-12.0..12.0)),
        6 => "f IS NOT NULL AND f = f".into(),
        7 => format!("s = '{}'", words.choose(rng).unwrap_or(&"a")),
        8 => "s LIKE 'a%' OR s LIKE '%語'".into(),
        9 => format!("length(s) > {}", rng.random_range(0..5)),
        10 => format!(
            "cat = '{}'",
            ["red", "green", "blue", "ünï", "none"]
                .choose(rng)
                .unwrap_or(&"red")
        ),
        11 => "cat <> 'red'".into(),
        12 => format!(
            "ts > to_timestamp_micros({})",
            1_700_000_000_000_000i64 + rng.random_range(0..100_000_000_000i64)
        ),
        13 => format!("d > {:.2}", rng.random_range(-1200.0..1200.0)),
        14 => format!("array_length(l) > {}", rng.random_range(0..4)),
        15 => "l IS NULL".into(),
        16 => "b".into(),
        _ => "b IS NULL OR NOT b".into(),
    }
}

fn predicate(rng: &mut ChaCha8Rng) -> String {
    let n = rng.random_range(1..=3);
    let mut p = atom(rng);
    for _ in 1..n {
        let op = if rng.random_bool(0.6) { "AND" } else { "OR" };
        p = format!("({p}) {op} ({})", atom(rng));
    }
    if rng.random_bool(0.15) {
        format!("NOT ({p})")
    } else {
        p
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_matches_local_evaluation_on_edge_cases() {
    let fx = Fixture::new(small_shards(), |root| {
        write_edge_cases(root, 11);
    })
    .await;
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    let mut total_rows = 0;
    let mut empty_results = 0;
    for case in 0..40 {
        let mut columns: Vec<&str> = COLUMNS.to_vec();
        columns.shuffle(&mut rng);
        columns.truncate(rng.random_range(1..=COLUMNS.len()));
        let pred = predicate(&mut rng);
        let sql = format!("SELECT {} FROM edge WHERE {pred}", columns.join(", "));

        let expected = sorted_rows(&fx.local(&sql).await);
        let mut request = ScanRequest::new(Query::Sql(sql.clone()));
        request.filter_pushdown = *[FilterPushdown::Auto, FilterPushdown::On, FilterPushdown::Off]
            .choose(&mut rng)
            .unwrap_or(&FilterPushdown::Auto);
        let (by_sql, _) = fx
            .collect(&request)
            .await
            .unwrap_or_else(|e| panic!("case {case}: {sql}: {e}"));
        assert_eq!(sorted_rows(&by_sql), expected, "case {case}: {sql}");

        // The same query as a planner fragment: identical rows in identical order.
        let fragment = ScanRequest {
            query: Query::Fragment(Fragment {
                dataset: "edge".into(),
                columns: columns.iter().map(|c| c.to_string()).collect(),
                predicate: Some(pred.clone()),
                ops: vec![],
            }),
            ..request.clone()
        };
        let (by_fragment, _) = fx
            .collect(&fragment)
            .await
            .unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert_eq!(
            rows(&by_fragment),
            rows(&by_sql),
            "case {case}: fragment vs SQL order: {pred}"
        );

        total_rows += expected.len();
        empty_results += usize::from(expected.is_empty());
    }
    // The generator must exercise both selective and non-selective filters.
    assert!(total_rows > 1000, "queries selected too little: {total_rows}");
    assert!(empty_results < 20, "too many empty results: {empty_results}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfiltered_projections_and_types_round_trip() {
    let fx = Fixture::new(small_shards(), |root| {
        write_edge_cases(root, 5);
    })
    .await;
    let sql = "SELECT * FROM edge";
    let served = fx.sql(sql).await.expect("served");
    let local = fx.local(sql).await;
    assert_eq!(
        served[0].schema().fields(),
        local[0].schema().fields(),
        "types survive the wire"
    );
    assert_eq!(sorted_rows(&served), sorted_rows(&local));
    // Shards come back in file and row-group order: ids ascend.
    let ids = rows(&fx.sql("SELECT id FROM edge").await.expect("ids"));
    let parsed: Vec<i64> = ids.iter().map(|s| s.parse().expect("id")).collect();
    assert!(
        parsed.windows(2).all(|w| w[0] < w[1]),
        "deterministic shard order"
    );
}

/// The baselines the benchmarks compare against compute the same answer as pushdown: the
/// engine in-process (a trainer reading the files itself), and a trainer that receives every
/// row and column and evaluates the query on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_and_full_row_baselines_equal_pushdown() {
    use futures::TryStreamExt;
    let fx = Fixture::images_and_text(300, 150).await;
    for (dataset, sql) in [
        (
            "images",
            "SELECT id, decode_resize(image, 16, 12) AS pixels, label FROM images WHERE label < 500",
        ),
        (
            "text",
            "SELECT id, tokenize(body, 32) AS tokens FROM text WHERE lang = 'en' AND quality > 0.5",
        ),
    ] {
        let request = ScanRequest::new(Query::Sql(sql.into()));
        let pushed = rows(&fx.collect(&request).await.expect("pushdown").0);
        assert!(!pushed.is_empty());

        let (_, batches) = pushdown_baselines::execute(fx.server.node(), &request)
            .await
            .expect("in-process");
        let in_process: Vec<_> = batches.try_collect().await.expect("in-process batches");
        assert_eq!(rows(&in_process), pushed, "{dataset}: in-process engine");

        let all = ScanRequest::new(Query::Sql(format!("SELECT * FROM {dataset}")));
        let info = fx.client.plan(&all).await.expect("plan");
        let options = pushdown_client::StreamOptions {
            concurrency: 1,
            ..pushdown_client::StreamOptions::default()
        };
        let stream = fx.client.stream(&info, options).expect("stream");
        // The trainer fetches the dataset's tokenizer, as for client-side `tokenize`.
        let resources: std::sync::Arc<dyn pushdown_ops::Resources> = if dataset == "text" {
            let pipeline =
                pushdown_planner::Pipeline::new(dataset).map("tokenize", "body", [32i64], "tokens");
            std::sync::Arc::new(
                fx.client
                    .resources_for(pipeline.steps(), dataset)
                    .await
                    .expect("tokenizer"),
            )
        } else {
            std::sync::Arc::new(pushdown_ops::NoResources)
        };
        let (_, batches) =
            pushdown_baselines::evaluate(&request.query, dataset, stream.schema(), stream, resources)
                .await
                .expect("evaluate");
        let full_row: Vec<_> = batches.try_collect().await.expect("full-row batches");
        assert_eq!(
            rows(&full_row),
            pushed,
            "{dataset}: full rows evaluated by the trainer"
        );
    }
}
