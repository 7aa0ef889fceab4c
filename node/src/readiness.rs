//! Whether a node should receive client traffic: it knows a leader, and its state is close to
//! the leader's.
//!
//! "Close" is measured in log entries: this node's applied index may trail the commit index it
//! knows, and (on a follower) the leader's applied index, by at most `max_lag`. A follower cannot
//! see the leader's progress in its own Raft metrics, so it asks the leader (one `NodeInfo`
//! call, bounded by [`LEADER_TIMEOUT`], made as a client of the leader would make it: over TLS
//! and with a token when the cluster wants them). A leader additionally needs a recent
//! acknowledgement from a quorum, so that one cut off from its followers stops calling itself
//! ready. A node that is shutting down is not ready from the moment it refuses new requests, so
//! a load balancer stops sending them while it drains.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_rpc::proto::cluster_client::ClusterClient;
use baton_rpc::proto::NodeInfoRequest;
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
        let leader_applied = self.leader_applied(leader).await?;
        if leader_applied.saturating_sub(applied) > self.max_lag {
            return Err(format!(
                "behind the leader: applied index {applied}, leader {leader} applied {leader_applied}"
            ));
        }
        Ok(format!(
            "follower of {leader}, applied index {applied}, leader applied {leader_applied}"
        ))
    }

    /// The leader's applied index, asked of the leader itself.
    async fn leader_applied(&self, leader: u64) -> Result<u64, String> {
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
                    return Ok(info.into_inner().applied_index);
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
