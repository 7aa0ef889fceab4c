//! The front door of client requests: admission under the in-flight limits, and the account of
//! every request's outcome in the metrics.
//!
//! A node under more load than it can serve must say so at once rather than queue without
//! bound: a client request that would exceed [`Limits::max_in_flight`] on the node, or
//! [`Limits::max_in_flight_per_connection`] on its connection, is answered `RESOURCE_EXHAUSTED`
//! with the code `OVERLOADED`, which the client library retries with back-off. (tonic's own
//! per-connection limit queues instead.) A request larger than [`Limits::max_request_bytes`] is
//! refused by tonic while decoding; this layer gives that refusal the code `REQUEST_TOO_LARGE`
//! so that it is not mistaken for a transport failure and retried.
//!
//! Only the client services pass through the limits. Raft traffic between nodes, watch streams
//! (long-lived by design, bounded by their own settings), health checks and reflection are never
//! refused here; cluster administration is counted but not limited, so that an operator can
//! still look at an overloaded node.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use baton_rpc::error::{detail_of, infra, infra_status, is_undecodable, refusal_status};
use baton_statemachine::Refusal;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::TcpConnectInfo;
use tonic::{Code, Status};
use tower_layer::Layer;
use tower_service::Service;

use crate::arriving::{Arriving, BODY_IDLE_LIMIT};
use crate::config::Limits;
use crate::metrics::metrics;

/// How a request is treated, by its gRPC path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Door {
    /// A client call: limited and counted.
    Client,
    /// Cluster administration: counted, never refused.
    Admin,
    /// A watch: not limited here (a stream lasts as long as its watcher wants; the watch service
    /// caps streams itself), but counted, with the refusal it opens with (`OVERLOADED`,
    /// `COMPACTED`, ...), and a request it cannot read is refused in Baton's terms, like any
    /// call's.
    Watch,
    /// Everything else: passed through untouched.
    Open,
}

fn door(path: &str) -> Door {
    if path.starts_with("/baton.v1.Cluster/") {
        Door::Admin
    } else if path.starts_with("/baton.v1.Watch/") {
        Door::Watch
    } else if path.starts_with("/baton.v1.") {
        Door::Client
    } else {
        Door::Open
    }
}

/// Counts a request the outer gate ([`crate::admission`]) refused before it reached this layer
/// (a missing token, a closed gate), so those refusals show in the metrics like any other.
pub(crate) fn count_refusal(path: &str, status: &Status) {
    if door(path) == Door::Open {
        return;
    }
    let method = path.trim_start_matches('/');
    let _in_flight = metrics().request_started(method);
    metrics().request_failed(method, status);
}

/// The tower layer that puts [`Admission`] in front of a node's gRPC services.
#[derive(Clone)]
pub struct AdmissionLayer {
    gate: Arc<Gate>,
}

impl AdmissionLayer {
    /// Admits client requests within `limits`.
    pub fn new(limits: Limits) -> Self {
        Self {
            gate: Arc::new(Gate {
                node: Arc::new(Semaphore::new(limits.max_in_flight)),
                connections: Mutex::default(),
                limits,
            }),
        }
    }
}

impl AdmissionLayer {
    /// The places on the node's limit that batches take for their calls ([`BatchPlaces`]).
    pub fn batch_places(&self) -> BatchPlaces {
        BatchPlaces {
            gate: self.gate.clone(),
        }
    }
}

/// A batch is admitted at the door as one request, before its calls are known; once they are,
/// each call beyond the first needs a place of its own on the node's in-flight limit, so that
/// batching carries no more concurrent work — and no more answers held in memory — past
/// [`Limits::max_in_flight`] than the same calls made one by one would. A batch runs as many of
/// its calls as there are places (at least the first, on the batch's own place); the rest are
/// answered `OVERLOADED` each, without running, and the client retries them. Taking what is free
/// rather than all or nothing keeps a large batch from waiting forever behind single calls.
#[derive(Clone)]
pub struct BatchPlaces {
    gate: Arc<Gate>,
}

