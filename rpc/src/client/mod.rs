//! The client library: leader discovery, redirects, retries and typed errors.
//!
//! A [`Client`] knows a list of endpoints. Writes go to the node it believes is the leader; a
//! follower answers `NOT_LEADER` with the leader's address and the client follows it. Transport
//! failures, timeouts and "no leader yet" are retried on other nodes until the call's deadline,
//! always with the same `(client_id, seq)`, so a write that was applied before its answer got lost
//! is answered from the store's session table instead of being applied twice.
//!
//! This module holds the plumbing and the cluster calls; each primitive's typed calls live in
//! their own file.

mod batcher;
mod board;
mod checkpoint;
mod cluster;
mod effect;
mod handoff;
mod queue;
mod security;
mod sink;
mod watch;

pub use board::TaskSnapshot;
pub use cluster::{SavedSnapshot, HANDOVER_WAIT};
pub use handoff::TicketSnapshot;
pub use queue::{AttemptHistory, QueueTaskPage, MAX_LEASE_WAIT};
pub use security::{ClientTls, Security};
pub use watch::{Event, Watch, WatchPosition, CLUSTER_ID_HEADER, WATCH_SILENCE};

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use baton_statemachine::{Refusal, MAX_REPLIES_PER_CLIENT};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Endpoint;
use tonic::{Code, Status};

use crate::error::{detail_of, infra, is_undecodable, refusal_of, Error};
use crate::proto::cluster_client::ClusterClient;
use crate::proto::{self, RequestHeader};
use security::Credentials;

/// The largest answer this client decodes: to a batch, a call made on its own, and every call
/// whose answer carries queue tasks or a listing (the other answers are bounded far below gRPC's
/// default 4 MiB by the store's own limits). Whole-state reads (every ticket, every board task)
/// grow with the store: with gRPC's default limit, `baton ticket list` and `baton check` failed
/// from about 30,000 tickets on. One queue task grows with its attempts' notes, and a write whose
/// answer the client cannot decode was applied all the same: the limit is there against a broken
/// server, not to judge answers.
pub(crate) const MAX_ANSWER_BYTES: usize = 1 << 30;

/// The least time worth sending a write with: one left less of its deadline after waiting for
/// the session's window is not sent (its answer could hardly come back in time). A call whose
/// whole deadline is shorter needs half of it left.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);

/// The first pause before retrying a failed attempt; it doubles up to [`MAX_RETRY_PAUSE`] (or
/// [`MAX_OVERLOADED_PAUSE`] while the last answer was `OVERLOADED`).
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(20);
/// The longest pause between attempts. A failover is retried through: after a leader dies, every
/// client's attempts fail at once, and a long cap (it was 500 ms) left writes waiting for the next
/// retry well after the new leader was elected (`baton bench --workload failover`).
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause once a node said `OVERLOADED`: retrying a busy node ten times a second (as
/// after a failover) would keep it busy answering refusals.
const MAX_OVERLOADED_PAUSE: Duration = Duration::from_secs(1);

/// Half the pause plus a random part of the other half, so that clients that failed together do
/// not all retry at the same instant.
fn jittered(pause: Duration) -> Duration {
    let half = pause / 2;
    half + half.mul_f64(rand::random::<f64>())
}

pub(crate) use batcher::{Conn, Grpc};
pub(crate) use queue::LeasePoll;
#[cfg(test)]
pub(crate) use queue::Leased;

/// Timeouts of a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// How long one call (with all its retries) may take before it fails. Keep it well under
    /// [`baton_statemachine::SESSION_RETRY_WINDOW_MS`] (5 minutes): a store crowded with new
    /// clients may forget a client idle that long, and a retry after that is applied afresh.
    pub deadline: Duration,
    /// How long one attempt against one node may take before the client tries elsewhere.
    pub attempt_timeout: Duration,
    /// How long to wait for a TCP connection to a node.
    pub connect_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(15),
            attempt_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(1),
        }
    }
}

/// A connection to a Baton cluster. Cheap to clone; clones share connections and the session.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClientConfig,
    security: Security,
    credentials: Credentials,
    endpoints: Vec<String>,
    channels: Mutex<HashMap<String, Conn>>,
    /// The address we believe is the leader's.
    leader: Mutex<Option<String>>,
    /// Round-robin cursor over `endpoints` when no leader is known.
    cursor: AtomicU64,
    /// Writes, at most [`SEQ_WINDOW`] ahead of the oldest unanswered one.
    session: Session,
    /// Long polls number their requests in a session of their own: a poll waits for work by
    /// design, and in the writes' session it would hold every write up. It has the same window
    /// (a lease attempt lost in a failover must still be remembered when it is retried).
    poll_session: Session,
}

/// How far the newest write may run ahead of the oldest one still unanswered. Half of what the
/// store remembers per client: it keeps a client's answers from the oldest unanswered request on
/// (`acked_below`), but at most [`MAX_REPLIES_PER_CLIENT`] of them. A write stuck under
/// thousands of later ones (an attempt lost in a failover, waiting out its timeout) would fall
/// out of that window before its retry, and come back `SESSION_EXPIRED`, its outcome unknown,
/// although the store may never have applied it. So new writes wait for it instead, which costs
/// a busy client at most what is left of that one write's deadline.
const SEQ_WINDOW: u64 = MAX_REPLIES_PER_CLIENT as u64 / 2;

/// The client's side of a session with the store: its identity and request numbers.
struct Session {
    /// The session's identity (random, drawn by the client).
    client_id: u64,
    /// How far the newest request may run ahead of the oldest unanswered one.
    window: u64,
    numbers: Mutex<Numbers>,
    /// Told when the oldest unanswered request ends, for requests waiting for the window.
    oldest_ended: tokio::sync::Notify,
}

/// A session's request numbers.
struct Numbers {
    /// The next request number to hand out.
    next_seq: u64,
    /// Requests sent and not yet answered (or abandoned).
    in_flight: BTreeSet<u64>,
}

impl Session {
    /// A new session: a fresh identity, request numbers from 1.
    fn new(window: u64) -> Self {
        Self {
            // Never zero: the store refuses it (the identity of a client that set none).
            client_id: rand::random::<u64>().max(1),
            window,
            numbers: Mutex::new(Numbers {
                next_seq: 1,
                in_flight: BTreeSet::new(),
            }),
            oldest_ended: tokio::sync::Notify::new(),
        }
    }
}

/// One write's place in the session: its seq, and every seq below `acked_below` is finished.
/// Numbering and registering happen under one lock, so a concurrent write can never announce a
/// lower, not-yet-sent seq as acknowledged; the seq leaves `in_flight` when the write ends,
/// including when its future is dropped.
struct InFlight<'a> {
    session: &'a Session,
    seq: u64,
    acked_below: u64,
}

