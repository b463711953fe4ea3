use arrow::datatypes::{DataType, Field, Schema};

use super::*;

fn images() -> Schema {
    Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("image", DataType::Binary, false),
        Field::new("label", DataType::Int32, false),
        Field::new("caption", DataType::Utf8, true),
    ])
}

#[test]
fn prunes_columns_and_pushes_prefix() {
    let p = Pipeline::new("images")
        .filter("label < 100")
        .select(["image", "label"])
        .shuffle(10)
        .batch(4);
    let plan = plan(&p, &images()).unwrap();
    assert_eq!(plan.fragment.columns, vec!["image", "label"]);
    assert_eq!(plan.fragment.predicate.as_deref(), Some("(label < 100)"));
    assert_eq!(plan.pruned_columns, vec!["id", "caption"]);
    let sides: Vec<Side> = plan.placements.iter().map(|p| p.side).collect();
    assert_eq!(
        sides,
        vec![Side::Server, Side::Server, Side::Client, Side::Client]
    );
}

#[test]
fn filter_after_shuffle_is_hoisted() {
    let p = Pipeline::new("images")
        .shuffle(10)
        .filter("id > 5")
        .filter("label < 3")
        .batch(2);
    let plan = plan(&p, &images()).unwrap();
    assert_eq!(
        plan.fragment.predicate.as_deref(),
        Some("(id > 5) AND (label < 3)")
    );
    // No select: every column is still delivered, filters add nothing to prune.
    assert_eq!(plan.fragment.columns.len(), 4);
    assert_eq!(plan.client_steps.len(), 2);
    assert!(plan.placements[0].reason.contains("hoisted before shuffle"));
}

#[test]
fn select_after_shuffle_prunes_the_fragment() {
    let p = Pipeline::new("images").shuffle(10).select(["label"]);
    let plan = plan(&p, &images()).unwrap();
    assert_eq!(plan.fragment.columns, vec!["label"]);
    // Projection commutes with a permutation: the select runs on the server.
    assert_eq!(plan.client_steps, vec![Step::Shuffle { buffer: 10 }]);
    assert!(plan.placements[0].reason.contains("hoisted before shuffle"));
}

#[test]
fn filter_column_not_selected_is_still_read_but_not_sent() {
    let p = Pipeline::new("images").select(["image"]).shuffle(3);
    assert!(matches!(
        plan(&p.clone().filter("label < 1"), &images()),
        Err(PlanError::UnknownColumn { .. })
    ));
    let p = Pipeline::new("images").filter("label < 1").select(["image"]);
    let plan = plan(&p, &images()).unwrap();
    assert_eq!(plan.fragment.columns, vec!["image"]);
    assert_eq!(plan.pruned_columns, vec!["id", "caption"]);
}

#[test]
fn errors_name_the_step() {
    let err = plan(&Pipeline::new("images").filter("nope > 1"), &images()).unwrap_err();
    assert!(err.to_string().contains("unknown column `nope`"), "{err}");
    let err = plan(&Pipeline::new("images").filter("label <"), &images()).unwrap_err();
    assert!(matches!(err, PlanError::BadExpression { index: 0, .. }));
    let err = plan(&Pipeline::new("images").batch(2).filter("label < 1"), &images()).unwrap_err();
    assert!(err.to_string().contains("before `batch`"), "{err}");
    assert!(plan(&Pipeline::new("images").batch(0), &images()).is_err());
}

#[test]
fn parses_toml_and_json() {
    let toml = r#"
dataset = "images"
[[steps]]
op = "filter"
expr = "label < 100"
[[steps]]
op = "batch"
size = 8
drop_last = true
"#;
    let p = Pipeline::parse(toml).unwrap();
    assert_eq!(
        p.steps()[1],
        Step::Batch {
            size: 8,
            drop_last: true
        }
    );
    let json = r#"{"dataset":"images","steps":[{"op":"shuffle","buffer":5}]}"#;
    assert_eq!(
        Pipeline::parse(json).unwrap().steps(),
        &[Step::Shuffle { buffer: 5 }]
    );
    assert_eq!(Pipeline::parse(&p.to_toml()).unwrap(), p);
    assert!(Pipeline::parse("dataset = 1").is_err());
    assert!(Pipeline::parse("dataset = \"x\"\n[[steps]]\nop = \"explode\"").is_err());
}

