//! Whether a node should receive client traffic: it knows a leader, and its state is close to
//! the leader's.
//!
//! "Close" is measured in log entries: this node's applied index may trail the commit index it
//! knows, and (on a follower) the leader's applied index, by at most `max_lag`. A follower cannot
//! see the leader's progress in its own Raft metrics, so it asks the leader (one `NodeInfo`
//! call, bounded by [`LEADER_TIMEOUT`], made as a client of the leader would make it: over TLS
//! and with a token when the cluster wants them). A leader additionally needs a recent
//! acknowledgement from a quorum, so that one cut off from its followers stops calling itself
//! ready, and a follower does not take the word of a leader that has been deposed or cut off
//! from a quorum since. A node that is shutting down, or handing its leadership over, is not
//! ready from the moment it refuses new requests, so a load balancer stops sending them while
//! it drains.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_rpc::proto::cluster_client::ClusterClient;
use baton_rpc::proto::{NodeInfoRequest, NodeInfoResponse};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::admission::Admission;
use crate::metrics::StoreStats;
use crate::node::NodeRef;

/// How long a follower waits for the leader's answer before it reports itself not ready.
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(1);

/// Judges a node's readiness.
pub struct Readiness {
    node: NodeRef,
    admission: Admission,
    stats: Arc<StoreStats>,
    max_lag: u64,
    /// A leader whose last quorum acknowledgement is older than this is not ready.
    max_quorum_silence: Duration,
    peer_addrs: BTreeMap<u64, String>,
    caller: LeaderCaller,
    /// The authorization the leader accepted last: tried first.
    accepted: std::sync::atomic::AtomicUsize,
    /// The connection to the leader, reused while the leader's address stays the same.
    leader_channel: Mutex<Option<(String, Channel)>>,
}

/// How a follower reaches its leader's client port: what any client of a protected cluster
/// presents there.
#[derive(Clone, Default)]
pub struct LeaderCaller {
    /// TLS towards the leader (this node's CA, and its certificate as the client's).
    pub tls: Option<ClientTlsConfig>,
    /// `Bearer <token>` for each of this node's client tokens, tried in turn until the leader
    /// accepts one (during a rotation the leader may know only some of them).
    pub authorizations: Vec<MetadataValue<Ascii>>,
}

impl Readiness {
    /// Judges `node`, behind `admission`'s gate: at most `max_lag` entries behind, and (as
    /// leader) acknowledged by a quorum within `max_quorum_silence`. `peer_addrs` overrides
    /// member addresses as in the Raft network; `caller` says how to call the leader.
    pub fn new(
        node: NodeRef,
        admission: Admission,
        stats: Arc<StoreStats>,
        max_lag: u64,
        max_quorum_silence: Duration,
        peer_addrs: BTreeMap<u64, String>,
        caller: LeaderCaller,
    ) -> Self {
        Self {
            node,
            admission,
            stats,
            max_lag,
            max_quorum_silence,
            peer_addrs,
            caller,
            accepted: std::sync::atomic::AtomicUsize::new(0),
            leader_channel: Mutex::new(None),
        }
    }

    /// `Ok` with a one-line summary when ready, `Err` with the reason when not.
    pub async fn check(&self) -> Result<String, String> {
        if self.admission.shutting_down() {
            return Err("shutting down: refusing new client requests".into());
        }
        if self.admission.is_closed() {
            return Err("handing leadership over: refusing new client requests meanwhile".into());
        }
        let raft = self.node.raft.metrics().borrow().clone();
        if let Err(fatal) = &raft.running_state {
            return Err(format!("raft has stopped: {fatal}"));
        }
        if raft
            .membership_config
            .membership()
            .voter_ids()
            .next()
            .is_none()
        {
            return Err("not part of an initialised cluster".into());
        }
        if raft
            .membership_config
            .membership()
            .get_node(&self.node.id)
            .is_none()
        {
            return Err(format!(
                "node {} is not a member of the cluster (removed)",
                self.node.id
            ));
        }
        let Some(leader) = raft.current_leader else {
            return Err("no leader is known".into());
        };
        let applied = raft.last_applied.map_or(0, |id| id.index);
        let committed = self.stats.committed();
        if committed.saturating_sub(applied) > self.max_lag {
            return Err(format!(
                "applying: applied index {applied}, commit index {committed}"
            ));
        }
        if leader == self.node.id {
            let silence = raft.millis_since_quorum_ack.map(Duration::from_millis);
            return match silence {
                Some(silence) if silence <= self.max_quorum_silence => Ok(format!(
                    "leader, applied index {applied}, commit index {committed}"
                )),
                Some(silence) => Err(format!(
                    "leader without a quorum acknowledgement for {silence:?}"
                )),
                None => Err("leader not yet acknowledged by a quorum".into()),
            };
        }
        let leader_applied = self.leader_applied(leader, raft.current_term).await?;
        if leader_applied.saturating_sub(applied) > self.max_lag {
            return Err(format!(
                "behind the leader: applied index {applied}, leader {leader} applied {leader_applied}"
            ));
        }
        Ok(format!(
            "follower of {leader}, applied index {applied}, leader applied {leader_applied}"
        ))
    }