impl<'a> InFlight<'a> {
    /// Numbers a request, once the session's window has room for it.
    async fn begin(session: &'a Session) -> Self {
        loop {
            // Registered before the check, so an end between the check and the wait is seen.
            let ended = session.oldest_ended.notified();
            if let Some(request) = Self::try_begin(session) {
                return request;
            }
            ended.await;
        }
    }

    /// Numbers a request if the window has room.
    fn try_begin(session: &'a Session) -> Option<Self> {
        let mut numbers = lock(&session.numbers);
        if let Some(oldest) = numbers.in_flight.first() {
            if numbers.next_seq - oldest >= session.window {
                return None;
            }
        }
        let seq = numbers.next_seq;
        numbers.next_seq += 1;
        numbers.in_flight.insert(seq);
        let acked_below = numbers.in_flight.first().copied().unwrap_or(seq);
        Some(Self {
            session,
            seq,
            acked_below,
        })
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut numbers = lock(&self.session.numbers);
        let was_oldest = numbers.in_flight.first() == Some(&self.seq);
        numbers.in_flight.remove(&self.seq);
        drop(numbers);
        if was_oldest {
            self.session.oldest_ended.notify_waiters();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How one failed attempt should be handled.
enum Verdict {
    /// A final answer: return it.
    Fail(Error),
    /// Try again now at this address (the leader's).
    Redirect(String),
    /// Try again elsewhere after a pause.
    Retry(String),
    /// The node is overloaded: try it again after a pause (it stays the presumed leader).
    Backoff(String),
}

impl Client {
    /// Connects to a cluster through any of its nodes (`host:port`, optionally with `http://`;
    /// `https://` needs TLS settings, [`Client::connect_with_security`]) and locates the leader. Fails with [`Error::Unavailable`] when no node answers before the
    /// deadline.
    pub async fn connect<S: AsRef<str>>(endpoints: &[S]) -> Result<Self, Error> {
        Self::connect_with(endpoints, ClientConfig::default()).await
    }

    /// [`Client::connect`] with explicit timeouts.
    pub async fn connect_with<S: AsRef<str>>(
        endpoints: &[S],
        config: ClientConfig,
    ) -> Result<Self, Error> {
        let client = Self::new(endpoints, config)?;
        client.discover_leader().await?;
        Ok(client)
    }

    /// A client that has not contacted any node yet (connections open on first use). Useful for
    /// per-node administration of a cluster that may have no leader.
    pub fn new<S: AsRef<str>>(endpoints: &[S], config: ClientConfig) -> Result<Self, Error> {
        Self::new_with_security(endpoints, config, Security::default())
    }

    /// [`Client::connect_with`] to a cluster that wants TLS or a token.
    pub async fn connect_with_security<S: AsRef<str>>(
        endpoints: &[S],
        config: ClientConfig,
        security: Security,
    ) -> Result<Self, Error> {
        let client = Self::new_with_security(endpoints, config, security)?;
        client.discover_leader().await?;
        Ok(client)
    }

    /// [`Client::new`] for a cluster that wants TLS or a token.
    pub fn new_with_security<S: AsRef<str>>(
        endpoints: &[S],
        config: ClientConfig,
        security: Security,
    ) -> Result<Self, Error> {
        let credentials = Credentials::new(&security)?;
        if security.tls.is_none() {
            if let Some(https) = endpoints.iter().map(|e| e.as_ref().trim()).find(|e| {
                e.get(..8)
                    .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
            }) {
                return Err(Error::Config(format!(
                    "endpoint {https} asks for TLS, but no TLS settings were given (the CA \
                     certificate): refusing to send requests, and any token, in plaintext"
                )));
            }
        }
        let endpoints: Vec<String> = endpoints
            .iter()
            .map(|e| normalize(e.as_ref()))
            .filter(|e| !e.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(Error::Config("no endpoints given".into()));
        }
        if let Some(portless) = endpoints.iter().find(|e| !has_port(e)) {
            // Dialled as given it would go to port 80 and fail after the whole deadline.
            return Err(Error::Config(format!(
                "endpoint {portless} names no port: use host:port (e.g. 10.0.0.1:7001)"
            )));
        }
        // Every endpoint is parsed now, not when failover first reaches it: a bad one found
        // mid-call would end that call (a write perhaps applied) instead of letting it go on
        // to the good ones.
        if let Some((endpoint, error)) = endpoints.iter().find_map(|e| {
            Endpoint::from_shared(format!("http://{e}"))
                .err()
                .map(|x| (e, x))
        }) {
            return Err(Error::Config(format!(
                "bad endpoint {endpoint:?}: {error} (one host:port per endpoint; a list is \
                 several endpoints, not one separated by commas)"
            )));
        }
        Ok(Client {
            inner: Arc::new(Inner {
                config,
                security,
                credentials,
                endpoints,
                channels: Mutex::default(),
                leader: Mutex::default(),
                cursor: AtomicU64::new(0),
                session: Session::new(SEQ_WINDOW),
                poll_session: Session::new(SEQ_WINDOW),
            }),
        })
    }

    /// The endpoints this client was given.
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// This client's session identity (its long polls number their requests under a second
    /// one of their own).
    pub fn client_id(&self) -> u64 {
        self.inner.session.client_id
    }

    // ------------------------------------------------------------------ cluster

    /// One node's own view of itself and the cluster (no retries, no redirects).
    pub async fn node_info(&self, addr: &str) -> Result<proto::NodeInfoResponse, Error> {
        let channel = self.channel(&normalize(addr))?;
        let mut cluster = ClusterClient::new(channel);
        self.ask_node(addr, cluster.node_info(proto::NodeInfoRequest {}))
            .await
    }

    /// One node's applied index and a digest of its own state there (no retries, no
    /// redirects): members at the same applied index must show the same digest.
    pub async fn state_digest(&self, addr: &str) -> Result<proto::StateDigestResponse, Error> {
        let channel = self.channel(&normalize(addr))?;
        let mut cluster = ClusterClient::new(channel);
        self.ask_node(addr, cluster.state_digest(proto::StateDigestRequest {}))
            .await
    }

    /// One attempt of a call to the node at `addr`, bounded by the attempt timeout; an outage
    /// names that node.
    async fn ask_node<T>(
        &self,
        addr: &str,
        attempt: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.inner.config.attempt_timeout, attempt).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(match final_error(&status) {
                Error::Unavailable { waited, last, .. } => Error::Unavailable {
                    endpoints: vec![addr.to_string()],
                    waited,
                    last,
                },
                other => other,
            }),
            Err(_) => Err(Error::Unavailable {
                endpoints: vec![addr.to_string()],
                waited: self.inner.config.attempt_timeout,
                last: "timed out".into(),
            }),
        }
    }

    /// Asks the node at `addr` to form a new cluster of `members` (`(id, addr)` pairs).
    pub async fn initialize(&self, addr: &str, members: &[(u64, String)]) -> Result<(), Error> {
        let channel = self.channel(&normalize(addr))?;
        let request = proto::InitializeRequest {
            members: members
                .iter()
                .map(|(id, addr)| proto::Member {
                    id: *id,
                    addr: addr.clone(),
                    voter: true,
                })
                .collect(),
        };
        let deadline = self.inner.config.deadline;
        match tokio::time::timeout(deadline, ClusterClient::new(channel).initialize(request)).await
        {
            Ok(answer) => answer.map(|_| ()).map_err(|status| final_error(&status)),
            Err(_) => Err(Error::Unavailable {
                endpoints: vec![addr.to_string()],
                waited: deadline,
                last: "no answer to the initialization (it may have gone through: see `baton \
                       status`)"
                    .into(),
            }),
        }
    }

    /// Waits until some node names a leader; returns its address.
    pub async fn discover_leader(&self) -> Result<String, Error> {
        let reply = self
            .call(|channel| async move {
                let info = ClusterClient::new(channel)
                    .node_info(proto::NodeInfoRequest {})
                    .await?
                    .into_inner();
                if info.leader_addr.is_empty() {
                    return Err(crate::error::infra_status(
                        Code::Unavailable,
                        infra::NO_LEADER,
                        "no leader elected yet",
                    ));
                }
                if !has_port(&normalize(&info.leader_addr)) {
                    // Dialled as given it would go to port 80.
                    return Err(crate::error::infra_status(
                        Code::Unavailable,
                        infra::NO_LEADER,
                        format!("the leader's address {} names no port", info.leader_addr),
                    ));
                }
                Ok(tonic::Response::new(info))
            })
            .await?;
        let leader = normalize(&reply.leader_addr);
        *lock(&self.inner.leader) = Some(leader.clone());
        Ok(leader)
    }

    // ------------------------------------------------------------------ plumbing

    /// Runs a write with a fresh `(client_id, seq)`, retried with the same header.
    async fn write<T, F, Fut>(&self, attempt: F) -> Result<T, Error>
    where
        F: Fn(RequestHeader, Conn) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.write_waiting(Duration::ZERO, attempt).await
    }

