//! The trainer's loader against real servers: reproducible whatever the concurrency or the
//! number of servers, exactly resumable, and fair across data-parallel ranks.

use arrow::array::AsArray;
use arrow::datatypes::{Int64Type, UInt8Type};
use pushdown_client::{
    Column, Loader, LoaderOptions, LoaderSource, LoaderState, MixtureSource, StreamOptions,
};
use pushdown_planner::Pipeline;
use pushdown_protocol::Compression;
use pushdown_server::Server;
use pushdown_tests::{Fixture, small_shards, write_images};

const SQL: &str = "SELECT id, label FROM images WHERE label < 600";

struct Setup {
    runtime: tokio::runtime::Runtime,
    fx: Fixture,
}

fn setup(rows: usize) -> Setup {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fx = runtime.block_on(Fixture::new(small_shards(), |root| {
        write_images(root, rows);
    }));
    Setup { runtime, fx }
}

fn options(seed: u64) -> LoaderOptions {
    LoaderOptions {
        batch_size: Some(32),
        shuffle_buffer: Some(100),
        seed,
        epochs: 2,
        ..LoaderOptions::default()
    }
}

fn loader(servers: &[String], o: LoaderOptions) -> Loader {
    Loader::new(servers, LoaderSource::Sql(SQL.into()), o).expect("loader")
}

fn ids(batch: &pushdown_client::TensorBatch) -> Vec<i64> {
    match batch.column("id").expect("id") {
        Column::Tensor { shape, values, .. } => {
            assert_eq!(shape, &vec![batch.rows]);
            values.as_primitive::<Int64Type>().values().to_vec()
        }
        Column::Arrow(_) => panic!("ids are a tensor"),
    }
}

fn drain(l: &mut Loader, limit: usize) -> Vec<Vec<i64>> {
    l.by_ref().take(limit).map(|b| ids(&b.expect("batch"))).collect()
}

#[test]
fn the_sequence_depends_on_the_seed_alone() {
    let s = setup(300);
    let url = s.fx.running.url();
    // A second server over the same data.
    let second = s.runtime.block_on(async {
        let store = pushdown_server::open_store(&s.fx.root.path().to_string_lossy()).expect("store");
        let server = Server::builder(store)
            .config(small_shards())
            .open()
            .await
            .expect("server");
        server.spawn("127.0.0.1:0".parse().unwrap()).await.expect("spawn")
    });
    let mut runs = Vec::new();
    for (servers, concurrency, compression) in [
        (vec![url.clone()], 1, Some(Compression::Zstd)),
        (vec![url.clone()], 4, Some(Compression::None)),
        (vec![second.url(), url.clone()], 3, Some(Compression::Lz4)),
        (vec![url.clone()], 2, None),
    ] {
        let mut o = options(7);
        o.compression = compression;
        o.stream = StreamOptions {
            concurrency,
            buffered_bytes: 1,
            ..StreamOptions::default()
        };
        o.workers = Some(concurrency);
        runs.push(drain(&mut loader(&servers, o), usize::MAX));
    }
    assert_eq!(runs[0], runs[1], "concurrency and compression change nothing");
    assert_eq!(runs[0], runs[2], "the number of servers changes nothing");
    assert_eq!(runs[0], runs[3], "the planner's codec changes nothing");

    let expected = s.runtime.block_on(s.fx.local_count("label < 600")) as usize;
    let epoch: Vec<i64> = runs[0]
        .iter()
        .take(expected.div_ceil(32))
        .flatten()
        .copied()
        .collect();
    assert_eq!(epoch.len(), expected, "one epoch is every row once");
    let mut sorted = epoch.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), expected);
    assert!(
        epoch.windows(2).filter(|w| w[0] > w[1]).count() > expected / 4,
        "shuffled"
    );
    let second_epoch: Vec<i64> = runs[0]
        .iter()
        .skip(expected.div_ceil(32))
        .flatten()
        .copied()
        .collect();
    assert_ne!(epoch, second_epoch, "each epoch is reshuffled");
    let other_seed = drain(&mut loader(&[url], options(8)), usize::MAX);
    assert_ne!(runs[0], other_seed);
}

/// A filter the statistics rule out everywhere plans no shards: empty epochs, not an error.
#[test]
fn a_filter_nothing_passes_gives_empty_epochs() {
    let s = setup(300);
    let source = LoaderSource::Sql("SELECT id, label FROM images WHERE id < 0".into());
    let mut l = Loader::new(&[s.fx.running.url()], source, options(3)).expect("loader");
    assert_eq!(l.epoch_len(), (0, 0));
    assert_eq!(drain(&mut l, usize::MAX), Vec::<Vec<i64>>::new());
}

#[test]
fn a_restored_loader_continues_exactly() {
    let s = setup(300);
    let servers = vec![s.fx.running.url()];
    let whole = drain(&mut loader(&servers, options(3)), usize::MAX);
    let per_epoch = whole.len() / 2;
    // k = 0, inside the first window, mid-shard, at and across the epoch boundary.
    for k in [0, 1, 4, 5, per_epoch, per_epoch + 1, whole.len() - 1] {
        let mut first = loader(&servers, options(3));
        let head = drain(&mut first, k);
        let saved = first.state().to_bytes();
        drop(first);
        let mut restored = loader(&servers, options(3));
        restored
            .restore(LoaderState::from_bytes(&saved).expect("state"))
            .expect("restore");
        let tail = drain(&mut restored, usize::MAX);
        let joined: Vec<Vec<i64>> = head.into_iter().chain(tail).collect();
        assert_eq!(joined, whole, "resumed after {k} batches");
    }
    // A state of another configuration is refused.
    let mut o = options(3);
    o.rank = 1;
    o.world_size = 2;
    let mut other = loader(&servers, o);
    let state = loader(&servers, options(3)).state();
    assert!(other.restore(state).is_err());
    // The codec is not part of the configuration: a state saved under one restores under
    // another (the planner's choice of codec depends on timings).
    let mut o = options(3);
    o.compression = Some(Compression::Zstd);
    let mut first = loader(&servers, o);
    let head = drain(&mut first, 3);
    let saved = first.state();
    let mut o = options(3);
    o.compression = Some(Compression::None);
    let mut restored = loader(&servers, o);
    restored.restore(saved).expect("restore under another codec");
    let joined: Vec<Vec<i64>> = head.into_iter().chain(drain(&mut restored, usize::MAX)).collect();
    assert_eq!(joined, whole);
}

