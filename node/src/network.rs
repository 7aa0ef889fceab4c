//! The client side of the Raft transport: openraft messages sent to peers as [`raft_wire`]
//! frames, over TLS with this node's certificate when the node runs TLS.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
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
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::cluster_id::OwnCluster;
use crate::codec;
use crate::handover::TimeoutNow;
use crate::pre_vote::PreVote;
use crate::raft_wire::{self, Header, Kind, Link, Outcome};
use crate::throttle::Throttle;
use crate::tls::{PeerConnector, TLS_REFUSAL};
use crate::types::{NodeId, TypeConfig};

/// How long `TimeoutNow` may take to be answered.
const TIMEOUT_NOW_LIMIT: Duration = Duration::from_secs(2);

/// How long dialing a peer may take. A call waits for it only until its own limit; the dial goes
/// on, and a connection made later is kept (see `Network::dial_kept`).
const CONNECT_LIMIT: Duration = Duration::from_secs(2);

/// How many connections to one peer there are at most; a call that finds them all in use waits
/// (within its own deadline) for one to come free.
///
/// openraft 0.9 makes a new client not only per replication stream but for every read-index
/// round (one per follower) and every election, and a round ends once a quorum answered, leaving
/// the call to the slowest follower running. A connection per client would mean a TCP connect
/// (and TLS handshake) for each linearizable read round: hundreds a second under a read load,
/// each leaving a socket in TIME_WAIT (5,300 after a 7 s `mixed-read` run when that was so),
/// enough to exhaust the ephemeral ports towards a peer on a real network. So connections
/// outlive clients: a call takes an idle one (or dials), and gives it back when answered, and
/// every connection made is kept.
const MAX_LINKS: usize = 8;

/// How many of a peer's [`MAX_LINKS`] may carry AppendEntries without entries (heartbeats,
/// commit-only appends and read-index rounds) at once; the others are left to entries, votes
/// and snapshots. A heartbeat that finds them all in use fails at once, as busy.
///
/// A read-index round ends once a quorum answered and leaves its call to a slow follower running
/// until that call's deadline, and under a read load rounds follow each other faster than that:
/// without a cap the leftover calls to a follower that is briefly slow (an fsync stall, a
/// snapshot being written) took every link, and the AppendEntries carrying its entries waited
/// behind them until they failed, which openraft took for an unreachable peer (a backoff during
/// which nothing is sent to it).
const MAX_HEARTBEAT_LINKS: usize = MAX_LINKS - 2;

/// What a call carries, for the links it may use (see [`MAX_HEARTBEAT_LINKS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Traffic {
    /// An AppendEntries without entries: a heartbeat or a read-index round.
    Heartbeat,
    /// Everything else: entries, votes, snapshots, handovers.
    Other,
}

/// What a call holds while it uses (or dials) a link: one of the peer's [`MAX_LINKS`], and for a
/// heartbeat one of its [`MAX_HEARTBEAT_LINKS`].
struct Slot {
    _link: OwnedSemaphorePermit,
    _heartbeat: Option<OwnedSemaphorePermit>,
}

/// How much sooner than openraft's limit a call gives up on its own.
const CALL_MARGIN: Duration = Duration::from_millis(3);

/// The least time a call must have left once its turn comes to use a connection (or half of what
/// it had to begin with, if that is less): with less, it
/// gives up as busy (openraft retries it without backing off) rather than write its request and
/// miss the answer — which drops a healthy connection with the answer unread and reports the
/// peer unreachable — or start a dial that cannot finish, which pauses every dial to a peer that
/// is only busy.
const LEAST_TURN: Duration = Duration::from_millis(2);

/// Whether a call that had `had` to be answered in, and `left` once a connection came free, gives
/// up as busy: less than [`LEAST_TURN`] left, or than half of what it had — so that a short
/// limit (a heartbeat of a few ms on a fast network) still sends when its turn comes at once.
fn too_late(had: Duration, left: Duration) -> bool {
    left < LEAST_TURN.min(had / 2)
}

/// How long after a failed dial, a fresh connection left unanswered, or a refusal that closed the
/// connection, no new connection to that peer is tried: calls meanwhile fail at once. Without it
/// every call to an unreachable peer (openraft retries replication every 20–500 ms and makes a
/// client for every read-index round) would open a connection of its own, and a network that
/// swallows connections would soon hold thousands.
const REDIAL_PAUSE: Duration = Duration::from_millis(100);

/// Creates one [`Peer`] per replication target, and keeps the connections to each peer.
///
/// A connection is used by one call at a time, and dropped when a call on it fails or goes
/// unanswered; when a kept one turns out broken, the others kept for that peer are dropped too.
/// TCP keepalive ([`raft_wire::tune`]) breaks idle connections to a peer that vanished.
#[derive(Clone, Default)]
pub struct Network {
    /// Peers reached at another address than the membership's (NAT, proxies, fault injection).
    peer_addrs: Arc<BTreeMap<NodeId, String>>,
    /// TLS towards peers (trusting the cluster CA, presenting this node's certificate).
    tls: Option<PeerConnector>,
    /// The connections kept per peer.
    peers: Arc<Mutex<HashMap<NodeId, Links>>>,
    /// The cluster named in every request ([`crate::cluster_id`]).
    cluster: OwnCluster,
    /// Warnings of TLS handshakes that failed.
    tls_warned: Throttle,
}