    /// [`Client::write`] for a call the server may hold for up to `wait` before answering (a long
    /// poll): each attempt and the whole call get `wait` on top of their usual limits.
    async fn write_waiting<T, F, Fut>(&self, wait: Duration, attempt: F) -> Result<T, Error>
    where
        F: Fn(RequestHeader, Conn) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let started = Instant::now();
        let request = self.number(wait, started).await?;
        self.send_numbered(&request, started, wait, false, attempt)
            .await
    }

    /// Numbers a write that the server may hold for `wait`, begun at `started`, in its session
    /// (long polls have one of their own): once the session's window has room, and while enough
    /// of the call's deadline is left to send it.
    async fn number(&self, wait: Duration, started: Instant) -> Result<InFlight<'_>, Error> {
        let session = if wait.is_zero() {
            &self.inner.session
        } else {
            &self.inner.poll_session
        };
        let deadline = self.inner.config.deadline + wait;
        let Ok(request) = tokio::time::timeout(deadline, InFlight::begin(session)).await else {
            return Err(Error::Unavailable {
                endpoints: vec![],
                waited: deadline,
                last: format!(
                    "not sent: an earlier write of this client stayed unanswered while {SEQ_WINDOW} \
                     later ones were made"
                ),
            });
        };
        // (Half the deadline for a deadline under twice MIN_ATTEMPT, or nothing would be sent.)
        if deadline.saturating_sub(started.elapsed()) < MIN_ATTEMPT.min(deadline / 2) {
            return Err(Error::Unavailable {
                endpoints: vec![],
                waited: started.elapsed(),
                last: format!(
                    "not sent: an earlier write of this client stayed unanswered while \
                     {SEQ_WINDOW} later ones were made, until too little of the deadline was left"
                ),
            });
        }
        Ok(request)
    }

    /// Sends the write numbered `request`, begun at `started`, which the server may hold for
    /// `wait`. Every attempt after the first is marked a retry, and the first too when `retry`
    /// (the request was sent before, by a call whose answer was dropped).
    async fn send_numbered<T, F, Fut>(
        &self,
        request: &InFlight<'_>,
        started: Instant,
        wait: Duration,
        retry: bool,
        attempt: F,
    ) -> Result<T, Error>
    where
        F: Fn(RequestHeader, Conn) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let sent = AtomicBool::new(retry);
        // The wait for the window counts against the call's deadline.
        let sending = Sending::Write { sent_before: retry };
        self.call_waiting(started, wait, sending, |channel| {
            let header = RequestHeader {
                client_id: request.session.client_id,
                seq: request.seq,
                acked_below: request.acked_below,
                retry: sent.swap(true, Ordering::Relaxed),
            };
            attempt(header, channel)
        })
        .await
    }

    /// Runs one call against the leader, following redirects and retrying infrastructure
    /// failures until the deadline.
    async fn call<T, F, Fut>(&self, attempt: F) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_waiting(Instant::now(), Duration::ZERO, Sending::Read, attempt)
            .await
    }

    /// [`Client::call`] where the server may hold each attempt for up to `wait`, for a call
    /// that began at `started`: the call ends `wait` after its usual deadline.
    async fn call_waiting<T, F, Fut>(
        &self,
        started: Instant,
        wait: Duration,
        sending: Sending,
        attempt: F,
    ) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let base = &self.inner.config;
        let config = ClientConfig {
            deadline: (base.deadline + wait).saturating_sub(started.elapsed()),
            attempt_timeout: base.attempt_timeout + wait,
            connect_timeout: base.connect_timeout,
        };
        self.call_within(&config, sending, attempt).await
    }

    /// [`Client::call`] for a request the leader may work on for long before it answers (a
    /// snapshot of the whole state, a listing of every ticket or task, a learner catching up, a
    /// membership change): one attempt may take the whole deadline, rather than being cut off and
    /// sent again to start the work over.
    async fn call_patiently<T, F, Fut>(&self, attempt: F) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let base = &self.inner.config;
        let config = ClientConfig {
            attempt_timeout: base.deadline.max(base.attempt_timeout),
            ..base.clone()
        };
        self.call_within(&config, Sending::Read, attempt).await
    }

    /// Runs one call with `config`'s limits (see [`Client::call`]).
    async fn call_within<T, F, Fut>(
        &self,
        config: &ClientConfig,
        sending: Sending,
        attempt: F,
    ) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let started = Instant::now();
        let mut tried: BTreeSet<String> = BTreeSet::new();
        let mut pause = FIRST_RETRY_PAUSE;
        let mut longest_pause = MAX_RETRY_PAUSE;
        let mut redirects = 0;
        // Whether a sending of this write may have been applied: one went unanswered, or a node
        // answered that it could not tell (deposed while the entry was in its log, say).
        let mut maybe_applied = matches!(sending, Sending::Write { sent_before: true });
        loop {
            let addr = self.target();
            tried.insert(addr.clone());
            let last = match self.channel(&addr) {
                // A leader's address as a node advertised it, which this client cannot dial: try
                // the endpoints it was given instead of failing every call from now on.
                Err(error) if !self.inner.endpoints.contains(&addr) => {
                    self.forget_leader(&addr);
                    format!("{addr}: {error}")
                }
                Err(error) => return Err(error),
                Ok(channel) => {
                    // No attempt outlives the call's deadline.
                    let budget = config
                        .attempt_timeout
                        .min(config.deadline.saturating_sub(started.elapsed()));
                    match tokio::time::timeout(budget, attempt(channel)).await {
                        Ok(Ok(reply)) => return Ok(reply.into_inner()),
                        Ok(Err(status)) => match classify(&status) {
                            Verdict::Fail(error) => {
                                return Err(settled(error, sending, maybe_applied))
                            }
                            Verdict::Redirect(leader) if redirects < 3 && leader != addr => {
                                maybe_applied = true;
                                redirects += 1;
                                *lock(&self.inner.leader) = Some(leader);
                                continue;
                            }
                            // Not followed (a node naming itself, reached under an address
                            // that leads elsewhere; too many hops): the hint goes, or every
                            // later call would go round the same loop and never reach the
                            // other endpoints.
                            Verdict::Redirect(leader) => {
                                maybe_applied = true;
                                self.forget_leader(&addr);
                                format!("{addr} redirected to {leader}")
                            }
                            Verdict::Retry(reason) => {
                                maybe_applied = true;
                                self.forget_leader(&addr);
                                longest_pause = MAX_RETRY_PAUSE;
                                format!("{addr}: {reason}")
                            }
                            // Turned away before anything was done.
                            Verdict::Backoff(reason) => {
                                longest_pause = MAX_OVERLOADED_PAUSE;
                                format!("{addr}: {reason}")
                            }
                        },
                        Err(_) => {
                            maybe_applied = true;
                            self.forget_leader(&addr);
                            longest_pause = MAX_RETRY_PAUSE;
                            format!("{addr}: no answer within {budget:?}")
                        }
                    }
                }
            };
            redirects = 0;
            let waited = started.elapsed();
            if waited + pause >= config.deadline {
                return Err(Error::Unavailable {
                    endpoints: tried.into_iter().collect(),
                    waited,
                    last,
                });
            }
            tracing::debug!(%last, ?pause, "retrying");
            tokio::time::sleep(jittered(pause)).await;
            // Back to the failover pace at once when the node stops saying OVERLOADED.
            pause = (pause * 2).min(longest_pause);
        }
    }

    /// The address to try next: the known leader, else the next endpoint in turn.
    fn target(&self) -> String {
        if let Some(leader) = lock(&self.inner.leader).clone() {
            return leader;
        }
        let endpoints = &self.inner.endpoints;
        let turn = self.inner.cursor.fetch_add(1, Ordering::Relaxed) as usize;
        endpoints[turn % endpoints.len()].clone()
    }

    fn forget_leader(&self, addr: &str) {
        let mut leader = lock(&self.inner.leader);
        if leader.as_deref() == Some(addr) {
            *leader = None;
        }
    }

    fn channel(&self, addr: &str) -> Result<Conn, Error> {
        let mut channels = lock(&self.inner.channels);
        if let Some(channel) = channels.get(addr) {
            return Ok(channel.clone());
        }
        let channel = Conn::new(self.grpc(addr)?, self.inner.config.attempt_timeout);
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// A new gRPC connection to `addr` (dialled on first use) with this client's TLS settings,
    /// and its token on every request.
    fn grpc(&self, addr: &str) -> Result<Grpc, Error> {
        let tls = self.inner.security.tls.as_ref();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| Error::Config(format!("bad endpoint {addr:?}: {e}")))?
            .connect_timeout(self.inner.config.connect_timeout)
            .tcp_nodelay(true)
            // A connection that cannot answer a ping in the time an attempt gets is dropped and
            // the next call dials anew. Without this, a connection a network swallowed without a
            // reset (a NAT that forgot an idle flow, a host that lost power) would carry every
            // later attempt to that node into the void until the kernel gave up, minutes later;
            // the pings also keep an idle connection's NAT entry alive.
            .http2_keep_alive_interval(self.inner.config.attempt_timeout)
            .keep_alive_timeout(self.inner.config.attempt_timeout)
            .keep_alive_while_idle(true);
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls.config())
                .map_err(|e| Error::Config(format!("bad TLS settings: {e}")))?;
        }
        Ok(InterceptedService::new(
            endpoint.connect_lazy(),
            self.inner.credentials.clone(),
        ))
    }
}