/// Without a shuffle the loader is the shards' rows in the epoch's shard order, cut into
/// batches (no window per row); a resume continues it exactly.
#[test]
fn without_a_shuffle_batches_are_the_shards_rows_in_order() {
    let s = setup(300);
    let servers = vec![s.fx.running.url()];
    let unshuffled = || LoaderOptions {
        shuffle_buffer: None,
        ..options(5)
    };
    let whole = drain(&mut loader(&servers, unshuffled()), usize::MAX);
    let per_epoch: Vec<i64> = whole[..whole.len() / 2].concat();
    assert!(
        whole[..whole.len() / 2]
            .iter()
            .rev()
            .skip(1)
            .all(|b| b.len() == 32)
    );
    // Rows within each shard keep the file's order (ids ascend inside a shard); the shards
    // come in the seed's order, so the epoch is a permutation of runs of ascending ids.
    let mut sorted = per_epoch.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), per_epoch.len(), "every row once");
    let descents = per_epoch.windows(2).filter(|w| w[1] < w[0]).count();
    let info = s.runtime.block_on(async {
        let client = pushdown_client::PushdownClient::connect(&servers)
            .await
            .expect("client");
        client
            .plan(&pushdown_protocol::ScanRequest::new(
                pushdown_protocol::Query::Sql(SQL.into()),
            ))
            .await
            .expect("plan")
    });
    assert!(
        descents < info.endpoint.len(),
        "{descents} descents over {} shards: rows moved inside a shard",
        info.endpoint.len()
    );
    for k in [1, 3, whole.len() / 2 + 1] {
        let mut first = loader(&servers, unshuffled());
        let head = drain(&mut first, k);
        let mut restored = loader(&servers, unshuffled());
        restored.restore(first.state()).expect("restore");
        let joined: Vec<Vec<i64>> = head.into_iter().chain(drain(&mut restored, usize::MAX)).collect();
        assert_eq!(joined, whole, "resumed after {k} batches");
    }
}

#[test]
fn the_loader_refuses_queries_that_are_not_row_wise() {
    let s = setup(100);
    let source = LoaderSource::Sql("SELECT id, label FROM images ORDER BY id DESC".into());
    let err = Loader::new(&[s.fx.running.url()], source, options(1)).expect_err("refused");
    assert!(err.to_string().contains("row-wise"), "{err}");
}

#[test]
fn ranks_get_equal_batches_and_cover_every_row() {
    let s = setup(300);
    let servers = vec![s.fx.running.url()];
    let n = s.runtime.block_on(s.fx.local_count("label < 600")) as usize;
    for world in 1..=4 {
        for drop_last in [true, false] {
            let mut all = Vec::new();
            let mut counts = Vec::new();
            for rank in 0..world {
                let o = LoaderOptions {
                    batch_size: Some(16),
                    shuffle_buffer: Some(50),
                    seed: 11,
                    rank,
                    world_size: world,
                    epochs: 1,
                    drop_last,
                    ..LoaderOptions::default()
                };
                let mut l = loader(&servers, o);
                let batches = drain(&mut l, usize::MAX);
                assert_eq!(batches.len() as u64, l.epoch_len().1);
                counts.push(batches.len());
                all.extend(batches.into_iter().flatten());
            }
            assert!(
                counts.iter().all(|&c| c == counts[0]),
                "{world} ranks: {counts:?}"
            );
            let total = all.len();
            all.sort_unstable();
            all.dedup();
            if drop_last {
                assert_eq!(all.len(), total, "no row twice");
                assert_eq!(total, (n / world) / 16 * 16 * world);
            } else {
                assert_eq!(all.len(), n, "every row");
                assert!(total - n < world, "padding under one row per rank");
            }
        }
    }
}

#[test]
fn pixels_come_out_as_tensors_with_the_intended_augmentation() {
    let s = setup(200);
    let servers = vec![s.fx.running.url()];
    let pipeline = |flip: f64| {
        Pipeline::new("images")
            .map("decode_resize", "image", [16i64, 12], "pixels")
            .select(["id", "pixels"])
            .map("random_flip", "pixels", [flip], "pixels")
            .map("random_crop", "pixels", [8i64, 8], "crop")
            .shuffle(64)
            .batch(25)
    };
    let load = |flip: f64| -> Vec<(i64, Vec<u8>, Vec<u8>)> {
        let o = LoaderOptions {
            seed: 5,
            workers: Some(3),
            ..LoaderOptions::default()
        };
        let l = Loader::new(&servers, LoaderSource::Pipeline(pipeline(flip)), o).expect("loader");
        let mut rows = Vec::new();
        for b in l {
            let b = b.expect("batch");
            let tensor = |name: &str, shape: &[usize]| match b.column(name).expect("column") {
                Column::Tensor { shape: s, values, .. } => {
                    assert_eq!(&s[1..], shape, "{name}");
                    values.as_primitive::<UInt8Type>().values().to_vec()
                }
                Column::Arrow(_) => panic!("{name} is a tensor"),
            };
            let (px, crop) = (tensor("pixels", &[12, 16, 3]), tensor("crop", &[8, 8, 3]));
            for (r, id) in ids(&b).into_iter().enumerate() {
                rows.push((
                    id,
                    px[r * 576..(r + 1) * 576].to_vec(),
                    crop[r * 192..(r + 1) * 192].to_vec(),
                ));
            }
        }
        rows.sort_by_key(|r| r.0);
        rows
    };
    let (plain, flipped) = (load(0.0), load(0.5));
    assert_eq!(plain.len(), 200);
    let mirror = |px: &[u8]| -> Vec<u8> {
        let mut out = vec![0; px.len()];
        for y in 0..12 {
            for x in 0..16 {
                let (a, b) = ((y * 16 + x) * 3, (y * 16 + 15 - x) * 3);
                out[a..a + 3].copy_from_slice(&px[b..b + 3]);
            }
        }
        out
    };
    let mut mirrored = 0;
    for ((id, a, crop), (_, b, _)) in plain.iter().zip(&flipped) {
        if a != b {
            assert_eq!(&mirror(a), b, "row {id}: flipped means mirrored");
            mirrored += 1;
        }
        // The crop is a window of the pixels it was cut from.
        let inside = (0..=4).any(|y0| {
            (0..=8).any(|x0| (0..8).all(|y| crop[y * 24..y * 24 + 24] == a[((y0 + y) * 16 + x0) * 3..][..24]))
        });
        assert!(inside, "row {id}: crop not inside the image");
    }
    let rate = mirrored as f64 / 200.0;
    let sigma = (0.25f64 / 200.0).sqrt();
    assert!((rate - 0.5).abs() < 4.0 * sigma, "flip rate {rate}");
}