/// The connections kept to one peer.
struct Links {
    /// The address they lead to.
    addr: String,
    /// Connections answered last time and not in use.
    idle: Vec<Link>,
    /// One per connection, idle or in use: [`MAX_LINKS`].
    permits: Arc<Semaphore>,
    /// Taken first by a heartbeat: [`MAX_HEARTBEAT_LINKS`].
    heartbeats: Arc<Semaphore>,
    /// No new connection before this instant (see [`REDIAL_PAUSE`]).
    quiet_until: Option<Instant>,
}

impl Links {
    fn to(addr: &str) -> Self {
        Self {
            addr: addr.to_string(),
            idle: Vec::new(),
            permits: Arc::new(Semaphore::new(MAX_LINKS)),
            heartbeats: Arc::new(Semaphore::new(MAX_HEARTBEAT_LINKS)),
            quiet_until: None,
        }
    }
}

impl Network {
    /// A network that reaches the peers in `peer_addrs` at those addresses and every other
    /// peer at its address in the membership, on behalf of a node of `cluster`.
    pub fn new(peer_addrs: BTreeMap<NodeId, String>, cluster: OwnCluster) -> Self {
        Self {
            peer_addrs: Arc::new(peer_addrs),
            tls: None,
            peers: Arc::default(),
            cluster,
            tls_warned: Throttle::default(),
        }
    }

    /// The header of a request to `to`.
    fn header(&self, to: NodeId) -> Header {
        Header {
            cluster: self.cluster.get(),
            to,
        }
    }

    /// This network with its peer links over TLS.
    pub fn with_tls(mut self, tls: PeerConnector) -> Self {
        self.tls = Some(tls);
        self.peers = Arc::default();
        self
    }

    /// The address peer `target`, whose membership address is `addr`, is reached at.
    fn address(&self, target: NodeId, addr: &str) -> String {
        self.peer_addrs
            .get(&target)
            .map_or(addr, String::as_str)
            .to_string()
    }

    /// The permits for calls to peer `target` at `addr` (all calls', heartbeats'), where a call
    /// starts. When the peer moved, what was kept for its old address is let go first.
    fn permits(&self, target: NodeId, addr: &str) -> (Arc<Semaphore>, Arc<Semaphore>) {
        let mut peers = lock(&self.peers);
        let links = peers.entry(target).or_insert_with(|| Links::to(addr));
        if links.addr != addr {
            *links = Links::to(addr);
        }
        (links.permits.clone(), links.heartbeats.clone())
    }

    /// Waits (until `deadline`) for a link to `target` at `addr` that `traffic` may use.
    async fn slot(
        &self,
        target: NodeId,
        addr: &str,
        traffic: Traffic,
        deadline: Instant,
    ) -> Result<Slot, CallFailure> {
        let busy = |limit: usize| {
            CallFailure::busy(format!(
                "node {target} at {addr}: all {limit} connections busy"
            ))
        };
        let (permits, heartbeats) = self.permits(target, addr);
        let heartbeat = match traffic {
            // Another heartbeat is due soon: no point in waiting for this one's turn.
            Traffic::Heartbeat => Some(
                heartbeats
                    .try_acquire_owned()
                    .map_err(|_| busy(MAX_HEARTBEAT_LINKS))?,
            ),
            Traffic::Other => None,
        };
        let link = tokio::time::timeout_at(deadline, permits.acquire_owned())
            .await
            .map_err(|_| busy(MAX_LINKS))?
            .map_err(|e| CallFailure::unsent(e.to_string()))?;
        Ok(Slot {
            _link: link,
            _heartbeat: heartbeat,
        })
    }

    /// Runs `f` on what is kept for peer `target` at `addr`; does nothing if the peer has moved
    /// since the call began, since what a call to its old address learns (a connection, a
    /// failure) says nothing about the new one.
    fn with_links<T>(
        &self,
        target: NodeId,
        addr: &str,
        f: impl FnOnce(&mut Links) -> T,
    ) -> Option<T> {
        lock(&self.peers)
            .get_mut(&target)
            .filter(|links| links.addr == addr)
            .map(f)
    }

    /// An idle connection to `target` at `addr`, if one is kept.
    fn take_idle(&self, target: NodeId, addr: &str) -> Option<Link> {
        self.with_links(target, addr, |links| links.idle.pop())
            .flatten()
    }

    /// Keeps `link`, just answered (or just made), for the next call to `target` at `addr`;
    /// beyond [`MAX_LINKS`] kept, it is closed.
    fn give_back(&self, target: NodeId, addr: &str, link: Link) {
        self.with_links(target, addr, |links| {
            links.quiet_until = None;
            if links.idle.len() < MAX_LINKS {
                links.idle.push(link);
            }
        });
    }

    /// A new connection to `addr`: TCP without Nagle's delay, the preamble, and TLS when the
    /// node runs it.
    async fn dial(&self, addr: &str) -> Result<Link, String> {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        raft_wire::tune(&stream);
        stream
            .write_all(&raft_wire::PREAMBLE)
            .await
            .map_err(|e| format!("cannot write to {addr}: {e}"))?;
        let stream: Box<dyn raft_wire::Stream> = match &self.tls {
            None => Box::new(stream),
            // A certificate the peers refuse (another CA, missing usages, expired) keeps this
            // node from following or leading, and openraft reports failed calls only at debug
            // level: said here as a warning.
            Some(tls) => Box::new(tls.connect(addr, stream).await.inspect_err(|why| {
                if why.contains(TLS_REFUSAL) && self.tls_warned.due() {
                    tracing::warn!(%why, "cannot reach a peer over TLS");
                }
            })?),
        };
        Ok(raft_wire::link(stream))
    }

