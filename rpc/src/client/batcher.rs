//! Calls to one node that are in flight at the same time travel as one `Batch.Call`.
//!
//! Every [`Conn`] has at most [`BATCHES_IN_FLIGHT`] requests on their way to its node. A call
//! that finds a free place and nobody queued leaves at once as a plain call, with no extra task
//! hop, so an idle client is as quick as without batching. A call that finds every place taken
//! queues; a batcher task sends everything queued as one batch as soon as a place frees up, and
//! hands each caller its own answer. Nothing ever waits for a batch to fill. Under load
//! that replaces hundreds of HTTP/2 streams (each with its headers, handler task and response
//! frames on both sides) by a handful, which is most of what a small request costs.
//!
//! A batched call is retried exactly like a direct one: the caller's retry loop sees the status
//! its item got. A node that does not know `Batch.Call` (an older version) answers UNIMPLEMENTED
//! without a Baton detail; the connection then sends every call directly.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::security::Credentials;
use super::MAX_ANSWER_BYTES;
use crate::batch::{Method, MAX_BYTES, MAX_ITEMS};
use crate::error::detail_of;
use crate::proto::batch_client::BatchClient;
use crate::proto::batch_result::Outcome;
use crate::proto::{BatchItem, BatchRequest};

/// How many requests (plain calls or batches) may be on their way to one node at once. Few, so
/// that calls made meanwhile gather into the next batch; more than one, so that a batch waiting
/// for its slowest item does not hold up the rest. Two measured best (`baton bench`, 64 clients:
/// less CPU per operation than one or four).
const BATCHES_IN_FLIGHT: usize = 2;

/// The most calls this client puts in one batch: half of what a node accepts
/// ([`MAX_ITEMS`]). A node charges every call of a batch to the connection's in-flight limit
/// (512 by default), so two full batches of [`MAX_ITEMS`] would take all of it, and a call that
/// never batches on the same connection (a long poll, a listing) would push calls of the next
/// batch over it, to be answered `OVERLOADED` and sent again after a pause.
const BATCH_ITEMS: usize = MAX_ITEMS / 2;

/// The gRPC connection to one node, as the generated clients use it.
pub(crate) type Grpc = InterceptedService<Channel, Credentials>;

/// A connection to one node: direct gRPC calls, and batched ones through its batcher.
#[derive(Clone)]
pub(crate) struct Conn {
    grpc: Grpc,
    batcher: Batcher,
}

impl Conn {
    /// A connection over `grpc` whose batches give up after `attempt_timeout`. Must be called
    /// inside a tokio runtime (it starts the batcher task).
    pub(crate) fn new(grpc: Grpc, attempt_timeout: Duration) -> Self {
        let batcher = Batcher::start(grpc.clone(), attempt_timeout);
        Self { grpc, batcher }
    }

    /// One unary call to `method` (a path from [`crate::batch`]), batched with the calls made
    /// at the same time.
    pub(crate) async fn unary<Req, Resp>(
        self,
        method: Method<Req, Resp>,
        request: Req,
    ) -> Result<tonic::Response<Resp>, Status>
    where
        Req: Message + Send + Sync + 'static,
        Resp: Message + Default + Send + Sync + 'static,
    {
        let method = method.path;
        if !self.batcher.unsupported.load(Ordering::Relaxed) {
            if let Some(_place) = self.batcher.place_for_one() {
                return direct(self.grpc, method, request).await;
            }
            match self.batcher.call(method, request.encode_to_vec()).await {
                Ok(bytes) => {
                    return Resp::decode(bytes.as_slice())
                        .map(tonic::Response::new)
                        .map_err(|e| {
                            Status::internal(format!("cannot decode the answer to {method}: {e}"))
                        })
                }
                // The batch itself unknown (set by `send`): this call and the later ones go
                // alone. A call the node does not know answers UNIMPLEMENTED inside a batch as
                // it would alone, and says nothing about batching.
                Err(status)
                    if is_unknown_method(&status)
                        && self.batcher.unsupported.load(Ordering::Relaxed) => {}
                Err(status) => return Err(status),
            }
        }
        direct(self.grpc, method, request).await
    }
}

/// One call on its own, as the generated client would make it.
async fn direct<Req, Resp>(
    grpc: Grpc,
    method: &'static str,
    request: Req,
) -> Result<tonic::Response<Resp>, Status>
where
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(grpc).max_decoding_message_size(MAX_ANSWER_BYTES);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("connection not ready: {e}")))?;
    grpc.unary(
        tonic::Request::new(request),
        PathAndQuery::from_static(method),
        tonic_prost::ProstCodec::default(),
    )
    .await
}