/// `pushdown run` and the `Loader` are one driver: the same pipeline and seed give the same
/// sample sequence, row for row and pixel for pixel (shard order, shuffle windows, batches,
/// and the randomness of client-side ops), with the rows counted up front or not.
#[test]
fn run_out_yields_the_loaders_sequence() {
    let s = setup(300);
    let servers = vec![s.fx.running.url()];
    let pipeline = Pipeline::new("images")
        .filter("label < 700")
        .map("decode_resize", "image", [8i64, 6], "pixels")
        .select(["id", "pixels"])
        .map("random_flip", "pixels", [0.5f64], "pixels")
        .shuffle(50)
        .batch(16);
    let o = LoaderOptions {
        seed: 11,
        epochs: 2,
        ..LoaderOptions::default()
    };

    let mut from_loader: Vec<(i64, Vec<u8>)> = Vec::new();
    let l = Loader::new(&servers, LoaderSource::Pipeline(pipeline.clone()), o.clone()).expect("loader");
    for b in l {
        let b = b.expect("batch");
        let Column::Tensor { values, .. } = b.column("pixels").expect("pixels") else {
            panic!("pixels are a tensor")
        };
        let px = values.as_primitive::<UInt8Type>().values().to_vec();
        for (r, id) in ids(&b).into_iter().enumerate() {
            from_loader.push((id, px[r * 144..(r + 1) * 144].to_vec()));
        }
    }

    let out = s.fx.root.path().join("run.parquet");
    let report = s
        .runtime
        .block_on(pushdown_client::run::run(&pushdown_client::run::RunOptions {
            out: Some(out.clone()),
            loader: o,
            ..pushdown_client::run::RunOptions::new(servers.clone(), LoaderSource::Pipeline(pipeline))
        }))
        .expect("run");
    let file = std::fs::File::open(&out).expect("out");
    let mut from_run: Vec<(i64, Vec<u8>)> = Vec::new();
    for b in parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("parquet")
        .build()
        .expect("reader")
    {
        let b = b.expect("batch");
        let id = b.column(0).as_primitive::<Int64Type>();
        let px = b.column(1).as_fixed_size_list();
        for r in 0..b.num_rows() {
            let row = px.value(r);
            from_run.push((id.value(r), row.as_primitive::<UInt8Type>().values().to_vec()));
        }
    }
    assert_eq!(report.rows as usize, from_run.len());
    assert!(
        from_loader.len() > 300,
        "two epochs of ~70%: {}",
        from_loader.len()
    );
    assert_eq!(from_run, from_loader, "run --out and the Loader disagree");
    // Really shuffled, and the epochs differ.
    let half = from_loader.len() / 2;
    assert_ne!(from_loader[..half], from_loader[half..]);
}

/// A column's type is fixed by its field: a numeric column is a tensor in every batch,
/// nullable or not (real Parquet calls every column nullable); a null in it is an error
/// naming the column and row, never a switch to Arrow. Strings stay Arrow.
#[test]
fn loader_column_types_follow_the_schema_not_the_batch() {
    use arrow::array::{ArrayRef, Int32Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;
    use pushdown_client::TensorBatch;
    use std::sync::Arc;

    let schema = Arc::new(Schema::new(vec![
        Field::new("label", DataType::Int32, false),
        Field::new("maybe", DataType::Int32, true),
        Field::new("name", DataType::Utf8, true),
    ]));
    let batch = |maybe: Vec<Option<i32>>| {
        let label: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        let maybe: ArrayRef = Arc::new(Int32Array::from(maybe));
        let name: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None]));
        TensorBatch::from_record_batch(
            &RecordBatch::try_new(Arc::clone(&schema), vec![label, maybe, name]).expect("batch"),
            0,
            7,
        )
    };
    let full = batch(vec![Some(1), Some(2)]).expect("no null where a tensor is due");
    assert!(matches!(full.column("label"), Some(Column::Tensor { .. })));
    assert!(
        matches!(full.column("maybe"), Some(Column::Tensor { .. })),
        "{full:?}"
    );
    assert!(matches!(full.column("name"), Some(Column::Arrow(_))));
    let err = batch(vec![Some(1), None]).expect_err("a null where a tensor is due");
    assert!(
        matches!(&err, pushdown_client::ClientError::NullInTensor { column, batch: 7, row: 1 } if column == "maybe"),
        "{err}"
    );
    assert!(Column::is_tensor(schema.field(0)));
    assert!(Column::is_tensor(schema.field(1)));
    assert!(!Column::is_tensor(schema.field(2)));
}

/// Each epoch is planned when it starts: a file added while an epoch runs joins the next one
/// (the running epoch reads exactly the files it was planned on), a file removed leaves the
/// next one, and a mid-epoch state saved before the change is refused rather than resumed on
/// other shards. Growth is picked up on request (the `refresh` action), with no restart.
#[test]
fn datasets_that_grow_change_the_next_epoch_only() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // No polling within the test: only `refresh` re-lists the data root.
    let config = pushdown_server::ServerConfig {
        catalog_refresh: std::time::Duration::from_secs(3600),
        ..small_shards()
    };
    let fx = runtime.block_on(Fixture::new(config, |root| {
        write_images(root, 256); // part-00000: ids 0..256
    }));
    let more = tempfile::tempdir().expect("scratch");
    write_images(more.path(), 512); // part-00001: ids 256..512
    let images = fx.root.path().join("images");
    let versions = |fx: &Fixture| {
        runtime
            .block_on(fx.client.refresh())
            .expect("refresh")
            .into_iter()
            .flat_map(|(_, v)| v)
            .map(|v| (v.dataset, v.version, v.files))
            .collect::<Vec<_>>()
    };
    let before = versions(&fx);
    assert_eq!(before.len(), 1);
    assert_eq!((before[0].0.as_str(), before[0].2), ("images", 1));

    let servers = vec![fx.running.url()];
    let o = LoaderOptions {
        batch_size: Some(32),
        shuffle_buffer: Some(100),
        seed: 5,
        epochs: 3,
        ..LoaderOptions::default()
    };
    let source = || LoaderSource::Sql("SELECT id, label FROM images".into());
    let mut l = Loader::new(&servers, source(), o.clone()).expect("loader");
    assert_eq!(l.epoch_len(), (256, 8));
    let mut epochs: Vec<Vec<i64>> = vec![Vec::new(); 3];
    for batch in l.by_ref().take(2) {
        epochs[0].extend(ids(&batch.expect("batch")));
    }
    let mid_epoch = l.state();
    assert_ne!(
        mid_epoch.version, 0,
        "a mid-epoch state names the shards' version"
    );

    std::fs::copy(
        more.path().join("images/part-00001.parquet"),
        images.join("part-00001.parquet"),
    )
    .expect("add a file");
    let grown = versions(&fx);
    assert_eq!(grown[0].2, 2);
    assert_ne!(
        grown[0].1, before[0].1,
        "the dataset's version changes with its files"
    );

    let mut boundary = None;
    while let Some(batch) = l.next() {
        let batch = batch.expect("batch");
        epochs[batch.epoch as usize].extend(ids(&batch));
        if batch.epoch == 1 && boundary.is_none() {
            // The state after the first epoch, taken as the second epoch's first batch is out.
            boundary = Some(batch.index);
        }
        if batch.epoch == 1 && l.state().batches == l.epoch_len().1 {
            // The second epoch is over: remove the first file before the third is planned.
            std::fs::remove_file(images.join("part-00000.parquet")).expect("remove a file");
            assert_eq!(versions(&fx)[0].2, 1);
        }
    }
    let sorted = |v: &[i64]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v
    };
    assert_eq!(
        sorted(&epochs[0]),
        (0..256).collect::<Vec<_>>(),
        "the running epoch keeps its files"
    );
    assert_eq!(
        sorted(&epochs[1]),
        (0..512).collect::<Vec<_>>(),
        "the next epoch has the new file"
    );
    assert_eq!(
        sorted(&epochs[2]),
        (256..512).collect::<Vec<_>>(),
        "a removed file leaves"
    );
    assert_eq!(boundary, Some(0));

    // Restoring the mid-epoch state: its shards are gone, so it is refused by name.
    let mut restored = Loader::new(&servers, source(), o.clone()).expect("loader");
    let err = restored
        .restore(mid_epoch.clone())
        .expect_err("the dataset changed");
    assert!(err.to_string().contains("dataset changed"), "{err}");
    // At an epoch boundary a state restores on what the servers list now.
    let mut restored = Loader::new(&servers, source(), o).expect("loader");
    restored
        .restore(LoaderState {
            epoch: 2,
            batches: 0,
            ..mid_epoch
        })
        .expect("restore at a boundary");
    let third: Vec<i64> = restored.flat_map(|b| ids(&b.expect("batch"))).collect();
    assert_eq!(
        third, epochs[2],
        "the same sequence as the loader that saw the change"
    );
}

