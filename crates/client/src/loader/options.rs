//! What the loader reads, and how it orders, partitions and batches: its options.

use std::time::Duration;

use pushdown_planner::Pipeline;
use pushdown_protocol::Compression;

use crate::connect::ConnectOptions;
use crate::error::{ClientError, Result};
use crate::order::{Echo, Sequence};
use crate::plan::Link;
use crate::stream::StreamOptions;

/// What the loader reads.
#[derive(Debug, Clone)]
pub enum LoaderSource {
    /// A row-wise SQL query (projection and filter over one dataset, server ops allowed).
    Sql(String),
    /// A pipeline: the planner places its ops; its shuffle and batch steps set the loader's
    /// shuffle window and batch size unless the options do.
    Pipeline(Pipeline),
}

/// One source of a mixture ([`Loader::mixture`](super::Loader::mixture)): what it reads, its
/// weight (any positive scale: the weights are normalized), and its servers (`None`: the
/// loader's).
#[derive(Debug, Clone)]
pub struct MixtureSource {
    pub source: LoaderSource,
    pub weight: f64,
    pub servers: Option<Vec<String>>,
}

/// How the loader orders, partitions and batches.
#[derive(Debug, Clone)]
pub struct LoaderOptions {
    /// Rows per batch on this rank (default: the pipeline's batch step, else 256); the global
    /// batch, which the order depends on, is `batch_size × world_size`.
    pub batch_size: Option<usize>,
    /// Rows per shuffle window on this rank (default: the pipeline's shuffle step, else 1: no
    /// shuffle), rounded up to whole batches; the global window is `× world_size`.
    pub shuffle_buffer: Option<usize>,
    pub seed: u64,
    pub rank: usize,
    pub world_size: usize,
    /// Canonical partitions of the global order: the epoch's rows are cut into this many
    /// contiguous parts, each global batch takes a chunk of each, and rank `r` of `W` reads
    /// `P/W` of them. Any world size dividing it sees the same global batches, so set it to a
    /// multiple of every world size a job will run at. Default: 8 with a shuffle (or the
    /// least multiple of 8 the world size divides), the world size without one. A restored
    /// state's is kept.
    pub partitions: Option<usize>,
    /// Epochs to iterate.
    pub epochs: usize,
    /// Drop the rows that do not fill a global batch; otherwise the last global batch holds
    /// them, and a rank one row short of the others repeats one (as `DistributedSampler`
    /// pads).
    pub drop_last: bool,
    /// Batches prepared ahead of the consumer.
    pub prefetch: usize,
    /// Threads that run client-side ops and build tensors, and batches built at once; `None`
    /// (the default): one per CPU the loader's threads may run on ([`Self::cpu_affinity`],
    /// else the process's CPUs).
    pub workers: Option<usize>,
    /// Streams in flight, buffering and retries. Its `order` is not used: the loader always
    /// takes shards in its epoch's order (the streams in flight only prefetch).
    pub stream: StreamOptions,
    /// How the server compresses the stream, forced. Default (`None`):
    /// [`pushdown_protocol::choose_codec`]'s choice for the link and the plan's profile: none
    /// to servers on this host, the servers' measured choice ([`Compression::Adaptive`]) to
    /// the rest, the planner's choice for a given bandwidth.
    pub compression: Option<Compression>,
    /// For placing a pipeline's ops and choosing the codec. Default: [`Link::auto`], found
    /// when connecting (unlimited on this host, measured off it).
    pub link: Link,
    /// Which of a pipeline's ops run on the servers.
    pub push: Push,
    /// The token and TLS settings the servers need.
    pub connect: ConnectOptions,
    /// Data echoing: each sample delivered more than once per epoch when reading it is the
    /// bottleneck (needs a shuffle window to spread the repeats).
    pub echo: Echo,
    /// How often the loader tells its servers how long its consumer waits (the `report`
    /// action, for their scaling signal); `None` never.
    pub report_every: Option<Duration>,
    /// CPUs the loader's threads (network, client ops, tensors) are confined to, so the
    /// training loop keeps the others; `None`: those named by `PUSHDOWN_LOADER_CPUS`
    /// (`0-3,8`), else anywhere the process may run. Each must be one the process may run on.
    pub cpu_affinity: Option<Vec<usize>>,
}

