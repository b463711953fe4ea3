//! Planning a pipeline against a server's measurements of it.

use pushdown_planner::{CostedPlan, Environment, Pipeline, plan_with_profile_limited};
use pushdown_protocol::{LinkKnown, Profile, Query, ScanRequest};

use crate::client::PushdownClient;
use crate::error::Result;

/// The link to the servers and the machines at both ends, as the planner needs them.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    pub bandwidth_bytes_per_s: f64,
    pub server_cores: Option<f64>,
    pub client_cores: Option<f64>,
    /// Where [`Link::bandwidth_bytes_per_s`] comes from.
    pub source: LinkSource,
}

/// Where a link's figure comes from: what `explain` and the run report say of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LinkSource {
    /// Given by the user (`--bandwidth`, `bandwidth_bytes_per_s`): planned for, and the codec
    /// chosen for it.
    Given,
    /// Not given: found when the loader connects ([`Link::resolve`]).
    #[default]
    Auto,
    /// Every server is on this host (a loopback address, or one of this host's own): the
    /// link is unlimited and streams travel uncompressed.
    Local,
    /// Servers off this host, whose link nothing has measured before the first stream:
    /// planned at [`Link::ASSUMED_BYTES_PER_S`], and each stream's codec chosen by its
    /// server from the send rate it measures, batch by batch (compressed while the socket
    /// holds it back, not while its CPU does).
    Measured,
}

impl Link {
    /// What the planner places ops by on a link off this host before anything is measured.
    /// Low on purpose: reducing ops on the server never cost a slow link anything, and the
    /// codec follows the measured rate whatever this says.
    pub const ASSUMED_BYTES_PER_S: f64 = 1e9 / 8.0;

    /// A link of the given bandwidth (bytes/s; infinite: unlimited).
    pub fn bandwidth(bandwidth_bytes_per_s: f64) -> Self {
        Self {
            bandwidth_bytes_per_s,
            server_cores: None,
            client_cores: None,
            source: LinkSource::Given,
        }
    }

    /// Found when connecting (the default): unlimited to servers on this host, measured to
    /// the rest.
    pub fn auto() -> Self {
        Self {
            source: LinkSource::Auto,
            ..Self::bandwidth(Self::ASSUMED_BYTES_PER_S)
        }
    }

    /// Measured whatever the servers' addresses say: for servers reached through a proxy on
    /// this host (every address is loopback, yet the link behind it is not).
    pub fn measured() -> Self {
        Self {
            source: LinkSource::Measured,
            ..Self::bandwidth(Self::ASSUMED_BYTES_PER_S)
        }
    }

    /// This trainer's cores: as given, else the ones this process may run on.
    pub fn trainer_cores(&self) -> f64 {
        self.client_cores
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()) as f64)
    }

    /// An [`LinkSource::Auto`] link resolved against the servers at `urls`: unlimited
    /// ([`LinkSource::Local`]) when every one is on this host, else [`LinkSource::Measured`].
    /// Any other link is returned as it is.
    pub async fn resolve(self, urls: &[String]) -> Self {
        if self.source != LinkSource::Auto {
            return self;
        }
        let mut local = !urls.is_empty();
        for url in urls {
            local &= is_on_this_host(url).await;
        }
        if local {
            Self {
                bandwidth_bytes_per_s: f64::INFINITY,
                source: LinkSource::Local,
                ..self
            }
        } else {
            Self {
                bandwidth_bytes_per_s: Self::ASSUMED_BYTES_PER_S,
                source: LinkSource::Measured,
                ..self
            }
        }
    }

    /// What this link tells [`pushdown_protocol::choose_codec`]: a given bandwidth, one
    /// host, or nothing known (the servers measure it as they send).
    pub fn known(&self) -> LinkKnown {
        match self.source {
            LinkSource::Given => LinkKnown::Given(self.bandwidth_bytes_per_s),
            LinkSource::Local => LinkKnown::Local,
            LinkSource::Auto | LinkSource::Measured => LinkKnown::Unknown,
        }
    }
}

