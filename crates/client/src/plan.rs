//! Planning a pipeline against a server's measurements of it.

use pushdown_planner::{CostedPlan, Environment, Pipeline, plan_with_profile};
use pushdown_protocol::{Profile, Query, ScanRequest};

use crate::{PushdownClient, Result};

/// The link to the servers and the machines at both ends, as the planner needs them.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    pub bandwidth_bytes_per_s: f64,
    pub server_cores: Option<f64>,
    pub client_cores: Option<f64>,
}

impl Link {
    pub fn bandwidth(bandwidth_bytes_per_s: f64) -> Self {
        Self {
            bandwidth_bytes_per_s,
            server_cores: None,
            client_cores: None,
        }
    }
}

/// Plans `pipeline`, placing its ops by the server's measurements of them when it has any.
pub async fn costed_plan(
    client: &PushdownClient,
    pipeline: &Pipeline,
    schema: &arrow::datatypes::Schema,
    link: Link,
) -> Result<CostedPlan> {
    let static_plan = pushdown_planner::plan(pipeline, schema)?;
    let profile = if static_plan.fragment.ops.is_empty() {
        Profile::default()
    } else {
        client
            .profile(&ScanRequest::new(Query::Fragment(static_plan.fragment.clone())))
            .await?
    };
    let env = Environment {
        bandwidth_bytes_per_s: link.bandwidth_bytes_per_s,
        // Every server of the fleet streams shards at once.
        server_cores: link
            .server_cores
            .unwrap_or(f64::from(profile.server_cores.max(1)) * client.urls().len() as f64),
        client_cores: link
            .client_cores
            .unwrap_or(std::thread::available_parallelism().map_or(1, |n| n.get()) as f64),
    };
    Ok(plan_with_profile(pipeline, schema, &profile, &env)?)
}
