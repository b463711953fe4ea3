//! Placement by measured cost.
//!
//! Within the legal prefix (deterministic, row-wise), each op could run on either side.
//! Pushing the first `j` ops of the fragment to the server is one candidate placement; the
//! planner estimates each candidate's throughput as
//!
//! ```text
//!   rows/s = selectivity × min(server_rate, network_rate, client_rate)      (Plumber's view)
//!   server_rate  = server_cores × 1e9 / (scanned × scan_ns + sel × Σ pushed op ns)
//!   network_rate = bandwidth / (sel × Σ bytes of the columns that cross)
//!   client_rate  = client_cores × 1e9 / (sel × Σ client op ns)
//! ```
//!
//! in rows of the dataset, where `scanned` is the share of them in row groups statistics leave
//! to scan (a filter on sorted data reads only its own rows), with every number measured by
//! the server's `profile` action on a sample of the data,
//! and takes the fastest (the fewest bytes when within 5%). Decode-to-full-size expands the data,
//! so it stays with the trainer; decode-and-downscale reduces it, so it moves to the data —
//! unless the link is so fast and the server so slow that the server becomes the bottleneck.

use std::collections::BTreeMap;
use std::fmt::Write;

use arrow::datatypes::Schema;
use pushdown_protocol::{CodecInputs, Compression, LinkKnown, Profile, Profiled, choose_codec};
use serde::Serialize;

use crate::error::PlanError;
use crate::pipeline::Pipeline;
use crate::split::{Plan, Side, plan_limited};

/// What the placement may assume about the machines and the link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Environment {
    pub bandwidth_bytes_per_s: f64,
    pub server_cores: f64,
    pub client_cores: f64,
    /// The trainer's own work per delivered row on the steps that run there whatever the
    /// placement (random ops, selects), as the client timed it; 0 when not measured.
    pub client_ns_per_row: f64,
}

/// One op's measured cost and where it was placed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpCost {
    pub op: String,
    pub side: Side,
    pub bytes_in: f64,
    pub bytes_out: f64,
    pub ns_per_row: f64,
}

/// The estimate of one candidate placement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    /// Ops of the fragment pushed to the server.
    pub pushed: usize,
    /// The share of shards whose pushed ops run on the server (1: all of them). The others
    /// arrive un-reduced and the trainer runs those ops: a split placement.
    pub server_fraction: f64,
    pub server_rows_per_s: f64,
    pub network_rows_per_s: f64,
    pub client_rows_per_s: f64,
    /// Bytes per delivered row that cross the network.
    pub wire_bytes_per_row: f64,
    pub estimated_rows_per_s: f64,
    /// The stream's codec for this placement over the environment's link: [`choose_codec`]
    /// given [`Estimate::profiled`]. For a candidate of the table, the codec it was costed
    /// with.
    #[serde(serialize_with = "serialize_display")]
    pub compression: Compression,
    /// What the profile says of compressing this placement's stream: with the codecs
    /// measured, the fastest once each one's CPU (compressing on the server, decompressing on
    /// the trainer) and bytes are counted, no compression on a tie; unmeasured, whether the
    /// link bounds the stream. The loader gives it to [`choose_codec`] with the link it knows.
    #[serde(skip)]
    pub profiled: Profiled,
}

fn serialize_display<S: serde::Serializer>(c: &Compression, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(c)
}

/// The chosen plan, its op costs and every candidate considered.
#[derive(Debug, Clone)]
pub struct CostedPlan {
    pub plan: Plan,
    pub ops: Vec<OpCost>,
    pub chosen: Estimate,
    pub candidates: Vec<Estimate>,
    /// The trainer's own work per row the estimates counted ([`Environment::client_ns_per_row`]).
    pub trainer_ns_per_row: f64,
    /// The server's scan: its cost per scanned row, the filter's selectivity, and the share
    /// of rows statistics leave to scan (`None`: not measured, all charged).
    pub scan_ns_per_row: f64,
    pub selectivity: f64,
    pub scanned_fraction: Option<f64>,
}

