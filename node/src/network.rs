//! The Raft transport: openraft messages carried as codec bytes inside gRPC calls, over TLS with
//! this node's certificate when the node runs TLS.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_rpc::proto::raft::raft_client::RaftClient;
use baton_rpc::proto::raft::{raft_reply, RaftRequest};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::codec;
use crate::handover::TimeoutNow;
use crate::types::{NodeId, TypeConfig};

/// Largest Raft message accepted or sent (append batches and snapshot chunks).
pub const MAX_RAFT_MESSAGE_BYTES: usize = 256 << 20;

/// How long `TimeoutNow` may take to be answered.
const TIMEOUT_NOW_LIMIT: Duration = Duration::from_secs(2);

/// How often an idle peer connection is pinged, and how long a ping may go unanswered before the
/// connection is dropped (the next call then connects anew). A connection that a network
/// swallowed without a reset would otherwise carry every later call into the void until the
/// kernel gave up on it, minutes later.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Creates one [`Peer`] per replication target.
#[derive(Clone, Default)]
pub struct Network {
    /// Peers reached at another address than the membership's (NAT, proxies, fault injection).
    peer_addrs: Arc<BTreeMap<NodeId, String>>,
    /// TLS towards peers (trusting the cluster CA, presenting this node's certificate).
    tls: Option<ClientTlsConfig>,
    /// One HTTP/2 connection per peer address, shared by every client made for that peer.
    ///
    /// openraft 0.9 makes a new client not only per replication stream but for every read-index
    /// round (one per follower) and every election. A channel per client meant a new TCP
    /// connection and HTTP/2 handshake for each linearizable read round: hundreds a second under
    /// a read load, each leaving a socket in TIME_WAIT (5,300 after a 7 s `mixed-read` run),
    /// enough to exhaust the ephemeral ports towards a peer on a real network.
    channels: Arc<Mutex<HashMap<(NodeId, String), Channel>>>,
}

impl Network {
    /// A network that reaches the peers in `peer_addrs` at those addresses and every other
    /// peer at its address in the membership.
    pub fn new(peer_addrs: BTreeMap<NodeId, String>) -> Self {
        Self {
            peer_addrs: Arc::new(peer_addrs),
            tls: None,
            channels: Arc::default(),
        }
    }

    /// This network with its peer links over TLS.
    pub fn with_tls(mut self, tls: ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self.channels = Arc::default();
        self
    }

    /// The channel to peer `target`, whose membership address is `addr`: the shared one, made
    /// (connecting lazily, on its first call) when this address has none yet.
    fn channel(&self, target: NodeId, addr: &str) -> Result<Channel, String> {
        let addr = self.peer_addrs.get(&target).map_or(addr, String::as_str);
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        let key = (target, addr.to_string());
        if let Some(channel) = channels.get(&key) {
            return Ok(channel.clone());
        }
        let channel = self.connect_lazy(addr)?;
        // A peer's address changed: its old connection is not needed any more.
        channels.retain(|(id, _), _| *id != target);
        channels.insert(key, channel.clone());
        Ok(channel)
    }

    fn connect_lazy(&self, addr: &str) -> Result<Channel, String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| e.to_string())?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_millis(500))
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| e.to_string())?;
        }
        Ok(endpoint.connect_lazy())
    }

    /// Asks peer `target` to start an election now (leadership handover); returns its refusal
    /// or the transport failure as text.
    pub async fn timeout_now(
        &self,
        target: NodeId,
        addr: &str,
        message: &TimeoutNow,
    ) -> Result<(), String> {
        let channel = self.channel(target, addr)?;
        let body = codec::encode(message).map_err(|e| e.to_string())?;
        let mut client = RaftClient::new(channel);
        let call = client.timeout_now(RaftRequest { body });
        let reply = tokio::time::timeout(TIMEOUT_NOW_LIMIT, call)
            .await
            .map_err(|_| format!("node {target} did not answer within {TIMEOUT_NOW_LIMIT:?}"))?
            .map_err(|status| format!("node {target}: {}", status.message()))?
            .into_inner();
        match reply.result {
            Some(raft_reply::Result::Ok(_)) => Ok(()),
            Some(raft_reply::Result::Err(bytes)) => {
                let why: String = codec::decode(&bytes).map_err(|e| e.to_string())?;
                Err(why)
            }
            None => Err(format!("node {target} sent an empty reply")),
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        let channel = self.channel(target, &node.addr);
        Peer { target, channel }
    }
}

/// A connection to one peer.
pub struct Peer {
    target: NodeId,
    channel: Result<Channel, String>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl Peer {
    async fn send<Req, Resp, E>(
        &mut self,
        kind: Kind,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let channel = self
            .channel
            .clone()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&TransportError(e))))?;
        let body = codec::encode(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = RaftClient::new(channel)
            .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES);
        let request = RaftRequest { body };
        let call = async {
            match kind {
                Kind::Append => client.append_entries(request).await,
                Kind::Vote => client.vote(request).await,
                Kind::Snapshot => client.install_snapshot(request).await,
            }
        };
        let reply = match tokio::time::timeout(option.hard_ttl(), call).await {
            Err(_) => {
                let e = TransportError(format!("no answer within {:?}", option.hard_ttl()));
                return Err(RPCError::Unreachable(Unreachable::new(&e)));
            }
            Ok(Err(status)) => {
                let e = TransportError(format!("{:?}: {}", status.code(), status.message()));
                return Err(RPCError::Unreachable(Unreachable::new(&e)));
            }
            Ok(Ok(reply)) => reply.into_inner(),
        };
        match reply.result {
            Some(raft_reply::Result::Ok(bytes)) => {
                codec::decode(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))
            }
            Some(raft_reply::Result::Err(bytes)) => {
                let err: RaftError<NodeId, E> =
                    codec::decode(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
                Err(RPCError::RemoteError(RemoteError::new(self.target, err)))
            }
            None => Err(RPCError::Network(NetworkError::new(&TransportError(
                "empty raft reply".into(),
            )))),
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Append,
    Vote,
    Snapshot,
}