/// UNIMPLEMENTED from gRPC itself (no Baton detail): the node does not know the method (for the
/// batch's own call: the batch service).
fn is_unknown_method(status: &Status) -> bool {
    status.code() == Code::Unimplemented && detail_of(status).is_none()
}

impl<B> tower_service::Service<tonic::codegen::http::Request<B>> for Conn
where
    Grpc: tower_service::Service<tonic::codegen::http::Request<B>>,
{
    type Response = <Grpc as tower_service::Service<tonic::codegen::http::Request<B>>>::Response;
    type Error = <Grpc as tower_service::Service<tonic::codegen::http::Request<B>>>::Error;
    type Future = <Grpc as tower_service::Service<tonic::codegen::http::Request<B>>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.grpc.poll_ready(cx)
    }

    fn call(&mut self, request: tonic::codegen::http::Request<B>) -> Self::Future {
        self.grpc.call(request)
    }
}

/// A call waiting to be sent: the method, its encoded request, and where its answer goes.
struct Pending {
    method: &'static str,
    request: Vec<u8>,
    answer: oneshot::Sender<Result<Vec<u8>, Status>>,
}

/// The queue in front of one node's batcher task; the task ends when every clone is dropped.
#[derive(Clone)]
struct Batcher {
    queue: mpsc::UnboundedSender<Pending>,
    /// Set once the node answered that it has no batch service.
    unsupported: Arc<AtomicBool>,
    /// The places for requests on their way to the node (plain calls and batches).
    places: Arc<Semaphore>,
    /// Calls queued and not yet put in a batch.
    queued: Arc<AtomicUsize>,
}

impl Batcher {
    fn start(grpc: Grpc, attempt_timeout: Duration) -> Self {
        let (queue, pending) = mpsc::unbounded_channel();
        let places = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
        let queued = Arc::new(AtomicUsize::new(0));
        let unsupported = Arc::<AtomicBool>::default();
        tokio::spawn(dispatch(
            grpc,
            pending,
            places.clone(),
            queued.clone(),
            unsupported.clone(),
            attempt_timeout,
        ));
        Self {
            queue,
            unsupported,
            places,
            queued,
        }
    }

    /// A place for a call to go alone: only when one is free and no call is queued before it.
    fn place_for_one(&self) -> Option<OwnedSemaphorePermit> {
        if self.queued.load(Ordering::Acquire) > 0 {
            return None;
        }
        self.places.clone().try_acquire_owned().ok()
    }

    async fn call(&self, method: &'static str, request: Vec<u8>) -> Result<Vec<u8>, Status> {
        let (answer, answered) = oneshot::channel();
        let pending = Pending {
            method,
            request,
            answer,
        };
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.queue.send(pending).is_err() {
            return Err(Status::unavailable("the connection's batcher has stopped"));
        }
        answered
            .await
            .unwrap_or_else(|_| Err(Status::unavailable("the batch was dropped unanswered")))
    }
}

/// Sends what is queued as batches whenever one of the connection's `places` is free.
async fn dispatch(
    grpc: Grpc,
    mut queue: mpsc::UnboundedReceiver<Pending>,
    places: Arc<Semaphore>,
    queued: Arc<AtomicUsize>,
    unsupported: Arc<AtomicBool>,
    attempt_timeout: Duration,
) {
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(pending) => pending,
            None => match queue.recv().await {
                Some(pending) => pending,
                None => return,
            },
        };
        let Ok(slot) = places.clone().acquire_owned().await else {
            return;
        };
        // Everything queued while waiting for a slot goes in this batch, within the limits.
        let mut bytes = first.request.len();
        let mut batch = vec![first];
        while batch.len() < BATCH_ITEMS {
            let Ok(next) = queue.try_recv() else { break };
            if bytes + next.request.len() > MAX_BYTES {
                carried = Some(next);
                break;
            }
            bytes += next.request.len();
            batch.push(next);
        }
        // Counted out only now, so plain calls keep yielding while a batch waits for a place.
        queued.fetch_sub(batch.len(), Ordering::AcqRel);
        // A caller that gave up while its call waited here (its future dropped: a timeout of
        // its own, a `select!`) is not sent: the write would reach the store after its writer
        // stopped waiting and perhaps read the key and tried again under a new seq.
        batch.retain(|pending| !pending.answer.is_closed());
        if batch.is_empty() {
            continue;
        }
        let grpc = grpc.clone();
        let unsupported = unsupported.clone();
        tokio::spawn(async move {
            send(grpc, batch, &unsupported, attempt_timeout).await;
            drop(slot);
        });
    }
}