    /// Dials `addr` (within [`CONNECT_LIMIT`]) in a task of its own, which holds `slot` until the
    /// dial ends, and hands the connection and the slot back by `deadline`. When the caller has stopped waiting, the connection, once made, is
    /// kept for the next call to `target`: on a link where a new connection takes longer than a
    /// call may (TLS takes about three round trips, an AppendEntries gets one heartbeat), dialing
    /// only within calls would fail every time, and the peer would not be reached again.
    async fn dial_kept(
        &self,
        target: NodeId,
        addr: &str,
        slot: Slot,
        deadline: Instant,
    ) -> Result<(Link, Slot), String> {
        let (made, mut wanted) = oneshot::channel();
        let (network, owned) = (self.clone(), addr.to_string());
        tokio::spawn(async move {
            let addr = owned;
            let dialed = tokio::time::timeout(CONNECT_LIMIT, network.dial(&addr))
                .await
                .unwrap_or_else(|_| Err(format!("cannot connect to {addr} in {CONNECT_LIMIT:?}")));
            match made.send(dialed.map(|link| (link, slot))) {
                Ok(()) => {}
                Err(Ok((link, _slot))) => network.give_back(target, &addr, link),
                Err(Err(why)) => tracing::debug!(peer = target, %why, "a dial outlived its call"),
            }
        });
        match tokio::time::timeout_at(deadline, &mut wanted).await {
            Ok(dialed) => dialed.unwrap_or_else(|_| Err("the dial task ended".to_string())),
            Err(_) => {
                // Made just as the wait ended: kept all the same.
                wanted.close();
                if let Ok(Ok((link, _slot))) = wanted.try_recv() {
                    self.give_back(target, addr, link);
                }
                Err(format!("cannot connect to node {target} at {addr} in time"))
            }
        }
    }

    /// Sends `frame`, a `kind` request which carries `traffic`, to peer `target` at `addr` and
    /// returns the answer by `deadline` (dialing included). Every failure is a transport failure.
    async fn call(
        &self,
        target: NodeId,
        addr: &str,
        (kind, traffic): (Kind, Traffic),
        frame: Bytes,
        deadline: Instant,
    ) -> Result<(Outcome, Bytes), CallFailure> {
        let unanswered =
            || CallFailure::sent(format!("node {target} at {addr}: no answer in time"));
        let had = deadline.saturating_duration_since(Instant::now());
        let slot = self.slot(target, addr, traffic, deadline).await?;
        if too_late(had, deadline.saturating_duration_since(Instant::now())) {
            return Err(CallFailure::busy(format!(
                "node {target} at {addr}: a connection came free too late to use"
            )));
        }
        if let Some(link) = self.take_idle(target, addr) {
            match exchange(link, frame.clone(), deadline).await {
                Ok((link, answer)) => return self.answered(target, addr, kind, link, answer),
                // A slow peer, or a dead connection that keepalive has not broken yet: only
                // this connection is dropped (the peer's others may be fine).
                Err(Failure::Late) => return Err(unanswered()),
                // A kept connection that broke: the peer restarted, say, and the others kept
                // for it are likely broken too. Forget them and dial once, within the same
                // limit; Raft's requests may safely arrive twice.
                Err(Failure::Broken(_)) => {
                    self.with_links(target, addr, |links| links.idle.clear());
                }
            }
        }
        let now = Instant::now();
        if let Some(until) = self
            .with_links(target, addr, |links| links.quiet_until)
            .flatten()
        {
            if now < until {
                return Err(CallFailure::unsent(format!(
                    "node {target} at {addr} was unreachable just now; next try in {:?}",
                    until - now
                )));
            }
        }
        let failure = match self.dial_kept(target, addr, slot, deadline).await {
            Err(why) => CallFailure::unsent(why),
            Ok((link, _slot)) => match exchange(link, frame, deadline).await {
                Ok((link, answer)) => return self.answered(target, addr, kind, link, answer),
                Err(Failure::Late) => unanswered(),
                Err(Failure::Broken(why)) => {
                    CallFailure::sent(format!("node {target} at {addr}: {why}"))
                }
            },
        };
        self.with_links(target, addr, |links| {
            links.quiet_until = Some(Instant::now() + REDIAL_PAUSE);
        });
        Err(failure)
    }

    /// The outcome and body of `answer` to a `kind` request, which came over `link`; the link is
    /// kept for the next call unless the peer is closing it (after a request it could not
    /// handle).
    fn answered(
        &self,
        target: NodeId,
        addr: &str,
        kind: Kind,
        link: Link,
        answer: Bytes,
    ) -> Result<(Outcome, Bytes), CallFailure> {
        let (outcome, body) = raft_wire::parse_answer(answer)
            .map_err(|e| CallFailure::sent(format!("node {target} at {addr}: {e}")))?;
        match outcome {
            // A build from before the question fails it and closes the connection, which says
            // nothing of the next request: pausing would fail the replication to that peer
            // meanwhile, at every question.
            Outcome::Failed if kind == Kind::Rules => {}
            // The peer closes the connection after such a refusal (of this node or this cluster,
            // say): a new one at once would most likely be refused too, and redialing on every
            // call (read-index rounds keep coming) costs both nodes a handshake each time.
            Outcome::Failed => {
                self.with_links(target, addr, |links| {
                    links.quiet_until = Some(Instant::now() + REDIAL_PAUSE);
                });
            }
            Outcome::Answered | Outcome::Refused => self.give_back(target, addr, link),
        }
        Ok((outcome, body))
    }

    /// Asks peer `target` to start an election now (leadership handover).
    pub async fn timeout_now(
        &self,
        target: NodeId,
        addr: &str,
        message: &TimeoutNow,
    ) -> Result<(), Declined> {
        self.ask(target, addr, Kind::TimeoutNow, message, TIMEOUT_NOW_LIMIT)
            .await
    }