/// Without measured codecs (an older server's profile): the link is taken to bound a
/// stream when it would carry the uncompressed rows at less
/// than this multiple of the slower end's rate. Compressing costs both ends CPU (zstd: ~3 ns
/// per byte to compress, ~1 to decompress, on cores that are the bottleneck when the link is
/// not), so only a link near the line is worth it.
const LINK_BOUND_HEADROOM: f64 = 1.25;

impl Estimate {
    /// Whether the link, not the server or the trainer, bounds this placement.
    pub fn link_bound(&self) -> bool {
        self.network_rows_per_s < LINK_BOUND_HEADROOM * self.server_rows_per_s.min(self.client_rows_per_s)
    }

    /// Whether the codec was chosen from the codecs' measured ratios and CPU.
    pub fn codec_measured(&self) -> bool {
        matches!(self.profiled, Profiled::Measured(_))
    }

    /// Sets what the profile says and the codec [`choose_codec`] makes of it over the
    /// environment's link.
    fn with_profiled(mut self, profiled: Profiled, env: &Environment) -> Self {
        self.profiled = profiled;
        self.compression = choose_codec(CodecInputs {
            forced: None,
            link: LinkKnown::Given(env.bandwidth_bytes_per_s),
            profiled,
        });
        self
    }
}

/// Estimates within this fraction of each other are a tie, and a tie goes to the placement
/// that moves fewer bytes: it spares the network and the trainer's CPU, which the
/// accelerator's own input work needs, for the same estimated throughput.
const TIE: f64 = 0.05;

/// Plans `pipeline` with each legal placement of its server-eligible ops, costs each with
/// `profile` (measured on the full static fragment) and `env`, and keeps the fastest.
pub fn plan_with_profile(
    pipeline: &Pipeline,
    schema: &Schema,
    profile: &Profile,
    env: &Environment,
) -> Result<CostedPlan, PlanError> {
    plan_with_profile_limited(pipeline, schema, profile, env, usize::MAX)
}

/// [`plan_with_profile`] among placements of at most `max_server_ops` ops on the server (the
/// ops before the first one the servers cannot run; `profile` measured on those).
pub fn plan_with_profile_limited(
    pipeline: &Pipeline,
    schema: &Schema,
    profile: &Profile,
    env: &Environment,
    max_server_ops: usize,
) -> Result<CostedPlan, PlanError> {
    let full = plan_limited(pipeline, schema, max_server_ops)?;
    let eligible = full.fragment.ops.len();
    let none = plan_limited(pipeline, schema, 0)?;
    let unreduced = wire(&none, 0, profile);
    let mut best: Option<(Plan, Estimate)> = None;
    let mut candidates = Vec::new();
    for pushed in 0..=eligible {
        let candidate = plan_limited(pipeline, schema, pushed)?;
        let costs = Costs::of(&candidate, pushed, profile, unreduced);
        // The whole placement, then (when ops are pushed) the best split of them.
        let mut estimates = vec![costs.estimate(pushed, 1.0, profile, env)];
        if pushed > 0 {
            let split = split_fractions(profile.shards)
                .into_iter()
                .map(|f| costs.estimate(pushed, f, profile, env))
                .max_by(|a, b| a.estimated_rows_per_s.total_cmp(&b.estimated_rows_per_s));
            let whole = estimates[0].estimated_rows_per_s;
            estimates.extend(split.filter(|s| s.estimated_rows_per_s > whole * (1.0 + TIE)));
        }
        for estimate in estimates {
            candidates.push(estimate.clone());
            let better = match &best {
                None => true,
                Some((_, b)) => {
                    estimate.estimated_rows_per_s > b.estimated_rows_per_s * (1.0 + TIE)
                        || (estimate.estimated_rows_per_s >= b.estimated_rows_per_s * (1.0 - TIE)
                            && estimate.wire_bytes_per_row < b.wire_bytes_per_row)
                }
            };
            if better {
                best = Some((candidate.clone(), estimate));
            }
        }
    }
    let (plan, chosen) = best.ok_or_else(|| PlanError::Format("no placement".into()))?;
    let labels: Vec<String> = full.fragment.ops.iter().map(ToString::to_string).collect();
    let ops = profile
        .ops
        .iter()
        .enumerate()
        .map(|(i, o)| OpCost {
            op: labels
                .get(i)
                .cloned()
                .unwrap_or_else(|| format!("{}({}) AS {}", o.op, o.input, o.output)),
            side: if i < chosen.pushed {
                Side::Server
            } else {
                Side::Client
            },
            bytes_in: o.bytes_in_per_row,
            bytes_out: o.bytes_out_per_row,
            ns_per_row: o.ns_per_row,
        })
        .collect();
    Ok(CostedPlan {
        plan,
        ops,
        chosen,
        candidates,
        trainer_ns_per_row: env.client_ns_per_row,
        scan_ns_per_row: profile.scan_ns_per_row,
        selectivity: profile.selectivity,
        scanned_fraction: profile.scanned_fraction,
    })
}

