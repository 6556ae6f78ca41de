//! The gossip part: N agents in this process over chitchat's channel transport on a paused
//! clock (`warmpath_agent::cluster::scale`), one size at a time on a thread of its own.

use std::time::Duration;

use warmpath_agent::cluster::scale::{self, GossipFigures, GossipSettings};

use crate::Error;

/// Measures one size: a current-thread runtime started paused (virtual time), on its own
/// thread so the caller's runtime is not blocked.
pub async fn measure(settings: GossipSettings) -> Result<GossipFigures, Error> {
    let agents = settings.agents;
    let run = move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .map_err(|source| Error::Io {
                what: "a paused runtime for the gossip measurement".into(),
                source,
            })?;
        rt.block_on(scale::measure(&settings))
            .map_err(|e| Error::Setup(format!("gossip at {agents} agents: {e}")))
    };
    tokio::task::spawn_blocking(run)
        .await
        .map_err(|e| Error::Setup(format!("gossip at {agents} agents panicked: {e}")))?
}

/// The settings of one size.
pub fn settings(agents: usize, pods: usize, interval: Duration, phase: Duration) -> GossipSettings {
    GossipSettings {
        agents,
        pods,
        gossip_interval: interval,
        phase,
        // A busy engine's batches: one per pod every 100 ms.
        batch_every: Duration::from_millis(100),
        // Five phases of the round, as the usage measurement (docs/cluster.md).
        changes: 5,
        limit: Duration::from_secs(300),
    }
}