/// A required message of an answer, or a protocol error naming the call.
fn answered<T>(message: Option<T>, call: &str, what: &str) -> Result<T, Error> {
    message.ok_or_else(|| Error::Protocol(format!("{call} answered without {what}")))
}

/// What a call sends, for what its failures mean.
#[derive(Debug, Clone, Copy)]
enum Sending {
    /// A read or an administrative call: asking again is harmless.
    Read,
    /// A write; `sent_before` when a call whose answer was dropped sent it already.
    Write { sent_before: bool },
}

/// The error a call ends with. A node's own refusal to take a write (its credentials, its size
/// limits: nodes may differ during a rolling restart) says nothing of an earlier sending that
/// `maybe_applied`: only the store's judgement of the request (a refusal, the session table's
/// answer) or a success settles that, so the outcome is unknown.
fn settled(error: Error, sending: Sending, maybe_applied: bool) -> Error {
    match error {
        Error::Server { code, message }
            if maybe_applied
                && matches!(sending, Sending::Write { .. })
                && code != infra::SEQ_REUSED =>
        {
            Error::OutcomeUnknown(format!(
                "{code}: {message} (an earlier sending of this write may have been applied)"
            ))
        }
        error => error,
    }
}

/// A grant's credential as the store mints it: a token (or holder) and a fence of at least 1.
/// An empty one, from a broken server, would be presented back and refused, or fence nothing.
fn credential(call: &str, token: &str, fence: u64) -> Result<(), Error> {
    if token.is_empty() || fence == 0 {
        return Err(Error::Protocol(format!(
            "{call} answered a grant without its credential (token {token:?}, fence {fence})"
        )));
    }
    Ok(())
}