/// Sends one batch and answers each of its callers; sets `unsupported` when the node does not
/// know the batch service.
async fn send(
    grpc: Grpc,
    batch: Vec<Pending>,
    unsupported: &AtomicBool,
    attempt_timeout: Duration,
) {
    let (items, answers): (Vec<BatchItem>, Vec<_>) = batch
        .into_iter()
        .map(|pending| {
            let item = BatchItem {
                method: pending.method.to_string(),
                request: pending.request,
            };
            (item, pending.answer)
        })
        .unzip();
    let mut client = BatchClient::new(grpc).max_decoding_message_size(MAX_ANSWER_BYTES);
    let call = client.call(BatchRequest { items });
    let results = match tokio::time::timeout(attempt_timeout, call).await {
        Ok(Ok(response)) => response.into_inner().results,
        Ok(Err(status)) => {
            if is_unknown_method(&status) {
                unsupported.store(true, Ordering::Relaxed);
            }
            return answer_all(answers, &status);
        }
        Err(_) => {
            let status = Status::deadline_exceeded(format!(
                "no answer to a batch within {attempt_timeout:?}"
            ));
            return answer_all(answers, &status);
        }
    };
    if results.len() != answers.len() {
        let status = Status::internal(format!(
            "the node answered {} results to a batch of {} calls",
            results.len(),
            answers.len()
        ));
        return answer_all(answers, &status);
    }
    for (answer, result) in answers.into_iter().zip(results) {
        let outcome = match result.outcome {
            Some(Outcome::Response(bytes)) => Ok(bytes),
            Some(Outcome::Status(status)) => Err(crate::batch::status_from_wire(status)),
            None => Err(Status::internal(
                "the node answered a batched call with nothing",
            )),
        };
        // The caller may have given up (its attempt timed out): nothing to do then.
        let _ = answer.send(outcome);
    }
}