/// Split placements are tried in steps of this many parts (fewer where there are fewer
/// shards).
const SPLIT_STEPS: u32 = 20;

/// The server's shares a split is tried at. An epoch deals whole shards to each side, so with
/// `shards` known the shares are whole shards (at most [`SPLIT_STEPS`] of them, evenly
/// spaced): a finer fraction is met only across epochs, each epoch's streams running on one
/// end or the other, and its estimate would count both ends' cores working at once when they
/// do not. With one shard there is no split (the lone stream runs on one end at a time).
fn split_fractions(shards: Option<u32>) -> Vec<f64> {
    let Some(n) = shards else {
        return (1..SPLIT_STEPS)
            .map(|k| f64::from(k) / f64::from(SPLIT_STEPS))
            .collect();
    };
    let steps = n.min(SPLIT_STEPS);
    let mut on_server: Vec<u32> = (1..steps)
        .filter_map(|k| {
            u32::try_from((u64::from(k) * u64::from(n) + u64::from(steps / 2)) / u64::from(steps)).ok()
        })
        .filter(|s| (1..n).contains(s))
        .collect();
    on_server.dedup();
    on_server
        .into_iter()
        .map(|s| f64::from(s) / f64::from(n))
        .collect()
}

/// What a delivered row of `plan`'s columns costs the link when its first `pushed` ops ran
/// on the server: its bytes, and for each codec (when every column's was measured) the
/// bytes compressed and the CPU to compress and decompress them.
#[derive(Debug, Clone, Copy, Default)]
struct Wire {
    bytes: f64,
    /// LZ4, then zstd.
    codecs: Option<[WireCodec; 2]>,
}

#[derive(Debug, Clone, Copy, Default)]
struct WireCodec {
    bytes: f64,
    compress_ns: f64,
    decompress_ns: f64,
}

impl Wire {
    /// Bytes, and the server's and the trainer's CPU per row, with `codec`; `None` when
    /// that codec's cost is not known.
    fn with(&self, codec: Compression) -> Option<WireCodec> {
        match codec {
            Compression::None | Compression::Adaptive => Some(WireCodec {
                bytes: self.bytes,
                ..Default::default()
            }),
            Compression::Lz4 => self.codecs.map(|c| c[0]),
            Compression::Zstd => self.codecs.map(|c| c[1]),
        }
    }
}

