//! Admission: the one gate every gRPC request passes before it reaches a service.
//!
//! Peers' Raft traffic does not pass here: it has connections of its own
//! ([`crate::raft_server`]), never gated (a node that is draining or handing over leadership
//! must keep talking Raft) and, when the node runs TLS, admitted only with a node certificate
//! ([`crate::tls::PeerAcceptor`]). Two rules, judged by the request's path before any handler
//! runs:
//!
//! - **Client traffic** (every other service) must carry `authorization: Bearer <token>` with one
//!   of the configured tokens when the node has any; otherwise it is answered `UNAUTHENTICATED`
//!   before it can change anything. Health checks are the one exception, so probes need no secret.
//! - While the **gate** is closed (a leader handover or a shutdown in progress), new client
//!   requests other than cluster administration are refused with a retryable status, so clients
//!   move to another node; requests already admitted are counted until they finish, so a shutdown
//!   can wait for them. (Of cluster administration, the membership changes refuse themselves
//!   while the gate is closed: `service::cluster`.)

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use baton_rpc::error::{infra, infra_status};
use tokio::sync::watch;
use tonic::Code;

use crate::auth::Tokens;

/// Cluster administration stays reachable while the gate is closed (it is how a handover is
/// asked for and watched).
const CLUSTER_PATH: &str = "/baton.v1.Cluster/";
/// Standard gRPC health checks: answered without a token.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";

/// Why the gate is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Leadership is being handed to another node: try again shortly (or elsewhere).
    HandingOver,
    /// The node is shutting down: go elsewhere.
    ShuttingDown,
}

/// The shared gate; clones share it.
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

struct Inner {
    tokens: Option<Tokens>,
    /// Watched, so that a request admitted to wait (a lease's long poll) can stop waiting when
    /// the gate closes instead of holding up the handover or shutdown that closed it.
    closed: watch::Sender<Option<Closed>>,
    in_flight: watch::Sender<usize>,
    /// Held while a leadership handover runs: one at a time.
    handover: tokio::sync::Mutex<()>,
}

/// What the gate decided about one request.
enum Decision {
    /// Pass without counting (administration, health).
    Pass,
    /// Pass, counted in flight until the response is ready.
    Counted(InFlight),
    /// Answer at once with this status.
    Refuse(tonic::Status),
}

