//! Calls to one node that are in flight at the same time travel as one `Batch.Call`.
//!
//! Every [`Conn`] has a batcher: a task that takes the queued calls, sends them as one batch
//! while fewer than [`BATCHES_IN_FLIGHT`] batches are on their way, and hands each caller its own
//! answer. Nothing waits for a batch to fill: a call made while the node is idle leaves at once,
//! alone; calls made while earlier batches are in flight queue up and leave together. Under load
//! that replaces hundreds of HTTP/2 streams (each with its headers, handler task and response
//! frames on both sides) by a handful, which is most of what a small request costs.
//!
//! A batched call is retried exactly like a direct one: the caller's retry loop sees the status
//! its item got. A node that does not know `Batch.Call` (an older version) answers UNIMPLEMENTED
//! without a Baton detail; the connection then sends every call directly.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::security::Credentials;
use crate::batch::{Method, MAX_BYTES, MAX_ITEMS};
use crate::error::detail_of;
use crate::proto::batch_client::BatchClient;
use crate::proto::batch_result::Outcome;
use crate::proto::{BatchItem, BatchRequest};

/// How many batches may be on their way to one node at once. Few, so that calls made meanwhile
/// gather into the next batch; more than one, so that a batch waiting for its slowest item does
/// not hold up the rest.
const BATCHES_IN_FLIGHT: usize = 4;

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
            match self.batcher.call(method, request.encode_to_vec()).await {
                Ok(bytes) => {
                    return Resp::decode(bytes.as_slice())
                        .map(tonic::Response::new)
                        .map_err(|e| {
                            Status::internal(format!("cannot decode the answer to {method}: {e}"))
                        })
                }
                Err(status) if is_unknown_method(&status) => {
                    self.batcher.unsupported.store(true, Ordering::Relaxed);
                }
                Err(status) => return Err(status),
            }
        }
        let mut grpc = tonic::client::Grpc::new(self.grpc);
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
}

/// UNIMPLEMENTED from gRPC itself (no Baton detail): the node does not know the batch service.
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
}

impl Batcher {
    fn start(grpc: Grpc, attempt_timeout: Duration) -> Self {
        let (queue, pending) = mpsc::unbounded_channel();
        tokio::spawn(dispatch(grpc, pending, attempt_timeout));
        Self {
            queue,
            unsupported: Arc::default(),
        }
    }

    async fn call(&self, method: &'static str, request: Vec<u8>) -> Result<Vec<u8>, Status> {
        let (answer, answered) = oneshot::channel();
        let pending = Pending {
            method,
            request,
            answer,
        };
        if self.queue.send(pending).is_err() {
            return Err(Status::unavailable("the connection's batcher has stopped"));
        }
        answered
            .await
            .unwrap_or_else(|_| Err(Status::unavailable("the batch was dropped unanswered")))
    }
}

/// Sends what is queued as batches, at most [`BATCHES_IN_FLIGHT`] at a time.
async fn dispatch(
    grpc: Grpc,
    mut queue: mpsc::UnboundedReceiver<Pending>,
    attempt_timeout: Duration,
) {
    let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(pending) => pending,
            None => match queue.recv().await {
                Some(pending) => pending,
                None => return,
            },
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        // Everything queued while waiting for a slot goes in this batch, within the limits.
        let mut bytes = first.request.len();
        let mut batch = vec![first];
        while batch.len() < MAX_ITEMS {
            let Ok(next) = queue.try_recv() else { break };
            if bytes + next.request.len() > MAX_BYTES {
                carried = Some(next);
                break;
            }
            bytes += next.request.len();
            batch.push(next);
        }
        let grpc = grpc.clone();
        tokio::spawn(async move {
            send(grpc, batch, attempt_timeout).await;
            drop(slot);
        });
    }
}

/// Sends one batch and answers each of its callers.
async fn send(grpc: Grpc, batch: Vec<Pending>, attempt_timeout: Duration) {
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
    let mut client = BatchClient::new(grpc);
    let call = client.call(BatchRequest { items });
    let results = match tokio::time::timeout(attempt_timeout, call).await {
        Ok(Ok(response)) => response.into_inner().results,
        Ok(Err(status)) => return answer_all(answers, &status),
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
