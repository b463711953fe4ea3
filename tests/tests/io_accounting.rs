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

/// `pushdown gen` writes each JPEG as a page of its own, and the server filters on `label`
/// inside the decoder: only the pages of the ~10% of images kept are read from the store
/// (with megabyte pages, every page held a kept row and all of them were read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selective_filter_reads_only_the_images_it_keeps() {
    let fx = Fixture::images(512).await;
    let sql = "SELECT image, label FROM images WHERE label < 100";
    let batches = fx.sql(sql).await.expect("query");
    assert_eq!(sorted_rows(&batches), sorted_rows(&fx.local(sql).await));
    let kept = num_rows(&batches) as f64 / 512.0;
    let read = fx.bytes_read() as f64 / fx.images_bytes() as f64;
    assert!(
        (0.02..0.3).contains(&kept) && read < kept + 0.1,
        "{:.0}% of the rows kept, {:.0}% of the bytes read",
        kept * 100.0,
        read * 100.0
    );
}

/// A filter on clips' durations fetches the clips it keeps and only the ends of the others
/// (where their containers state their length), once: a second scan reads nothing of a
/// dropped clip. The rows are those of the duration computed from whole clips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duration_filter_reads_only_the_clips_it_keeps() {
    let fx = Fixture::speech(96).await;
    durations_prune_reads(
        &fx,
        "speech",
        "audio['bytes']",
        &["audio_seconds(audio)"],
        (2.0, 4.5),
    )
    .await;
}

/// The same of video: `video_seconds` and `video_info(…)['seconds']` filters read no video
/// bytes of the clips they drop but their ends (once), in MP4 with its metadata at either
/// end and in Matroska.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_video_duration_filter_reads_only_the_clips_it_keeps() {
    let fx = Fixture::new(pushdown_tests::small_shards(), |root| {
        pushdown_tests::write_timed_videos(root, 24);
    })
    .await;
    let seconds = ["video_seconds(video)", "video_info(video)['seconds']"];
    durations_prune_reads(&fx, "videos", "video", &seconds, (2.5, 4.5)).await;
}