impl std::fmt::Display for Link {
    /// The figure and where it came from, as `explain` and the run report print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let figure = if self.bandwidth_bytes_per_s.is_finite() {
            format!("{:.0} Mbit/s", self.bandwidth_bytes_per_s * 8.0 / 1e6)
        } else {
            "unlimited".to_owned()
        };
        match self.source {
            LinkSource::Given => write!(f, "{figure} (given)"),
            LinkSource::Local => write!(f, "unlimited (every server is on this host)"),
            LinkSource::Auto | LinkSource::Measured => write!(
                f,
                "{figure} assumed for placement (servers off this host; the codec follows the \
                 send rate each server measures)"
            ),
        }
    }
}

/// Whether the server at `url` runs on this host: its address is a loopback one, or one this
/// host can bind (an address of one of its interfaces). A name that does not resolve is not.
pub async fn is_on_this_host(url: &str) -> bool {
    let Some(authority) = url
        .split("://")
        .nth(1)
        .map(|rest| rest.split('/').next().unwrap_or(rest))
    else {
        return false;
    };
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_owned()
    } else {
        format!("{authority}:0")
    };
    let Ok(addrs) = tokio::net::lookup_host(with_port).await else {
        return false;
    };
    let addrs: Vec<_> = addrs.collect();
    !addrs.is_empty()
        && addrs.iter().all(|a| {
            let ip = a.ip();
            ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind((ip, 0)).is_ok()
        })
}

/// Plans `pipeline`, placing its ops by the server's measurements of them when it has any.
pub async fn costed_plan(
    client: &PushdownClient,
    pipeline: &Pipeline,
    schema: &arrow::datatypes::Schema,
    link: Link,
) -> Result<CostedPlan> {
    costed_plan_for_ranks(client, pipeline, schema, link, 1).await
}

/// [`costed_plan`] for one of `ranks` trainers of a distributed job reading the same servers
/// at once: this rank reads its share of the shards, and the servers' cores are shared by
/// every rank (unless `link.server_cores` says what this rank gets).
pub async fn costed_plan_for_ranks(
    client: &PushdownClient,
    pipeline: &Pipeline,
    schema: &arrow::datatypes::Schema,
    link: Link,
    ranks: usize,
) -> Result<CostedPlan> {
    let (limit, unrunnable) = server_op_limit(client, pipeline).await;
    let static_plan = pushdown_planner::plan_limited(pipeline, schema, limit)?;
    let profile = if static_plan.fragment.ops.is_empty() {
        Profile::default()
    } else {
        let request = ScanRequest::new(Query::Fragment(static_plan.fragment.clone()));
        let mut profile = client.profile(&request).await?;
        // One server counts its own shards; a fleet deals every server's.
        if client.urls().len() > 1 && profile.shards.is_some() {
            let endpoints = client.plan(&request).await?.endpoint.len();
            profile.shards = u32::try_from(endpoints).ok().filter(|n| *n > 0);
        }
        profile
    };
    let client_ns_per_row = trainer_ns_per_row(pipeline, schema, limit).unwrap_or(0.0);
    let (profile, env) = for_one_rank(profile, link, client.urls().len(), ranks, client_ns_per_row);
    let mut costed = plan_with_profile_limited(pipeline, schema, &profile, &env, limit)?;
    if let Some(op) = unrunnable {
        note_unrunnable(&mut costed.plan, &op);
    }
    Ok(costed)
}

/// How many of `pipeline`'s map steps, in order, the servers can run: those before the first
/// op the servers do not list (their `ops` action), and that op's name. Every step where the
/// servers cannot say.
pub async fn server_op_limit(client: &PushdownClient, pipeline: &Pipeline) -> (usize, Option<String>) {
    if !pipeline
        .steps()
        .iter()
        .any(|s| matches!(s, pushdown_planner::Step::Map(_)))
    {
        return (usize::MAX, None);
    }
    match client.server_ops().await {
        Some(ops) => op_limit(pipeline, &ops),
        None => (usize::MAX, None),
    }
}