fn wire(plan: &Plan, pushed: usize, profile: &Profile) -> Wire {
    let mut sizes: BTreeMap<&str, (f64, Option<pushdown_protocol::Codecs>)> = profile
        .column_bytes_per_row
        .iter()
        .map(|(k, v)| (k.as_str(), (*v, profile.column_codecs.get(k).copied())))
        .collect();
    for op in profile.ops.iter().take(pushed) {
        sizes.insert(op.output.as_str(), (op.bytes_out_per_row, op.output_codecs));
    }
    let mut out = Wire {
        bytes: 0.0,
        codecs: Some(Default::default()),
    };
    for column in &plan.fragment.columns {
        let Some((bytes, codecs)) = sizes.get(column.as_str()).copied() else {
            continue;
        };
        out.bytes += bytes;
        out.codecs = match (out.codecs, codecs) {
            (Some(mut sum), Some(c)) => {
                for (s, c) in sum.iter_mut().zip([c.lz4, c.zstd]) {
                    s.bytes += bytes * c.ratio;
                    s.compress_ns += bytes * c.compress_ns_per_byte;
                    s.decompress_ns += bytes * c.decompress_ns_per_byte;
                }
                Some(sum)
            }
            _ => None,
        };
    }
    out
}

/// What one placement of a fragment's ops costs per row, from the profile.
struct Costs {
    /// Selectivity of the filter.
    sel: f64,
    /// Scanning, per row of the dataset: the profiled cost per scanned row times the share
    /// of rows that pruning leaves to scan (server).
    scan_ns: f64,
    /// The pushed ops, per row that passes the filter.
    pushed_ns: f64,
    /// The ops left to the trainer, per row that passes.
    rest_ns: f64,
    /// A delivered row on the link with the pushed ops run, and with none run.
    wire: Wire,
    unreduced: Wire,
}

impl Costs {
    fn of(plan: &Plan, pushed: usize, profile: &Profile, unreduced: Wire) -> Self {
        let (mut pushed_ns, mut rest_ns) = (0.0, 0.0);
        for (i, op) in profile.ops.iter().enumerate() {
            if i < pushed {
                pushed_ns += op.ns_per_row;
            } else {
                rest_ns += op.ns_per_row;
            }
        }
        Self {
            sel: profile.selectivity.clamp(1e-9, 1.0),
            // Pruned row groups are never read: the scan is paid on the rest only.
            scan_ns: profile.scan_ns_per_row * profile.scanned_fraction.unwrap_or(1.0),
            pushed_ns,
            rest_ns,
            wire: wire(plan, pushed, profile),
            unreduced,
        }
    }

    /// The placement's throughput with the pushed ops run on the server for `fraction` of
    /// the shards and on the trainer for the rest: each stage's rate is its capacity over
    /// its work per row (a split adds work to both ends and moves the mix of bytes). With
    /// the codecs measured, each is costed (its bytes on the link, its CPU on both ends)
    /// and the fastest kept, no compression on a tie.
    fn estimate(&self, pushed: usize, fraction: f64, profile: &Profile, env: &Environment) -> Estimate {
        let measured = self.wire.codecs.is_some() && self.unreduced.codecs.is_some();
        if !measured {
            // Compression spends both ends' CPU to save link time: without measured codecs,
            // worth it only when the link bounds the stream, or when nothing was measured
            // at all (an empty profile: the link's rate is all there is to go by).
            let estimate = self.with_codec(pushed, fraction, Compression::None, env);
            let profiled = match profile.rows_sampled {
                0 => Profiled::No,
                _ => Profiled::LinkBound(estimate.link_bound()),
            };
            return estimate.with_profiled(profiled, env);
        }
        let all: Vec<Estimate> = [Compression::None, Compression::Lz4, Compression::Zstd]
            .into_iter()
            .map(|c| self.with_codec(pushed, fraction, c, env))
            .collect();
        let best = all.iter().map(|e| e.estimated_rows_per_s).fold(0.0, f64::max);
        // The cheapest codec within a tie of the best: CPU is spared for the rows.
        let chosen = all
            .into_iter()
            .find(|e| e.estimated_rows_per_s >= best * (1.0 - TIE))
            .unwrap_or_else(|| self.with_codec(pushed, fraction, Compression::None, env));
        let codec = chosen.compression;
        chosen.with_profiled(Profiled::Measured(codec), env)
    }