/// Scans of `table` filtered by `seconds[i] BETWEEN low AND high` (`clip`: the clips' bytes)
/// keep the rows whose whole clips' durations are within, read at most the kept clips and
/// every clip's ends on the first scan, and the kept clips alone after it.
async fn durations_prune_reads(
    fx: &Fixture,
    table: &str,
    clip: &str,
    seconds: &[&str],
    (low, high): (f64, f64),
) {
    use arrow::array::AsArray;
    use arrow::datatypes::{Float64Type, Int64Type};
    // Every clip's id, size and duration (from the whole clip, read locally).
    let clips = fx
        .local(&format!("SELECT id, {clip} FROM {table} ORDER BY id"))
        .await;
    let durations = fx
        .sql(&format!("SELECT id, {} FROM {table}", seconds[0]))
        .await
        .expect("durations");
    fx.bytes_read();
    let size: Vec<u64> = clips
        .iter()
        .flat_map(|b| {
            b.column(1)
                .as_binary::<i32>()
                .iter()
                .map(|c| c.map_or(0, <[u8]>::len) as u64)
        })
        .collect();
    let mut secs = vec![0.0; size.len()];
    for b in &durations {
        let ids = b.column(0).as_primitive::<Int64Type>();
        for (id, d) in ids
            .values()
            .iter()
            .zip(b.column(1).as_primitive::<Float64Type>().values())
        {
            secs[*id as usize] = *d;
        }
    }
    let expected: Vec<i64> = (0..size.len())
        .filter(|&i| (low..=high).contains(&secs[i]))
        .map(|i| i as i64)
        .collect();
    let kept: u64 = expected.iter().map(|&i| size[i as usize]).sum();
    let dropped: u64 = size.iter().sum::<u64>() - kept;
    // The first scan reads every clip's ends (16 KiB from each side) to learn its duration.
    let ends: u64 = size.iter().map(|s| (*s).min(32 << 10)).sum();
    assert!(
        (4..size.len() * 2 / 3).contains(&expected.len()) && dropped > 4 * ends,
        "{} of {} kept; dropped clips {dropped} bytes, their ends {ends}",
        expected.len(),
        size.len()
    );
    // Footers' offset indexes and the other columns' pages.
    let slack = 256 << 10;
    let scans = [
        (seconds[0], "first", kept + ends + slack),
        (seconds[0], "second", kept + slack),
    ];
    let others = seconds[1..].iter().map(|s| (*s, "another op's", kept + slack));
    for (seconds, scan, allowed) in scans.into_iter().chain(others) {
        let sql = format!("SELECT id, {clip} AS clip FROM {table} WHERE {seconds} BETWEEN {low} AND {high}");
        let batches = fx.sql(&sql).await.expect(&sql);
        let mut got: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        got.sort_unstable();
        assert_eq!(got, expected, "{scan} scan: {sql}");
        let read = fx.bytes_read();
        assert!(
            read <= allowed,
            "{scan} scan ({seconds}) read {read} bytes; kept clips {kept}, dropped {dropped} (their ends {ends})"
        );
    }
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

// The fragment cache: what a repeated or equivalent fragment costs the second time.

mod cache {
    use std::collections::BTreeSet;

    use pushdown_protocol::{Fragment, OpCall, Query, ScanRequest, Value};
    use pushdown_server::{CacheConfig, CacheMode, ServerConfig};
    use pushdown_tests::{Fixture, num_rows, small_shards, sorted_rows, write_images};

    fn cached(mode: CacheMode) -> ServerConfig {
        ServerConfig {
            cache: CacheConfig {
                default_mode: mode,
                ..CacheConfig::default()
            },
            ..small_shards()
        }
    }

    /// A counter of the server's metrics, by its exposition line prefix.
    fn metric(fx: &Fixture, line: &str) -> f64 {
        fx.server
            .metrics()
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    fn lookups(fx: &Fixture, outcome: &str) -> u64 {
        metric(
            fx,
            &format!("pushdown_cache_lookups_total{{outcome=\"{outcome}\"}}"),
        ) as u64
    }

    fn thumbs(columns: &[&str], predicate: &str) -> ScanRequest {
        ScanRequest::new(Query::Fragment(Fragment {
            dataset: "images".into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            predicate: Some(predicate.into()),
            ops: vec![OpCall::new("thumbnail", "image", vec![Value::Int(8)], "thumb")],
        }))
    }

    /// Rows as text, columns in name order: the same set of columns in any order compares
    /// equal.
    fn by_name(batches: &[arrow::array::RecordBatch]) -> Vec<String> {
        let batches: Vec<_> = batches
            .iter()
            .map(|b| {
                let schema = b.schema();
                let mut names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                names.sort();
                let indices: Vec<usize> = names
                    .iter()
                    .map(|n| schema.index_of(n).expect("column"))
                    .collect();
                b.project(&indices).expect("project")
            })
            .collect();
        sorted_rows(&batches)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn equivalent_fragments_written_differently_share_entries_and_read_nothing() {
        let fx = Fixture::new(cached(CacheMode::On), |root| {
            write_images(root, 512);
        })
        .await;
        let first = thumbs(&["id", "label", "thumb"], "id < 300 AND label >= 10");
        let (a, _) = fx.collect(&first).await.expect("first");
        let shards = fx.client.plan(&first).await.expect("plan").endpoint.len() as u64;
        assert!(shards >= 3, "{shards} shards");
        assert!(fx.bytes_read() > 0);
        assert_eq!(lookups(&fx, "miss"), shards);

        // Columns in another order, conjuncts swapped and literals on the left.
        let second = thumbs(&["thumb", "id", "label"], "10 <= label AND 300 > id");
        let (b, _) = fx.collect(&second).await.expect("second");
        assert_eq!(fx.bytes_read(), 0, "served from the cache: nothing read");
        assert_eq!(lookups(&fx, "hit_memory"), shards);
        assert_eq!(lookups(&fx, "miss"), shards);
        assert_eq!(by_name(&a), by_name(&b));
        assert_eq!(
            b[0].schema().field(0).name(),
            "thumb",
            "the second request's column order"
        );
        assert!(num_rows(&a) > 100);

        // The same fragment as SQL is the same plan.
        let sql = "SELECT id, label, thumbnail(image, 8) AS thumb FROM images WHERE label >= 10 AND id < 300";
        let c = fx.sql(sql).await.expect("sql");
        assert_eq!(by_name(&a), by_name(&c));
        assert_eq!(
            lookups(&fx, "hit_memory"),
            2 * shards,
            "SQL hits the fragment's entries"
        );

        // A different fragment (another predicate) is its own entry.
        fx.collect(&thumbs(&["id", "thumb"], "id < 299 AND label >= 10"))
            .await
            .expect("other");
        assert!(fx.bytes_read() > 0);
        assert_eq!(lookups(&fx, "miss"), 2 * shards);

        // Explain says what the cache holds for this fragment.
        let explain = fx
            .client
            .action(pushdown_protocol::ActionKind::Explain, second.encode())
            .await
            .expect("explain");
        let text = String::from_utf8_lossy(&explain[0]).to_string();
        assert!(
            text.contains(&format!("cache: mode on; {shards} of {shards} shards cached")),
            "{text}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn touching_a_file_invalidates_its_entries_only() {
        let fx = Fixture::new(cached(CacheMode::On), |root| {
            write_images(root, 512);
        })
        .await;
        let request = thumbs(&["id", "thumb"], "id >= 0");
        let (before, _) = fx.collect(&request).await.expect("first");
        let shards = lookups(&fx, "miss");
        fx.bytes_read();
        // Same bytes, new modification time: the file is another version to the cache.
        let dir = fx.root.path().join("images");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .collect();
        files.sort();
        let touched = std::fs::File::options()
            .write(true)
            .open(&files[0])
            .expect("open");
        touched
            .set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
            .expect("touch");
        drop(touched);
        let (after, _) = fx.collect(&request).await.expect("again");
        assert_eq!(sorted_rows(&before), sorted_rows(&after));
        let recomputed = lookups(&fx, "miss") - shards;
        let per_file = shards / files.len() as u64;
        assert_eq!(
            recomputed, per_file,
            "only the touched file's shards are computed again"
        );
        assert_eq!(lookups(&fx, "hit_memory"), shards - per_file);
        assert!(fx.bytes_read() > 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_identical_requests_compute_once() {
        let fx = Fixture::new(cached(CacheMode::On), |root| {
            write_images(root, 512);
        })
        .await;
        let request = thumbs(&["id", "thumb"], "label < 500");
        let options = || pushdown_client::StreamOptions {
            concurrency: 4,
            ..Default::default()
        };
        let (a, b, c) = tokio::join!(
            pushdown_tests::collect_with(&fx.client, &request, options()),
            pushdown_tests::collect_with(&fx.client, &request, options()),
            pushdown_tests::collect_with(&fx.client, &request, options()),
        );
        let rows: BTreeSet<_> = [a, b, c]
            .into_iter()
            .map(|r| sorted_rows(&r.expect("stream").0))
            .collect();
        assert_eq!(rows.len(), 1, "every request got the same rows");
        let shards = fx.client.plan(&request).await.expect("plan").endpoint.len() as u64;
        assert_eq!(lookups(&fx, "miss"), shards, "each shard computed once");
        assert_eq!(lookups(&fx, "hit_memory"), 2 * shards);
        // The image column of each file read once (plus footers' neighbours): not three times.
        let read = fx.bytes_read();
        assert!(
            read <= fx.images_bytes() * 11 / 10,
            "read {read} of {}",
            fx.images_bytes()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn off_never_caches_and_auto_keeps_only_what_pays() {
        // Off: the same request twice reads twice.
        let fx = Fixture::new(cached(CacheMode::Off), |root| {
            write_images(root, 256);
        })
        .await;
        let request = thumbs(&["id", "thumb"], "id >= 0");
        fx.collect(&request).await.expect("first");
        let once = fx.bytes_read();
        fx.collect(&request).await.expect("second");
        assert_eq!(fx.bytes_read(), once);
        assert_eq!(lookups(&fx, "hit_memory"), 0);
        assert!(lookups(&fx, "bypass") > 0);

        // Auto: a JPEG re-encode costs far more than reading its small output back, and a
        // dataset forced off stays off.
        let mut config = cached(CacheMode::Auto);
        config.cache.modes.insert("text".into(), CacheMode::Off);
        let fx = Fixture::new(config, |root| {
            write_images(root, 256);
        })
        .await;
        fx.collect(&request).await.expect("first");
        let shards = lookups(&fx, "miss");
        fx.collect(&request).await.expect("second");
        assert_eq!(lookups(&fx, "hit_memory"), shards, "thumbnails are worth caching");
        assert_eq!(metric(&fx, "pushdown_cache_admitted_total") as u64, shards);
    }
}

/// The batches of one `DoGet` of `ticket`, and the bytes the server read for it.
async fn redeem(
    fx: &Fixture,
    ticket: &pushdown_protocol::ShardTicket,
) -> (Vec<arrow::array::RecordBatch>, u64) {
    use futures::TryStreamExt;
    fx.bytes_read();
    let mut client = pushdown_tests::raw_client(fx.running.url()).await;
    let stream = client
        .do_get(arrow_flight::Ticket::new(ticket.encode()))
        .await
        .expect("do_get")
        .into_inner()
        .map_err(|s| arrow_flight::error::FlightError::Tonic(Box::new(s)));
    let batches: Vec<_> = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(stream)
        .try_collect()
        .await
        .expect("stream");
    (batches, fx.bytes_read())
}

/// A loader's part of a shard (`skip_rows`, `take_rows`: the global order cuts shards between
/// readers) is the slice of the shard's output. With no filter, row `i` of the output is row
/// `i` of the shard, so the server reads the part as a row selection: only the row group
/// holding it is read. With a filter it stops at the part's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_of_a_shard_is_read_as_a_row_selection() {
    let config = pushdown_server::ServerConfig {
        shard_max_rows: 256,
        ..pushdown_tests::small_shards()
    };
    let fx = Fixture::new(config, |root| {
        pushdown_tests::write_images(root, 512);
    })
    .await;
    // Rows 150..190 of the output, without a filter: inside the shard's third 64-row row
    // group, short of its end. With a filter, its rows are found by the filter alone (its
    // column read, counted), then read as a selection.
    for (sql, (skip, take)) in [
        ("SELECT id, label, image FROM images", (150, 40)),
        (
            "SELECT id, label, image FROM images WHERE label % 3 <> 0",
            (100, 40),
        ),
        (
            "SELECT id, image FROM images WHERE label % 3 <> 0 AND id % 2 = 0",
            (50, 20),
        ),
    ] {
        let info = fx
            .client
            .plan(&ScanRequest::new(Query::Sql(sql.into())))
            .await
            .expect("plan");
        let ticket = &info.endpoint[0].ticket.as_ref().expect("ticket").ticket;
        let whole = pushdown_protocol::ShardTicket::decode(ticket).expect("ours");
        assert_eq!(whole.shard.as_ref().map(|s| s.row_groups.len()), Some(4), "{sql}");
        let (all, whole_read) = redeem(&fx, &whole).await;
        let all = arrow::compute::concat_batches(&all[0].schema(), &all).expect("concat");
        assert!(all.num_rows() > skip + take, "{sql}: {} rows", all.num_rows());
        let part = pushdown_protocol::ShardTicket {
            skip_rows: skip as u64,
            take_rows: Some(take as u64),
            ..whole.clone()
        };
        let (got, part_read) = redeem(&fx, &part).await;
        assert_eq!(
            pushdown_tests::rows(&got),
            pushdown_tests::rows(&[all.slice(skip, take)]),
            "{sql}"
        );
        assert!(
            part_read * 3 < whole_read,
            "{sql}: the part read {part_read} bytes, the whole shard {whole_read}"
        );
        // To the shard's end: only the rows past `skip`.
        let tail = pushdown_protocol::ShardTicket {
            skip_rows: skip as u64,
            ..whole.clone()
        };
        let (got, _) = redeem(&fx, &tail).await;
        assert_eq!(
            pushdown_tests::rows(&got),
            pushdown_tests::rows(&[all.slice(skip, all.num_rows() - skip)]),
            "{sql}"
        );
    }
}
