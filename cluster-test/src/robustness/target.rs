//! What the nemesis needs from a cluster under test, so that the same faults, probes and
//! recovery run against `baton node` processes ([`Cluster`]: SIGKILL, SIGSTOP, TCP proxies) and
//! against containers ([`crate::docker::DockerCluster`]: `docker kill`, `docker pause`,
//! `docker network disconnect`).
//!
//! Every fault here is one a real deployment suffers; a target only decides how to inflict it.

use std::path::PathBuf;
use std::time::Duration;

use baton_rpc::proto::{NodeInfoResponse, StateDigestResponse};

use super::faults::LeaderFault;
use crate::cluster::Cluster;
use crate::wait;

/// A three-node (or larger) cluster the nemesis can break and mend.
///
/// The futures are awaited in place by the run that owns the target (never spawned), so the
/// trait does not promise `Send` futures.
#[allow(async_fn_in_trait)]
pub trait Target {
    /// Every node's client address, in id order (stopped nodes included).
    fn endpoints(&self) -> Vec<String>;
    /// The client address of node `id`.
    fn addr(&self, id: u64) -> String;
    /// Ids of every node, in order.
    fn ids(&self) -> Vec<u64>;
    /// Ids of the nodes that run (paused or isolated ones included; killed ones not).
    fn live_ids(&self) -> Vec<u64>;
    /// How long one wait (a leader, a restarted node, a node catching up) may take.
    fn timeout(&self) -> Duration;
    /// Node `id`'s own view of itself (one attempt, no retries).
    async fn node_info(&self, id: u64) -> Result<NodeInfoResponse, baton_rpc::Error>;
    /// Node `id`'s applied index and the digest of its state there (one attempt).
    async fn state_digest(&self, id: u64) -> Result<StateDigestResponse, baton_rpc::Error>;
    /// Kills node `id` without a graceful shutdown (SIGKILL).
    async fn kill(&mut self, id: u64) -> anyhow::Result<()>;
    /// Restarts a killed node from its data and waits until it answers.
    async fn restart(&mut self, id: u64) -> anyhow::Result<()>;
    /// Freezes node `id`: it keeps its connections and memory but runs nothing.
    async fn pause(&mut self, id: u64) -> anyhow::Result<()>;
    /// Lets a paused node go on.
    async fn resume(&mut self, id: u64) -> anyhow::Result<()>;
    /// Cuts node `id` off from every other node (clients still reach it).
    async fn isolate(&mut self, id: u64) -> anyhow::Result<()>;
    /// Undoes every cut and slowed link.
    async fn heal_all(&mut self) -> anyhow::Result<()>;
    /// Keeps what the run leaves behind (data, logs) for inspection; returns where it is.
    fn keep(&mut self) -> PathBuf;

    /// How this target inflicts `fault` and undoes it, in the words of the fault log
    /// (default: those of node processes).
    fn fault_words(&self, fault: LeaderFault) -> (&'static str, &'static str) {
        process_fault_words(fault)
    }

    /// Waits up to `limit` until one of `ids` says it leads at a term above `term`; returns its
    /// id.
    async fn new_leader(&self, ids: &[u64], term: u64, limit: Duration) -> anyhow::Result<u64> {
        wait::until("a new leader", limit, || async move {
            for id in ids {
                if let Ok(info) = self.node_info(*id).await {
                    if info.role == "leader" && info.term > term {
                        return Ok(*id);
                    }
                }
            }
            Err(format!("none of {ids:?} leads above term {term}"))
        })
        .await
    }