#[test]
fn deterministic_maps_join_the_server_prefix() {
    let p = Pipeline::new("images")
        .filter("label < 10")
        .map("thumbnail", "image", [64i64], "image")
        .map("hash_bucket", "caption", [100i64], "bucket")
        .select(["image", "bucket"])
        .shuffle(8);
    let plan = plan(&p, &images()).unwrap();
    assert_eq!(plan.fragment.ops.len(), 2);
    assert_eq!(plan.fragment.ops[1].output, "bucket");
    assert_eq!(plan.fragment.columns, vec!["image", "bucket"]);
    assert_eq!(plan.client_steps, vec![Step::Shuffle { buffer: 8 }]);
    assert_eq!(plan.pruned_columns, vec!["id"]);
}

#[test]
fn maps_are_checked_against_their_ops() {
    let unknown = plan(
        &Pipeline::new("images").map("sharpen", "image", [1i64], "image"),
        &images(),
    );
    assert!(unknown.unwrap_err().to_string().contains("unknown op `sharpen`"));
    let bad_params = plan(
        &Pipeline::new("images").map("thumbnail", "image", ["big"], "image"),
        &images(),
    );
    assert!(bad_params.unwrap_err().to_string().contains("max_side"));
    let wrong_type = plan(
        &Pipeline::new("images").map("decode_resize", "label", [8i64, 8], "x"),
        &images(),
    );
    assert!(wrong_type.is_err());
    // A filter on an op's output cannot be evaluated before the op: refused, not misplaced.
    let on_output = Pipeline::new("images")
        .map("hash_bucket", "caption", [10i64], "bucket")
        .filter("bucket = 3");
    assert!(plan(&on_output, &images()).is_err());
}

#[test]
fn map_steps_parse_from_toml() {
    let p = Pipeline::parse(
        r#"
dataset = "images"
[[steps]]
op = "map"
call = "decode_resize"
input = "image"
params = [64, 64]
output = "pixels"
"#,
    )
    .unwrap();
    assert_eq!(p.steps()[0].to_string(), "decode_resize(image, 64, 64) AS pixels");
    assert_eq!(Pipeline::parse(&p.to_toml()).unwrap(), p);
}

