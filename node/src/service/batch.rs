//! `Batch.Call`: many unary calls in one request (see `baton.proto` and
//! [`baton_rpc::batch`]).
//!
//! Each item is decoded and handed to the very handler that serves the call on its own, and all
//! items run concurrently, so the writes among them meet in the proposer and share Raft entries.
//! Each item gets the answer (or the status) the call alone would have got; one item's refusal
//! or bad bytes never touch the others.

use baton_rpc::batch::{self, Method};
use baton_rpc::proto::batch_result::Outcome;
use baton_rpc::proto::batch_server;
use baton_rpc::proto::board_server::Board;
use baton_rpc::proto::handoff_server::Handoff;
use baton_rpc::proto::queue_server::Queue;
use baton_rpc::proto::{BatchItem, BatchRequest, BatchResponse, BatchResult};
use baton_statemachine::Refusal;
use futures::future::join_all;
use prost::Message;
use tonic::{Request, Response, Status};

use super::{refused, BoardService, HandoffService, QueueService};
use crate::admission::Admission;
use crate::limits::BatchPlaces;
use crate::metrics::metrics;
use crate::node::NodeRef;

/// Serves batches with the same handlers as the services themselves.
pub struct BatchService {
    board: BoardService,
    handoff: HandoffService,
    queue: QueueService,
    places: BatchPlaces,
}

impl BatchService {
    /// The batch service of `node`, behind `admission`'s gate, its calls taking `places`.
    pub fn new(node: NodeRef, admission: Admission, places: BatchPlaces) -> Self {
        Self {
            board: BoardService::new(node.clone()),
            handoff: HandoffService::new(node.clone()),
            queue: QueueService::new(node, admission),
            places,
        }
    }

    /// One item: counted and timed like the call on its own.
    async fn item(&self, item: BatchItem) -> BatchResult {
        let name = item.method.trim_start_matches('/');
        let _in_flight = metrics().request_started(name);
        let outcome = match self.dispatch(&item.method, &item.request).await {
            Ok(response) => Outcome::Response(response),
            Err(status) => {
                metrics().request_failed(name, &status);
                Outcome::Status(batch::status_to_wire(&status))
            }
        };
        BatchResult {
            outcome: Some(outcome),
        }
    }

    /// One item answered `status` without running, counted like a call refused on its own.
    fn answered_without_running(&self, item: &BatchItem, status: Status) -> BatchResult {
        crate::limits::count_refusal(&item.method, &status);
        BatchResult {
            outcome: Some(Outcome::Status(batch::status_to_wire(&status))),
        }
    }

    async fn dispatch(&self, method: &str, request: &[u8]) -> Result<Vec<u8>, Status> {
        use batch::*;
        let (board, handoff, queue) = (&self.board, &self.handoff, &self.queue);
        match method {
            m if m == BOARD_CLAIM.path => run(BOARD_CLAIM, request, |r| board.claim(r)).await,
            m if m == BOARD_RELEASE.path => run(BOARD_RELEASE, request, |r| board.release(r)).await,
            m if m == BOARD_COMPLETE.path => {
                run(BOARD_COMPLETE, request, |r| board.complete(r)).await
            }
            m if m == BOARD_RENEW.path => run(BOARD_RENEW, request, |r| board.renew(r)).await,
            m if m == HANDOFF_OFFER.path => run(HANDOFF_OFFER, request, |r| handoff.offer(r)).await,
            m if m == HANDOFF_TAKE.path => run(HANDOFF_TAKE, request, |r| handoff.take(r)).await,
            m if m == HANDOFF_REPLY.path => run(HANDOFF_REPLY, request, |r| handoff.reply(r)).await,
            m if m == HANDOFF_CANCEL.path => {
                run(HANDOFF_CANCEL, request, |r| handoff.cancel(r)).await
            }
            m if m == HANDOFF_GET.path => run(HANDOFF_GET, request, |r| handoff.get(r)).await,
            m if m == QUEUE_SUBMIT.path => run(QUEUE_SUBMIT, request, |r| queue.submit(r)).await,
            m if m == QUEUE_START.path => run(QUEUE_START, request, |r| queue.start(r)).await,
            m if m == QUEUE_RENEW.path => run(QUEUE_RENEW, request, |r| queue.renew(r)).await,
            m if m == QUEUE_COMPLETE.path => {
                run(QUEUE_COMPLETE, request, |r| queue.complete(r)).await
            }
            m if m == QUEUE_FAIL.path => run(QUEUE_FAIL, request, |r| queue.fail(r)).await,
            m if m == QUEUE_GET_TASK.path => {
                run(QUEUE_GET_TASK, request, |r| queue.get_task(r)).await
            }
            other => Err(Status::unimplemented(format!(
                "{other:?} cannot be batched; call it on its own"
            ))),
        }
    }
}

/// Decodes `request` for `method`, runs `handler` on it and encodes its answer.
async fn run<Req, Resp, F, Fut>(
    method: Method<Req, Resp>,
    request: &[u8],
    handler: F,
) -> Result<Vec<u8>, Status>
where
    Req: Message + Default,
    Resp: Message,
    F: FnOnce(Request<Req>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<Resp>, Status>>,
{
    let request = Req::decode(request).map_err(|e| {
        refused(Refusal::invalid(
            "request",
            format!("is not a valid message for {}: {e}", method.path),
        ))
    })?;
    let response = handler(Request::new(request)).await?;
    Ok(response.into_inner().encode_to_vec())
}

#[tonic::async_trait]
impl batch_server::Batch for BatchService {
    #[tracing::instrument(skip_all, fields(items))]
    async fn call(
        &self,
        request: Request<BatchRequest>,
    ) -> Result<Response<BatchResponse>, Status> {
        let remote = request.remote_addr();
        let items = request.into_inner().items;
        tracing::Span::current().record("items", items.len());
        if items.len() > batch::MAX_ITEMS {
            return Err(refused(Refusal::invalid(
                "items",
                format!("a batch carries at most {} calls", batch::MAX_ITEMS),
            )));
        }
        let (_places, admitted) = self.places.take(items.len(), remote);
        let refusal = (admitted < items.len()).then(|| self.places.refusal(remote));
        let refusal = &refusal;
        let results = join_all(items.into_iter().enumerate().map(|(i, item)| async move {
            match refusal {
                Some(refusal) if i >= admitted => {
                    self.answered_without_running(&item, refusal.clone())
                }
                _ => self.item(item).await,
            }
        }))
        .await;
        Ok(Response::new(BatchResponse { results }))
    }
}