/// The rows of each batch of `l` as (id, crop bytes), batch by batch.
fn id_crops(l: &mut Loader, limit: usize) -> Vec<Vec<(i64, Vec<u8>)>> {
    l.by_ref()
        .take(limit)
        .map(|b| {
            let b = b.expect("batch");
            let crop = match b.column("crop").expect("crop") {
                Column::Tensor { values, .. } => values.as_primitive::<UInt8Type>().values().to_vec(),
                Column::Arrow(_) => panic!("crop is a tensor"),
            };
            let per = crop.len() / b.rows.max(1);
            ids(&b)
                .into_iter()
                .enumerate()
                .map(|(r, id)| (id, crop[r * per..(r + 1) * per].to_vec()))
                .collect()
        })
        .collect()
}

fn crop_pipeline() -> Pipeline {
    Pipeline::new("images")
        .map("decode_resize", "image", [16i64, 12], "pixels")
        .select(["id", "pixels"])
        .map("random_crop", "pixels", [8i64, 8], "crop")
        .select(["id", "crop"])
}

#[test]
fn echoing_delivers_each_sample_k_times_augmented_anew_and_resumes_exactly() {
    let s = setup(200);
    let servers = vec![s.fx.running.url()];
    let o = LoaderOptions {
        batch_size: Some(32),
        shuffle_buffer: Some(64),
        seed: 3,
        epochs: 1,
        echo: pushdown_client::Echo::Fixed(2),
        ..LoaderOptions::default()
    };
    let mut l = Loader::new(&servers, LoaderSource::Pipeline(crop_pipeline()), o.clone()).expect("loader");
    // Each window is given twice, round after round, each round cut into the window's
    // batches: 200 rows in batches of 32 are 6 full and one of 8, so 14 batches of 400 rows.
    assert_eq!(l.epoch_len(), (400, 14), "twice the rows per epoch");
    let batches = id_crops(&mut l, usize::MAX);
    let stats = l.stats();
    assert_eq!((stats.rows, stats.distinct_rows, stats.echo), (400, 200, 2));
    let rows: Vec<(i64, Vec<u8>)> = batches.iter().flatten().cloned().collect();
    let mut by_id: std::collections::BTreeMap<i64, Vec<&Vec<u8>>> = Default::default();
    for (id, crop) in &rows {
        by_id.entry(*id).or_default().push(crop);
    }
    assert_eq!(by_id.len(), 200);
    assert!(by_id.values().all(|c| c.len() == 2), "each sample exactly twice");
    let differ = by_id.values().filter(|c| c[0] != c[1]).count();
    assert!(
        differ >= 160,
        "repeats augmented anew: only {differ} of 200 differ"
    );
    assert!(
        rows.windows(2).all(|w| w[0].0 != w[1].0),
        "repeats are never adjacent"
    );

    // Resumed after 5 batches: the same rest, crops included.
    let mut first =
        Loader::new(&servers, LoaderSource::Pipeline(crop_pipeline()), o.clone()).expect("loader");
    let head = id_crops(&mut first, 5);
    assert_eq!(head, batches[..5]);
    let state = first.state();
    assert_eq!(state.echo, 2);
    let mut resumed =
        Loader::new(&servers, LoaderSource::Pipeline(crop_pipeline()), o.clone()).expect("loader");
    resumed.restore(state.clone()).expect("restore");
    assert_eq!(id_crops(&mut resumed, usize::MAX), batches[5..]);

    // A state of another echo factor belongs to another sequence.
    let other = LoaderOptions {
        echo: pushdown_client::Echo::Fixed(3),
        ..o
    };
    let mut l3 = Loader::new(&servers, LoaderSource::Pipeline(crop_pipeline()), other).expect("loader");
    assert!(l3.restore(state).is_err());
}

#[test]
fn cached_reduced_samples_still_get_new_augmentations_each_epoch() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let config = pushdown_server::ServerConfig {
        cache: pushdown_server::CacheConfig {
            default_mode: pushdown_server::CacheMode::On,
            ..Default::default()
        },
        ..small_shards()
    };
    let fx = runtime.block_on(Fixture::new(config, |root| {
        write_images(root, 128);
    }));
    let o = LoaderOptions {
        batch_size: Some(32),
        shuffle_buffer: Some(64),
        seed: 11,
        epochs: 2,
        push: pushdown_client::Push::First(1),
        ..LoaderOptions::default()
    };
    let mut l = Loader::new(&[fx.running.url()], LoaderSource::Pipeline(crop_pipeline()), o).expect("loader");
    let (_, per_epoch) = l.epoch_len();
    let epochs: Vec<Vec<(i64, Vec<u8>)>> = (0..2)
        .map(|_| {
            let mut rows: Vec<_> = id_crops(&mut l, per_epoch as usize)
                .into_iter()
                .flatten()
                .collect();
            rows.sort();
            rows
        })
        .collect();
    let metrics = fx.server.metrics().encode();
    let hits = metrics
        .lines()
        .find_map(|l| l.strip_prefix("pushdown_cache_lookups_total{outcome=\"hit_memory\"}"))
        .map_or(0.0, |v| v.trim().parse::<f64>().expect("number"));
    assert!(
        hits >= 1.0,
        "the second epoch's decode_resize came from the cache:\n{metrics}"
    );
    let differ = epochs[0]
        .iter()
        .zip(&epochs[1])
        .filter(|(a, b)| {
            assert_eq!(a.0, b.0);
            a.1 != b.1
        })
        .count();
    assert!(differ >= 100, "only {differ} of 128 crops changed between epochs");
}

/// Each epoch after the first is started while the one before ends (its first window filled
/// ahead); the batches are still exactly those of the epoch planned on its own.
#[test]
fn epochs_started_ahead_are_the_epochs_planned_at_their_start() {
    let s = setup(300);
    let url = s.fx.running.url();
    let mut o = options(11);
    o.epochs = 3;
    o.prefetch = 1;
    let straight = drain(&mut loader(std::slice::from_ref(&url), o.clone()), usize::MAX);
    let mut fresh = Vec::new();
    for epoch in 0..3 {
        let mut l = loader(std::slice::from_ref(&url), o.clone());
        let mut state = l.state();
        state.epoch = epoch;
        l.restore(state).expect("restore at an epoch's start");
        let (_, batches) = l.epoch_len();
        fresh.extend(drain(&mut l, batches as usize));
    }
    assert_eq!(straight.len(), fresh.len());
    assert_eq!(straight, fresh, "an epoch started ahead is the same epoch");
}