    fn with_codec(&self, pushed: usize, fraction: f64, codec: Compression, env: &Environment) -> Estimate {
        let (sel, f) = (self.sel, fraction);
        let none = WireCodec::default();
        let (w, u) = (
            self.wire.with(codec).unwrap_or(none),
            self.unreduced.with(codec).unwrap_or(none),
        );
        let mix = |a: f64, b: f64| f * a + (1.0 - f) * b;
        let wire = mix(w.bytes, u.bytes);
        let rate = |cores: f64, ns: f64| {
            if ns <= 0.0 {
                f64::INFINITY
            } else {
                cores.max(0.01) * 1e9 / ns
            }
        };
        // Rates in rows of the dataset per second (the scan is paid on the unpruned share).
        let server = rate(
            env.server_cores,
            self.scan_ns + sel * (f * self.pushed_ns + mix(w.compress_ns, u.compress_ns)),
        );
        let network = if wire <= 0.0 {
            f64::INFINITY
        } else {
            env.bandwidth_bytes_per_s / (sel * wire)
        };
        let client = rate(
            env.client_cores,
            sel * ((1.0 - f) * self.pushed_ns
                + self.rest_ns
                + mix(w.decompress_ns, u.decompress_ns)
                + env.client_ns_per_row),
        );
        Estimate {
            pushed,
            server_fraction: f,
            server_rows_per_s: sel * server,
            network_rows_per_s: sel * network,
            client_rows_per_s: sel * client,
            wire_bytes_per_row: wire,
            estimated_rows_per_s: sel * server.min(network).min(client),
            compression: codec,
            profiled: Profiled::No,
        }
    }
}

impl CostedPlan {
    /// The decision table, as `pushdown explain` prints it.
    pub fn explain(&self) -> String {
        let mut out = self.plan.explain();
        self.write_measured(&mut out);
        self.write_candidates(&mut out);
        self.write_compression(&mut out);
        out
    }

    /// `explain`'s measurements: the scan, then each op's cost and side.
    fn write_measured(&self, out: &mut String) {
        let scanned = match self.scanned_fraction {
            Some(f) => format!("statistics leave {:.1}% of the rows to scan", 100.0 * f),
            None => "every row scanned (pruning not measured)".into(),
        };
        let _ = writeln!(
            out,
            "\nmeasured scan: {:.0} ns per scanned row; {:.1}% of the rows pass the filter; {scanned}",
            self.scan_ns_per_row,
            100.0 * self.selectivity
        );
        let _ = writeln!(out, "measured ops (per row that passes the filter):");
        let _ = writeln!(
            out,
            "  {:<40} {:<6} {:>12} {:>12} {:>14}",
            "op", "side", "bytes in", "bytes out", "ns/row"
        );
        for op in &self.ops {
            let _ = writeln!(
                out,
                "  {:<40} {:<6} {:>12.0} {:>12.0} {:>14.0}",
                op.op, op.side, op.bytes_in, op.bytes_out, op.ns_per_row
            );
        }
        if self.trainer_ns_per_row > 0.0 {
            let _ = writeln!(
                out,
                "  {:<40} {:<6} {:>12} {:>12} {:>14.0}",
                "the trainer's own steps (timed there)", "client", "", "", self.trainer_ns_per_row
            );
        }
    }