/// The most entry bytes one AppendEntries carries (its first entry goes even when larger).
///
/// openraft 0.9 gives an AppendEntries the heartbeat interval (50 ms by default) to be answered,
/// backs off 500 ms after a timeout and then resends from the same place. A follower behind by a
/// run of large entries (board seeds of 10,000 tasks, ~300 KB each, up to 64 per message, each a
/// sled blob file to write and sync) could not answer in time, again and again: it fell behind
/// the leader's purged log and, hearing nothing meanwhile, stood for election over and over,
/// unseating the leader (docs/benchmarks.md, "State scale"). openraft lets the transport send a
/// prefix of the entries and answer `PartialSuccess`, which bounds every message.
pub const APPEND_BUDGET_BYTES: usize = 512 << 10;

/// How many of the entries whose encoded sizes are `sizes` (in log order) one AppendEntries
/// carries: as many as fit in `budget`, and at least one.
fn entries_within(sizes: impl IntoIterator<Item = usize>, budget: usize) -> usize {
    let (mut count, mut total) = (0, 0usize);
    for size in sizes {
        total = total.saturating_add(size);
        if count > 0 && total > budget {
            break;
        }
        count += 1;
    }
    count
}

/// How long replication to a peer waits before each retry after a failed call: 20 ms, doubling to
/// at most 500 ms; a successful call starts the sequence over.
///
/// openraft 0.9's default is 500 ms from the first failure, and since an AppendEntries fails when
/// it is not answered within the heartbeat interval (50 ms), one slow answer (a follower writing
/// a snapshot image, say) silenced the leader towards that follower for 550 ms; a second in a row
/// outlasted its election timer (600–800 ms by default), and the follower stood for election and
/// unseated a healthy leader (docs/benchmarks.md, "State scale"). A peer that is really gone is
/// still retried only every 500 ms after the first ~0.6 s.
fn retry_delays() -> impl Iterator<Item = Duration> + Send + 'static {
    (0u32..).map(|attempt| Duration::from_millis((20u64 << attempt.min(5)).min(500)))
}

impl RaftNetwork<TypeConfig> for Peer {
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(retry_delays())
    }

    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        let all = rpc.entries.len();
        let keep = if all > 1 {
            entries_within(
                rpc.entries.iter().map(codec::encoded_len),
                APPEND_BUDGET_BYTES,
            )
        } else {
            all
        };
        if keep == all {
            return self.send(Kind::Append, &rpc, &option).await;
        }
        rpc.entries.truncate(keep);
        let last_sent = rpc.entries.last().map(|entry| entry.log_id);
        let response = self.send(Kind::Append, &rpc, &option).await?;
        Ok(match response {
            AppendEntriesResponse::Success => AppendEntriesResponse::PartialSuccess(last_sent),
            other => other,
        })
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.send(Kind::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.send(Kind::Vote, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_append_carries_what_fits_the_budget_and_at_least_one_entry() {
        assert_eq!(entries_within([100, 100, 100], 250), 2);
        assert_eq!(entries_within([100, 100, 100], 300), 3);
        assert_eq!(
            entries_within([400, 100], 250),
            1,
            "a large first entry goes alone"
        );
        assert_eq!(entries_within([100, 400, 100], 250), 1);
        assert_eq!(entries_within(std::iter::empty(), 250), 0);
        assert_eq!(entries_within([usize::MAX, 1], 250), 1);
    }

    /// A listener that accepts TCP connections, counts them and never answers on them.
    async fn silent_listener() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(socket);
            }
        });
        (addr, accepted)
    }

    /// Sends one vote through a fresh client for peer 2 at `addr` (unanswered: it times out).
    async fn call_through_new_client(network: &mut Network, addr: &str) {
        let mut peer = network.new_client(2, &BasicNode::new(addr)).await;
        let vote = VoteRequest::new(openraft::Vote::new(1, 1), None);
        let option = RPCOption::new(Duration::from_millis(100));
        assert!(peer.vote(vote, option).await.is_err(), "nobody answers");
    }

    #[tokio::test]
    async fn the_clients_made_for_one_peer_share_one_connection() {
        let (addr, accepted) = silent_listener().await;
        let mut network = Network::default();
        for _ in 0..3 {
            call_through_new_client(&mut network, &addr).await;
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);

        // The peer moved: its next client connects to the new address.
        let (moved, accepted_there) = silent_listener().await;
        call_through_new_client(&mut network, &moved).await;
        call_through_new_client(&mut network, &moved).await;
        assert_eq!(accepted_there.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(
            network.channels.lock().unwrap().len(),
            1,
            "the old one is let go"
        );
    }

    #[tokio::test]
    async fn a_connection_whose_peer_stops_answering_is_replaced() {
        let (addr, accepted) = silent_listener().await;
        let mut network = Network::default();
        call_through_new_client(&mut network, &addr).await;
        // The keep-alive pings go unanswered: the connection is dropped, the next call dials anew.
        tokio::time::sleep(KEEP_ALIVE_INTERVAL + KEEP_ALIVE_TIMEOUT + Duration::from_millis(500))
            .await;
        call_through_new_client(&mut network, &addr).await;
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn retries_start_soon_and_back_off_to_half_a_second() {
        let delays: Vec<u64> = retry_delays()
            .take(8)
            .map(|d| d.as_millis() as u64)
            .collect();
        assert_eq!(delays, [20, 40, 80, 160, 320, 500, 500, 500]);
    }
}