impl BatchPlaces {
    /// Places for up to `calls` calls of a batch that came on `remote`'s connection (given back
    /// when dropped) and how many of its calls may run: at least 1, at most `calls`. The extra
    /// places count on the connection's limit too, or one connection's batches could take
    /// every place on the node.
    pub fn take(&self, calls: usize, remote: Option<SocketAddr>) -> (Option<Places>, usize) {
        let wanted = calls.min(self.gate.limits.max_in_flight).saturating_sub(1);
        let (wanted, connection) = match remote {
            Some(remote) => {
                let charged = self.gate.charge(remote, wanted);
                (charged, Some((self.gate.clone(), remote, charged)))
            }
            None => (wanted, None),
        };
        let mut places = Places(Ticket {
            _node: None,
            connection,
        });
        // Another request may take a place between the look and the taking: look again.
        for _ in 0..3 {
            let extra = wanted.min(self.gate.node.available_permits());
            let Ok(count) = u32::try_from(extra) else {
                break;
            };
            if count == 0 {
                break;
            }
            if let Ok(node) = self.gate.node.clone().try_acquire_many_owned(count) {
                places.0._node = Some(node);
                places.0.keep_on_connection(extra);
                return (Some(places), extra + 1);
            }
        }
        (None, 1)
    }

    /// The answer to a call of a batch from `remote` that found no place: the connection's
    /// limit when that is full, else the node's.
    pub fn refusal(&self, remote: Option<SocketAddr>) -> Status {
        let limit = self.gate.limits.max_in_flight_per_connection;
        let connection_full = remote.is_some_and(|remote| {
            self.gate
                .connections()
                .get(&remote)
                .is_some_and(|count| *count >= limit)
        });
        if connection_full {
            connection_full_status(limit)
        } else {
            node_full(self.gate.limits.max_in_flight)
        }
    }
}

/// The places a batch took for its calls beyond the first; dropping them gives them back.
pub struct Places(Ticket);

/// The answer to a request beyond its connection's in-flight limit.
fn connection_full_status(limit: usize) -> Status {
    overloaded(format!(
        "this connection has its limit of {limit} requests in flight \
         (limits.max_in_flight_per_connection); retry with back-off"
    ))
}

