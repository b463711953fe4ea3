//! Every target replays its checked-in corpus and its seeds: a crash once found stays
//! fixed, with no nightly toolchain. `PUSHDOWN_WRITE_FUZZ_SEEDS=1` writes the seeds into
//! the corpora first (`gen-<n>` files; libFuzzer's own findings keep their hash names).

use std::path::{Path, PathBuf};

use crate::{TARGETS, last_panic, seeds};

fn corpus(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(name)
}

/// Runs `target` on `input`, naming the input and the panic when it fails.
fn replay(name: &str, target: crate::Target, what: &str, input: &[u8]) {
    if std::panic::catch_unwind(|| target(input)).is_err() {
        // The default hook again, so this failure is printed.
        drop(std::panic::take_hook());
        panic!("fuzz target {name} panicked on {what}: {}", last_panic());
    }
}

#[test]
fn every_target_holds_on_its_corpus_and_seeds() {
    let write = std::env::var_os("PUSHDOWN_WRITE_FUZZ_SEEDS").is_some();
    for &(name, target) in TARGETS {
        let dir = corpus(name);
        let seeds = seeds(name);
        if write {
            std::fs::create_dir_all(&dir).expect("corpus folder");
            for (i, seed) in seeds.iter().enumerate() {
                std::fs::write(dir.join(format!("gen-{}", i + 1)), seed).expect("seed written");
            }
        }
        for (i, seed) in seeds.iter().enumerate() {
            replay(name, target, &format!("seed {}", i + 1), seed);
        }
        let entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{name} has no corpus at {}: {e}", dir.display()))
            .map(|e| e.expect("an entry").path())
            .collect();
        assert!(!entries.is_empty(), "{name}'s corpus {} is empty", dir.display());
        for path in entries {
            let input = std::fs::read(&path).expect("a corpus file");
            replay(name, target, &path.display().to_string(), &input);
        }
    }
}

/// The made seeds are valid inputs (a seed the decoder refuses would start the fuzzer from
/// nothing): each decodes to what it was made as.
#[test]
fn the_seeds_are_accepted() {
    use pushdown_client::LoaderState;
    use pushdown_engine::{PreparedStatement, Tokens, Views};
    use pushdown_planner::Pipeline;
    use pushdown_protocol::{ScanRequest, ShardTicket};

    let all = |name: &str, ok: &dyn Fn(&[u8]) -> bool| {
        let seeds = seeds(name);
        assert!(!seeds.is_empty(), "{name} has no seeds");
        for (i, seed) in seeds.iter().enumerate() {
            assert!(ok(seed), "{name}'s seed {} is refused", i + 1);
        }
    };
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).expect("text");
    all("ticket", &|b| ShardTicket::decode(b).is_ok());
    all("command", &|b| ScanRequest::decode_command(b).is_ok());
    all("flight_sql", &|b| {
        matches!(pushdown_server::fuzzing::flight_sql_command(b), Some(Ok(_)))
    });
    all("parameters", &|b| {
        let messages = crate::split_messages(b);
        matches!(pushdown_server::fuzzing::parameters(&messages), Ok(Some(batch)) if batch.num_rows() == 1)
    });
    all("prepared_handle", &|b| {
        PreparedStatement::decode(b).and_then(|p| p.bound_sql()).is_ok()
    });
    all("pipeline", &|b| Pipeline::parse(&text(b)).is_ok());
    all("loader_state", &|b| LoaderState::from_bytes(b).is_ok());
    all("tokens", &|b| Tokens::parse(&text(b)).is_ok());
    all("views", &|b| Views::from_toml(&text(b)).is_ok());
    all("parquet", &|b| {
        parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(bytes::Bytes::copy_from_slice(b), 64)
            .is_ok_and(|r| {
                r.map(|batch| batch.map(|b| b.num_rows()))
                    .sum::<Result<usize, _>>()
                    .is_ok_and(|n| n > 0)
            })
    });
    all("client_ipc", &|b| {
        let messages = crate::split_messages(b);
        // The schema, the batch and the trailer, each whole.
        messages.len() == 3 && messages[2].data_header.is_empty() && !messages[1].data_body.is_empty()
    });
}