    /// Asks voter `target` whether it would vote for this node (a pre-vote) within `limit`.
    pub async fn pre_vote(
        &self,
        target: NodeId,
        addr: &str,
        message: &PreVote,
        limit: Duration,
    ) -> Result<(), Declined> {
        self.ask(target, addr, Kind::PreVote, message, limit).await
    }

    /// Asks new member `target` to join this node's cluster within `limit` (initialization).
    pub async fn join(&self, target: NodeId, addr: &str, limit: Duration) -> Result<(), Declined> {
        self.ask(target, addr, Kind::Join, &(), limit).await
    }

    /// Asks member `target` whether its build applies `rules` (`crate::rules_adoption`), within
    /// `limit`.
    pub async fn applies_rules(
        &self,
        target: NodeId,
        addr: &str,
        rules: u32,
        limit: Duration,
    ) -> Result<(), Declined> {
        self.ask(target, addr, Kind::Rules, &rules, limit).await
    }

    /// What the build of node `target` at `addr`, a member or not yet one, says of `rules`
    /// (`members add` asks before the node joins), within `limit`.
    pub async fn rules_verdict(
        &self,
        target: NodeId,
        addr: &str,
        rules: u32,
        limit: Duration,
    ) -> RulesVerdict {
        match self
            .exchange(target, addr, Kind::Rules, &rules, limit)
            .await
        {
            Ok((Outcome::Answered, _)) => RulesVerdict::Applies,
            Ok((Outcome::Refused, body)) => {
                // Most often the node is not added: its connection is not kept for later.
                let dialed = self.address(target, addr);
                self.with_links(target, &dialed, |links| links.idle.clear());
                match codec::decode::<String>(&body) {
                    Ok(why) => RulesVerdict::AppliesNot(format!("its build says: {why}")),
                    Err(e) => {
                        RulesVerdict::Unknown(format!("node {target}: undecodable answer: {e}"))
                    }
                }
            }
            Ok((Outcome::Failed, body)) => {
                let why = String::from_utf8_lossy(&body);
                if why.starts_with(UNKNOWN_KIND) {
                    RulesVerdict::AppliesNot(
                        "the build at that address is from before versioned apply rules: run a \
                         newer build"
                            .into(),
                    )
                } else {
                    RulesVerdict::Unknown(format!("node {target}: {why}"))
                }
            }
            Err(declined) => RulesVerdict::Unknown(declined.to_string()),
        }
    }

    /// Sends `target` a request of Baton's own whose answer is a yes or a refusal in words.
    async fn ask<T: Serialize>(
        &self,
        target: NodeId,
        addr: &str,
        kind: Kind,
        message: &T,
        limit: Duration,
    ) -> Result<(), Declined> {
        let (outcome, body) = self.exchange(target, addr, kind, message, limit).await?;
        match outcome {
            Outcome::Answered => Ok(()),
            Outcome::Refused => Err(Declined::Refused(
                codec::decode(&body).map_err(|e| Declined::Refused(e.to_string()))?,
            )),
            // The peer could not handle the request, so it did not act on it.
            Outcome::Failed => Err(Declined::Refused(format!(
                "node {target}: {}",
                String::from_utf8_lossy(&body)
            ))),
        }
    }

    /// Sends `target` a request of Baton's own: the answer's outcome and body, or why none came.
    async fn exchange<T: Serialize>(
        &self,
        target: NodeId,
        addr: &str,
        kind: Kind,
        message: &T,
        limit: Duration,
    ) -> Result<(Outcome, Bytes), Declined> {
        let deadline = call_deadline(Instant::now(), limit);
        let addr = self.address(target, addr);
        let frame = raft_wire::request(kind, self.header(target), message)
            .map_err(|e| Declined::Refused(e.to_string()))?;
        self.call(target, &addr, (kind, Traffic::Other), frame, deadline)
            .await
            .map_err(|failure| {
                let why = format!("node {target}: {}", failure.why);
                if failure.delivery == Delivery::Sent {
                    Declined::Unanswered(why)
                } else {
                    Declined::Refused(why)
                }
            })
    }
}

/// How a build that does not know a request kind fails it (every build so far: the words of
/// [`raft_wire::WireError::UnknownKind`]).
const UNKNOWN_KIND: &str = "unknown request kind";

/// What a node's build says of a version of the apply rules ([`Network::rules_verdict`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RulesVerdict {
    /// It applies them.
    Applies,
    /// It does not, for the reason given: it answered no, or its build is older than the
    /// question (it fails it as an unknown request).
    AppliesNot(String),
    /// No answer that says either: the node could not be reached, or refused the request itself
    /// (it belongs to another cluster, say).
    Unknown(String),
}

/// Why a peer did not say yes to one of Baton's own requests.
#[derive(Debug, thiserror::Error)]
pub enum Declined {
    /// The peer did not act on the request: it answered no (for the reason given), could not
    /// handle it, or never got it (no connection, the redial pause, every connection busy).
    #[error("{0}")]
    Refused(String),
    /// The request went out and no usable answer came (the time limit, a connection that broke
    /// after the send, an answer that could not be read): the peer may have acted on it.
    #[error("{0}")]
    Unanswered(String),
}

/// A call that got no answer, and whether its request went out (so the peer may have acted).
#[derive(Debug)]
struct CallFailure {
    why: String,
    delivery: Delivery,
}