/// A decoded answer. A value the client cannot decode is the server's fault, reported as a
/// protocol error and never as a contract refusal.
fn decoded<T>(result: Result<T, Refusal>, call: &str) -> Result<T, Error> {
    result.map_err(|refusal| Error::Protocol(format!("{call} answered badly: {refusal}")))
}

/// Whether a normalized endpoint ends in a port (`host:port`, `[v6]:port`).
fn has_port(endpoint: &str) -> bool {
    let authority = endpoint.split('/').next().unwrap_or_default();
    authority.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.ends_with(':') && port.parse::<u16>().is_ok_and(|p| p > 0)
    })
}

/// The instant `wait` from now, or one decades away for a wait too long to add (a duration
/// typed as `300000000000y`), instead of the overflow's panic.
pub(crate) fn instant_after(wait: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 24 * 3600))
}

/// `http://host:port/` -> `host:port`.
fn normalize(endpoint: &str) -> String {
    let endpoint = endpoint.trim();
    let endpoint = ["http://", "https://"]
        .iter()
        .find_map(|scheme| {
            let head = endpoint.get(..scheme.len())?;
            head.eq_ignore_ascii_case(scheme)
                .then(|| &endpoint[scheme.len()..])
        })
        .unwrap_or(endpoint);
    endpoint.trim_end_matches('/').to_string()
}

fn classify(status: &Status) -> Verdict {
    let Some(detail) = detail_of(status) else {
        if status.code() == Code::OutOfRange {
            // gRPC's own size limit (here or at the node): the same message fails every time.
            return Verdict::Fail(Error::Protocol(format!(
                "a message passed gRPC's size limit: {}",
                status.message()
            )));
        }
        if is_undecodable(status) {
            // The same bytes fail the same way every time: the client and the node do not
            // speak the same protocol (a mismatched version, something else at the address).
            return Verdict::Fail(Error::Protocol(format!(
                "a message could not be decoded (do client and server versions match?): {}",
                status.message()
            )));
        }
        if let Code::Unauthenticated | Code::PermissionDenied = status.code() {
            // Not a Baton node's answer (its own carry a detail): something in front of the
            // cluster refusing this client's credentials. Asking again changes nothing. (An
            // `Unimplemented` is retried: during a rolling upgrade another node may have the
            // method.)
            return Verdict::Fail(Error::Protocol(format!(
                "{:?} without a Baton answer (a proxy in front of the cluster?): {}",
                status.code(),
                status.message()
            )));
        }
        // No Baton detail: the node never answered (transport failure, proxy, overload).
        return Verdict::Retry(format!("{:?}: {}", status.code(), status.message()));
    };
    if let Some(refusal) = refusal_of(&detail) {
        return Verdict::Fail(Error::Refused(refusal));
    }
    match detail.code.as_str() {
        // A leader address without a port would be dialled at port 80: treated as no address.
        infra::NOT_LEADER if has_port(&normalize(&detail.leader_addr)) => {
            Verdict::Redirect(normalize(&detail.leader_addr))
        }
        infra::NOT_LEADER
        | infra::NO_LEADER
        | infra::INTERNAL
        | infra::NOT_INITIALIZED
        | infra::SHUTTING_DOWN => Verdict::Retry(format!("{}: {}", detail.code, status.message())),
        infra::OVERLOADED => Verdict::Backoff(format!("{}: {}", detail.code, status.message())),
        infra::SESSION_EXPIRED => {
            Verdict::Fail(Error::OutcomeUnknown(status.message().to_string()))
        }
        code => Verdict::Fail(Error::Server {
            code: code.to_string(),
            message: status.message().to_string(),
        }),
    }
}

/// Maps a status to an error without retrying (for per-node administrative calls).
fn final_error(status: &Status) -> Error {
    match classify(status) {
        Verdict::Fail(error) => error,
        Verdict::Redirect(_) | Verdict::Retry(_) | Verdict::Backoff(_) => match detail_of(status) {
            Some(detail) => Error::Server {
                code: detail.code,
                message: status.message().to_string(),
            },
            None => Error::Unavailable {
                endpoints: vec![],
                waited: Duration::ZERO,
                last: format!("{:?}: {}", status.code(), status.message()),
            },
        },
    }
}

#[cfg(test)]
mod broken_server_tests;

#[cfg(test)]
mod classify_tests {
    use super::*;

    /// An endpoint without a port would be dialled at port 80 and fail only after the whole
    /// deadline: refused at once, naming it.
    #[test]
    fn an_endpoint_without_a_port_is_refused() {
        for good in [
            "10.0.0.1:7001",
            "http://node1:7001/",
            "http://node1:7001/x",
            "[::1]:7001",
            "localhost:1",
            "HTTP://node1:7001",
        ] {
            assert!(
                Client::new(&[good], ClientConfig::default()).is_ok(),
                "{good}"
            );
        }
        for bad in [
            "10.0.0.1",
            "node1:",
            "node1:0",
            ":7001",
            "node1:http",
            "::1",
        ] {
            match Client::new(&["127.0.0.1:7001", bad], ClientConfig::default()) {
                Err(Error::Config(message)) => assert!(message.contains("no port"), "{message}"),
                other => panic!("{bad}: {:?}", other.map(|_| ())),
            }
        }
    }

    /// An endpoint with a port that still cannot be dialled (two joined by a comma, a space in
    /// the host) is refused when the client is made, not when failover first reaches it in the
    /// middle of a call, which then ended with it.
    #[test]
    fn an_endpoint_that_cannot_be_parsed_is_refused_at_once() {
        for bad in [
            "10.0.0.2:7001,10.0.0.3:7001",
            "node 2:7001",
            "node\u{7f}:7001",
        ] {
            match Client::new(&["127.0.0.1:7001", bad], ClientConfig::default()) {
                Err(Error::Config(message)) => {
                    assert!(message.contains("bad endpoint"), "{message}")
                }
                other => panic!("{bad}: {:?}", other.map(|_| ())),
            }
        }
    }

    /// A message over gRPC's size limit fails the same way on every node and every attempt:
    /// retrying it for the whole deadline only to report "cluster unavailable" misleads.
    #[test]
    fn a_message_over_the_size_limit_fails_at_once() {
        let status = Status::out_of_range("decoded message length too large");
        match classify(&status) {
            Verdict::Fail(Error::Protocol(message)) => {
                assert!(message.contains("size limit"), "{message}");
            }
            _ => panic!("not a final protocol error"),
        }
        assert!(matches!(
            classify(&Status::unavailable("connection refused")),
            Verdict::Retry(_)
        ));
    }