    /// `explain`'s candidate placements, the chosen one marked, and how a split divides the work.
    fn write_candidates(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\ncandidate placements (rows/s; the slowest stage bounds the pipeline; wire bytes as the codec sends them):"
        );
        let _ = writeln!(
            out,
            "  {:>6} {:>9} {:>14} {:>14} {:>14} {:>14} {:>6} {:>14}",
            "pushed", "on server", "server", "network", "client", "wire B/row", "codec", "estimate"
        );
        for c in &self.candidates {
            let mark = if c.pushed == self.chosen.pushed && c.server_fraction == self.chosen.server_fraction {
                " ← chosen"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  {:>6} {:>8.0}% {:>14} {:>14} {:>14} {:>14.0} {:>6} {:>14}{mark}",
                c.pushed,
                c.server_fraction * 100.0,
                rate(c.server_rows_per_s),
                rate(c.network_rows_per_s),
                rate(c.client_rows_per_s),
                c.wire_bytes_per_row,
                c.compression.to_string(),
                rate(c.estimated_rows_per_s),
            );
        }
        if self.chosen.server_fraction < 1.0 {
            let _ = writeln!(
                out,
                "\nsplit: {:.0}% of the shards run the pushed ops on the server, {:.0}% arrive \
                 un-reduced and the trainer runs them (alone, the server would run them for \
                 {} rows/s, the trainer for {})",
                self.chosen.server_fraction * 100.0,
                (1.0 - self.chosen.server_fraction) * 100.0,
                rate(
                    self.whole(self.chosen.pushed)
                        .map_or(f64::NAN, |w| w.server_rows_per_s)
                ),
                rate(self.whole(0).map_or(f64::NAN, |w| w.client_rows_per_s)),
            );
        }
    }

    /// `explain`'s stream compression and why.
    fn write_compression(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\nstream compression: {} ({})",
            self.chosen.compression,
            match (
                self.chosen.codec_measured(),
                self.chosen.link_bound(),
                self.chosen.compression,
            ) {
                (true, _, Compression::None) =>
                    "with each codec's measured ratio and CPU, none is faster: CPU goes to the rows",
                (true, ..) =>
                    "the fastest with each codec's measured ratio and CPU (compressing on the server, decompressing on the trainer)",
                (false, true, _) => "the link bounds the stream",
                (false, false, Compression::None) => "the link has room: CPU goes to the rows",
                (false, false, _) => "nothing measured: chosen by the link's rate",
            }
        );
    }

    /// The estimate of pushing `pushed` ops for every shard.
    fn whole(&self, pushed: usize) -> Option<&Estimate> {
        self.candidates
            .iter()
            .find(|c| c.pushed == pushed && c.server_fraction >= 1.0)
    }

    /// `{"ops": [...], "estimated_rows_per_s": …, "compression": "zstd", "candidates": [...]}`. A stage with no work
    /// has an unbounded rate, written as `null`.
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Json<'a> {
            ops: &'a [OpCost],
            estimated_rows_per_s: f64,
            compression: String,
            candidates: &'a [Estimate],
        }
        serde_json::to_string_pretty(&Json {
            ops: &self.ops,
            estimated_rows_per_s: finite(self.chosen.estimated_rows_per_s),
            compression: self.chosen.compression.to_string(),
            candidates: &self.candidates,
        })
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

fn finite(x: f64) -> f64 {
    if x.is_finite() { x } else { f64::MAX }
}

fn rate(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.0}")
    } else {
        "∞".into()
    }
}

/// Parses `1Gbit`, `10gbit`, `100Mbit`, `125MB` (bytes), a plain number of bytes/s, or
/// `unlimited` (same host: no link to save).
pub fn parse_bandwidth(text: &str) -> Result<f64, String> {
    let t = text.trim().to_ascii_lowercase();
    if t == "unlimited" {
        return Ok(f64::INFINITY);
    }
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad bandwidth `{text}`"))?;
    let factor = match unit.trim() {
        "" | "b/s" | "bps" => 1.0,
        "kbit" => 1e3 / 8.0,
        "mbit" => 1e6 / 8.0,
        "gbit" => 1e9 / 8.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        other => {
            return Err(format!(
                "bad bandwidth unit `{other}` (use kbit, mbit, gbit, kb, mb, gb)"
            ));
        }
    };
    Ok(n * factor)
}