fn answer_all(answers: Vec<oneshot::Sender<Result<Vec<u8>, Status>>>, status: &Status) {
    for answer in answers {
        let _ = answer.send(Err(status.clone()));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use tonic::transport::server::TcpIncoming;
    use tonic::transport::{Endpoint, Server};

    use super::*;
    use crate::proto::batch_server::{Batch, BatchServer};
    use crate::proto::{BatchResponse, BatchResult};

    /// A node whose batch service records every call it is sent (method and request) and
    /// answers each with the request's own bytes — except, when `known` names a method, any
    /// other method, which it answers UNIMPLEMENTED, as a node of an older version answers a
    /// method it does not know.
    #[derive(Default, Clone)]
    struct MockNode {
        /// Every call sent: its method and request bytes.
        seen: Arc<Mutex<Vec<Call>>>,
        known: Option<&'static str>,
    }

    type Call = (String, Vec<u8>);

    impl MockNode {
        fn knowing_only(method: &'static str) -> Self {
            Self {
                known: Some(method),
                ..Self::default()
            }
        }

        fn methods(&self) -> Vec<String> {
            self.seen
                .lock()
                .unwrap()
                .iter()
                .map(|(m, _)| m.clone())
                .collect()
        }

        fn requests(&self) -> Vec<Vec<u8>> {
            self.seen
                .lock()
                .unwrap()
                .iter()
                .map(|(_, r)| r.clone())
                .collect()
        }
    }

    #[tonic::async_trait]
    impl Batch for MockNode {
        async fn call(
            &self,
            request: tonic::Request<BatchRequest>,
        ) -> Result<tonic::Response<BatchResponse>, Status> {
            let items = request.into_inner().items;
            let mut seen = self.seen.lock().unwrap();
            let results = items
                .into_iter()
                .map(|item| {
                    seen.push((item.method.clone(), item.request.clone()));
                    let outcome = if self.known.is_none_or(|known| item.method == known) {
                        Outcome::Response(item.request)
                    } else {
                        Outcome::Status(crate::batch::status_to_wire(&Status::unimplemented(
                            "unknown method",
                        )))
                    };
                    BatchResult {
                        outcome: Some(outcome),
                    }
                })
                .collect();
            Ok(tonic::Response::new(BatchResponse { results }))
        }
    }

    /// A connection to a node on 127.0.0.1 whose batch service is `node`.
    async fn serve(node: impl Batch) -> Grpc {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            Server::builder()
                .add_service(BatchServer::new(node))
                .serve_with_incoming(TcpIncoming::from(listener)),
        );
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        InterceptedService::new(channel, Credentials::new(&Default::default()).unwrap())
    }

    /// A call the node does not know fails UNIMPLEMENTED inside a batch, as it would alone, and
    /// the calls after it still travel in batches (batching used to be switched off for the
    /// connection for good: a newer client meeting an older node lost it on every connection).
    #[tokio::test]
    async fn a_method_unknown_inside_a_batch_leaves_batching_on() {
        let node = MockNode::knowing_only("/y");
        let grpc = serve(node.clone()).await;
        let conn = Conn::new(grpc, Duration::from_secs(5));
        // Both places taken, so each call queues and goes in a batch.
        let taken: Vec<_> = (0..BATCHES_IN_FLIGHT)
            .map(|_| conn.batcher.place_for_one().unwrap())
            .collect();
        let unknown = tokio::spawn({
            let conn = conn.clone();
            async move {
                conn.unary(
                    crate::batch::BOARD_CLAIM,
                    crate::proto::ClaimTaskRequest::default(),
                )
                .await
            }
        });
        while conn.batcher.queued.load(Ordering::Acquire) < 1 {
            tokio::task::yield_now().await;
        }
        let mut taken = taken;
        drop(taken.pop());
        let status = unknown.await.unwrap().unwrap_err();
        assert_eq!(status.code(), Code::Unimplemented);
        assert!(!conn.batcher.unsupported.load(Ordering::Relaxed));
        // The next call still goes in a batch (a direct /y would reach no method at all here).
        let known = conn.batcher.call("/y", b"known".to_vec()).await.unwrap();
        assert_eq!(known, b"known");
        assert_eq!(
            node.methods(),
            vec![crate::batch::BOARD_CLAIM.path.to_string(), "/y".to_string()]
        );
        drop(taken);
    }

    /// A call whose caller gave up while it was queued never reaches the node; the one queued
    /// with it still does, and gets its own answer.
    #[tokio::test]
    async fn a_call_abandoned_while_queued_is_not_sent() {
        let node = MockNode::default();
        let grpc = serve(node.clone()).await;
        let batcher = Batcher::start(grpc, Duration::from_secs(5));
        // Both places are taken (as by two calls on their way), so calls queue.
        let taken: Vec<_> = (0..BATCHES_IN_FLIGHT)
            .map(|_| batcher.place_for_one().unwrap())
            .collect();
        let abandoned = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.call("/m", b"abandoned".to_vec()).await }
        });
        let kept = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.call("/m", b"kept".to_vec()).await }
        });
        while batcher.queued.load(Ordering::Acquire) < 2 {
            tokio::task::yield_now().await;
        }
        abandoned.abort();
        assert!(abandoned.await.unwrap_err().is_cancelled());
        drop(taken);
        assert_eq!(kept.await.unwrap().unwrap(), b"kept");
        assert_eq!(node.requests(), vec![b"kept".to_vec()]);
    }

    /// An answer this client cannot decode is a protocol error, failed at once, whether it came
    /// alone (gRPC's decoder) or inside a batch: asked again, the node sends the same bytes.
    /// (It was retried until the deadline and reported as an unavailable cluster.) The mock
    /// node's answers are messages of another type: a nested message where the client expects
    /// a number.
    #[tokio::test]
    async fn an_undecodable_answer_is_a_protocol_error() {
        use crate::proto::{BatchItem, RequestHeader, SinkWriteResponse};
        fn protocol_error(status: &Status) -> bool {
            matches!(
                super::super::classify(status),
                super::super::Verdict::Fail(crate::Error::Protocol(_))
            )
        }
        let grpc = serve(MockNode::default()).await;

        // Alone: a batch's answer, read as if it were a sink write's.
        let request = BatchRequest {
            items: vec![BatchItem {
                method: "/x".into(),
                request: b"x".to_vec(),
            }],
        };
        let status = direct::<_, SinkWriteResponse>(grpc.clone(), "/baton.v1.Batch/Call", request)
            .await
            .unwrap_err();
        assert!(protocol_error(&status), "alone: {status:?}");

        // In a batch: the claim's own bytes echoed, read as a sink write's answer.
        let conn = Conn::new(grpc, Duration::from_secs(5));
        let taken: Vec<_> = (0..BATCHES_IN_FLIGHT)
            .map(|_| conn.batcher.place_for_one().unwrap())
            .collect();
        let claim = crate::proto::ClaimTaskRequest {
            header: Some(RequestHeader {
                client_id: 7,
                ..RequestHeader::default()
            }),
            ..Default::default()
        };
        let method = crate::batch::Method::<_, SinkWriteResponse>::new("/x");
        let call = tokio::spawn({
            let conn = conn.clone();
            async move { conn.unary(method, claim).await }
        });
        while conn.batcher.queued.load(Ordering::Acquire) < 1 {
            tokio::task::yield_now().await;
        }
        drop(taken);
        let status = call.await.unwrap().unwrap_err();
        assert!(protocol_error(&status), "in a batch: {status:?}");
    }
}