    /// Credentials something in front of the cluster refuses fail the same way on every
    /// attempt: said at once, not after the deadline as "cluster unavailable".
    #[test]
    fn a_refusal_that_is_not_a_baton_answer_fails_at_once() {
        assert!(
            matches!(classify(&Status::unimplemented("")), Verdict::Retry(_)),
            "another node may have the method"
        );
        for status in [
            Status::unauthenticated("proxy: bad credentials"),
            Status::permission_denied("proxy: forbidden"),
        ] {
            match classify(&status) {
                Verdict::Fail(Error::Protocol(message)) => {
                    assert!(message.contains("proxy"), "{message}")
                }
                _ => panic!("{:?} is retried", status.code()),
            }
        }
    }

    /// A refusal is the store's answer only when a Baton detail says so: a status without one
    /// (from a proxy, a load balancer, something else at the address), whatever its gRPC code
    /// and however much its text looks like a refusal, is never taken for a contract refusal.
    #[test]
    fn a_status_without_a_baton_detail_is_never_a_refusal() {
        let texts: Vec<String> = ["TAKEN".to_string()]
            .into_iter()
            .chain(Refusal::all().map(|refusal| refusal.code().to_string()))
            .chain(Refusal::all().map(|refusal| Error::Refused(refusal).to_string()))
            .collect();
        for code in [
            Code::Aborted,
            Code::NotFound,
            Code::FailedPrecondition,
            Code::AlreadyExists,
            Code::InvalidArgument,
            Code::Internal,
            Code::DeadlineExceeded,
            Code::Cancelled,
        ] {
            for text in &texts {
                let status = Status::new(code, text.clone());
                assert!(detail_of(&status).is_none());
                if let Verdict::Fail(Error::Refused(refusal)) = classify(&status) {
                    panic!("{code:?} {text:?} without a detail was read as {refusal:?}");
                }
                let error = final_error(&status);
                assert!(
                    error.refusal().is_none(),
                    "{code:?} {text:?} without a detail ended as {error:?}"
                );
            }
        }
    }

    /// A request older than the store's session window is neither refused nor retried: its
    /// first attempt may or may not have taken effect, so the host hears "outcome unknown" (an
    /// infrastructure error, never a contract refusal) and reconciles.
    #[test]
    fn a_forgotten_request_is_outcome_unknown() {
        let status = crate::error::infra_status(
            Code::Aborted,
            infra::SESSION_EXPIRED,
            "older than the session window",
        );
        match classify(&status) {
            Verdict::Fail(error @ Error::OutcomeUnknown(_)) => {
                assert!(error.is_infrastructure());
                assert!(error.refusal().is_none());
            }
            _ => panic!("SESSION_EXPIRED is not outcome unknown"),
        }
    }

    /// A wait too long to add to now is taken as decades, not a panic.
    #[test]
    fn a_wait_too_long_to_add_is_decades() {
        let far = instant_after(Duration::MAX);
        assert!(far > tokio::time::Instant::now() + Duration::from_secs(10 * 365 * 24 * 3600));
        let soon = instant_after(Duration::from_secs(1));
        assert!(soon <= tokio::time::Instant::now() + Duration::from_secs(1));
    }

    /// A seq used twice gets the same answer on every attempt: said at once with its code, not
    /// retried to the deadline.
    #[test]
    fn a_reused_seq_fails_at_once() {
        let status = crate::error::infra_status(
            Code::FailedPrecondition,
            crate::error::infra::SEQ_REUSED,
            "the store's answer to this request is a Task reply",
        );
        match classify(&status) {
            Verdict::Fail(Error::Server { code, .. }) => assert_eq!(code, "SEQ_REUSED"),
            _ => panic!("a reused seq is retried"),
        }
    }

    /// A leader address without a port would be dialled at port 80 and burn the deadline: the
    /// hint is dropped and the client tries its endpoints.
    #[test]
    fn a_leader_hint_without_a_port_is_not_followed() {
        let hint = |addr: &str| classify(&crate::error::not_leader_status(Some((2, addr.into()))));
        assert!(matches!(hint("node2"), Verdict::Retry(_)));
        match hint("HTTP://node2:7001/") {
            Verdict::Redirect(leader) => assert_eq!(leader, "node2:7001"),
            _ => panic!("a good hint is not followed"),
        }
    }

    /// Endpoints are normalized whatever the scheme's case, so they dial as given.
    #[test]
    fn a_scheme_in_capitals_is_understood() {
        let client = Client::new(
            &["HTTP://node1:7001/", "Http://node2:7001"],
            ClientConfig::default(),
        )
        .expect("both endpoints are good");
        assert_eq!(client.endpoints(), ["node1:7001", "node2:7001"]);
    }
}