/// `pushdown run` and the Loader start the next epoch by one policy (the client's
/// `loader::ahead`): over the same query, each begins every epoch after the first with the
/// one started ahead of it, and asks the server for the same plans (the first epoch's, then
/// for each next one its plan when it starts and the check when it begins), in the same
/// order of samples.
#[test]
fn run_and_the_loader_overlap_epochs_alike() {
    let s = setup(300);
    let servers = vec![s.fx.running.url()];
    let mut o = options(11);
    o.epochs = 3;
    let plans = || s.fx.server.metrics().requests_of("get_flight_info", "ok");

    let before = plans();
    let mut l = loader(&servers, o.clone());
    let from_loader: Vec<i64> = drain(&mut l, usize::MAX).concat();
    let loader_stats = l.stats();
    drop(l);
    let loader_plans = plans() - before;

    let before = plans();
    let out = s.fx.root.path().join("ahead.parquet");
    let report = s
        .runtime
        .block_on(pushdown_client::run::run(&pushdown_client::run::RunOptions {
            out: Some(out.clone()),
            loader: o,
            ..pushdown_client::run::RunOptions::new(servers.clone(), LoaderSource::Sql(SQL.into()))
        }))
        .expect("run");
    let run_plans = plans() - before;
    let file = std::fs::File::open(&out).expect("out");
    let from_run: Vec<i64> = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("parquet")
        .build()
        .expect("reader")
        .flat_map(|b| {
            b.expect("batch")
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect();

    assert_eq!(
        loader_stats.epochs_ahead, 2,
        "the Loader began epochs 1 and 2 ahead"
    );
    assert_eq!(report.epochs_ahead, 2, "run began epochs 1 and 2 ahead");
    assert_eq!(loader_plans, run_plans, "the same plans asked for");
    assert_eq!(from_run, from_loader, "the same samples in the same order");
}

/// Where a pipeline's reducing ops run never changes its samples: all on the server, all on
/// the trainer (planned so, or shards the server leaves un-reduced), split between them, or
/// adapted while the epoch runs give the same rows, values and order.
mod placement {
    use super::*;
    use std::sync::Arc;

    use arrow::datatypes::Int32Type;
    use pushdown_client::Push;

    type Sample = (i64, Vec<u8>, i32);

    fn pipeline() -> Pipeline {
        Pipeline::new("images")
            .filter("label < 700")
            .map("decode_resize", "image", [16i64, 12], "pixels")
            .map("hash_bucket", "caption", [50i64], "bucket")
            .select(["id", "pixels", "bucket"])
            .map("random_crop", "pixels", [8i64, 8], "crop")
            .select(["id", "crop", "bucket"])
    }

    fn samples(servers: &[String], push: Push) -> (Vec<Vec<Sample>>, pushdown_client::LoaderStats) {
        let o = LoaderOptions {
            batch_size: Some(24),
            shuffle_buffer: Some(50),
            seed: 5,
            epochs: 2,
            push,
            compression: Some(Compression::None),
            ..LoaderOptions::default()
        };
        let mut l = Loader::new(servers, LoaderSource::Pipeline(pipeline()), o).expect("loader");
        let tensor = |b: &pushdown_client::TensorBatch, name: &str| match b.column(name).expect(name) {
            Column::Tensor { values, .. } => Arc::clone(values),
            Column::Arrow(_) => panic!("{name} is a tensor"),
        };
        let out = l
            .by_ref()
            .map(|b| {
                let b = b.expect("batch");
                let crop = tensor(&b, "crop");
                let crop = crop.as_primitive::<UInt8Type>().values();
                let bucket = tensor(&b, "bucket");
                let bucket = bucket.as_primitive::<Int32Type>().values();
                let per = crop.len() / b.rows.max(1);
                ids(&b)
                    .into_iter()
                    .enumerate()
                    .map(|(r, id)| (id, crop[r * per..(r + 1) * per].to_vec(), bucket[r]))
                    .collect()
            })
            .collect();
        (out, l.stats())
    }

    fn server(s: &Setup, reducing_streams: Option<usize>) -> pushdown_server::RunningServer {
        s.runtime.block_on(async {
            let store = pushdown_server::open_store(&s.fx.root.path().to_string_lossy()).expect("store");
            let server = Server::builder(store)
                .config(pushdown_server::ServerConfig {
                    cpu_threads: 1,
                    reducing_streams,
                    ..small_shards()
                })
                .open()
                .await
                .expect("server");
            server.spawn("127.0.0.1:0".parse().unwrap()).await.expect("spawn")
        })
    }

    #[test]
    fn every_placement_gives_the_same_samples_in_the_same_order() {
        let s = setup(600);
        let url = vec![s.fx.running.url()];
        let (reference, stats) = samples(&url, Push::First(2));
        let rows: usize = reference.iter().map(Vec::len).sum();
        assert!(rows > 700, "two epochs of the filtered rows: {rows}");
        assert_eq!(stats.completed.rows, 0, "all on the server");
        let buckets: std::collections::BTreeSet<i32> =
            reference.iter().flatten().map(|(_, _, k)| *k).collect();
        assert!(buckets.len() > 10, "hash_bucket ran: {buckets:?}");

        // Held to the test's end (a forgotten handle kept its server's task: LeakSanitizer).
        let (busy_server, mixed_server) = (server(&s, Some(0)), server(&s, None));
        let busy = vec![busy_server.url()];
        let mixed = vec![mixed_server.url()];
        for (name, servers, push) in [
            ("planned on the trainer", &url, Push::First(0)),
            (
                "left to the trainer by the server",
                &url,
                Push::Split {
                    first: 2,
                    server_fraction: 0.0,
                },
            ),
            (
                "split",
                &url,
                Push::Split {
                    first: 2,
                    server_fraction: 0.5,
                },
            ),
            ("adaptive, the server always busy", &busy, Push::Adaptive(2)),
            ("adaptive, one reducing stream", &mixed, Push::Adaptive(2)),
        ] {
            let (got, stats) = samples(servers, push);
            assert!(
                got == reference,
                "{name}: the samples differ from all-server placement"
            );
            let done = stats.completed.rows;
            match name {
                "planned on the trainer" => assert_eq!(done, 0, "{name}: nothing deferred"),
                "left to the trainer by the server" => {
                    assert_eq!(done as usize, rows, "{name}: every row's ops ran on the trainer")
                }
                // Every shard the trainer had room for was left to it (it asks for none
                // beyond two un-reduced streams per core).
                "adaptive, the server always busy" => assert!(
                    done > 0 && done as usize <= rows,
                    "{name}: {done} of {rows} rows' ops on the trainer"
                ),
                "split" => assert!(
                    done > 0 && (done as usize) < rows,
                    "{name}: {done} of {rows} rows' ops on the trainer"
                ),
                _ => {}
            }
        }
    }
}

/// Passes, as a `for` loop over a torch dataset makes them: each `begin` is the next epoch,
/// and together they are the epochs one loader iterates at once; a pass left early is
/// abandoned; the epoch started ahead at a boundary is the one the next pass takes.
#[test]
fn passes_are_the_epochs_one_iteration_gives() {
    let s = setup(600);
    let urls = vec![s.fx.running.url()];
    let whole = drain(
        &mut loader(
            &urls,
            LoaderOptions {
                epochs: 3,
                ..options(5)
            },
        ),
        usize::MAX,
    );
    let per_epoch = whole.len() / 3;
    let mut passes = loader(
        &urls,
        LoaderOptions {
            epochs: 1,
            ..options(5)
        },
    );
    let mut got = Vec::new();
    for epoch in 0..3 {
        passes.begin(epoch, 1, epoch == 0);
        let pass = drain(&mut passes, usize::MAX);
        assert_eq!(pass.len(), per_epoch, "epoch {epoch}");
        got.extend(pass);
        assert_eq!(passes.position(), (epoch + 1, 0));
    }
    assert_eq!(got, whole);
    // Left after 2 batches: the next pass is epoch 1 from its start.
    let mut left = loader(
        &urls,
        LoaderOptions {
            epochs: 1,
            ..options(5)
        },
    );
    left.begin(0, 1, true);
    assert_eq!(drain(&mut left, 2), whole[..2].to_vec());
    left.begin(1, 1, false);
    assert_eq!(
        drain(&mut left, usize::MAX),
        whole[per_epoch..2 * per_epoch].to_vec()
    );
}

/// A pipeline's batch step is what the loader batches by, its `drop_last` included; a
/// batch size that disagrees with it is refused.
#[test]
fn a_pipelines_batch_step_is_honoured_with_its_drop_last() {
    let s = setup(200);
    let urls = vec![s.fx.running.url()];
    let pipeline =
        Pipeline::new("images")
            .filter("id < 21")
            .select(["id"])
            .step(pushdown_planner::Step::Batch {
                size: 8,
                drop_last: true,
            });
    let make = |batch_size| {
        Loader::new(
            &urls,
            LoaderSource::Pipeline(pipeline.clone()),
            LoaderOptions {
                batch_size,
                epochs: 1,
                ..LoaderOptions::default()
            },
        )
    };
    let sizes: Vec<usize> = make(None)
        .expect("loader")
        .map(|b| b.expect("batch").rows)
        .collect();
    assert_eq!(sizes, vec![8, 8]);
    let err = make(Some(5)).expect_err("disagrees");
    assert!(
        err.to_string()
            .contains("disagrees with the pipeline's batch step"),
        "{err}"
    );
}

/// Every rank of `world` (batches of `batch` rows, windows of `window` rows), from `state`
/// if given, for `take` global batches: each global batch as the ranks' batches joined.
fn global_batches(
    servers: &[String],
    world: usize,
    batch: usize,
    window: usize,
    state: Option<LoaderState>,
    take: usize,
) -> Vec<Vec<i64>> {
    global_batches_of(loader, servers, (world, batch, window), state, take)
}

/// [`global_batches`] of the loaders `make` builds.
fn global_batches_of(
    make: fn(&[String], LoaderOptions) -> Loader,
    servers: &[String],
    (world, batch, window): (usize, usize, usize),
    state: Option<LoaderState>,
    take: usize,
) -> Vec<Vec<i64>> {
    let ranks: Vec<Vec<Vec<i64>>> = (0..world)
        .map(|rank| {
            let o = LoaderOptions {
                batch_size: Some(batch),
                shuffle_buffer: Some(window),
                rank,
                world_size: world,
                ..options(21)
            };
            let mut l = make(servers, o);
            if let Some(state) = &state {
                l.restore(state.clone()).expect("restore");
            }
            drain(&mut l, take)
        })
        .collect();
    let len = ranks[0].len();
    assert!(
        ranks.iter().all(|r| r.len() == len),
        "as many batches on every rank"
    );
    (0..len)
        .map(|t| {
            let sizes: Vec<usize> = ranks.iter().map(|r| r[t].len()).collect();
            assert!(sizes.iter().all(|&s| s == sizes[0]), "equal batches: {sizes:?}");
            ranks.iter().flat_map(|r| r[t].clone()).collect()
        })
        .collect()
}

/// The state every rank of 4 (batches of 6, windows of 24) saves after `k` batches of the
/// loaders `make` builds: the same bytes on every rank.
fn state_at_4(make: fn(&[String], LoaderOptions) -> Loader, servers: &[String], k: usize) -> LoaderState {
    let states: Vec<Vec<u8>> = (0..4)
        .map(|rank| {
            let o = LoaderOptions {
                batch_size: Some(6),
                shuffle_buffer: Some(24),
                rank,
                world_size: 4,
                ..options(21)
            };
            let mut l = make(servers, o);
            drain(&mut l, k);
            l.state().to_bytes()
        })
        .collect();
    assert!(
        states.iter().all(|s| *s == states[0]),
        "the same state on every rank"
    );
    LoaderState::from_bytes(&states[0]).expect("state")
}

/// What `x` has that `y` lacks, and what `y` has that `x` lacks, counted as multisets.
fn difference(x: &[i64], y: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let mut extra = y.to_vec();
    let mut missing = Vec::new();
    for id in x {
        match extra.iter().position(|e| e == id) {
            Some(at) => {
                extra.remove(at);
            }
            None => missing.push(*id),
        }
    }
    (missing, extra)
}

fn sorted(batches: Vec<Vec<i64>>) -> Vec<Vec<i64>> {
    batches
        .into_iter()
        .map(|mut b| {
            b.sort_unstable();
            b
        })
        .collect()
}

/// The global order: the same global batches (as sets of rows) at world sizes 1, 2 and 4,
/// over uneven shards (a filter) with a shuffle window, both epochs.
#[test]
fn global_batches_are_the_same_at_every_world_size() {
    let s = setup(300);
    let servers = vec![s.fx.running.url()];
    let n = s.runtime.block_on(s.fx.local_count("label < 600")) as usize;
    let one = global_batches(&servers, 1, 24, 96, None, usize::MAX);
    assert_eq!(one.len(), 2 * n.div_ceil(24));
    let mut rows: Vec<i64> = one[..one.len() / 2].concat();
    rows.sort_unstable();
    rows.dedup();
    assert_eq!(rows.len(), n, "every row once per epoch");
    for world in [2, 4] {
        let joined = global_batches(&servers, world, 24 / world, 96 / world, None, usize::MAX);
        let last = one.len() / 2 - 1;
        let (mut a, mut b) = (sorted(one.clone()), sorted(joined));
        if !(n % 24).is_multiple_of(world) {
            // The last batch of each epoch: its rows, and fewer than `world` repeated.
            for t in [last, 2 * last + 1] {
                assert!(b[t].len() - a[t].len() < world);
                b[t].retain(|id| a[t].contains(id));
                b[t].dedup();
                a[t].dedup();
            }
        }
        assert_eq!(a, b, "world size {world}");
    }
}

/// A state saved at world size 4 is the same on every rank, and continues at 2 and at 8
/// (the global batch unchanged) with the uninterrupted run's global batches.
#[test]
fn a_state_saved_at_one_world_size_continues_at_another() {
    let s = setup(300);
    let servers = vec![s.fx.running.url()];
    let whole = sorted(global_batches(&servers, 4, 6, 24, None, usize::MAX));
    for k in [3, 7, whole.len() / 2 + 1] {
        let state = state_at_4(loader, &servers, k);
        for (world, batch, window) in [(2, 12, 48), (8, 3, 12)] {
            let rest = sorted(global_batches(
                &servers,
                world,
                batch,
                window,
                Some(state.clone()),
                usize::MAX,
            ));
            let (a, b) = (&whole[k..], &rest[..]);
            assert_eq!(a.len(), b.len(), "k={k} world {world}");
            for (t, (x, y)) in a.iter().zip(b).enumerate() {
                if x != y {
                    // Only an epoch's padded last batch may differ: in its repeated rows
                    // (fewer than the world size, the epoch's rows `r` of the short ranks).
                    let (missing, extra) = difference(x, y);
                    let last = (k + t + 1) % (whole.len() / 2) == 0;
                    assert!(
                        last && missing.len() < 4 && extra.len() < world,
                        "k={k} world {world} batch {t}: {missing:?} {extra:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn states_that_cannot_continue_here_are_refused_by_what_differs() {
    let s = setup(200);
    let servers = vec![s.fx.running.url()];
    let at4 = |o: LoaderOptions| LoaderOptions {
        batch_size: Some(6),
        shuffle_buffer: Some(24),
        world_size: 4,
        ..o
    };
    let mut saved = loader(&servers, at4(options(21)));
    drain(&mut saved, 2);
    let state = saved.state();
    let refused = |o: LoaderOptions, sql: &str| {
        let mut l = Loader::new(&servers, LoaderSource::Sql(sql.into()), o).expect("loader");
        l.restore(state.clone()).expect_err("refused").to_string()
    };
    let half = |o: LoaderOptions| LoaderOptions {
        world_size: 2,
        batch_size: Some(12),
        shuffle_buffer: Some(48),
        ..o
    };
    let why = refused(
        LoaderOptions {
            batch_size: Some(6),
            ..half(options(21))
        },
        SQL,
    );
    assert!(
        why.contains("global batch is 24") && why.contains("batch_size=12"),
        "{why}"
    );
    let why = refused(
        LoaderOptions {
            shuffle_buffer: Some(24),
            ..half(options(21))
        },
        SQL,
    );
    assert!(
        why.contains("shuffle window") && why.contains("shuffle_buffer=48"),
        "{why}"
    );
    let why = refused(half(options(22)), SQL);
    assert!(why.contains("seed is 21"), "{why}");
    let why = refused(
        half(options(21)),
        "SELECT id, label FROM images WHERE label < 500",
    );
    assert!(why.contains("another query"), "{why}");
    let why = refused(
        LoaderOptions {
            partitions: Some(16),
            ..half(options(21))
        },
        SQL,
    );
    assert!(why.contains("8 partitions") && why.contains("16"), "{why}");
    let why = refused(
        LoaderOptions {
            world_size: 3,
            batch_size: Some(8),
            shuffle_buffer: Some(32),
            partitions: Some(24),
            ..options(21)
        },
        SQL,
    );
    assert!(why.contains("8 partitions"), "{why}");
    // A world size that does not divide the partitions is refused at the start.
    let o = LoaderOptions {
        world_size: 3,
        partitions: Some(8),
        ..options(21)
    };
    let err = Loader::new(&servers, LoaderSource::Sql(SQL.into()), o).expect_err("W=3 of 8");
    assert!(err.to_string().contains("does not divide"), "{err}");
}

/// A state of the per-rank order (`PDL3`, earlier versions) restores at an epoch boundary
/// and is refused mid-epoch, saying so.
#[test]
fn states_of_the_per_rank_order_restore_at_epoch_boundaries() {
    let s = setup(200);
    let servers = vec![s.fx.running.url()];
    let mut l = loader(&servers, options(21));
    let fingerprint = l.per_rank_fingerprint();
    let v3 = |fingerprint: u64, epoch: u64, batches: u64| {
        let mut bytes = b"PDL3".to_vec();
        for word in [fingerprint, epoch, batches, 0, 1] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        LoaderState::from_bytes(&bytes).expect("v3 state")
    };
    l.restore(v3(fingerprint, 1, 0))
        .expect("an epoch boundary restores");
    assert_eq!(l.position(), (1, 0));
    let whole = drain(&mut loader(&servers, options(21)), usize::MAX);
    let second = drain(&mut l, usize::MAX);
    assert_eq!(second, whole[whole.len() / 2..], "epoch 1 as the loader gives it");
    let err = l.restore(v3(fingerprint, 1, 3)).expect_err("mid-epoch");
    assert!(
        err.to_string().contains("mid-epoch 1") && err.to_string().contains("per-rank"),
        "{err}"
    );
    assert!(
        l.restore(v3(fingerprint ^ 1, 0, 0)).is_err(),
        "another configuration's"
    );
}

/// The two sources of the mixture tests: a third of the rows weighted 0.7, the rest 0.3 (so
/// the first runs through several of its epochs while the second is in its first).
const MIX_A: &str = "SELECT id, label FROM images WHERE id % 3 = 0";
const MIX_B: &str = "SELECT id, label FROM images WHERE id % 3 <> 0";

fn mix_sources(weights: [f64; 2]) -> Vec<MixtureSource> {
    [MIX_A, MIX_B]
        .into_iter()
        .zip(weights)
        .map(|(sql, weight)| MixtureSource {
            source: LoaderSource::Sql(sql.into()),
            weight,
            servers: None,
        })
        .collect()
}

fn mixed(servers: &[String], o: LoaderOptions) -> Loader {
    Loader::mixture(servers, mix_sources([0.7, 0.3]), o).expect("mixture")
}

/// Each global batch holds the sources by weight (within a row), over 10 batches within
/// 10% and over the run within 2%; each source's rows come once per its own epoch: the
/// small, heavy source cycles through its epochs while the other is in its first.
#[test]
fn a_mixture_holds_its_sources_by_weight_and_each_source_once_per_its_epoch() {
    let s = setup(600);
    let servers = vec![s.fx.running.url()];
    let o = LoaderOptions {
        batch_size: Some(32),
        shuffle_buffer: Some(64),
        epochs: 2,
        ..options(5)
    };
    let mut l = mixed(&servers, o.clone());
    assert_eq!(l.epoch_len(), (600 / 32 * 32, 600 / 32), "⌊Σ rows / G⌋ batches");
    let batches = drain(&mut l, usize::MAX);
    assert_eq!(batches.len(), 2 * (600 / 32), "two mixture epochs");
    let from_a = |b: &Vec<i64>| b.iter().filter(|id| *id % 3 == 0).count();
    for (t, b) in batches.iter().enumerate() {
        assert_eq!(b.len(), 32, "every batch whole");
        let a = from_a(b) as f64;
        assert!(
            (a - 0.7 * 32.0).abs() <= 1.0,
            "batch {t}: {a} of 32 from the first source"
        );
    }
    let share = |bs: &[Vec<i64>]| bs.iter().map(from_a).sum::<usize>() as f64 / (32 * bs.len()) as f64;
    for w in batches.windows(10) {
        assert!((share(w) - 0.7).abs() <= 0.07, "10 batches: {}", share(w));
    }
    assert!(
        (share(&batches) - 0.7).abs() <= 0.014,
        "the run: {}",
        share(&batches)
    );
    // Once per its epoch: every row of a source seen as often as every other, within one.
    let mut seen = std::collections::BTreeMap::<i64, usize>::new();
    for id in batches.concat() {
        *seen.entry(id).or_default() += 1;
    }
    for (name, rest) in [("first", 0), ("second", 1)] {
        let counts: Vec<usize> = (0..600)
            .filter(|id| (id % 3 == 0) == (rest == 0))
            .map(|id| seen.get(&id).copied().unwrap_or(0))
            .collect();
        let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(hi - lo <= 1, "the {name} source: rows seen {lo} to {hi} times");
        if rest == 0 {
            assert!(*lo >= 3, "the first source ran through its epochs: {lo}");
        } else {
            assert_eq!(*hi, 1, "the second source is still in its first epoch");
        }
    }
    // The same seed, the same mixture.
    assert_eq!(drain(&mut mixed(&servers, o), usize::MAX), batches);
}

/// A mixture's global batches are the same at world sizes 1, 2 and 4, and a state saved at
/// 4 (the same bytes on every rank) continues at 2 and 8 with the uninterrupted batches,
/// across a mixture epoch's end.
#[test]
fn a_mixture_is_elastic_and_resumes_exactly() {
    let s = setup(300);
    let servers = vec![s.fx.running.url()];
    let one = sorted(global_batches_of(mixed, &servers, (1, 24, 96), None, usize::MAX));
    assert_eq!(one.len(), 2 * (300 / 24));
    for world in [2, 4] {
        let joined = global_batches_of(mixed, &servers, (world, 24 / world, 96 / world), None, usize::MAX);
        assert_eq!(sorted(joined), one, "world size {world}");
    }
    for k in [5, 300 / 24 + 2] {
        let state = state_at_4(mixed, &servers, k);
        for (world, batch, window) in [(2, 12, 48), (8, 3, 12)] {
            let rest = global_batches_of(
                mixed,
                &servers,
                (world, batch, window),
                Some(state.clone()),
                usize::MAX,
            );
            assert_eq!(sorted(rest), one[k..], "k={k} world {world}");
        }
    }
}

/// What a mixture cannot be, or cannot continue, is refused by name.
#[test]
fn mixtures_that_cannot_be_are_refused_by_what_differs() {
    let s = setup(200);
    let servers = vec![s.fx.running.url()];
    let o = || LoaderOptions {
        batch_size: Some(8),
        shuffle_buffer: Some(32),
        ..options(3)
    };
    let mut sources = mix_sources([0.5, 0.5]);
    sources[1].source = LoaderSource::Sql("SELECT id FROM images WHERE id % 3 <> 0".into());
    let e = Loader::mixture(&servers, sources, o())
        .expect_err("schemas differ")
        .to_string();
    assert!(
        e.contains("source 1's columns differ") && e.contains("\"label\""),
        "{e}"
    );
    let e = Loader::mixture(&servers, mix_sources([0.5, -1.0]), o())
        .expect_err("weight")
        .to_string();
    assert!(e.contains("source 1 has weight -1"), "{e}");
    let mut sources = mix_sources([0.5, 0.5]);
    sources[0].source = LoaderSource::Sql("SELECT id, label FROM images WHERE id < 4".into());
    let e = Loader::mixture(&servers, sources, o())
        .expect_err("small")
        .to_string();
    assert!(
        e.contains("source 0 has 4 rows, fewer than one global batch"),
        "{e}"
    );
    let mut sources = mix_sources([0.5, 0.5]);
    sources[1].source = LoaderSource::Sql("SELECT label, COUNT(*) AS id FROM images GROUP BY label".into());
    let e = Loader::mixture(&servers, sources, o())
        .expect_err("whole")
        .to_string();
    assert!(e.contains("source 1"), "{e}");
    let e = Loader::mixture(
        &servers,
        mix_sources([1.0, 1.0]),
        LoaderOptions {
            echo: pushdown_client::Echo::Fixed(2),
            ..o()
        },
    )
    .expect_err("echo")
    .to_string();
    assert!(e.contains("echo"), "{e}");
    let e = Loader::mixture(
        &servers,
        mix_sources([1.0, 1.0]),
        LoaderOptions {
            batch_size: Some(6),
            ..o()
        },
    )
    .expect_err("6 rows over 8 partitions")
    .to_string();
    assert!(e.contains("must be a multiple of its partitions (8)"), "{e}");
    // States: a mixture's is not a single loader's, nor another mixture's.
    let mut m = Loader::mixture(&servers, mix_sources([0.7, 0.3]), o()).expect("mixture");
    drain(&mut m, 2);
    let mixture_state = m.state();
    let mut single = loader(&servers, o());
    drain(&mut single, 2);
    let e = single
        .restore(mixture_state.clone())
        .expect_err("mixture state")
        .to_string();
    assert!(e.contains("saved by a mixture of 2 sources"), "{e}");
    let e = m.restore(single.state()).expect_err("single state").to_string();
    assert!(e.contains("one source"), "{e}");
    let mut other = Loader::mixture(&servers, mix_sources([0.6, 0.4]), o()).expect("mixture");
    let e = other
        .restore(mixture_state.clone())
        .expect_err("weights")
        .to_string();
    assert!(e.contains("another mixture"), "{e}");
    let mut other = Loader::mixture(
        &servers,
        mix_sources([0.7, 0.3]),
        LoaderOptions { seed: 4, ..o() },
    )
    .expect("mixture");
    let e = other
        .restore(mixture_state.clone())
        .expect_err("seed")
        .to_string();
    assert!(e.contains("seed is 3"), "{e}");
    let mut other = Loader::mixture(
        &servers,
        mix_sources([0.7, 0.3]),
        LoaderOptions {
            batch_size: Some(16),
            ..o()
        },
    )
    .expect("mixture");
    let e = other
        .restore(mixture_state.clone())
        .expect_err("batch")
        .to_string();
    assert!(e.contains("global batch is 8"), "{e}");
    // And the same mixture continues it.
    let mut same = Loader::mixture(&servers, mix_sources([0.7, 0.3]), o()).expect("mixture");
    same.restore(mixture_state).expect("the same mixture");
    assert_eq!(same.position(), (0, 2));
}