/// How far a failed call got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// The request went out: it may have been handled.
    Sent,
    /// It never left: the peer could not be reached.
    Unsent,
    /// It never left: every connection it may use was busy with earlier calls to the peer (a
    /// slow peer, not a missing one).
    Busy,
}

impl CallFailure {
    fn sent(why: String) -> Self {
        Self {
            why,
            delivery: Delivery::Sent,
        }
    }

    fn unsent(why: String) -> Self {
        Self {
            why,
            delivery: Delivery::Unsent,
        }
    }

    fn busy(why: String) -> Self {
        Self {
            why,
            delivery: Delivery::Busy,
        }
    }

    /// How openraft is told: a busy peer is a network error, which it retries with the next
    /// heartbeat or entries; anything else makes it back off (see [`retry_delays`]), so that an
    /// unreachable peer is not dialled at every turn.
    fn into_rpc_error<E: std::error::Error>(self) -> RpcError<E> {
        let error = TransportError(self.why);
        match self.delivery {
            Delivery::Busy => RPCError::Network(NetworkError::new(&error)),
            Delivery::Sent | Delivery::Unsent => RPCError::Unreachable(Unreachable::new(&error)),
        }
    }
}

/// When a call given `limit` from `started` gives up on its own: a little before openraft drops
/// it, so that a late answer is still booked (the connection dropped, the redial pause set).
fn call_deadline(started: Instant, limit: Duration) -> Instant {
    started + limit.saturating_sub(CALL_MARGIN).max(limit / 2)
}

/// Why an exchange on a connection failed.
enum Failure {
    /// No answer by the deadline (the connection is dropped: its state is unknown).
    Late,
    /// The connection broke or sent something that is not a frame.
    Broken(String),
}