#[cfg(test)]
mod connection_tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A node that accepts connections, counts them and never says a word.
    pub(crate) async fn silent_node() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        (addr, accepted)
    }

    /// A node whose sink turns every write away with `code` and Baton's `baton_code`.
    struct Refusing {
        code: Code,
        baton_code: &'static str,
    }

    /// A node refusing a token it does not accept.
    const UNAUTHENTICATING: Refusing = Refusing {
        code: Code::Unauthenticated,
        baton_code: infra::UNAUTHENTICATED,
    };

    /// A node at its in-flight limit.
    const OVERLOADED: Refusing = Refusing {
        code: Code::ResourceExhausted,
        baton_code: infra::OVERLOADED,
    };

    #[tonic::async_trait]
    impl crate::proto::sink_server::Sink for Refusing {
        async fn write(
            &self,
            _: tonic::Request<crate::proto::SinkWriteRequest>,
        ) -> Result<tonic::Response<crate::proto::SinkWriteResponse>, Status> {
            Err(crate::error::infra_status(
                self.code,
                self.baton_code,
                "this node turns the write away",
            ))
        }

        async fn read(
            &self,
            _: tonic::Request<crate::proto::SinkReadRequest>,
        ) -> Result<tonic::Response<crate::proto::SinkReadResponse>, Status> {
            Err(Status::unimplemented("not in this test"))
        }
    }

    /// A node that says the leader is at the address it holds.
    struct Redirecting(String);

    #[tonic::async_trait]
    impl crate::proto::sink_server::Sink for Redirecting {
        async fn write(
            &self,
            _: tonic::Request<crate::proto::SinkWriteRequest>,
        ) -> Result<tonic::Response<crate::proto::SinkWriteResponse>, Status> {
            Err(crate::error::not_leader_status(Some((9, self.0.clone()))))
        }

        async fn read(
            &self,
            _: tonic::Request<crate::proto::SinkReadRequest>,
        ) -> Result<tonic::Response<crate::proto::SinkReadResponse>, Status> {
            Err(Status::unimplemented("not in this test"))
        }
    }

    /// A [`Redirecting`] node naming `to`, or its own address when `to` is `None`.
    async fn redirecting_node(to: Option<String>) -> String {
        sink_node(|addr| Redirecting(to.unwrap_or_else(|| addr.to_string()))).await
    }

    /// A node on a free local port serving the sink `service` makes, given that address.
    async fn sink_node<S: crate::proto::sink_server::Sink>(
        service: impl FnOnce(&str) -> S,
    ) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(crate::proto::sink_server::SinkServer::new(service(&addr)))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        addr
    }

    /// A leader hint that leads to a node naming itself the leader (an address that reaches
    /// another node than the one advertising it) is dropped: the client kept dialling it until
    /// the deadline, call after call, and never tried its other endpoints.
    #[tokio::test]
    async fn a_hint_that_loops_is_forgotten() {
        let config = ClientConfig {
            deadline: Duration::from_secs(3),
            attempt_timeout: Duration::from_millis(300),
            connect_timeout: Duration::from_millis(300),
        };
        let looping = redirecting_node(None).await;
        let pointing = redirecting_node(Some(looping)).await;
        let refusing = refusing_node(UNAUTHENTICATING).await;
        let client = Client::new(&[pointing, refusing], config).unwrap();
        // The refusing node was reached (after redirects, so the outcome is unknown).
        match client.write_fenced("r", 1, b"v").await {
            Err(error @ Error::OutcomeUnknown(_)) => {
                assert!(error.to_string().contains("UNAUTHENTICATED"), "{error}")
            }
            other => panic!("{other:?}"),
        }
    }

    async fn refusing_node(refusing: Refusing) -> String {
        sink_node(|_| refusing).await
    }

    /// A node's refusal to take a write says nothing of an earlier attempt that went
    /// unanswered: that one may have been applied, so the outcome is unknown — not the
    /// refusal's "nothing was done", on which a host would write again and meet its own write.
    #[tokio::test]
    async fn a_node_refusing_a_retry_leaves_the_outcome_unknown() {
        let config = ClientConfig {
            deadline: Duration::from_secs(5),
            attempt_timeout: Duration::from_millis(300),
            connect_timeout: Duration::from_millis(300),
        };
        let refusing = refusing_node(UNAUTHENTICATING).await;
        // Its refusal of a first attempt is final: nothing was done.
        let alone = Client::new(std::slice::from_ref(&refusing), config.clone()).unwrap();
        match alone.write_fenced("r", 1, b"v").await {
            Err(Error::Server { code, .. }) => assert_eq!(code, "UNAUTHENTICATED"),
            other => panic!("{other:?}"),
        }
        // After a first attempt that went unanswered, the same refusal leaves it unknown.
        let (silent, _) = silent_node().await;
        let client = Client::new(&[silent, refusing.clone()], config.clone()).unwrap();
        match client.write_fenced("r", 1, b"v").await {
            Err(error @ Error::OutcomeUnknown(_)) => {
                assert!(error.outcome_unknown());
                assert!(error.to_string().contains("UNAUTHENTICATED"), "{error}");
            }
            other => panic!("{other:?}"),
        }
        // A first sending turned away OVERLOADED did nothing: the refusal after it is final.
        let overloaded = refusing_node(OVERLOADED).await;
        let client = Client::new(&[overloaded, refusing], config).unwrap();
        match client.write_fenced("r", 1, b"v").await {
            Err(Error::Server { code, .. }) => assert_eq!(code, "UNAUTHENTICATED"),
            other => panic!("{other:?}"),
        }
    }

    /// A connection whose keep-alive ping goes unanswered is dropped, and a later call dials
    /// anew; until then the calls reuse the one connection.
    #[tokio::test]
    async fn a_connection_that_stops_answering_is_replaced() {
        let (addr, accepted) = silent_node().await;
        // Calls give up long before the first ping is due (one attempt_timeout after connecting).
        let attempt = Duration::from_secs(1);
        let config = ClientConfig {
            deadline: Duration::from_millis(100),
            attempt_timeout: attempt,
            connect_timeout: attempt,
        };
        let client = Client::new(&[addr], config).unwrap();
        assert!(client.ticket("k").await.is_err(), "nobody answers");
        assert!(client.ticket("k").await.is_err());
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection, reused");
        // The keep-alive ping goes unanswered (about two attempt_timeouts after connecting): the
        // connection is dropped and a call after that dials. Calls until one has, rather than
        // one call after a fixed wait that a busy machine could outlast the ping by.
        let started = Instant::now();
        while accepted.load(Ordering::SeqCst) < 2 {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the silent connection was still in use after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(client.ticket("k").await.is_err());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "one new connection");
        println!("replaced after {:?}", started.elapsed());
    }

    /// `https://` says the caller expects TLS; without TLS settings the client would have
    /// dialled in plaintext and sent the token for anyone on the path to read.
    #[test]
    fn an_https_endpoint_without_tls_settings_is_refused() {
        let security = Security {
            token: Some("secret".into()),
            tls: None,
        };
        let error = Client::new_with_security(
            &["127.0.0.1:7001", " HTTPS://baton.example:7443/"],
            ClientConfig::default(),
            security,
        )
        .err()
        .unwrap();
        match error {
            Error::Config(message) => {
                assert!(message.contains("HTTPS://baton.example:7443"), "{message}")
            }
            other => panic!("not a configuration error: {other:?}"),
        }
        assert!(Client::new(&["http://127.0.0.1:7001"], ClientConfig::default()).is_ok());
    }

    /// A node may name a leader at an address this client cannot dial (as another node's
    /// configuration spells it): the calls go on at the endpoints given, instead of every later
    /// call failing at once with a configuration error.
    #[tokio::test]
    async fn an_undialable_leader_address_is_forgotten() {
        let (addr, accepted) = silent_node().await;
        let config = ClientConfig {
            deadline: Duration::from_millis(300),
            attempt_timeout: Duration::from_millis(100),
            connect_timeout: Duration::from_millis(100),
        };
        let client = Client::new(&[addr], config).unwrap();
        *lock(&client.inner.leader) = Some("bad host:7001".into());
        let error = client.ticket("k").await.unwrap_err();
        assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
        assert_eq!(*lock(&client.inner.leader), None);
        assert!(
            accepted.load(Ordering::SeqCst) >= 1,
            "the endpoint was tried"
        );
    }

    /// A write (a cancel) from `client` while the session's window is full, the oldest write of
    /// the window ending `after` it was made: what the write failed with, and when.
    async fn write_held_by_the_window(client: &Client, after: Duration) -> (Error, Duration) {
        let session = &client.inner.session;
        let stuck = InFlight::begin(session).await;
        let mut later = Vec::new();
        for _ in 1..SEQ_WINDOW {
            later.push(InFlight::begin(session).await);
        }
        let started = Instant::now();
        let write = client.cancel("k", "me");
        let unblock = async {
            tokio::time::sleep(after).await;
            drop(stuck);
            std::future::pending::<()>().await
        };
        tokio::select! {
            error = write => (error.unwrap_err(), started.elapsed()),
            () = unblock => unreachable!(),
        }
    }

    /// A write that waited for the session's window has used part of its deadline: the call
    /// as a whole ends at the deadline (it used to get a whole deadline more after the wait).
    #[tokio::test]
    async fn the_wait_for_the_window_counts_against_the_deadline() {
        let (addr, _) = silent_node().await;
        // Long enough that the bound below sits seconds from both the expected end (10 s) and
        // the old one (8 s of waiting and then a whole deadline: 18 s).
        let deadline = Duration::from_secs(10);
        let config = ClientConfig {
            deadline,
            attempt_timeout: Duration::from_millis(200),
            connect_timeout: Duration::from_millis(200),
        };
        let client = Client::new(&[addr], config).unwrap();
        let (error, took) = write_held_by_the_window(&client, deadline * 4 / 5).await;
        assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
        assert!(
            took < deadline + deadline * 2 / 5,
            "took {took:?}, past the {deadline:?} deadline by more than any attempt"
        );
        println!("the write ended after {took:?}");
    }

    /// A write let through the window with too little of its deadline left is not sent (it
    /// could only end as "no answer", its outcome unknown).
    #[tokio::test]
    async fn a_write_the_window_held_until_its_deadline_is_not_sent() {
        let (addr, accepted) = silent_node().await;
        let deadline = Duration::from_millis(500);
        let config = ClientConfig {
            deadline,
            ..ClientConfig::default()
        };
        let client = Client::new(&[addr], config).unwrap();
        let (error, _) = write_held_by_the_window(&client, deadline - MIN_ATTEMPT / 2).await;
        match error {
            Error::Unavailable { last, .. } => assert!(last.contains("not sent"), "{last}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 0, "nothing was sent");
    }

    /// A client whose whole deadline is shorter than [`MIN_ATTEMPT`] still sends its writes.
    #[tokio::test]
    async fn a_write_with_a_short_deadline_is_sent() {
        let (addr, accepted) = silent_node().await;
        let config = ClientConfig {
            deadline: MIN_ATTEMPT / 2,
            ..ClientConfig::default()
        };
        let client = Client::new(&[addr], config).unwrap();
        match client.cancel("k", "me").await.unwrap_err() {
            Error::Unavailable { last, .. } => assert!(!last.contains("not sent"), "{last}"),
            other => panic!("{other:?}"),
        }
        assert!(accepted.load(Ordering::SeqCst) >= 1, "the write went out");
    }

    #[tokio::test]
    async fn a_call_ends_at_its_deadline_even_inside_an_attempt() {
        let (addr, _) = silent_node().await;
        let config = ClientConfig {
            deadline: Duration::from_millis(200),
            attempt_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(1),
        };
        let client = Client::new(&[addr], config).unwrap();
        let started = Instant::now();
        let error = client.ticket("k").await.unwrap_err();
        assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
        // Far below the 30 s an attempt may take: the deadline cut the attempt short.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }
}

#[cfg(test)]
mod session_tests {
    #![allow(clippy::unwrap_used)]

    use baton_statemachine::{Origin, Reply, Response, SessionLookup, Sessions};
    use futures::FutureExt;

    use super::*;

    /// Numbers a request at once, or `None` when it would have to wait for the window.
    fn begin(session: &Session) -> Option<InFlight<'_>> {
        InFlight::begin(session).now_or_never()
    }

    #[test]
    fn acked_below_never_passes_a_request_still_in_flight() {
        let s = Session::new(SEQ_WINDOW);
        let a = begin(&s).unwrap();
        let b = begin(&s).unwrap();
        assert_eq!((a.seq, a.acked_below), (1, 1));
        assert_eq!(
            (b.seq, b.acked_below),
            (2, 1),
            "1 is still waiting for its answer"
        );
        drop(a);
        let c = begin(&s).unwrap();
        assert_eq!((c.seq, c.acked_below), (3, 2));
        drop(b);
        drop(c);
        let d = begin(&s).unwrap();
        assert_eq!((d.seq, d.acked_below), (4, 4));
    }

    #[test]
    fn concurrent_writers_never_acknowledge_an_unsent_seq() {
        let s = std::sync::Arc::new(Session::new(SEQ_WINDOW));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..2_000 {
                        // Waits when a thread holding an old seq was descheduled while the
                        // others made a window's worth of requests: its end wakes them.
                        let request = futures::executor::block_on(InFlight::begin(&s));
                        // Every seq below acked_below was handed out and is finished.
                        assert!(request.acked_below <= request.seq);
                        let numbers = lock(&s.numbers);
                        assert!(numbers
                            .in_flight
                            .range(..request.acked_below)
                            .next()
                            .is_none());
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("writer thread");
        }
        assert!(
            lock(&s.numbers).in_flight.is_empty(),
            "every finished request left the set"
        );
    }

    /// The store's own session table, fed every write but one whose attempt was lost (as in a
    /// failover, waiting out its attempt timeout while thousands of later writes are made):
    /// later writes wait once the window is full, so the lost one's retry still finds its seq
    /// within what the store remembers, and is applied (or answered) once instead of coming
    /// back `SESSION_EXPIRED`, its outcome unknown.
    #[test]
    fn a_write_stuck_under_thousands_of_later_ones_can_still_be_retried() {
        let client = Client::new(&["127.0.0.1:7001"], ClientConfig::default()).unwrap();
        // Long polls too: a lease attempt lost in a failover is retried like any write.
        for session in [&client.inner.session, &client.inner.poll_session] {
            a_stuck_request_can_still_be_retried(session);
        }
    }

    fn a_stuck_request_can_still_be_retried(s: &Session) {
        let origin = |request: &InFlight| Origin {
            client_id: s.client_id,
            seq: request.seq,
            acked_below: request.acked_below,
        };
        let mut store = Sessions::default();
        let stuck = begin(s).unwrap();
        let mut sent = 0;
        for n in 0..3 * MAX_REPLIES_PER_CLIENT as u64 {
            let Some(request) = begin(s) else { break };
            store.record(
                &origin(&request),
                Response::Answer(Ok(Reply::Swept { expired: n })),
                0,
            );
            sent += 1;
        }
        assert_eq!(
            sent,
            SEQ_WINDOW - 1,
            "the window filled, then writes waited"
        );
        assert_eq!(store.lookup(&origin(&stuck)), SessionLookup::New);
        // The waiting write goes as soon as the stuck one ends.
        let mut waiting = Box::pin(InFlight::begin(s));
        assert!((&mut waiting).now_or_never().is_none());
        drop(stuck);
        assert!(waiting.now_or_never().is_some());
    }
}