impl Admission {
    /// A gate that checks `tokens` (none: no token needed).
    pub fn new(tokens: Option<Tokens>) -> Self {
        Self {
            inner: Arc::new(Inner {
                tokens,
                closed: watch::Sender::new(None),
                in_flight: watch::Sender::new(0),
                handover: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// Refuses new client requests from now on, for `why` (a shutdown is never downgraded to a
    /// handover).
    pub fn close(&self, why: Closed) {
        self.inner.closed.send_if_modified(|closed| {
            let changed = *closed != Some(Closed::ShuttingDown) && *closed != Some(why);
            if changed {
                *closed = Some(why);
            }
            changed
        });
    }

    /// Admits client requests again (after a handover; never after a shutdown began).
    pub fn reopen(&self) {
        self.inner.closed.send_if_modified(|closed| {
            let changed = *closed == Some(Closed::HandingOver);
            if changed {
                *closed = None;
            }
            changed
        });
    }

    /// Whether the gate is closed (the leader must not propose while it is).
    pub fn is_closed(&self) -> bool {
        self.inner.closed.borrow().is_some()
    }

    /// The status a new client request gets now, if the gate is closed.
    pub fn refusal_now(&self) -> Option<tonic::Status> {
        (*self.inner.closed.borrow()).map(refusal)
    }

    /// Whether the gate closed for a shutdown (it never reopens then).
    pub fn shutting_down(&self) -> bool {
        *self.inner.closed.borrow() == Some(Closed::ShuttingDown)
    }

    /// Resolves when the gate is closed (at once if it is), with the status a new request would
    /// be refused with then.
    pub async fn closed(&self) -> tonic::Status {
        let mut closed = self.inner.closed.subscribe();
        // The sender lives in `self`: waiting cannot fail.
        let why = match closed.wait_for(Option::is_some).await {
            Ok(why) => *why,
            Err(_) => None,
        };
        match why {
            Some(why) => refusal(why),
            None => std::future::pending().await,
        }
    }

    /// The right to run a leadership handover, if no other one is running.
    pub fn handover_slot(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.inner.handover.try_lock().ok()
    }

    /// Client requests admitted and not finished yet.
    pub fn in_flight(&self) -> usize {
        *self.inner.in_flight.borrow()
    }

    /// Waits until no admitted client request is in flight, at most `limit`; returns how many
    /// were still running when it gave up (0 when all finished).
    pub async fn drain(&self, limit: Duration) -> usize {
        let mut count = self.inner.in_flight.subscribe();
        let finished = tokio::time::timeout(limit, count.wait_for(|n| *n == 0)).await;
        match finished {
            Ok(_) => 0,
            Err(_) => self.in_flight(),
        }
    }

    /// The tower layer that applies this gate to a server.
    pub fn layer(&self) -> AdmissionLayer {
        AdmissionLayer {
            admission: self.clone(),
        }
    }

    fn decide<B>(&self, request: &http::Request<B>) -> Decision {
        let path = request.uri().path();
        if path.starts_with(HEALTH_PATH) {
            return Decision::Pass;
        }
        if let Some(tokens) = &self.inner.tokens {
            if let Err(why) = tokens.check(request.headers()) {
                tracing::debug!(path, %why, "request refused: unauthenticated");
                return Decision::Refuse(infra_status(
                    Code::Unauthenticated,
                    infra::UNAUTHENTICATED,
                    why.to_string(),
                ));
            }
        }
        if path.starts_with(CLUSTER_PATH) {
            return Decision::Pass;
        }
        // Counted before the gate is looked at: a request that found it open is in the count by
        // then, so a drain that begins after the gate closed waits for it. (Looked at first, a
        // request could find it open, then the gate close and the drain see nothing in flight,
        // and only then the request be counted and run.) One that finds it closed leaves the
        // count as it is refused.
        let admitted = InFlight::begin(&self.inner.in_flight);
        let closed = *self.inner.closed.borrow();
        match closed {
            None => Decision::Counted(admitted),
            Some(why) => Decision::Refuse(refusal(why)),
        }
    }
}

/// The retryable status a client request gets while the gate is closed for `why`.
fn refusal(why: Closed) -> tonic::Status {
    match why {
        Closed::HandingOver => infra_status(
            Code::Unavailable,
            infra::NO_LEADER,
            "leadership is being handed to another node; retry shortly",
        ),
        Closed::ShuttingDown => infra_status(
            Code::Unavailable,
            infra::SHUTTING_DOWN,
            "this node is shutting down; use another node",
        ),
    }
}

/// One admitted client request; leaves the count when dropped (also when the call is cancelled).
struct InFlight {
    count: watch::Sender<usize>,
}

impl InFlight {
    fn begin(count: &watch::Sender<usize>) -> Self {
        count.send_modify(|n| *n += 1);
        Self {
            count: count.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.count.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Applies an [`Admission`] to every service of a server.
#[derive(Clone)]
pub struct AdmissionLayer {
    admission: Admission,
}

impl<S> tower::Layer<S> for AdmissionLayer {
    type Service = AdmissionService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService {
            admission: self.admission.clone(),
            inner,
        }
    }
}

/// The service an [`AdmissionLayer`] wraps around the server's routes.
#[derive(Clone)]
pub struct AdmissionService<S> {
    admission: Admission,
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, B> tower::Service<http::Request<B>> for AdmissionService<S>
where
    S: tower::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Send,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.admission.decide(&request) {
            Decision::Refuse(status) => {
                crate::limits::count_refusal(request.uri().path(), &status);
                Box::pin(async move { Ok(status.into_http()) })
            }
            Decision::Pass => Box::pin(self.inner.call(request)),
            Decision::Counted(in_flight) => {
                let response = self.inner.call(request);
                Box::pin(async move {
                    let response = response.await;
                    drop(in_flight);
                    response
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str, token: Option<&str>) -> http::Request<()> {
        let mut builder = http::Request::builder().uri(format!("http://node{path}"));
        if let Some(token) = token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        builder.body(()).expect("a valid request")
    }

    fn refused_code(decision: Decision) -> Option<Code> {
        match decision {
            Decision::Refuse(status) => Some(status.code()),
            Decision::Pass | Decision::Counted(_) => None,
        }
    }

    /// No request is admitted after a drain that began once the gate closed has found nothing
    /// in flight. Requests race the close from other threads, round after round; a request
    /// admitted after the drain returned would run unwaited-for during a handover or shutdown.
    #[test]
    fn nothing_is_admitted_after_the_drain_saw_nothing_in_flight() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        use std::time::Instant;

        /// What one racer did in a round.
        #[derive(Default)]
        struct Racer {
            /// Decisions it made.
            decided: AtomicUsize,
            /// Refusals it got for requests it made once the drain had returned.
            refused_after_drain: AtomicUsize,
        }

        /// Spins until `done`, for 30 s at most.
        fn wait_until(what: &str, done: impl Fn() -> bool) {
            let started = Instant::now();
            while !done() {
                assert!(started.elapsed() < Duration::from_secs(30), "{what}");
                std::thread::yield_now();
            }
        }

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let late = Arc::new(AtomicUsize::new(0));
        for _ in 0..300 {
            let gate = Admission::new(None);
            let drained = Arc::new(AtomicBool::new(false));
            let stop = Arc::new(AtomicBool::new(false));
            let racers: Vec<Arc<Racer>> = (0..2).map(|_| Arc::default()).collect();
            let threads: Vec<_> = racers
                .iter()
                .map(|racer| {
                    let (gate, drained, stop, late, racer) = (
                        gate.clone(),
                        drained.clone(),
                        stop.clone(),
                        late.clone(),
                        racer.clone(),
                    );
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Acquire) {
                            let after_drain = drained.load(Ordering::Acquire);
                            let decision = gate.decide(&request("/baton.v1.Handoff/Offer", None));
                            match decision {
                                Decision::Counted(_) if drained.load(Ordering::Acquire) => {
                                    late.fetch_add(1, Ordering::Relaxed);
                                }
                                Decision::Refuse(_) if after_drain => {
                                    racer.refused_after_drain.fetch_add(1, Ordering::Relaxed);
                                }
                                _ => {}
                            }
                            racer.decided.fetch_add(1, Ordering::Release);
                        }
                    })
                })
                .collect();
            // Both racers are deciding when the gate closes (not still starting up).
            wait_until("a racer made no decision before the close", || {
                racers
                    .iter()
                    .all(|racer| racer.decided.load(Ordering::Acquire) > 0)
            });
            gate.close(Closed::ShuttingDown);
            let running = runtime.block_on(gate.drain(Duration::from_secs(5)));
            assert_eq!(running, 0);
            drained.store(true, Ordering::Release);
            // And both went on asking after the drain, and were refused: the rounds looked where
            // a late admission would show.
            wait_until("a racer was not refused after the drain", || {
                racers
                    .iter()
                    .all(|racer| racer.refused_after_drain.load(Ordering::Relaxed) > 0)
            });
            stop.store(true, Ordering::Release);
            threads.into_iter().for_each(|r| r.join().expect("racer"));
        }
        assert_eq!(
            late.load(Ordering::Relaxed),
            0,
            "requests admitted after the drain"
        );
    }

    #[test]
    fn client_requests_need_a_configured_token() {
        let tokens = Tokens::parse("s3cret-0123456789\n").expect("tokens");
        let gate = Admission::new(Some(tokens));
        let write = "/baton.v1.Handoff/Offer";
        assert_eq!(
            refused_code(gate.decide(&request(write, None))),
            Some(Code::Unauthenticated)
        );
        assert_eq!(
            refused_code(gate.decide(&request(write, Some("wrong")))),
            Some(Code::Unauthenticated)
        );
        assert_eq!(
            refused_code(gate.decide(&request(write, Some("s3cret-0123456789")))),
            None
        );
        assert_eq!(
            refused_code(gate.decide(&request("/baton.v1.Cluster/NodeInfo", None))),
            Some(Code::Unauthenticated),
            "administration needs the token too"
        );
    }

    #[test]
    fn a_closed_gate_refuses_client_requests_but_not_administration() {
        let gate = Admission::new(None);
        gate.close(Closed::HandingOver);
        assert_eq!(
            refused_code(gate.decide(&request("/baton.v1.Board/Claim", None))),
            Some(Code::Unavailable)
        );
        assert_eq!(
            refused_code(gate.decide(&request("/baton.v1.Cluster/NodeInfo", None))),
            None
        );
        gate.reopen();
        assert!(!gate.is_closed());
        gate.close(Closed::ShuttingDown);
        gate.reopen();
        assert!(gate.is_closed(), "a shutdown is never undone");
    }

    #[tokio::test]
    async fn a_waiter_learns_when_the_gate_closes_and_why() {
        let gate = Admission::new(None);
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.closed().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "the gate is open");
        gate.close(Closed::HandingOver);
        let status = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiter should learn of the closing")
            .expect("the waiter should not fail");
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("handed"), "{status:?}");
        gate.close(Closed::ShuttingDown);
        let status = gate.closed().await;
        assert!(status.message().contains("shutting down"), "{status:?}");
    }

    #[tokio::test]
    async fn drain_waits_for_admitted_requests() {
        let gate = Admission::new(None);
        let admitted = gate.decide(&request("/baton.v1.Board/Claim", None));
        assert_eq!(gate.in_flight(), 1);
        assert_eq!(gate.drain(Duration::from_millis(20)).await, 1);
        drop(admitted);
        assert_eq!(gate.drain(Duration::from_secs(5)).await, 0);
    }
}