/// [`server_op_limit`] for servers that run `ops`.
fn op_limit(pipeline: &Pipeline, ops: &std::collections::BTreeSet<String>) -> (usize, Option<String>) {
    let maps: Vec<&str> = pipeline
        .steps()
        .iter()
        .filter_map(|s| match s {
            pushdown_planner::Step::Map(m) => Some(m.call.as_str()),
            _ => None,
        })
        .collect();
    match maps.iter().position(|call| !ops.contains(*call)) {
        Some(at) => (at, Some(maps[at].to_owned())),
        None => (usize::MAX, None),
    }
}

/// Says why `op`, which the servers cannot run, was kept in the trainer: where it is what
/// ended the server's part (not where a random step or a forced count had already).
pub fn note_unrunnable(plan: &mut pushdown_planner::Plan, op: &str) {
    let step = plan.client_steps.first().and_then(|s| match s {
        pushdown_planner::Step::Map(m) if m.call == op => Some(s.to_string()),
        _ => None,
    });
    if let Some(placement) = step.and_then(|step| plan.placements.iter_mut().find(|p| p.step == step)) {
        placement.reason = format!(
            "kept in the trainer: the servers cannot run `{op}` (their `ops` action does not list it)"
        );
    }
}

/// What one of `ranks` trainers plans with, reading from `servers`: its share of the shards
/// (rounded up), and every server's cores divided among the ranks.
fn for_one_rank(
    mut profile: Profile,
    link: Link,
    servers: usize,
    ranks: usize,
    client_ns_per_row: f64,
) -> (Profile, Environment) {
    let ranks = ranks.max(1);
    profile.shards = profile
        .shards
        .map(|n| n.div_ceil(u32::try_from(ranks).unwrap_or(u32::MAX)).max(1));
    let env = Environment {
        client_ns_per_row,
        bandwidth_bytes_per_s: link.bandwidth_bytes_per_s,
        // Every server of the fleet streams shards at once, to every rank.
        server_cores: link
            .server_cores
            .unwrap_or(f64::from(profile.server_cores.max(1)) * servers as f64 / ranks as f64),
        client_cores: link.trainer_cores(),
    };
    (profile, env)
}

/// Rows timed for [`trainer_ns_per_row`].
const TIMED_ROWS: usize = 256;

/// This process's own work per delivered row on the pipeline's row-wise steps that run here
/// whatever the placement (random ops and selects after the fragment), timed on rows of the
/// fragment's output shape (zeros: the kernels here cost the same whatever the values); the
/// best of three; the fragment is at most `max_server_ops` ops (what the servers can run).
/// `None` when it cannot be timed (a step needs a dataset's resources, a type has no zero
/// value, a kernel refuses zeros).
pub fn trainer_ns_per_row(
    pipeline: &Pipeline,
    schema: &arrow::datatypes::Schema,
    max_server_ops: usize,
) -> Option<f64> {
    use std::sync::Arc;
    let full = pushdown_planner::plan_limited(pipeline, schema, max_server_ops).ok()?;
    let bound = pushdown_ops::Calls::bind(
        &full.fragment.ops,
        Arc::new(schema.clone()),
        &pushdown_ops::NoResources,
    )
    .ok()?;
    let out = bound.schema();
    let indices = full
        .fragment
        .columns
        .iter()
        .map(|c| out.index_of(c))
        .collect::<std::result::Result<Vec<_>, _>>()
        .ok()?;
    let wire = Arc::new(out.project(&indices).ok()?);
    let steps: Vec<pushdown_planner::Step> = full
        .client_steps
        .iter()
        .filter(|s| {
            matches!(
                s,
                pushdown_planner::Step::Select { .. } | pushdown_planner::Step::Map(_)
            )
        })
        .cloned()
        .collect();
    if steps.is_empty() {
        return Some(0.0);
    }
    let steps =
        crate::steps::RowSteps::new(&steps, Arc::clone(&wire), 0, Arc::new(pushdown_ops::NoResources))
            .ok()?;
    let columns = wire
        .fields()
        .iter()
        .map(|f| zeros(f.data_type(), TIMED_ROWS))
        .collect::<Option<Vec<_>>>()?;
    let batch = arrow::record_batch::RecordBatch::try_new(wire, columns).ok()?;
    steps.apply(batch.clone(), 0).ok()?;
    (1..=3)
        .map(|key| {
            let start = std::time::Instant::now();
            steps.apply(batch.clone(), key).ok()?;
            Some(start.elapsed().as_nanos() as f64 / TIMED_ROWS as f64)
        })
        .collect::<Option<Vec<f64>>>()?
        .into_iter()
        .reduce(f64::min)
}