/// Which of a pipeline's ops run on the servers. Placement never changes the samples: a
/// shard the server leaves un-reduced is finished by this client with the same kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Push {
    /// The planner's choice, from the servers' measurements and [`LoaderOptions::link`],
    /// which may split an op's shards between the servers and this client. Not adapted at
    /// run time (see [`Push::Adaptive`]): the planner accounts for the link, which the
    /// adaptive policy sees only through the rates it measures.
    #[default]
    Costed,
    /// Exactly the first `k` ops that may run on a server, on every shard (benchmarks that
    /// measure every placement). Not costed: the codec is [`pushdown_protocol::choose_codec`]'s
    /// with no profile.
    First(usize),
    /// The first `first` ops on the server for `server_fraction` of the shards; the other
    /// shards arrive un-reduced and this client runs those ops. Not adapted.
    Split { first: usize, server_fraction: f64 },
    /// The first `k` ops, each shard's placed when it is requested, with no plan: to the end
    /// expected to finish it first, the server timed by its shards' recent latency once per
    /// round of two this trainer keeps there (a shared server's cores are divided about
    /// equally among its trainers), this client by its queue at its rate; every shard to
    /// the server while the loader's consumer does not wait. See benches/RESULTS.md, "Split
    /// placement" and "One server core shared by 3 trainers".
    Adaptive(usize),
}

impl Push {
    /// The first `first` ops on the server for `server_fraction` of the shards:
    /// [`Push::Split`], or [`Push::First`] when that is every shard.
    pub fn placed(first: usize, server_fraction: f64) -> Self {
        if server_fraction < 1.0 {
            Push::Split {
                first,
                server_fraction,
            }
        } else {
            Push::First(first)
        }
    }
}

impl std::str::FromStr for Push {
    type Err = ClientError;

    /// `costed` (the planner's choice), `server` (every op that may run on a server runs
    /// there), `trainer` (none does), `split:F` (every such op, on a fraction F of the
    /// shards) or `adaptive` (every such op, each shard placed when it is requested).
    fn from_str(s: &str) -> Result<Self> {
        let all = usize::MAX;
        match s.trim() {
            "costed" => Ok(Push::Costed),
            "server" => Ok(Push::First(all)),
            "trainer" | "client" => Ok(Push::First(0)),
            "adaptive" => Ok(Push::Adaptive(all)),
            other => match other.strip_prefix("split:").map(|f| f.trim().parse::<f64>()) {
                Some(Ok(f)) if (0.0..=1.0).contains(&f) => Ok(Push::Split {
                    first: all,
                    server_fraction: f,
                }),
                _ => Err(ClientError::Invalid(format!(
                    "placement {other:?}: one of costed, server, trainer, split:F (F in 0..=1, \
                     the servers' share of the shards), adaptive"
                ))),
            },
        }
    }
}

impl LoaderOptions {
    /// What the sample sequence takes from these options.
    pub(crate) fn sequence(&self) -> Sequence {
        Sequence {
            seed: self.seed,
            rank: self.rank as u64,
            world_size: self.world_size as u64,
            drop_last: self.drop_last,
            echo: self.echo,
        }
    }
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            batch_size: None,
            shuffle_buffer: None,
            seed: 0,
            rank: 0,
            world_size: 1,
            partitions: None,
            epochs: 1,
            drop_last: false,
            prefetch: 4,
            workers: None,
            stream: StreamOptions::default(),
            compression: None,
            link: Link::auto(),
            push: Push::Costed,
            connect: ConnectOptions::default(),
            echo: Echo::Off,
            report_every: Some(Duration::from_secs(1)),
            cpu_affinity: None,
        }
    }
}
