//! Ops run identically on either side: as SQL UDFs in the server and as kernels in the client.

use arrow::array::Array;
use pushdown_client::LoaderSource;
use pushdown_client::run::{RunOptions, run};
use pushdown_ops::{Calls, Value};
use pushdown_planner::{Environment, MapStep, Pipeline, Side, Step, plan, plan_with_profile};
use pushdown_protocol::{Query, ScanRequest};
use pushdown_server::ServerConfig;
use pushdown_tests::{Fixture, num_rows, rows};

/// Runs `op(column, params)` in the server via SQL and in the client on the column (itself
/// a SQL expression, evaluated by the server); the outputs must be identical, row for row.
async fn same_on_both_sides(fx: &Fixture, column: &str, call: &str, params: &[Value]) {
    same_on_both_sides_of(fx, "images", column, call, params).await;
}

async fn same_on_both_sides_of(fx: &Fixture, dataset: &str, column: &str, call: &str, params: &[Value]) {
    let sql_params: Vec<String> = params.iter().map(Value::to_string).collect();
    let sql = format!(
        "SELECT id, {call}({column}{}) AS out FROM {dataset}",
        sql_params.iter().map(|p| format!(", {p}")).collect::<String>()
    );
    let served = fx.sql(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));

    let raw = fx
        .sql(&format!("SELECT id, {column} AS out FROM {dataset}"))
        .await
        .expect("raw");
    let step = Step::Map(MapStep {
        call: call.into(),
        input: "out".into(),
        params: params.to_vec(),
        output: None,
    });
    // Client-side resources (the dataset's tokenizer) come from the server, as in `run`.
    let resources = fx
        .client
        .resources_for(std::slice::from_ref(&step), dataset)
        .await
        .expect("resources");
    // The client's executor: the op calls bound to the batches' schema, applied batch by batch.
    let Step::Map(map) = &step else { unreachable!() };
    let calls = Calls::bind(&[map.call()], raw[0].schema(), &resources).expect("client calls");
    let ctx = pushdown_ops::Context {
        seed: 0,
        resources: &resources,
    };
    let local: Vec<_> = raw
        .into_iter()
        .map(|b| calls.apply(b, &ctx).expect("apply"))
        .collect();
    assert_eq!(num_rows(&served), num_rows(&local));
    assert_eq!(
        served[0].schema().field(1).data_type(),
        local[0].schema().field(1).data_type(),
        "{call}"
    );
    assert_eq!(rows(&served), rows(&local), "{call}: server and client differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_op_is_identical_on_server_and_client() {
    let fx = Fixture::images_and_text(96, 120).await;
    same_on_both_sides(&fx, "image", "decode_resize", &[16.into(), 12.into()]).await;
    same_on_both_sides(
        &fx,
        "image",
        "decode_center_crop",
        &[24.into(), 20.into(), 16.into()],
    )
    .await;
    same_on_both_sides(&fx, "image", "thumbnail", &[32.into()]).await;
    same_on_both_sides(&fx, "image", "thumbnail", &[48.into(), 60.into()]).await;
    same_on_both_sides(&fx, "caption", "hash_bucket", &[1000.into()]).await;
    same_on_both_sides(&fx, "label", "hash_bucket", &[7.into()]).await;
    same_on_both_sides(&fx, "label", "cast_to", &["float32".into()]).await;
    let pixels = "decode_resize(image, 24, 20)";
    same_on_both_sides(&fx, pixels, "center_crop", &[16.into(), 12.into()]).await;
    same_on_both_sides(&fx, pixels, "grayscale", &[]).await;
    same_on_both_sides(&fx, pixels, "normalize", &[0.45.into(), 0.225.into()]).await;
    let imagenet = [
        pushdown_ops::Value::List(vec![0.485, 0.456, 0.406]),
        pushdown_ops::Value::List(vec![0.229, 0.224, 0.225]),
        "chw".into(),
    ];
    same_on_both_sides(&fx, pixels, "normalize", &imagenet).await;
    same_on_both_sides(&fx, pixels, "to_chw", &[]).await;
    same_on_both_sides_of(&fx, "text", "body", "tokenize", &[256.into()]).await;
    same_on_both_sides_of(&fx, "text", "body", "tokenize", &[16.into(), "text".into()]).await;
    let tokens = "tokenize(body, 300)";
    same_on_both_sides_of(&fx, "text", tokens, "pad_tokens", &[64.into()]).await;
    same_on_both_sides_of(&fx, "text", tokens, "pad_tokens", &[512.into(), 2.into()]).await;
    // Every deterministic op of the registry is covered above or in the speech test.
    for op in pushdown_ops::registry().iter().filter(|op| op.is_deterministic()) {
        assert!(
            [
                "decode_audio",
                "log_mel",
                "audio_seconds",
                "decode_frames",
                "video_frames",
                "video_info",
                "video_seconds",
                "decode_resize",
                "decode_center_crop",
                "to_chw",
                "thumbnail",
                "hash_bucket",
                "cast_to",
                "center_crop",
                "grayscale",
                "normalize",
                "tokenize",
                "pad_tokens"
            ]
            .contains(&op.name()),
            "untested op {}",
            op.name()
        );
    }
    // Random ops are not server functions: refused by name, saying where they run.
    for sql in [
        "SELECT random_flip(decode_resize(image, 8, 8), 0.5) FROM images",
        "SELECT random_resized_crop(image, 8, 8) FROM images",
    ] {
        let err = fx.sql(sql).await.expect_err("random ops run in the trainer only");
        assert!(
            err.contains("random_") && err.contains("runs in the trainer"),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audio_ops_are_identical_on_server_and_client() {
    let fx = Fixture::speech(12).await;
    let on_both = |column: &'static str, call: &'static str, params: Vec<Value>| {
        let fx = &fx;
        async move { same_on_both_sides_of(fx, "speech", column, call, &params).await }
    };
    on_both("audio", "audio_seconds", vec![]).await;
    on_both("audio", "decode_audio", vec![16000.into()]).await;
    on_both("audio", "decode_audio", vec![22050.into(), 2.into()]).await;
    on_both("audio", "log_mel", vec![16000.into(), 80.into()]).await;
    let pcm = "decode_audio(audio, 16000)";
    on_both(
        pcm,
        "log_mel",
        vec![
            16000.into(),
            128.into(),
            400.into(),
            160.into(),
            10.into(),
            "float16".into(),
        ],
    )
    .await;
    // The trainer's random audio ops are refused in SQL by name.
    for sql in [
        "SELECT random_audio_crop(decode_audio(audio, 16000), 2) FROM speech",
        "SELECT spec_augment(log_mel(audio, 16000, 80), 2, 10, 2, 20) FROM speech",
    ] {
        let err = fx.sql(sql).await.expect_err("random ops run in the trainer only");
        assert!(err.contains("runs in the trainer"), "{err}");
    }
}

/// Video ops, where this build has FFmpeg: the same on both sides; where it has not:
/// refused by name, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn video_ops_are_identical_on_server_and_client_or_refused_by_name() {
    let fx = Fixture::new(pushdown_tests::small_shards(), |root| {
        pushdown_tests::write_videos(root, 6);
    })
    .await;
    // The server lists the video ops exactly when it runs them (planners keep them in the
    // trainer otherwise: crates/client's plan tests).
    let listed = fx.client.server_ops().await.expect("the ops action");
    for op in ["decode_frames", "video_frames", "video_info", "video_seconds"] {
        assert_eq!(listed.contains(op), pushdown_ops::VIDEO, "{op}");
    }
    assert!(listed.contains("decode_resize") && listed.contains("random_clip"));
    if !pushdown_ops::VIDEO {
        for sql in [
            "SELECT decode_frames(video, 4, 16, 16) FROM videos",
            "SELECT id FROM videos WHERE video_seconds(video) > 1",
        ] {
            let err = fx.sql(sql).await.expect_err("no FFmpeg in this build");
            assert!(err.contains("no video support"), "{err}");
        }
        return;
    }
    let on_both = |call: &'static str, params: Vec<Value>| {
        let fx = &fx;
        async move { same_on_both_sides_of(fx, "videos", "video", call, &params).await }
    };
    on_both("decode_frames", vec![4.into(), 32.into(), 48.into()]).await;
    on_both("video_frames", vec![4.into(), 16.into(), 24.into()]).await;
    on_both("video_frames", vec![2.5.into(), 8.into(), 8.into(), 3.into()]).await;
    on_both("video_info", vec![]).await;
    on_both("video_seconds", vec![]).await;
    // A filter on the container's metadata runs at the server.
    let long = fx
        .sql("SELECT id FROM videos WHERE video_info(video)['seconds'] > 1.5 AND video_seconds(video) < 2.5")
        .await
        .expect("filter");
    let ids: Vec<String> = rows(&long);
    assert_eq!(ids, ["1", "4"], "the 2 s clips");
    // The trainer's random clip choice is refused in SQL by name.
    let err = fx
        .sql("SELECT random_clip(decode_frames(video, 8, 8, 8), 4, 1) FROM videos")
        .await
        .expect_err("random ops run in the trainer only");
    assert!(
        err.contains("random_clip") && err.contains("runs in the trainer"),
        "{err}"
    );
}

/// A video decoder's frames count in the server's memory budget, once per run beside its
/// outputs: where one query's memory cannot hold them, decoding is refused at planning
/// (no retry can fit it) while metadata ops, which decode nothing, run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_video_decoder_s_frames_count_in_the_memory_budget() {
    if !pushdown_ops::VIDEO {
        return;
    }
    let config = ServerConfig {
        max_query_memory: 48 << 20,
        ..pushdown_tests::small_shards()
    };
    let fx = Fixture::new(config, |root| pushdown_tests::write_videos(root, 3)).await;
    let err = fx
        .sql("SELECT decode_frames(video, 2, 8, 8) FROM videos")
        .await
        .expect_err("64 MiB of decoder frames in a 48 MiB query");
    assert!(
        err.contains("decode_frames")
            && err.contains("64.0 MiB of it besides its output")
            && !err.contains("attempts"),
        "refused once, at planning: {err}"
    );
    let seconds = fx
        .sql("SELECT video_seconds(video) FROM videos")
        .await
        .expect("no decoding");
    assert_eq!(seconds.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thumbnails_move_a_fraction_of_the_image_bytes() {
    let fx = Fixture::images(256).await;
    let bytes = |sql: &'static str| {
        let fx = &fx;
        async move {
            let (batches, totals) = fx
                .collect(&ScanRequest::new(Query::Sql(sql.into())))
                .await
                .expect(sql);
            assert_eq!(num_rows(&batches), 256);
            totals.bytes_received
        }
    };
    let raw = bytes("SELECT image FROM images").await;
    let thumbs = bytes("SELECT thumbnail(image, 32) AS image FROM images").await;
    assert!(
        thumbs * 100 < raw * 15,
        "thumbnails moved {thumbs} bytes of {raw} (≥ 15%)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_push_deterministic_ops_to_the_server() {
    let fx = Fixture::images(200).await;
    let pipeline = Pipeline::new("images")
        .filter("label < 500")
        .map("decode_resize", "image", [8i64, 8], "pixels")
        .select(["pixels", "label"])
        .shuffle(50)
        .batch(32);
    let schema = fx.client.dataset_schema("images").await.expect("schema");
    let planned = plan(&pipeline, &schema).expect("plan");
    assert_eq!(planned.fragment.ops.len(), 1);
    assert_eq!(planned.fragment.columns, vec!["pixels", "label"]);
    assert!(
        planned.placements[1].side == Side::Server,
        "{}",
        planned.explain()
    );

    // Over a slow link (10 Mbit/s) shipping JPEGs is the bottleneck: the measured placement
    // pushes the downscale too.
    let report = run(&RunOptions {
        loader: pushdown_client::LoaderOptions {
            link: pushdown_client::Link::bandwidth(10e6 / 8.0),
            seed: 1,
            ..Default::default()
        },
        ..RunOptions::new(vec![fx.running.url()], LoaderSource::Pipeline(pipeline))
    })
    .await
    .expect("run");
    let n = fx.local_count("label < 500").await;
    assert_eq!(report.rows, n);
    // 8×8×3 pixel bytes per row instead of a JPEG, plus the schema and
    // trailer of each stream (one per partition of the order at least: 8 by default).
    assert!(
        report.totals.bytes_received < n * 8 * 8 * 3 * 2 + 16 * 1024,
        "{:?}",
        report.totals
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_op_calls_are_invalid_arguments() {
    let fx = Fixture::images(32).await;
    for sql in [
        "SELECT thumbnail(image) FROM images",
        "SELECT thumbnail(label, 3) FROM images",
        "SELECT decode_resize(image, id, 3) FROM images",
        "SELECT hash_bucket(caption, 0) FROM images",
    ] {
        let err = fx.sql(sql).await.expect_err(sql);
        assert!(
            err.contains("InvalidArgument") || err.contains("invalid"),
            "{sql}: {err}"
        );
    }
    // A corrupt image fails the stream with the row, not silently.
    let err = fx
        .sql("SELECT thumbnail(CAST(caption AS BYTEA), 8) FROM images")
        .await
        .expect_err("captions are not images");
    assert!(err.contains("row 0"), "{err}");
    let ok = fx.sql("SELECT id FROM images").await.expect("still serving");
    assert_eq!(ok.iter().map(|b| b.column(0).len()).sum::<usize>(), 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_planner_places_ops_by_the_servers_measurements() {
    use pushdown_client::{Link, costed_plan};
    let fx = Fixture::images(128).await;
    let schema = fx.client.dataset_schema("images").await.expect("schema");
    let gbit = 1e9 / 8.0;
    let pipeline = |side: i64| {
        Pipeline::new("images")
            .filter("label < 800")
            .map("decode_resize", "image", [side, side], "pixels")
            .select(["pixels", "label"])
            .shuffle(16)
    };

    // The profile is measured: real sizes, real times.
    let fragment = plan(&pipeline(64), &schema).expect("plan").fragment;
    let profile = fx
        .client
        .profile(&ScanRequest::new(Query::Fragment(fragment.clone())))
        .await
        .expect("profile");
    assert_eq!(profile.rows_sampled, 128);
    assert!(
        (0.6..=0.95).contains(&profile.selectivity),
        "{}",
        profile.selectivity
    );
    let op = &profile.ops[0];
    assert!(op.bytes_in_per_row > 5_000.0, "JPEGs: {op:?}");
    assert!((op.bytes_out_per_row - 64.0 * 64.0 * 3.0).abs() < 64.0, "{op:?}");
    assert!(op.ns_per_row > 0.0 && profile.scan_ns_per_row > 0.0);
    // `label` is not sorted: statistics prune nothing, every row is scanned.
    assert_eq!(profile.scanned_fraction, Some(1.0));
    // The shards a split can deal out: the endpoints the server plans for the fragment.
    let endpoints = fx
        .client
        .plan(&ScanRequest::new(Query::Fragment(fragment.clone())))
        .await
        .expect("plan")
        .endpoint
        .len();
    assert_eq!(profile.shards, Some(endpoints as u32));
    // `id` is: `id < 40` leaves the first of the two 64-row row groups.
    let by_id = Pipeline::new("images")
        .filter("id < 40")
        .map("decode_resize", "image", [64i64, 64], "pixels")
        .select(["pixels", "label"]);
    let pruned = fx
        .client
        .profile(&ScanRequest::new(Query::Fragment(
            plan(&by_id, &schema).expect("plan").fragment,
        )))
        .await
        .expect("profile");
    assert_eq!(pruned.scanned_fraction, Some(0.5), "{pruned:?}");
    assert!(
        (pruned.selectivity - 40.0 / 128.0).abs() < 1e-9,
        "{}",
        pruned.selectivity
    );

    // Downscale to 64×64: reducing, pushed. To 512×512: expanding, kept with the trainer.
    // The machines are stated (a 16-core storage host, 4 trainer cores per accelerator, a
    // 100 Mbit/s link) so the decision does not depend on the machine running the test: in
    // a debug build the 512×512 upscale is slow enough (~70 ms/row) that at 1 Gbit/s the
    // trainer's CPU, not the link, would bound both placements.
    let env = Environment {
        bandwidth_bytes_per_s: 100e6 / 8.0,
        server_cores: 16.0,
        client_cores: 4.0,
        client_ns_per_row: 0.0,
    };
    let costed = |side: i64| {
        let (fx, schema) = (&fx, &schema);
        async move {
            let fragment = plan(&pipeline(side), schema).expect("plan").fragment;
            let profile = fx
                .client
                .profile(&ScanRequest::new(Query::Fragment(fragment)))
                .await
                .expect("profile");
            plan_with_profile(&pipeline(side), schema, &profile, &env).expect("costed")
        }
    };
    let small = costed(64).await;
    assert_eq!(small.chosen.pushed, 1, "{}", small.explain());
    let large = costed(512).await;
    // Kept with the trainer, or at most a small share of the shards expanded by the server
    // (a split: in a debug build the trainer's cores bound it, and the server's spare ones
    // may take a few shards).
    let kept = large.chosen.pushed == 0 || large.chosen.server_fraction <= 0.25;
    assert!(kept, "{}", large.explain());
    if large.chosen.pushed == 0 {
        assert_eq!(large.plan.fragment.columns, vec!["image", "label"]);
    }
    // `pushdown run` plans the same way, with this machine's cores.
    costed_plan(&fx.client, &pipeline(64), &schema, Link::bandwidth(gbit))
        .await
        .expect("run's plan");

    // Either way, the trainer gets the same rows.
    for (costed, side) in [(&small, 64), (&large, 512)] {
        let report = run(&RunOptions {
            loader: pushdown_client::LoaderOptions {
                link: Link::bandwidth(gbit),
                seed: 1,
                ..Default::default()
            },
            ..RunOptions::new(vec![fx.running.url()], LoaderSource::Pipeline(pipeline(side)))
        })
        .await
        .expect("run");
        let n = fx.local_count("label < 800").await;
        assert_eq!(report.rows, n, "{}", costed.explain());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_truncates_with_the_datasets_own_tokenizer() {
    use arrow::array::AsArray;
    let fx = Fixture::images_and_text(16, 200).await;
    let ids = |batches: &[arrow::record_batch::RecordBatch], col: usize| -> Vec<Vec<u32>> {
        batches
            .iter()
            .flat_map(|b| {
                // The dataset's tokenizer has 4,096 ids: they travel as 16-bit ids.
                let column = b.column(col);
                assert_eq!(
                    column.data_type(),
                    &arrow::datatypes::DataType::List(std::sync::Arc::new(
                        arrow::datatypes::Field::new_list_field(arrow::datatypes::DataType::UInt16, false)
                    ))
                );
                (0..column.len())
                    .map(|r| pushdown_client::pack::token_ids(column, r).expect("ids"))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let batches = fx
        .sql("SELECT tokenize(body, 100000) AS full, tokenize(body, 64) AS cut, body FROM text")
        .await
        .expect("tokenize");
    let (full, cut) = (ids(&batches, 0), ids(&batches, 1));
    assert_eq!(full.len(), 200);
    let mut truncated = 0;
    for (f, c) in full.iter().zip(&cut) {
        assert_eq!(c.len(), f.len().min(64));
        assert_eq!(&f[..c.len()], c.as_slice(), "truncation keeps the prefix");
        truncated += usize::from(f.len() > 64);
        // The tokenizer was trained on this corpus: no unknown tokens, and sub-word merges
        // make tokens fewer than characters.
        assert!(!f.contains(&1), "[UNK] in {f:?}");
    }
    assert!(
        truncated > 150,
        "most documents are longer than 64 tokens: {truncated}"
    );
    let body = batches[0].column(2).as_string::<i32>().value(0);
    assert!(
        full[0].len() * 2 < body.len(),
        "{} tokens for {} bytes",
        full[0].len(),
        body.len()
    );

    // Tokens move fewer bytes than the documents.
    let bytes = |sql: &'static str| {
        let fx = &fx;
        async move {
            fx.collect(&ScanRequest::new(Query::Sql(sql.into())))
                .await
                .expect(sql)
                .1
                .bytes_received
        }
    };
    let (docs, tokens) = (
        bytes("SELECT body FROM text").await,
        bytes("SELECT tokenize(body, 128) AS t FROM text").await,
    );
    assert!(tokens * 2 < docs, "tokens {tokens} bytes vs documents {docs}");

    // Resources that do not exist are clear errors, and the server goes on serving.
    let err = fx
        .sql("SELECT tokenize(caption, 8) FROM images")
        .await
        .expect_err("images ship no tokenizer");
    assert!(err.contains("ships no tokenizer.json"), "{err}");
    let err = fx
        .sql("SELECT tokenize(body, 8, 'nope') FROM text")
        .await
        .expect_err("unknown tokenizer");
    assert!(err.contains("no dataset 'nope'"), "{err}");
    let err = fx
        .sql("SELECT tokenize(body, 0) FROM text")
        .await
        .expect_err("max_len 0");
    assert!(err.contains("max_len"), "{err}");
    let err = fx.client.tokenizer("images").await.expect_err("no tokenizer");
    assert!(err.to_string().contains("ships no tokenizer.json"), "{err}");
    // A caption tokenized with the text dataset's tokenizer: named explicitly.
    let named = fx
        .sql("SELECT tokenize(caption, 8, 'text') AS t FROM images")
        .await
        .expect("named tokenizer");
    assert_eq!(num_rows(&named), 16);
}

#[test]
fn generated_tokenizers_are_reproducible() {
    use pushdown_datasets::{GenOptions, Kind, generate};
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    for d in &dirs {
        generate(&GenOptions::new(Kind::Text, 300), d.path()).expect("gen");
    }
    let read =
        |d: &tempfile::TempDir| std::fs::read(d.path().join("tokenizer.json")).expect("tokenizer.json");
    assert_eq!(read(&dirs[0]), read(&dirs[1]));
    pushdown_ops::load_tokenizer(&read(&dirs[0])).expect("loads");
}