/// `rows` non-null zero values of `data_type` (empty strings and lists, zero numbers).
fn zeros(data_type: &arrow::datatypes::DataType, rows: usize) -> Option<arrow::array::ArrayRef> {
    fn valid(data: arrow::array::ArrayData) -> Option<arrow::array::ArrayData> {
        let children = data
            .child_data()
            .iter()
            .cloned()
            .map(valid)
            .collect::<Option<Vec<_>>>()?;
        data.into_builder().nulls(None).child_data(children).build().ok()
    }
    valid(arrow::array::ArrayData::new_null(data_type, rows)).map(arrow::array::make_array)
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, Field, Schema};
    use pushdown_planner::Pipeline;

    use super::*;

    /// A rank of a distributed job plans with its share of the shards and of the servers'
    /// cores; cores given for the link are this rank's already.
    #[test]
    fn a_rank_plans_with_its_share_of_shards_and_server_cores() {
        let profile = Profile {
            shards: Some(10),
            server_cores: 8,
            ..Profile::default()
        };
        let link = Link {
            client_cores: Some(4.0),
            ..Link::bandwidth(1e9)
        };
        let (alone, env) = for_one_rank(profile.clone(), link, 2, 1, 0.0);
        assert_eq!((alone.shards, env.server_cores), (Some(10), 16.0));
        let (rank, env) = for_one_rank(profile.clone(), link, 2, 4, 0.0);
        assert_eq!((rank.shards, env.server_cores), (Some(3), 4.0));
        assert_eq!(env.client_cores, 4.0);
        let (many, _) = for_one_rank(profile.clone(), link, 2, 64, 0.0);
        assert_eq!(many.shards, Some(1), "every rank reads at least one shard");
        let given = Link {
            server_cores: Some(1.5),
            ..link
        };
        assert_eq!(for_one_rank(profile, given, 2, 4, 0.0).1.server_cores, 1.5);
    }

    /// Loopback and this host's own addresses are unlimited; a name that does not resolve,
    /// or an address this host does not have, is measured.
    #[tokio::test]
    async fn servers_on_this_host_have_an_unlimited_link_and_others_a_measured_one() {
        for url in [
            "http://127.0.0.1:50051",
            "http://localhost:1",
            "grpc://[::1]:9",
            "http://127.0.0.2:80",
        ] {
            assert!(is_on_this_host(url).await, "{url}");
        }
        // TEST-NET-1 (RFC 5737): never an address of this host.
        for url in ["http://192.0.2.1:50051", "http://host.invalid:1", "not a url"] {
            assert!(!is_on_this_host(url).await, "{url}");
        }
        let local = Link::auto().resolve(&["http://127.0.0.1:1".into()]).await;
        assert_eq!(local.source, LinkSource::Local);
        assert!(local.bandwidth_bytes_per_s.is_infinite());
        assert_eq!(local.known(), LinkKnown::Local);
        let mixed = Link::auto()
            .resolve(&["http://127.0.0.1:1".into(), "http://192.0.2.1:1".into()])
            .await;
        assert_eq!(mixed.source, LinkSource::Measured);
        assert_eq!(mixed.known(), LinkKnown::Unknown);
        assert!(mixed.to_string().contains("assumed"), "{mixed}");
        // A given link stays as given, on loopback too.
        let given = Link::bandwidth(125e6)
            .resolve(&["http://127.0.0.1:1".into()])
            .await;
        assert_eq!(
            (given.source, given.known()),
            (LinkSource::Given, LinkKnown::Given(125e6))
        );
        assert_eq!(given.to_string(), "1000 Mbit/s (given)");
    }

    #[test]
    fn zero_rows_are_valid_values_of_every_shape_ops_emit() {
        let item = std::sync::Arc::new(Field::new("item", DataType::UInt8, false));
        for t in [
            DataType::Int32,
            DataType::Float64,
            DataType::Utf8,
            DataType::Binary,
            DataType::FixedSizeList(std::sync::Arc::clone(&item), 12),
            DataType::List(item),
        ] {
            let a = zeros(&t, 5).unwrap_or_else(|| panic!("{t}"));
            assert_eq!((a.len(), a.null_count(), a.data_type()), (5, 0, &t));
        }
    }

    #[test]
    fn the_trainers_own_steps_are_timed_on_the_fragments_output_shape() {
        let schema = Schema::new(vec![
            Field::new("image", DataType::Binary, false),
            Field::new("label", DataType::Int32, false),
        ]);
        let augmented = Pipeline::new("images")
            .map("decode_resize", "image", [64i64, 64], "pixels")
            .select(["pixels", "label"])
            .map("random_crop", "pixels", [56i64, 56], "pixels")
            .map("random_flip", "pixels", [0.5f64], "pixels")
            .batch(8);
        let ns = trainer_ns_per_row(&augmented, &schema, usize::MAX).expect("timed");
        assert!(ns > 0.0, "{ns}");
        // Nothing left to the trainer but batching: nothing to time.
        let plain = Pipeline::new("images")
            .map("decode_resize", "image", [64i64, 64], "pixels")
            .select(["pixels", "label"])
            .batch(8);
        assert_eq!(trainer_ns_per_row(&plain, &schema, usize::MAX), Some(0.0));
    }

    /// Servers without an op keep it, and every map after it, in the trainer, saying why.
    #[test]
    fn ops_the_servers_lack_stay_in_the_trainer() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("video", DataType::Binary, true),
        ]);
        let pipeline = Pipeline::new("videos")
            .filter("id > 3")
            .map("video_seconds", "video", Vec::<i64>::new(), "seconds")
            .map("decode_frames", "video", [8i64, 32, 32], "frames")
            .map("to_chw", "frames", Vec::<i64>::new(), "frames")
            .select(["frames", "seconds"]);
        let every: std::collections::BTreeSet<String> = pushdown_ops::registry()
            .iter()
            .map(|op| op.name().to_owned())
            .collect();
        assert_eq!(op_limit(&pipeline, &every), (usize::MAX, None));
        let mut no_video = every.clone();
        no_video.retain(|name| !name.starts_with("video_") && name != "decode_frames");
        assert_eq!(
            op_limit(&pipeline, &no_video),
            (0, Some("video_seconds".to_owned()))
        );
        let mut no_frames = every;
        no_frames.remove("decode_frames");
        let (limit, op) = op_limit(&pipeline, &no_frames);
        assert_eq!(limit, 1);
        let mut plan = pushdown_planner::plan_limited(&pipeline, &schema, limit).expect("plan");
        note_unrunnable(&mut plan, op.as_deref().expect("an op"));
        // The filter and video_seconds run at the server; decode_frames and after in the trainer.
        assert_eq!(plan.fragment.ops.len(), 1);
        assert_eq!(plan.fragment.predicate.as_deref(), Some("(id > 3)"));
        let reason = plan
            .placements
            .iter()
            .find(|p| p.step.contains("decode_frames"))
            .map(|p| (p.side, p.reason.clone()))
            .expect("placed");
        assert_eq!(reason.0, pushdown_planner::Side::Client);
        assert!(
            reason.1.contains("servers cannot run `decode_frames`"),
            "{}",
            reason.1
        );
    }
}