/// The answer to a request beyond the node's in-flight limit.
fn node_full(limit: usize) -> Status {
    overloaded(format!(
        "this node is serving its limit of {limit} client requests (limits.max_in_flight); \
         retry with back-off or use another node"
    ))
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// The in-flight counts the limits apply to.
struct Gate {
    limits: Limits,
    node: Arc<Semaphore>,
    /// Requests in flight per connection (by the client's address); an entry goes when its
    /// count returns to zero.
    connections: Mutex<HashMap<SocketAddr, usize>>,
}

/// Places in the counts: on the node, and how many on the connection; dropping gives them back.
struct Ticket {
    _node: Option<OwnedSemaphorePermit>,
    connection: Option<(Arc<Gate>, SocketAddr, usize)>,
}

impl Ticket {
    /// Keeps only `kept` of the places charged to the connection, giving the rest back.
    fn keep_on_connection(&mut self, kept: usize) {
        if let Some((gate, remote, charged)) = &mut self.connection {
            gate.discharge(*remote, charged.saturating_sub(kept));
            *charged = kept.min(*charged);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some((gate, remote, charged)) = self.connection.take() {
            gate.discharge(remote, charged);
        }
    }
}

impl Gate {
    fn connections(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, usize>> {
        self.connections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A place for one more request from `remote`, or the `OVERLOADED` answer.
    fn admit(self: &Arc<Self>, remote: Option<SocketAddr>) -> Result<Ticket, Status> {
        let node = self
            .node
            .clone()
            .try_acquire_owned()
            .map_err(|_| node_full(self.limits.max_in_flight))?;
        let Some(remote) = remote else {
            return Ok(Ticket {
                _node: Some(node),
                connection: None,
            });
        };
        if self.charge(remote, 1) == 0 {
            return Err(connection_full_status(
                self.limits.max_in_flight_per_connection,
            ));
        }
        Ok(Ticket {
            _node: Some(node),
            connection: Some((self.clone(), remote, 1)),
        })
    }

    /// Counts up to `wanted` more requests on `remote`'s connection, as many as its limit has
    /// room for; returns how many.
    fn charge(&self, remote: SocketAddr, wanted: usize) -> usize {
        let mut connections = self.connections();
        let count = connections.entry(remote).or_insert(0);
        let charged = wanted.min(
            self.limits
                .max_in_flight_per_connection
                .saturating_sub(*count),
        );
        *count += charged;
        if *count == 0 {
            connections.remove(&remote);
        }
        charged
    }

    /// Gives `n` places on `remote`'s connection back.
    fn discharge(&self, remote: SocketAddr, n: usize) {
        let mut connections = self.connections();
        if let Some(count) = connections.get_mut(&remote) {
            *count = count.saturating_sub(n);
            if *count == 0 {
                connections.remove(&remote);
            }
        }
    }
}

fn overloaded(message: String) -> Status {
    infra_status(Code::ResourceExhausted, infra::OVERLOADED, message)
}

/// When `status` is tonic's refusal of an oversized message (`OUT_OF_RANGE` without a Baton
/// detail — Baton's own `OUT_OF_RANGE` answers always carry one): the same refusal with its code
/// and the setting to change.
fn too_large(status: &Status, limits: &Limits) -> Option<Status> {
    if status.code() != Code::OutOfRange || detail_of(status).is_some() {
        return None;
    }
    Some(infra_status(
        Code::ResourceExhausted,
        infra::REQUEST_TOO_LARGE,
        format!(
            "the request is larger than this node accepts (limits.max_request_bytes = {}): {}",
            limits.max_request_bytes,
            status.message()
        ),
    ))
}

/// When `status` is gRPC's report that the request could not be decoded: the refusal a batch
/// gives the same bytes, `Invalid` on `request`, so a client learns its message is at fault and
/// not the node.
fn undecodable(status: &Status) -> Option<Status> {
    if !is_undecodable(status) {
        return None;
    }
    Some(refusal_status(&Refusal::invalid(
        "request",
        format!(
            "is not a valid message for this method: {}",
            status.message()
        ),
    )))
}

/// The service [`AdmissionLayer`] makes.
#[derive(Clone)]
pub struct Admission<S> {
    inner: S,
    gate: Arc<Gate>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Admission<S>
where
    S: Service<http::Request<Arriving<B>>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The clone that was not polled ready stays behind (the usual tower pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let path = request.uri().path();
        let door = door(path);
        if door == Door::Open {
            return Box::pin(inner.call(request.map(Arriving::unbounded)));
        }
        let limits = self.gate.limits;
        let method = path.trim_start_matches('/').to_string();
        let in_flight = metrics().request_started(&method);
        if door == Door::Watch {
            // In flight until its stream opens (or is refused), like any call until its answer.
            let answer = inner.call(request.map(Arriving::unbounded));
            return Box::pin(async move {
                let answered = explained(answer.await?, &limits, Some(&method));
                drop(in_flight);
                Ok(answered)
            });
        }
        let (ticket, request) = match door {
            Door::Client => {
                let remote = request
                    .extensions()
                    .get::<TcpConnectInfo>()
                    .and_then(|info| info.remote_addr());
                match self.gate.admit(remote) {
                    // The place is held until the answer: the body must keep arriving.
                    Ok(ticket) => (
                        Some(ticket),
                        request.map(|body| Arriving::within(body, BODY_IDLE_LIMIT)),
                    ),
                    Err(status) => {
                        metrics().request_failed(&method, &status);
                        return Box::pin(std::future::ready(Ok(status.into_http())));
                    }
                }
            }
            Door::Admin | Door::Watch | Door::Open => (None, request.map(Arriving::unbounded)),
        };
        let answer = inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            drop(ticket);
            drop(in_flight);
            Ok(explained(response, &limits, Some(&method)))
        })
    }
}

/// `response`, or, when it is gRPC's own refusal of a request too large or not decodable,
/// Baton's typed one; a failure of a counted call's `method` is counted.
fn explained<R: Default>(
    response: http::Response<R>,
    limits: &Limits,
    method: Option<&str>,
) -> http::Response<R> {
    // A call that failed before answering carries its status in the headers (trailers-only).
    let Some(status) = Status::from_header_map(response.headers()) else {
        return response;
    };
    if status.code() == Code::Ok {
        return response;
    }
    let explained = too_large(&status, limits).or_else(|| undecodable(&status));
    if let Some(method) = method {
        metrics().request_failed(method, explained.as_ref().unwrap_or(&status));
    }
    match explained {
        Some(explained) => explained.into_http(),
        None => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(node: usize, per_connection: usize) -> Arc<Gate> {
        AdmissionLayer::new(Limits {
            max_request_bytes: 1024,
            max_in_flight: node,
            max_in_flight_per_connection: per_connection,
            ..Limits::default()
        })
        .gate
    }

    fn addr(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    fn code_of(status: &Status) -> String {
        detail_of(status).map(|d| d.code).unwrap_or_default()
    }

    #[test]
    fn the_connection_limit_refuses_the_extra_request_and_frees_its_place() {
        let gate = gate(10, 2);
        let a = gate.admit(addr(1)).expect("first");
        let _b = gate.admit(addr(1)).expect("second");
        let refused = gate
            .admit(addr(1))
            .err()
            .expect("third on the same connection");
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert_eq!(code_of(&refused), infra::OVERLOADED);
        assert!(refused.message().contains("max_in_flight_per_connection"));
        gate.admit(addr(2))
            .expect("another connection has its own places");
        drop(a);
        gate.admit(addr(1)).expect("a place was given back");
    }

    #[test]
    fn the_node_limit_counts_every_connection() {
        let gate = gate(2, 10);
        let _a = gate.admit(addr(1)).expect("first");
        let b = gate.admit(addr(2)).expect("second");
        let refused = gate.admit(addr(3)).err().expect("over the node's limit");
        assert!(refused.message().contains("limits.max_in_flight"));
        drop(b);
        gate.admit(None).expect("a place was given back");
        assert!(
            gate.connections().len() <= 2,
            "finished connections are forgotten"
        );
    }

    #[test]
    fn only_client_services_pass_the_limits() {
        assert_eq!(door("/baton.v1.Handoff/Offer"), Door::Client);
        assert_eq!(door("/baton.v1.Queue/Lease"), Door::Client);
        assert_eq!(door("/baton.v1.Cluster/NodeInfo"), Door::Admin);
        assert_eq!(door("/baton.v1.Watch/Watch"), Door::Watch);
        assert_eq!(door("/grpc.health.v1.Health/Check"), Door::Open);
    }

    #[test]
    fn tonic_size_refusals_get_their_code_and_others_are_left_alone() {
        let limits = Limits::default();
        let explained = too_large(
            &Status::out_of_range("Error, decoded message length too large: found 9 bytes"),
            &limits,
        )
        .expect("tonic's refusal is recognised");
        assert_eq!(explained.code(), Code::ResourceExhausted);
        assert_eq!(code_of(&explained), infra::REQUEST_TOO_LARGE);
        assert!(explained.message().contains("limits.max_request_bytes"));

        let compacted = baton_rpc::error::compacted_status(1, 5);
        assert!(too_large(&compacted, &limits).is_none());
        assert!(too_large(&Status::not_found("x"), &limits).is_none());
    }
}