    /// The applied index of `leader` (the leader of `term` as this node knows it), asked of the
    /// leader itself, which must still lead and be acknowledged by a quorum.
    async fn leader_applied(&self, leader: u64, term: u64) -> Result<u64, String> {
        let addr = self
            .peer_addrs
            .get(&leader)
            .cloned()
            .or_else(|| self.node.member_addr(leader))
            .ok_or_else(|| format!("leader {leader} has no known address"))?;
        let mut cluster = ClusterClient::new(self.channel(&addr)?);
        let tokens = self.caller.authorizations.len();
        let first = self.accepted.load(std::sync::atomic::Ordering::Relaxed);
        let mut last = String::new();
        // No token to present: one plain call.
        for turn in 0..tokens.max(1) {
            let which = (first + turn) % tokens.max(1);
            let mut request = tonic::Request::new(NodeInfoRequest {});
            if let Some(authorization) = self.caller.authorizations.get(which) {
                request
                    .metadata_mut()
                    .insert("authorization", authorization.clone());
            }
            match tokio::time::timeout(LEADER_TIMEOUT, cluster.node_info(request)).await {
                Ok(Ok(info)) => {
                    self.accepted
                        .store(which, std::sync::atomic::Ordering::Relaxed);
                    return judge_leader(
                        self.node.id,
                        leader,
                        term,
                        &info.into_inner(),
                        self.max_quorum_silence,
                    );
                }
                Ok(Err(status)) => {
                    last = format!(
                        "leader {leader} at {addr} answered {:?}: {}",
                        status.code(),
                        status.message()
                    );
                    if status.code() != tonic::Code::Unauthenticated {
                        break;
                    }
                }
                Err(_) => {
                    last = format!(
                        "leader {leader} at {addr} did not answer within {LEADER_TIMEOUT:?}"
                    );
                    break;
                }
            }
        }
        Err(last)
    }

    fn channel(&self, addr: &str) -> Result<Channel, String> {
        let mut cached = self
            .leader_channel
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((cached_addr, channel)) = cached.as_ref() {
            if cached_addr == addr {
                return Ok(channel.clone());
            }
        }
        let scheme = if self.caller.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| format!("bad leader address {addr:?}: {e}"))?
            .connect_timeout(LEADER_TIMEOUT);
        if let Some(tls) = &self.caller.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| format!("cannot use TLS towards {addr:?}: {e}"))?;
        }
        let channel = endpoint.connect_lazy();
        *cached = Some((addr.to_string(), channel.clone()));
        Ok(channel)
    }
}

/// The applied index in `info`, the answer of the node this follower (`me`) takes for the
/// leader of `term`, if that node says it still leads that term (or a later one), counts `me`
/// among its members, and a quorum acknowledged it within `max_quorum_silence`. A follower cut
/// off from the rest of the cluster can go on naming a leader that has been deposed, or that is
/// cut off from a quorum with it; neither can serve the clients this follower would take. A node
/// removed from the cluster may never hear of its removal (the leader stops sending to it), so
/// it learns it here, before its lag would show it after many writes.
fn judge_leader(
    me: u64,
    leader: u64,
    term: u64,
    info: &NodeInfoResponse,
    max_quorum_silence: Duration,
) -> Result<u64, String> {
    if info.role != "leader" || info.leader_id != Some(leader) || info.term < term {
        return Err(format!(
            "node {leader} no longer leads: it is {} in term {} (this node is in term {term})",
            info.role, info.term
        ));
    }
    if !info.members.iter().any(|member| member.id == me) {
        return Err(format!(
            "node {me} is not a member of the cluster (leader {leader} does not list it)"
        ));
    }
    // Absent from a leader that has not been acknowledged yet, and from older versions.
    if let Some(age) = info.quorum_ack_age_ms.map(Duration::from_millis) {
        if age > max_quorum_silence {
            return Err(format!(
                "leader {leader} without a quorum acknowledgement for {age:?}"
            ));
        }
    }
    Ok(info.applied_index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(role: &str, term: u64, leader: Option<u64>, ack: Option<u64>) -> NodeInfoResponse {
        NodeInfoResponse {
            id: 1,
            role: role.into(),
            term,
            leader_id: leader,
            applied_index: 42,
            quorum_ack_age_ms: ack,
            members: [1, 2, 3]
                .map(|id| baton_rpc::proto::Member {
                    id,
                    addr: format!("10.0.0.{id}:7001"),
                    voter: true,
                })
                .to_vec(),
            ..Default::default()
        }
    }

    const SILENCE: Duration = Duration::from_millis(600);

    /// The follower judging.
    const ME: u64 = 2;

    #[test]
    fn a_leader_that_still_leads_gives_its_applied_index() {
        assert_eq!(
            judge_leader(ME, 1, 5, &info("leader", 5, Some(1), Some(50)), SILENCE),
            Ok(42)
        );
        // Not yet acknowledged, or a version that does not say.
        assert_eq!(
            judge_leader(ME, 1, 5, &info("leader", 5, Some(1), None), SILENCE),
            Ok(42)
        );
    }

    #[test]
    fn a_deposed_or_cut_off_leader_makes_the_follower_not_ready() {
        for (why, answer) in [
            ("now a follower", info("follower", 6, Some(2), None)),
            ("a candidate", info("candidate", 6, None, None)),
            ("leads an older term", info("leader", 4, Some(1), Some(50))),
            ("names another leader", info("leader", 5, Some(2), Some(50))),
            ("no quorum", info("leader", 5, Some(1), Some(5_000))),
        ] {
            assert!(judge_leader(ME, 1, 5, &answer, SILENCE).is_err(), "{why}");
        }
    }

    #[test]
    fn a_leader_that_does_not_list_this_node_makes_it_not_ready() {
        let mut answer = info("leader", 5, Some(1), Some(50));
        answer.members.retain(|member| member.id != ME);
        let why = judge_leader(ME, 1, 5, &answer, SILENCE).expect_err("not a member");
        assert!(why.contains("not a member"), "{why}");
    }
}