    /// Waits until the running nodes agree on one leader: it says it leads, and every other
    /// running node names it at the same term. Returns its id.
    async fn leader(&self) -> anyhow::Result<u64> {
        let live = self.live_ids();
        wait::until(
            "a leader every running node agrees on",
            self.timeout(),
            || {
                let live = live.clone();
                async move {
                    let mut infos = Vec::new();
                    for id in live {
                        match self.node_info(id).await {
                            Ok(info) => infos.push(info),
                            Err(error) => return Err(format!("node {id}: {error}")),
                        }
                    }
                    let leader = infos
                        .iter()
                        .find(|info| info.role == "leader")
                        .ok_or_else(|| format!("no node leads yet: {}", describe(&infos)))?;
                    let agreed = infos
                        .iter()
                        .all(|info| info.leader_id == Some(leader.id) && info.term == leader.term);
                    if agreed {
                        Ok(leader.id)
                    } else {
                        Err(format!("no agreement yet: {}", describe(&infos)))
                    }
                }
            },
        )
        .await
    }

    /// Waits until every running node has applied what the leader has applied right now;
    /// returns that index.
    async fn wait_all_caught_up(&self) -> anyhow::Result<u64> {
        let leader = self.leader().await?;
        let index = self.node_info(leader).await?.applied_index;
        for id in self.live_ids() {
            let what = format!("node {id} to apply index {index}");
            wait::until(&what, self.timeout(), || async move {
                match self.node_info(id).await {
                    Ok(info) if info.applied_index >= index => Ok(()),
                    Ok(info) => Err(format!(
                        "applied {} (last log {})",
                        info.applied_index, info.last_log_index
                    )),
                    Err(error) => Err(error.to_string()),
                }
            })
            .await?;
        }
        Ok(index)
    }
}

fn describe(infos: &[NodeInfoResponse]) -> String {
    infos
        .iter()
        .map(|i| format!("{}:{}@t{}(leader {:?})", i.id, i.role, i.term, i.leader_id))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Node processes: the [`Cluster`]'s own operations, unchanged.
impl Target for Cluster {
    fn endpoints(&self) -> Vec<String> {
        Cluster::endpoints(self)
    }

    fn addr(&self, id: u64) -> String {
        Cluster::addr(self, id).to_string()
    }

    fn ids(&self) -> Vec<u64> {
        Cluster::ids(self)
    }

    fn live_ids(&self) -> Vec<u64> {
        Cluster::live_ids(self)
    }

    fn timeout(&self) -> Duration {
        self.options().timeout
    }

    async fn node_info(&self, id: u64) -> Result<NodeInfoResponse, baton_rpc::Error> {
        Cluster::node_info(self, id).await
    }

    async fn state_digest(&self, id: u64) -> Result<StateDigestResponse, baton_rpc::Error> {
        Cluster::state_digest(self, id).await
    }

    /// A power loss of the node where its data dir can lose power ([`Cluster::lose_power_of`]),
    /// else a SIGKILL.
    async fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        Cluster::lose_power_of(self, id).await.map(|_| ())
    }

    fn fault_words(&self, fault: LeaderFault) -> (&'static str, &'static str) {
        match fault {
            LeaderFault::Kill if self.can_lose_power() => (
                "power loss (SIGKILL, then unsynced writes lost or partly kept) of",
                "restarted",
            ),
            other => process_fault_words(other),
        }
    }

    async fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        Cluster::restart(self, id).await
    }

    async fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        Cluster::pause(self, id)
    }

    async fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        Cluster::resume(self, id)
    }

    async fn isolate(&mut self, id: u64) -> anyhow::Result<()> {
        self.network()?.isolate(id);
        Ok(())
    }

    /// Nothing to heal without proxies.
    async fn heal_all(&mut self) -> anyhow::Result<()> {
        if let Ok(network) = self.network() {
            network.heal_all();
        }
        Ok(())
    }

    fn keep(&mut self) -> PathBuf {
        Cluster::keep(self)
    }

    async fn wait_all_caught_up(&self) -> anyhow::Result<u64> {
        Cluster::wait_all_caught_up(self).await
    }
}

/// How node processes suffer each fault and recover, in the words of the fault log.
fn process_fault_words(fault: LeaderFault) -> (&'static str, &'static str) {
    match fault {
        LeaderFault::Kill => ("SIGKILL", "restarted"),
        LeaderFault::Pause => ("SIGSTOP", "SIGCONT"),
        LeaderFault::Isolate => ("isolate", "heal"),
    }
}
