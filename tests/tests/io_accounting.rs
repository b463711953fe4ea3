//! Pushdown is proven by what was read, not only by what came back.

use pushdown_protocol::{PlanEstimate, Query, ScanRequest};
use pushdown_tests::{Fixture, local_eval, num_rows, sorted_rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projecting_a_narrow_column_reads_a_small_fraction() {
    let fx = Fixture::images(512).await;
    let total = fx.images_bytes();

    let labels = fx.sql("SELECT label FROM images").await.expect("labels");
    assert_eq!(num_rows(&labels), 512);
    let narrow = fx.bytes_read();
    assert!(narrow > 0, "reads are recorded");
    assert!(
        narrow * 20 < total,
        "projecting `label` read {narrow} of {total} bytes (more than 5%)"
    );

    // The control: projecting the images reads nearly everything.
    let images = fx.sql("SELECT image FROM images").await.expect("images");
    assert_eq!(num_rows(&images), 512);
    let wide = fx.bytes_read();
    assert!(
        wide * 10 > total * 8,
        "projecting `image` read only {wide} of {total} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_prune_row_groups_at_planning() {
    let fx = Fixture::images(512).await;
    // Ids ascend: only the first of the 8 row groups can hold id < 50, and only it gets an
    // endpoint (planning reads the statistics); an unfiltered query gets one per shard of
    // two row groups.
    let sql = "SELECT id, image FROM images WHERE id < 50";
    let mut request = ScanRequest::new(Query::Sql(sql.into()));
    request.stats = true;
    let info = fx.client.plan(&request).await.expect("plan");
    let estimate = PlanEstimate::decode(&info.app_metadata).expect("estimate");
    assert_eq!(info.endpoint.len(), 1);
    assert_eq!(estimate.row_groups_pruned, 7, "{estimate:?}");
    assert_eq!(estimate.rows_upper_bound, 64, "{estimate:?}");
    let unfiltered = ScanRequest::new(Query::Sql("SELECT id, image FROM images".into()));
    let everything = fx.client.plan(&unfiltered).await.expect("plan");
    assert_eq!(everything.endpoint.len(), 4);
    assert_eq!(
        PlanEstimate::decode(&everything.app_metadata)
            .expect("estimate")
            .row_groups_pruned,
        0
    );

    let (batches, totals) = fx.collect(&request).await.expect("query");
    assert_eq!(num_rows(&batches), 50);
    assert_eq!(totals.server.row_groups, 1, "{:?}", totals.server);
    assert_eq!(totals.server.row_groups_pruned, 0, "{:?}", totals.server);
    let pruned = fx.bytes_read();

    let all = fx.sql("SELECT id, image FROM images").await.expect("all");
    assert_eq!(num_rows(&all), 512);
    let unpruned = fx.bytes_read();
    assert!(
        pruned * 4 < unpruned,
        "pruned scan read {pruned}, full scan {unpruned}"
    );

    // The metrics say the same (two plans of the filtered query, one of the full one).
    let text = fx.server.metrics().encode();
    assert!(
        text.contains("pushdown_row_groups_pruned_at_planning_total 14\n"),
        "{text}"
    );
    assert_eq!(
        sorted_rows(&batches),
        sorted_rows(&local_eval(fx.root.path(), sql).await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planning_splits_shards_around_pruned_row_groups() {
    let fx = Fixture::images(512).await;
    // Files of 256 ids in row groups of 64. Shards are runs of matching row groups: a pruned
    // row group between two matching ones of the same file splits them into two shards.
    let cases = [
        ("id < 10 OR (id >= 150 AND id < 160)", 2, 6),
        ("id < 10 OR id >= 500", 2, 6),
        ("id >= 64 AND id < 192", 1, 6),
        // Nothing can match: no endpoints, an empty answer.
        ("id < 0", 0, 8),
        // Statistics cannot judge this: every row group is planned, two per shard.
        ("label % 10 = 7", 4, 0),
    ];
    for (predicate, endpoints, pruned) in cases {
        let sql = format!("SELECT id, label FROM images WHERE {predicate}");
        let request = ScanRequest::new(Query::Sql(sql.clone()));
        let info = fx.client.plan(&request).await.expect("plan");
        let estimate = PlanEstimate::decode(&info.app_metadata).expect("estimate");
        assert_eq!(info.endpoint.len(), endpoints, "{predicate}: {estimate:?}");
        assert_eq!(estimate.row_groups_pruned, pruned, "{predicate}: {estimate:?}");
        assert_eq!(estimate.rows_upper_bound, (8 - pruned) * 64, "{predicate}");
        if endpoints == 0 {
            assert_eq!(info.total_records, 0, "{predicate}: known to be empty");
        }
        let (batches, _) = fx.collect(&request).await.expect("query");
        assert_eq!(
            sorted_rows(&batches),
            sorted_rows(&local_eval(fx.root.path(), &sql).await),
            "{predicate}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_pushdown_reads_and_sends_less() {
    let fx = Fixture::images(512).await;
    let mut request = ScanRequest::new(Query::Sql(
        "SELECT image, label FROM images WHERE label < 100".into(),
    ));
    request.stats = true;
    let (batches, totals) = fx.collect(&request).await.expect("query");
    let expected = local_eval(
        fx.root.path(),
        "SELECT image, label FROM images WHERE label < 100",
    )
    .await;
    assert_eq!(sorted_rows(&batches), sorted_rows(&expected));
    // Only ~10% of the rows cross the network.
    assert!(
        totals.bytes_received * 4 < fx.images_bytes(),
        "sent {} of {}",
        totals.bytes_received,
        fx.images_bytes()
    );
    assert_eq!(totals.server.rows_sent as usize, num_rows(&batches));
    assert!(totals.server.bytes_scanned > 0);
}

/// Every counter of the servers' accounting comes from DataFusion's scan metrics: a whole
/// query (an aggregate, one stream) prunes row groups while it runs, and its late filter
/// decodes rows it then drops. An upgrade that renames a metric zeroes one of these.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_metrics_are_counted_while_a_whole_query_runs() {
    let fx = Fixture::images(512).await;
    let mut request = ScanRequest::new(Query::Sql(
        "SELECT count(*) AS n, max(width) AS m FROM images WHERE id < 100 AND label < 500".into(),
    ));
    request.stats = true;
    request.filter_pushdown = pushdown_protocol::FilterPushdown::On;
    let (batches, totals) = fx.collect(&request).await.expect("query");
    assert_eq!(num_rows(&batches), 1);
    let s = totals.server;
    assert!(s.bytes_scanned > 0, "{s:?}");
    assert!(
        s.row_groups_pruned > 0,
        "ids are in order: most row groups ruled out: {s:?}"
    );
    assert!(
        s.rows_scanned >= 100,
        "decoded rows, kept and dropped by the filter: {s:?}"
    );
}

/// Pruning at planning agrees with DataFusion over the files on nullable columns and on
/// negated and inequality predicates (clicks: `i1..i13` have nulls, rows are in day order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planning_prunes_nullable_and_negated_predicates_correctly() {
    use pushdown_datasets::{GenOptions, Kind, generate};
    let fx = Fixture::new(pushdown_tests::small_shards(), |root| {
        let mut options = GenOptions::new(Kind::Clicks, 24 * 256);
        options.row_group_rows = Some(256);
        options.rows_per_file = Some(2048);
        generate(&options, &root.join("clicks")).expect("clicks");
    })
    .await;
    // (predicate, whether statistics must rule some row groups out)
    let cases = [
        ("i1 IS NULL AND day = 5", true),
        ("i2 IS NOT NULL AND day < 2", true),
        // The row group holding only day 3 (min = max = 3) is ruled out.
        ("day <> 3", true),
        ("NOT (day >= 2 AND day < 22)", true),
        ("NOT (i3 IS NULL) AND day > 20", true),
        ("i4 IS NULL OR day = 0", false),
        ("coalesce(i5, -1) = -1 AND day BETWEEN 7 AND 8", true),
    ];
    for (predicate, prunes) in cases {
        let sql = format!("SELECT day, i1, i2, i3, i4, i5 FROM clicks WHERE {predicate}");
        let request = ScanRequest::new(Query::Sql(sql.clone()));
        let info = fx.client.plan(&request).await.expect("plan");
        let estimate = PlanEstimate::decode(&info.app_metadata).expect("estimate");
        assert_eq!(
            estimate.row_groups_pruned > 0,
            prunes,
            "{predicate}: {estimate:?}"
        );
        let (batches, _) = fx.collect(&request).await.expect("query");
        let local = local_eval(fx.root.path(), &sql).await;
        assert!(num_rows(&local) > 0, "{predicate}: the case selects rows");
        assert_eq!(sorted_rows(&batches), sorted_rows(&local), "{predicate}");
    }
}