/// Writes `frame` on `link` and reads the answer, by `deadline`; gives the link back with it.
async fn exchange(
    mut link: Link,
    frame: Bytes,
    deadline: Instant,
) -> Result<(Link, Bytes), Failure> {
    let talk = async {
        link.send(frame).await.map_err(|e| e.to_string())?;
        match link.next().await {
            Some(Ok(answer)) => Ok(answer.freeze()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("the connection was closed".to_string()),
        }
    };
    match tokio::time::timeout_at(deadline, talk).await {
        Err(_) => Err(Failure::Late),
        Ok(Err(why)) => Err(Failure::Broken(why)),
        Ok(Ok(answer)) => Ok((link, answer)),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer {
            target,
            addr: self.address(target, &node.addr),
            network: self.clone(),
        }
    }
}

/// One peer, as openraft's replication, elections and read-index rounds see it.
pub struct Peer {
    target: NodeId,
    addr: String,
    network: Network,
}

type RpcError<E> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;
type RpcResult<T, E> = Result<T, RpcError<E>>;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl Peer {
    /// Sends `request`, which carries `traffic` and which openraft handed over at `started`
    /// with `option`'s limit.
    async fn send<Req, Resp, E>(
        &mut self,
        kind: Kind,
        traffic: Traffic,
        request: &Req,
        started: Instant,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let deadline = call_deadline(started, option.hard_ttl());
        let frame = raft_wire::request(kind, self.network.header(self.target), request)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let (outcome, body) = self
            .network
            .call(self.target, &self.addr, (kind, traffic), frame, deadline)
            .await
            .map_err(CallFailure::into_rpc_error)?;
        match outcome {
            Outcome::Answered => {
                codec::decode(&body).map_err(|e| RPCError::Network(NetworkError::new(&e)))
            }
            Outcome::Refused => {
                let err: RaftError<NodeId, E> =
                    codec::decode(&body).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
                Err(RPCError::RemoteError(RemoteError::new(self.target, err)))
            }
            Outcome::Failed => Err(RPCError::Unreachable(Unreachable::new(&TransportError(
                format!("node {}: {}", self.target, String::from_utf8_lossy(&body)),
            )))),
        }
    }
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
        let started = Instant::now();
        let all = rpc.entries.len();
        let traffic = if all == 0 {
            Traffic::Heartbeat
        } else {
            Traffic::Other
        };
        let keep = if all > 1 {
            entries_within(
                rpc.entries.iter().map(codec::encoded_len),
                APPEND_BUDGET_BYTES,
            )
        } else {
            all
        };
        if keep == all {
            return self
                .send(Kind::AppendEntries, traffic, &rpc, started, &option)
                .await;
        }
        rpc.entries.truncate(keep);
        let last_sent = rpc.entries.last().map(|entry| entry.log_id);
        let response = self
            .send(Kind::AppendEntries, traffic, &rpc, started, &option)
            .await?;
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
        self.send(
            Kind::InstallSnapshot,
            Traffic::Other,
            &rpc,
            Instant::now(),
            &option,
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.send(Kind::Vote, Traffic::Other, &rpc, Instant::now(), &option)
            .await
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

    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};

    /// A stand-in peer on a loopback port: it counts its connections, reads each one's preamble
    /// and grants every vote asked of it; while `mute` it reads requests and answers none, and
    /// with `hang_up` it closes each connection after answering once (as a restart would).
    #[derive(Clone)]
    struct StandIn {
        addr: String,
        accepted: Arc<AtomicUsize>,
        mute: Arc<AtomicBool>,
        hang_up: Arc<AtomicBool>,
        /// Refuses every request and closes the connection, as a node does with a request for
        /// another node or cluster.
        refuse: Arc<AtomicBool>,
        /// How long it takes to answer, in milliseconds.
        delay_ms: Arc<AtomicU64>,
    }

    impl StandIn {
        async fn start() -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let peer = StandIn {
                addr: listener.local_addr().unwrap().to_string(),
                accepted: Arc::default(),
                mute: Arc::default(),
                hang_up: Arc::default(),
                refuse: Arc::default(),
                delay_ms: Arc::default(),
            };
            let serving = peer.clone();
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    serving.accepted.fetch_add(1, SeqCst);
                    tokio::spawn(serving.clone().serve(stream));
                }
            });
            peer
        }

        async fn serve(self, mut stream: TcpStream) {
            use tokio::io::AsyncReadExt;
            let mut preamble = [0u8; 8];
            stream.read_exact(&mut preamble).await.unwrap();
            assert_eq!(preamble, raft_wire::PREAMBLE);
            let mut link = raft_wire::link(Box::new(stream));
            while let Some(Ok(frame)) = link.next().await {
                let (kind, header, _) = raft_wire::parse_request(frame.freeze()).unwrap();
                assert_eq!(header.to, 2);
                if self.mute.load(SeqCst) {
                    continue;
                }
                if self.refuse.load(SeqCst) {
                    let _ = link.send(raft_wire::failed("not this node")).await;
                    return;
                }
                if kind == Kind::Rules {
                    // As a build from before the question answers it.
                    let _ = link.send(raft_wire::failed("unknown request kind 7")).await;
                    return;
                }
                assert_eq!(kind, Kind::Vote);
                let delay = self.delay_ms.load(SeqCst);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let granted: Result<VoteResponse<NodeId>, RaftError<NodeId>> =
                    Ok(VoteResponse::new(openraft::Vote::new(1, 1), None, true));
                let answered = link.send(raft_wire::answer(&granted).unwrap()).await;
                // A caller that gave up has closed the connection.
                if answered.is_err() || self.hang_up.load(SeqCst) {
                    return;
                }
            }
        }
    }

    /// Asks for a vote through a fresh client for peer 2 at `addr`: whether it was granted.
    async fn vote_through_new_client(network: &mut Network, addr: &str) -> bool {
        let mut peer = network.new_client(2, &BasicNode::new(addr)).await;
        let vote = VoteRequest::new(openraft::Vote::new(1, 1), None);
        let option = RPCOption::new(Duration::from_millis(200));
        peer.vote(vote, option)
            .await
            .is_ok_and(|response| response.vote_granted)
    }

    /// [`vote_through_new_client`] on a task of its own.
    fn vote_in_background(network: &Network, addr: &str) -> tokio::task::JoinHandle<bool> {
        let (mut network, addr) = (network.clone(), addr.to_string());
        tokio::spawn(async move { vote_through_new_client(&mut network, &addr).await })
    }

    #[tokio::test]
    async fn the_clients_made_for_one_peer_share_one_connection() {
        let peer = StandIn::start().await;
        let mut network = Network::default();
        for _ in 0..3 {
            assert!(vote_through_new_client(&mut network, &peer.addr).await);
        }
        assert_eq!(peer.accepted.load(SeqCst), 1);

        // The peer moved: its next client connects to the new address.
        let moved = StandIn::start().await;
        assert!(vote_through_new_client(&mut network, &moved.addr).await);
        assert!(vote_through_new_client(&mut network, &moved.addr).await);
        assert_eq!(moved.accepted.load(SeqCst), 1);
        let peers = network.peers.lock().unwrap();
        assert_eq!(peers.len(), 1, "one peer");
        assert_eq!(peers[&2].addr, moved.addr, "the old address is let go");
    }

    #[tokio::test]
    async fn a_connection_to_the_old_address_is_not_kept_after_the_peer_moved() {
        let old = StandIn::start().await;
        old.delay_ms.store(100, SeqCst);
        let moved = StandIn::start().await;
        let mut network = Network::default();
        // A call to the old address is still running when the peer moves.
        let slow = vote_in_background(&network, &old.addr);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(vote_through_new_client(&mut network, &moved.addr).await);
        assert!(slow.await.unwrap(), "the call in flight is still answered");
        {
            let peers = network.peers.lock().unwrap();
            assert_eq!(peers[&2].addr, moved.addr, "the new address stays");
            assert_eq!(peers[&2].idle.len(), 1, "only the new address's connection");
        }
        assert!(vote_through_new_client(&mut network, &moved.addr).await);
        assert_eq!(moved.accepted.load(SeqCst), 1);
    }

    /// An AppendEntries to peer 2 at `addr` through a fresh client (as openraft's read-index
    /// rounds make them), carrying `entries` blank entries, with `limit` to be answered.
    fn append_in_background(
        network: &Network,
        addr: &str,
        entries: u64,
        limit: Duration,
    ) -> tokio::task::JoinHandle<
        RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible>,
    > {
        let (mut network, addr) = (network.clone(), addr.to_string());
        tokio::spawn(async move {
            let mut peer = network.new_client(2, &BasicNode::new(&addr)).await;
            let leader = openraft::CommittedLeaderId::new(1, 1);
            let request = AppendEntriesRequest {
                vote: openraft::Vote::new_committed(1, 1),
                prev_log_id: None,
                entries: (1..=entries)
                    .map(|index| openraft::Entry {
                        log_id: openraft::LogId::new(leader, index),
                        payload: openraft::EntryPayload::Blank,
                    })
                    .collect(),
                leader_commit: None,
            };
            peer.append_entries(request, RPCOption::new(limit)).await
        })
    }

    /// Heartbeats and read-index rounds left running to a follower that stopped answering for a
    /// while cannot take every link to it: an AppendEntries carrying entries still gets one (it
    /// used to wait behind them, "all 8 connections busy", and fail as unreachable, which makes
    /// openraft back off). A heartbeat that finds its links in use fails at once as a network
    /// error, which openraft does not back off from.
    #[tokio::test]
    async fn heartbeats_leave_links_for_replication() {
        let peer = StandIn::start().await;
        peer.mute.store(true, SeqCst);
        let network = Network::default();
        let heartbeats: Vec<_> = (0..3 * MAX_LINKS)
            .map(|_| append_in_background(&network, &peer.addr, 0, Duration::from_secs(2)))
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let entries = append_in_background(&network, &peer.addr, 1, Duration::from_millis(300));
        match entries.await.unwrap() {
            Err(RPCError::Unreachable(e)) => {
                assert!(e.to_string().contains("no answer in time"), "{e}")
            }
            other => panic!("the entries did not go out: {other:?}"),
        }
        assert_eq!(peer.accepted.load(SeqCst), MAX_HEARTBEAT_LINKS + 1);
        let mut busy = 0;
        for heartbeat in heartbeats {
            match heartbeat.await.unwrap() {
                Err(RPCError::Network(e)) => {
                    assert!(e.to_string().contains("busy"), "{e}");
                    busy += 1;
                }
                Err(RPCError::Unreachable(_)) => {}
                other => panic!("the peer said nothing, yet: {other:?}"),
            }
        }
        assert_eq!(busy, 3 * MAX_LINKS - MAX_HEARTBEAT_LINKS);
    }

    /// A call whose turn comes with too little time left gives up as busy (it used to send
    /// anyway and miss the answer, dropping a healthy kept connection with its answer unread and
    /// reporting the peer unreachable), but a call that had little time to begin with and got
    /// its turn at once still sends (a heartbeat of a few ms would otherwise never go out).
    #[test]
    fn a_turn_that_comes_too_late_is_given_up() {
        let ms = Duration::from_millis;
        assert!(too_late(ms(47), ms(1)), "waited until 1 ms was left");
        assert!(!too_late(ms(47), ms(2)));
        assert!(!too_late(ms(47), ms(47)));
        assert!(!too_late(ms(2), ms(2)), "a short limit, its turn at once");
        assert!(!too_late(ms(1), ms(1)));
        assert!(too_late(ms(2), Duration::from_micros(900)));
        assert!(too_late(ms(2), Duration::ZERO));
    }

    #[tokio::test]
    async fn a_connection_whose_peer_stops_answering_is_replaced() {
        let peer = StandIn::start().await;
        let mut network = Network::default();
        assert!(vote_through_new_client(&mut network, &peer.addr).await);
        // The peer goes quiet on the kept connection (a network that swallows it, say): the
        // call fails by its deadline and the connection is dropped.
        peer.mute.store(true, SeqCst);
        assert!(!vote_through_new_client(&mut network, &peer.addr).await);
        peer.mute.store(false, SeqCst);
        assert!(vote_through_new_client(&mut network, &peer.addr).await);
        assert_eq!(peer.accepted.load(SeqCst), 2, "the next call dialed anew");
    }

    #[tokio::test]
    async fn an_unanswered_call_drops_its_own_connection_and_keeps_the_others() {
        let peer = StandIn::start().await;
        peer.delay_ms.store(30, SeqCst);
        let network = Network::default();
        let both = (0..2).map(|_| vote_in_background(&network, &peer.addr));
        for granted in futures::future::join_all(both).await {
            assert!(granted.unwrap());
        }
        assert_eq!(peer.accepted.load(SeqCst), 2, "two kept connections");

        // One call goes unanswered (the peer is slower than the 200 ms limit).
        peer.delay_ms.store(400, SeqCst);
        let mut caller = network.clone();
        assert!(!vote_through_new_client(&mut caller, &peer.addr).await);
        assert_eq!(network.peers.lock().unwrap()[&2].idle.len(), 1);

        // The other connection still serves, without a new dial and without a pause.
        peer.delay_ms.store(0, SeqCst);
        assert!(vote_through_new_client(&mut caller, &peer.addr).await);
        assert_eq!(peer.accepted.load(SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failure_at_the_old_address_leaves_the_new_one_alone() {
        let old = StandIn::start().await;
        old.mute.store(true, SeqCst);
        let moved = StandIn::start().await;
        let mut network = Network::default();
        // A call to the old address is still waiting for its answer when the peer moves.
        let doomed = vote_in_background(&network, &old.addr);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(vote_through_new_client(&mut network, &moved.addr).await);
        assert!(!doomed.await.unwrap(), "the old address never answers");
        {
            let peers = network.peers.lock().unwrap();
            assert_eq!(peers[&2].addr, moved.addr);
            assert_eq!(peers[&2].idle.len(), 1, "the new connection is kept");
            assert!(
                peers[&2].quiet_until.is_none(),
                "and the new address not paused"
            );
        }
        assert!(vote_through_new_client(&mut network, &moved.addr).await);
        assert_eq!(moved.accepted.load(SeqCst), 1);
    }

    #[tokio::test]
    async fn a_call_on_a_broken_kept_connection_dials_again_at_once() {
        let peer = StandIn::start().await;
        peer.hang_up.store(true, SeqCst);
        let mut network = Network::default();
        for calls in 1..=3 {
            // Each kept connection was closed by the peer after its answer; no call fails.
            assert!(vote_through_new_client(&mut network, &peer.addr).await);
            assert_eq!(peer.accepted.load(SeqCst), calls);
        }
    }

    /// A fresh connection left unanswered pauses dialing that peer: the calls within
    /// [`REDIAL_PAUSE`] fail without a new connection, and the first call after it dials again.
    #[tokio::test]
    async fn a_peer_that_swallows_connections_is_not_dialed_again_at_once() {
        let peer = StandIn::start().await;
        peer.mute.store(true, SeqCst);
        let mut network = Network::default();
        assert!(!vote_through_new_client(&mut network, &peer.addr).await);
        assert_eq!(peer.accepted.load(SeqCst), 1);
        // The clock stands still for the calls inside the pause, so that a slow machine cannot
        // let the pause run out under them (they touch no socket: the pause is read first).
        tokio::time::pause();
        let started = Instant::now();
        for _ in 0..10 {
            assert!(!vote_through_new_client(&mut network, &peer.addr).await);
        }
        assert_eq!(started.elapsed(), Duration::ZERO, "they failed at once");
        // Had one dialed, the connection would be accepted while it waits for the answer; the
        // accepting task gets its turn here as well, in case it has not had one yet.
        tokio::task::yield_now().await;
        assert_eq!(peer.accepted.load(SeqCst), 1, "without dialing");
        tokio::time::resume();
        tokio::time::sleep(REDIAL_PAUSE).await;
        peer.mute.store(false, SeqCst);
        assert!(vote_through_new_client(&mut network, &peer.addr).await);
        assert_eq!(peer.accepted.load(SeqCst), 2);
    }

    /// A build from before the apply rules question fails it and closes the connection, as any
    /// request it does not know: the answer is no, and the next call dials again at once (a
    /// pause would fail the replication to the older peer at every question).
    #[tokio::test]
    async fn an_older_peer_says_no_to_the_rules_question_and_is_dialed_again_at_once() {
        let peer = StandIn::start().await;
        let mut network = Network::default();
        let rules = baton_statemachine::rules::RULES;
        let limit = Duration::from_millis(500);
        let asked = network.applies_rules(2, &peer.addr, rules, limit).await;
        assert!(
            matches!(&asked, Err(Declined::Refused(why)) if why.contains("unknown request")),
            "{asked:?}"
        );
        assert!(network.peers.lock().unwrap()[&2].quiet_until.is_none());
        assert!(vote_through_new_client(&mut network, &peer.addr).await);
        assert_eq!(peer.accepted.load(SeqCst), 2);
    }

    /// Asked of a node being added, the same failure is a build that does not apply the rules;
    /// a refusal of the request itself, or no connection, says nothing of its build.
    #[tokio::test]
    async fn what_a_node_being_added_says_of_the_rules() {
        let rules = baton_statemachine::rules::RULES;
        let limit = Duration::from_millis(500);
        let older = StandIn::start().await;
        let network = Network::default();
        let verdict = network.rules_verdict(2, &older.addr, rules, limit).await;
        assert!(
            matches!(&verdict, RulesVerdict::AppliesNot(why) if why.contains("from before")),
            "{verdict:?}"
        );
        assert!(
            network.peers.lock().unwrap()[&2].quiet_until.is_none(),
            "no redial pause"
        );
        let refusing = StandIn::start().await;
        refusing.refuse.store(true, SeqCst);
        let verdict = Network::default()
            .rules_verdict(2, &refusing.addr, rules, limit)
            .await;
        assert!(
            matches!(&verdict, RulesVerdict::Unknown(why) if why.contains("not this node")),
            "{verdict:?}"
        );
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().to_string()
        };
        let verdict = Network::default()
            .rules_verdict(2, &closed, rules, limit)
            .await;
        assert!(matches!(verdict, RulesVerdict::Unknown(_)), "{verdict:?}");
    }

    /// A refusal closes the connection, and the next call does not dial again at once: a
    /// member whose address leads to another node was dialed anew by every read-index round.
    #[tokio::test]
    async fn a_peer_that_refuses_is_not_dialed_again_at_once() {
        let peer = StandIn::start().await;
        peer.refuse.store(true, SeqCst);
        let mut network = Network::default();
        assert!(!vote_through_new_client(&mut network, &peer.addr).await);
        assert!(network.peers.lock().unwrap()[&2].quiet_until.is_some());
        assert!(!vote_through_new_client(&mut network, &peer.addr).await);
        assert_eq!(peer.accepted.load(SeqCst), 1, "dialed again at once");
    }

    #[tokio::test]
    async fn concurrent_calls_share_a_bounded_set_of_connections() {
        let peer = StandIn::start().await;
        peer.delay_ms.store(30, SeqCst);
        let network = Network::default();
        let calls = (0..3 * MAX_LINKS).map(|_| {
            let (mut network, addr) = (network.clone(), peer.addr.clone());
            tokio::spawn(async move {
                let mut peer = network.new_client(2, &BasicNode::new(&addr)).await;
                let vote = VoteRequest::new(openraft::Vote::new(1, 1), None);
                peer.vote(vote, RPCOption::new(Duration::from_secs(5)))
                    .await
                    .is_ok_and(|response| response.vote_granted)
            })
        });
        for granted in futures::future::join_all(calls).await {
            assert!(
                granted.unwrap(),
                "every call is answered, some after waiting"
            );
        }
        assert_eq!(peer.accepted.load(SeqCst), MAX_LINKS);
        assert_eq!(
            network.peers.lock().unwrap()[&2].idle.len(),
            MAX_LINKS,
            "all kept"
        );
    }

    #[tokio::test]
    async fn an_unreachable_peer_fails_the_call_in_time() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap().to_string();
        drop(free);
        let mut network = Network::default();
        let started = std::time::Instant::now();
        assert!(!vote_through_new_client(&mut network, &addr).await);
        assert!(started.elapsed() < Duration::from_secs(2));
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