#[test]
fn pack_and_bucket_steps_parse_come_last_and_leave_the_rest_to_plan() {
    let text = r#"
dataset = "web"
steps = [
  { op = "map", call = "tokenize", input = "body", params = [4096], output = "tokens" },
  { op = "select", columns = ["tokens"] },
  { op = "pack", column = "tokens", length = 2048, eos_id = 2 },
  { op = "batch", size = 8 },
]
"#;
    let p = Pipeline::parse(text).unwrap();
    assert_eq!(p.steps()[2].to_string(), "pack tokens length=2048 eos_id=2");
    assert_eq!(Pipeline::parse(&p.to_toml()).unwrap(), p);
    let (rest, step) = p.without_regroup();
    let Some(Step::Pack(pack)) = step else {
        panic!("no pack step")
    };
    assert!(pack.split_documents && pack.pad_id.is_none());
    assert_eq!(rest.steps().len(), 3);
    assert!(!rest.steps().iter().any(|s| matches!(s, Step::Pack(_))));
    let schema = Schema::new(vec![Field::new("body", DataType::Utf8, false)]);
    assert!(plan(&p, &schema).is_ok(), "a batch step may follow");
    let bucketed = Pipeline::parse(
        r#"{"dataset": "web", "steps": [{"op": "bucket_by", "column": "body", "boundaries": [64, 256]}]}"#,
    )
    .unwrap();
    assert!(matches!(bucketed.without_regroup().1, Some(Step::BucketBy(b)) if b.pad_id == 0));
    for (steps, says) in [
        (
            r#"[{"op": "pack", "column": "body", "length": 8}, {"op": "filter", "expr": "body <> ''"}]"#,
            "only a batch step may come after it",
        ),
        (
            r#"[{"op": "pack", "column": "body", "length": 8}, {"op": "bucket_by", "column": "body", "boundaries": [4]}]"#,
            "one pack or bucket_by step",
        ),
    ] {
        let p = Pipeline::parse(&format!(r#"{{"dataset": "web", "steps": {steps}}}"#)).unwrap();
        let e = plan(&p, &schema).expect_err("refused").to_string();
        assert!(e.contains(says), "{e}");
    }
    let e = Pipeline::parse(r#"{"dataset": "web", "steps": [{"op": "pack", "column": "b", "size": 8}]}"#)
        .expect_err("unknown field")
        .to_string();
    assert!(e.contains("size") || e.contains("length"), "{e}");
}

mod cost {
    use pushdown_protocol::{OpProfile, Profile};

    use super::*;

    fn profile(bytes_out: f64) -> Profile {
        Profile {
            rows_sampled: 256,
            selectivity: 1.0,
            scan_ns_per_row: 5_000.0,
            column_bytes_per_row: [("image".to_string(), 15_000.0), ("label".to_string(), 4.0)].into(),
            ops: vec![OpProfile {
                op: "decode_resize".into(),
                input: "image".into(),
                output: "pixels".into(),
                bytes_in_per_row: 15_000.0,
                bytes_out_per_row: bytes_out,
                ns_per_row: 2_000_000.0,
                output_codecs: None,
            }],
            server_cores: 16,
            column_codecs: Default::default(),
            scanned_fraction: None,
            shards: None,
        }
    }

    fn codecs(lz4_ratio: f64, zstd_ratio: f64) -> pushdown_protocol::Codecs {
        use pushdown_protocol::CodecCost;
        pushdown_protocol::Codecs {
            lz4: CodecCost {
                ratio: lz4_ratio,
                compress_ns_per_byte: 0.5,
                decompress_ns_per_byte: 0.2,
            },
            zstd: CodecCost {
                ratio: zstd_ratio,
                compress_ns_per_byte: 3.0,
                decompress_ns_per_byte: 1.0,
            },
        }
    }

    /// `profile` with each column's codecs measured: JPEG bytes do not compress, pixels do.
    fn measured(bytes_out: f64, pixels: pushdown_protocol::Codecs) -> Profile {
        let mut p = profile(bytes_out);
        p.column_codecs = [
            ("image".to_string(), codecs(1.0, 0.99)),
            ("label".to_string(), codecs(0.5, 0.3)),
        ]
        .into();
        p.ops[0].output_codecs = Some(pixels);
        p
    }

    fn pipeline(side: i64) -> Pipeline {
        Pipeline::new("images")
            .map("decode_resize", "image", [side, side], "pixels")
            .select(["pixels", "label"])
            .shuffle(100)
            .batch(8)
    }

    const GBIT: f64 = 1e9 / 8.0;

    #[test]
    fn reducing_ops_go_to_the_server() {
        let env = Environment {
            bandwidth_bytes_per_s: GBIT,
            server_cores: 16.0,
            client_cores: 8.0,
            client_ns_per_row: 0.0,
        };
        let costed = plan_with_profile(&pipeline(64), &images(), &profile(64.0 * 64.0 * 3.0), &env).unwrap();
        assert_eq!(costed.chosen.pushed, 1, "{}", costed.explain());
        assert_eq!(costed.plan.fragment.ops.len(), 1);
        assert_eq!(costed.plan.fragment.columns, vec!["pixels", "label"]);
        assert_eq!(costed.ops[0].side, Side::Server);
        assert_eq!(costed.ops[0].op, "decode_resize(image, 64, 64) AS pixels");
        assert!(costed.explain().contains("← chosen"));
        let json: serde_json::Value = serde_json::from_str(&costed.to_json()).unwrap();
        assert_eq!(json["ops"][0]["side"], "server");
        assert!(json["estimated_rows_per_s"].as_f64().unwrap() > 0.0);
    }

    /// Compression spends CPU to save link time: zstd when a slow link bounds the stream,
    /// LZ4 when a fast one does, nothing when the link has room.
    #[test]
    fn compression_follows_the_bottleneck() {
        use pushdown_protocol::Compression;
        let cases = [
            (GBIT, 16.0, Compression::Zstd),
            (10.0 * GBIT, 200.0, Compression::Lz4),
            (100.0 * GBIT, 16.0, Compression::None),
        ];
        for (bandwidth_bytes_per_s, server_cores, expected) in cases {
            let env = Environment {
                bandwidth_bytes_per_s,
                server_cores,
                client_cores: 8.0,
                client_ns_per_row: 0.0,
            };
            let costed =
                plan_with_profile(&pipeline(64), &images(), &profile(64.0 * 64.0 * 3.0), &env).unwrap();
            assert_eq!(costed.chosen.pushed, 1, "{}", costed.explain());
            assert_eq!(costed.chosen.compression, expected, "{}", costed.explain());
            assert!(
                costed
                    .explain()
                    .contains(&format!("stream compression: {expected}"))
            );
            let json: serde_json::Value = serde_json::from_str(&costed.to_json()).unwrap();
            assert_eq!(json["compression"], expected.to_string());
        }
    }

    /// With the codecs measured, each is costed with its bytes and its CPU on both ends:
    /// a slow link compresses what compresses, a roomy one compresses nothing, and bytes
    /// that do not compress (JPEG) are never compressed, however slow the link.
    #[test]
    fn measured_codecs_are_costed_with_their_cpu() {
        use pushdown_protocol::Compression;
        let env = |bandwidth_bytes_per_s, server_cores| Environment {
            bandwidth_bytes_per_s,
            server_cores,
            client_cores: 8.0,
            client_ns_per_row: 0.0,
        };
        let pixels = 64.0 * 64.0 * 3.0;
        let costed = |profile: &Profile, env: &Environment| {
            plan_with_profile(&pipeline(64), &images(), profile, env).unwrap()
        };
        // Pixels that halve with zstd over 100 Mbit/s and 16 server cores: zstd, and the
        // estimate counts its bytes.
        let slow = costed(&measured(pixels, codecs(0.7, 0.5)), &env(100e6 / 8.0, 16.0));
        assert_eq!(slow.chosen.compression, Compression::Zstd, "{}", slow.explain());
        assert!(slow.chosen.codec_measured());
        assert!((slow.chosen.wire_bytes_per_row - (pixels * 0.5 + 4.0 * 0.3)).abs() < 1.0);
        assert!(
            slow.explain().contains("measured ratio and CPU"),
            "{}",
            slow.explain()
        );
        // A roomy link: no codec.
        let roomy = costed(&measured(pixels, codecs(0.7, 0.5)), &env(100.0 * GBIT, 16.0));
        assert_eq!(roomy.chosen.compression, Compression::None, "{}", roomy.explain());
        // Pixels that do not compress (noise) over the slow link: compressing buys nothing,
        // so nothing is compressed — the rule by link speed alone would have said zstd.
        let noise = costed(&measured(pixels, codecs(1.0, 0.99)), &env(100e6 / 8.0, 16.0));
        assert_eq!(noise.chosen.compression, Compression::None, "{}", noise.explain());
        // One server core, decoding at 2 ms a row, on a link that carries the compressed rows
        // with room: zstd's 3 ns a byte would slow the bound server, LZ4's costs less than the
        // tie; neither gains, so none.
        let busy = costed(&measured(pixels, codecs(0.7, 0.5)), &env(GBIT, 1.0));
        assert_eq!(busy.chosen.compression, Compression::None, "{}", busy.explain());
        // Unmeasured, the rule by link speed still holds (older servers).
        let old = costed(&profile(pixels), &env(100e6 / 8.0, 16.0));
        assert!(!old.chosen.codec_measured());
        assert_eq!(old.chosen.compression, Compression::Zstd);
    }

    /// A filter keeping 1/24 of the rows, over data whose statistics prune the other 23/24
    /// row groups (clicks' `day = 3`): the server scans one row per row it sends. Charged as if
    /// it scanned every row, the server looked like the bottleneck at 100 Mbit/s and the
    /// stream went uncompressed; charged for what it scans, the link bounds it and the
    /// planner compresses.
    #[test]
    fn pruned_row_groups_cost_no_scan() {
        use pushdown_protocol::Compression;
        let env = Environment {
            bandwidth_bytes_per_s: 100e6 / 8.0,
            server_cores: 1.0,
            client_cores: 1.0,
            client_ns_per_row: 0.0,
        };
        let mut p = measured(48.0, codecs(0.5, 0.4));
        p.selectivity = 1.0 / 24.0;
        p.scan_ns_per_row = 300.0;
        p.ops[0].ns_per_row = 10.0;
        p.ops[0].bytes_in_per_row = 48.0;
        p.column_bytes_per_row.insert("image".into(), 48.0);
        let unpruned = plan_with_profile(&pipeline(4), &images(), &p, &env).unwrap();
        p.scanned_fraction = Some(1.0 / 24.0);
        let pruned = plan_with_profile(&pipeline(4), &images(), &p, &env).unwrap();
        // The server stage: 24× the rate once only the kept row groups are charged.
        let ratio = pruned.chosen.server_rows_per_s / unpruned.chosen.server_rows_per_s;
        assert!(ratio > 10.0, "{ratio}: {}", pruned.explain());
        assert!(!unpruned.chosen.link_bound(), "{}", unpruned.explain());
        assert_eq!(
            unpruned.chosen.compression,
            Compression::None,
            "{}",
            unpruned.explain()
        );
        assert_eq!(
            pruned.chosen.compression,
            Compression::Zstd,
            "{}",
            pruned.explain()
        );
        assert!(pruned.chosen.estimated_rows_per_s > 2.0 * unpruned.chosen.estimated_rows_per_s);
    }

    #[test]
    fn expanding_ops_stay_with_the_trainer() {
        let env = Environment {
            bandwidth_bytes_per_s: GBIT,
            server_cores: 16.0,
            client_cores: 8.0,
            client_ns_per_row: 0.0,
        };
        let costed =
            plan_with_profile(&pipeline(512), &images(), &profile(512.0 * 512.0 * 3.0), &env).unwrap();
        assert_eq!(costed.chosen.pushed, 0, "{}", costed.explain());
        assert!(costed.plan.fragment.ops.is_empty());
        // The JPEG crosses instead, with the column the client needs.
        assert_eq!(costed.plan.fragment.columns, vec!["image", "label"]);
        assert!(matches!(costed.plan.client_steps[0], Step::Map(_)));
        assert!(
            costed.plan.explain().contains("kept in the trainer"),
            "{}",
            costed.plan.explain()
        );
    }

    #[test]
    fn a_fast_link_and_a_slow_server_keep_reducing_ops_on_the_client() {
        let env = Environment {
            bandwidth_bytes_per_s: 100.0 * GBIT,
            server_cores: 1.0,
            client_cores: 64.0,
            client_ns_per_row: 0.0,
        };
        let costed = plan_with_profile(&pipeline(64), &images(), &profile(64.0 * 64.0 * 3.0), &env).unwrap();
        assert_eq!(costed.chosen.pushed, 0, "{}", costed.explain());
    }

    /// One server core and one trainer core, each decoding at 400 µs a row, on a 1 Gbit/s link.
    fn equal_ends() -> (Environment, Profile) {
        let env = Environment {
            bandwidth_bytes_per_s: GBIT,
            server_cores: 1.0,
            client_cores: 1.0,
            client_ns_per_row: 0.0,
        };
        let mut profile = profile(12_000.0);
        profile.ops[0].ns_per_row = 400_000.0;
        (env, profile)
    }

    /// The best estimate among placements that run the pushed ops on every shard.
    fn best_whole(costed: &CostedPlan) -> f64 {
        costed
            .candidates
            .iter()
            .filter(|c| c.server_fraction == 1.0)
            .map(|c| c.estimated_rows_per_s)
            .fold(0.0, f64::max)
    }

    /// One server core and one trainer core, each as fast at the op, and a link with room:
    /// each end decoding half of the shards is twice either alone.
    #[test]
    fn equal_ends_and_a_roomy_link_split_the_op() {
        let (env, profile) = equal_ends();
        let costed = plan_with_profile(&pipeline(64), &images(), &profile, &env).unwrap();
        let chosen = &costed.chosen;
        assert_eq!(chosen.pushed, 1, "{}", costed.explain());
        assert!(
            (chosen.server_fraction - 0.5).abs() < 0.06,
            "{}",
            costed.explain()
        );
        let whole = best_whole(&costed);
        assert!(chosen.estimated_rows_per_s > 1.9 * whole, "{}", costed.explain());
        // The split moves both kinds of rows: its bytes are between the two.
        assert!(chosen.wire_bytes_per_row > 12_004.0 && chosen.wire_bytes_per_row < 15_004.0);
        assert!(
            costed.explain().contains("split: 50% of the shards"),
            "{}",
            costed.explain()
        );
        // A slow link keeps the op whole on the server: only reduced rows fit.
        let slow = Environment {
            bandwidth_bytes_per_s: GBIT / 100.0,
            ..env
        };
        let costed = plan_with_profile(&pipeline(64), &images(), &profile, &slow).unwrap();
        assert_eq!(
            (costed.chosen.pushed, costed.chosen.server_fraction),
            (1, 1.0),
            "{}",
            costed.explain()
        );
    }

    /// A split deals whole shards to each side: with one shard there is none to deal (the
    /// lone stream runs on one end at a time), and with three only thirds are reachable.
    #[test]
    fn a_split_takes_whole_shards() {
        let (env, mut profile) = equal_ends();
        profile.shards = Some(1);
        let one = plan_with_profile(&pipeline(64), &images(), &profile, &env).unwrap();
        assert!(
            one.candidates.iter().all(|c| c.server_fraction == 1.0),
            "{}",
            one.explain()
        );
        profile.shards = Some(3);
        let three = plan_with_profile(&pipeline(64), &images(), &profile, &env).unwrap();
        let fraction = three.chosen.server_fraction;
        assert!(fraction < 1.0, "{}", three.explain());
        assert!(
            [1.0 / 3.0, 2.0 / 3.0].iter().any(|f| (fraction - f).abs() < 1e-9),
            "{fraction}: {}",
            three.explain()
        );
        // Thirds are not halves: the estimate is below the even split's ~2× either end alone.
        let whole = best_whole(&three);
        let gain = three.chosen.estimated_rows_per_s / whole;
        assert!((1.4..1.6).contains(&gain), "{gain}: {}", three.explain());
        // Many shards: whole-shard shares, at most 19 of them; unknown: twentieths.
        profile.shards = Some(30);
        let many = plan_with_profile(&pipeline(64), &images(), &profile, &env).unwrap();
        let shards = many.chosen.server_fraction * 30.0;
        assert!((shards - shards.round()).abs() < 1e-9, "{}", many.explain());
        assert!(
            (many.chosen.server_fraction - 0.5).abs() < 0.06,
            "{}",
            many.explain()
        );
        profile.shards = None;
        let unknown = plan_with_profile(&pipeline(64), &images(), &profile, &env).unwrap();
        assert!(
            (unknown.chosen.server_fraction - 0.5).abs() < 0.06,
            "{}",
            unknown.explain()
        );
    }

    #[test]
    fn bandwidths_parse() {
        assert_eq!(parse_bandwidth("1Gbit").unwrap(), 125e6);
        assert_eq!(parse_bandwidth("100mbit").unwrap(), 12.5e6);
        assert_eq!(parse_bandwidth("125MB").unwrap(), 125e6);
        assert_eq!(parse_bandwidth("1000").unwrap(), 1000.0);
        assert_eq!(parse_bandwidth("unlimited").unwrap(), f64::INFINITY);
        assert!(parse_bandwidth("fast").is_err());
        assert!(parse_bandwidth("1 parsec").is_err());
    }
}

#[test]
fn random_maps_run_in_the_trainer() {
    let p = Pipeline::new("images")
        .map("decode_resize", "image", [64i64, 64], "image")
        .map("random_crop", "image", [56i64, 56], "image")
        .map("random_flip", "image", [0.5], "image")
        .map("color_jitter", "image", [0.2], "image")
        .map("normalize", "image", [0.5, 0.25], "image")
        .select(["image", "label"]);
    let plan = plan(&p, &images()).unwrap();
    assert_eq!(
        plan.fragment.ops.len(),
        1,
        "only the deterministic prefix: {}",
        plan.explain()
    );
    // Everything after the first random op stays in the trainer, deterministic or not.
    assert_eq!(plan.client_steps.len(), 5);
    assert!(plan.placements[1].reason.contains("random"), "{}", plan.explain());
    assert_eq!(plan.fragment.columns, vec!["image", "label"]);
}

/// Golden files for the `explain` text, in the spirit of sqllogictest: each file under
/// `crates/planner/explain/` is a TOML case (schema, pipeline, and for a costed plan the
/// environment and a synthetic profile), a line `----`, and the text `explain` must print.
/// `PUSHDOWN_UPDATE_GOLDEN=1 cargo test -p pushdown-planner golden` rewrites the expected
/// text after a deliberate change; review the diff like code.
mod golden {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    use pushdown_protocol::{CodecCost, Codecs, OpProfile, Profile};
    use serde::Deserialize;

    use super::*;

    const SEPARATOR: &str = "\n----\n";

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Case {
        /// `[name, type]` pairs, in the dataset's column order.
        schema: Vec<(String, String)>,
        pipeline: Pipeline,
        environment: Option<Env>,
        profile: Option<ProfileSpec>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Env {
        bandwidth: String,
        server_cores: f64,
        client_cores: f64,
        #[serde(default)]
        client_ns_per_row: f64,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ProfileSpec {
        selectivity: f64,
        scan_ns_per_row: f64,
        server_cores: u32,
        column_bytes_per_row: BTreeMap<String, f64>,
        /// Codec ratios `[lz4, zstd]` by column (and by op output); absent: not measured.
        #[serde(default)]
        column_ratios: BTreeMap<String, (f64, f64)>,
        scanned_fraction: Option<f64>,
        shards: Option<u32>,
        #[serde(default)]
        ops: Vec<OpSpec>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct OpSpec {
        op: String,
        input: String,
        output: String,
        bytes_in_per_row: f64,
        bytes_out_per_row: f64,
        ns_per_row: f64,
        output_ratios: Option<(f64, f64)>,
    }

    fn codecs((lz4, zstd): (f64, f64)) -> Codecs {
        let cost = |ratio, compress, decompress| CodecCost {
            ratio,
            compress_ns_per_byte: compress,
            decompress_ns_per_byte: decompress,
        };
        Codecs {
            lz4: cost(lz4, 0.5, 0.2),
            zstd: cost(zstd, 3.0, 1.0),
        }
    }

    impl ProfileSpec {
        fn profile(self) -> Profile {
            Profile {
                rows_sampled: 256,
                selectivity: self.selectivity,
                scan_ns_per_row: self.scan_ns_per_row,
                column_bytes_per_row: self.column_bytes_per_row,
                ops: self
                    .ops
                    .into_iter()
                    .map(|o| OpProfile {
                        op: o.op,
                        input: o.input,
                        output: o.output,
                        bytes_in_per_row: o.bytes_in_per_row,
                        bytes_out_per_row: o.bytes_out_per_row,
                        ns_per_row: o.ns_per_row,
                        output_codecs: o.output_ratios.map(codecs),
                    })
                    .collect(),
                server_cores: self.server_cores,
                column_codecs: self
                    .column_ratios
                    .into_iter()
                    .map(|(c, r)| (c, codecs(r)))
                    .collect(),
                scanned_fraction: self.scanned_fraction,
                shards: self.shards,
            }
        }
    }

    fn data_type(name: &str) -> DataType {
        match name {
            "int32" => DataType::Int32,
            "int64" => DataType::Int64,
            "float32" => DataType::Float32,
            "float64" => DataType::Float64,
            "utf8" => DataType::Utf8,
            "binary" => DataType::Binary,
            other => panic!("golden case: unknown column type `{other}`"),
        }
    }

    /// The text `explain` prints for the case in `input`.
    fn explain(input: &str) -> String {
        let case: Case = toml::from_str(input).unwrap_or_else(|e| panic!("golden case: {e}"));
        let schema = Schema::new(
            case.schema
                .iter()
                .map(|(name, ty)| Field::new(name, data_type(ty), true))
                .collect::<Vec<_>>(),
        );
        match (case.environment, case.profile) {
            (None, None) => match plan(&case.pipeline, &schema) {
                Ok(p) => p.explain(),
                Err(e) => format!("error: {e}\n"),
            },
            (Some(env), Some(profile)) => {
                let env = Environment {
                    bandwidth_bytes_per_s: parse_bandwidth(&env.bandwidth).expect("golden case: bandwidth"),
                    server_cores: env.server_cores,
                    client_cores: env.client_cores,
                    client_ns_per_row: env.client_ns_per_row,
                };
                match plan_with_profile(&case.pipeline, &schema, &profile.profile(), &env) {
                    Ok(p) => p.explain(),
                    Err(e) => format!("error: {e}\n"),
                }
            }
            _ => panic!("golden case: a costed case needs both [environment] and [profile]"),
        }
    }

    fn cases() -> Vec<PathBuf> {
        // Where cargo runs the test from now (it sets the variable for every test run), not
        // where the binary was built: a binary built in another checkout still reads these.
        let manifest =
            std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_owned());
        let dir = Path::new(&manifest).join("explain");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "explain"))
            .collect();
        files.sort();
        files
    }

    #[test]
    fn explain_matches_the_golden_files() {
        let update = std::env::var_os("PUSHDOWN_UPDATE_GOLDEN").is_some();
        let files = cases();
        assert!(files.len() >= 5, "golden cases missing: {files:?}");
        let mut failed = Vec::new();
        for path in files {
            let text = std::fs::read_to_string(&path).expect("golden file");
            let (input, expected) = text.split_once(SEPARATOR).unwrap_or((text.as_str(), ""));
            let actual = explain(input);
            if update {
                std::fs::write(&path, format!("{input}{SEPARATOR}{actual}")).expect("write golden file");
            } else if actual != expected {
                failed.push(format!(
                    "{}: explain differs\n--- expected\n{expected}--- actual\n{actual}",
                    path.display()
                ));
            }
        }
        assert!(
            failed.is_empty(),
            "{}\n(rerun with PUSHDOWN_UPDATE_GOLDEN=1 after a deliberate change)",
            failed.join("\n")
        );
    }
}
