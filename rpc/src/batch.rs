//! The calls that may travel inside a `Batch.Call`, named by their gRPC method paths.
//!
//! The client library ([`crate::Client`]) sends these through a per-node batcher and the node
//! dispatches them by the same names, so the list lives here, once. Only short unary calls
//! belong: a long poll (`Queue/Lease`) or a listing would hold every other item of its batch.

use std::marker::PhantomData;

use tonic::{Code, Status};

use crate::proto::{self, BatchStatus};

/// A unary method that may be batched: its gRPC path, typed by its request and response.
pub struct Method<Req, Resp> {
    /// The full gRPC path, e.g. `/baton.v1.Board/Claim`.
    pub path: &'static str,
    types: PhantomData<fn(Req) -> Resp>,
}

impl<Req, Resp> Method<Req, Resp> {
    pub(crate) const fn new(path: &'static str) -> Self {
        Self {
            path,
            types: PhantomData,
        }
    }
}

impl<Req, Resp> Clone for Method<Req, Resp> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Req, Resp> Copy for Method<Req, Resp> {}

/// `Board/Claim`.
pub const BOARD_CLAIM: Method<proto::ClaimTaskRequest, proto::ClaimTaskResponse> =
    Method::new("/baton.v1.Board/Claim");
/// `Board/Release`.
pub const BOARD_RELEASE: Method<proto::ReleaseTaskRequest, proto::ReleaseTaskResponse> =
    Method::new("/baton.v1.Board/Release");
/// `Board/Complete`.
pub const BOARD_COMPLETE: Method<proto::CompleteTaskRequest, proto::CompleteTaskResponse> =
    Method::new("/baton.v1.Board/Complete");
/// `Board/Renew`.
pub const BOARD_RENEW: Method<proto::RenewTaskRequest, proto::RenewTaskResponse> =
    Method::new("/baton.v1.Board/Renew");
/// `Handoff/Offer`.
pub const HANDOFF_OFFER: Method<proto::OfferRequest, proto::OfferResponse> =
    Method::new("/baton.v1.Handoff/Offer");
/// `Handoff/Take`.
pub const HANDOFF_TAKE: Method<proto::TakeRequest, proto::TakeResponse> =
    Method::new("/baton.v1.Handoff/Take");
/// `Handoff/Reply`.
pub const HANDOFF_REPLY: Method<proto::ReplyRequest, proto::ReplyResponse> =
    Method::new("/baton.v1.Handoff/Reply");
/// `Handoff/Cancel`.
pub const HANDOFF_CANCEL: Method<proto::CancelRequest, proto::CancelResponse> =
    Method::new("/baton.v1.Handoff/Cancel");
/// `Handoff/Get`: a linearizable read of one ticket.
pub const HANDOFF_GET: Method<proto::GetTicketRequest, proto::GetTicketResponse> =
    Method::new("/baton.v1.Handoff/Get");
/// `Queue/Submit`.
pub const QUEUE_SUBMIT: Method<proto::SubmitRequest, proto::SubmitResponse> =
    Method::new("/baton.v1.Queue/Submit");
/// `Queue/Start`.
pub const QUEUE_START: Method<proto::StartAttemptRequest, proto::StartAttemptResponse> =
    Method::new("/baton.v1.Queue/Start");
/// `Queue/Renew`.
pub const QUEUE_RENEW: Method<proto::RenewAttemptRequest, proto::RenewAttemptResponse> =
    Method::new("/baton.v1.Queue/Renew");
/// `Queue/Complete`.
pub const QUEUE_COMPLETE: Method<proto::CompleteAttemptRequest, proto::CompleteAttemptResponse> =
    Method::new("/baton.v1.Queue/Complete");
/// `Queue/Fail`.
pub const QUEUE_FAIL: Method<proto::FailAttemptRequest, proto::FailAttemptResponse> =
    Method::new("/baton.v1.Queue/Fail");
/// `Queue/GetTask`: a linearizable read of one queue task.
pub const QUEUE_GET_TASK: Method<proto::GetQueueTaskRequest, proto::GetQueueTaskResponse> =
    Method::new("/baton.v1.Queue/GetTask");

/// Every method a node accepts inside a batch.
pub const METHODS: &[&str] = &[
    BOARD_CLAIM.path,
    BOARD_RELEASE.path,
    BOARD_COMPLETE.path,
    BOARD_RENEW.path,
    HANDOFF_OFFER.path,
    HANDOFF_TAKE.path,
    HANDOFF_REPLY.path,
    HANDOFF_CANCEL.path,
    HANDOFF_GET.path,
    QUEUE_SUBMIT.path,
    QUEUE_START.path,
    QUEUE_RENEW.path,
    QUEUE_COMPLETE.path,
    QUEUE_FAIL.path,
    QUEUE_GET_TASK.path,
];

/// The most items in one batch: the client library puts no more in one, and a node refuses a
/// batch with more (`INVALID_ARGUMENT`) without running any of them.
pub const MAX_ITEMS: usize = 256;

/// The most request bytes the client library puts in one batch (a single larger call still goes
/// alone, and meets the node's own request limit as it would unbatched).
pub const MAX_BYTES: usize = 512 << 10;

/// The wire form of the status a batched call failed with (the node's side).
pub fn status_to_wire(status: &Status) -> BatchStatus {
    BatchStatus {
        code: status.code() as i32,
        message: status.message().to_string(),
        details: status.details().to_vec(),
    }
}

/// The status a batched call failed with, exactly as the call on its own would have carried it
/// (the client's side).
pub fn status_from_wire(status: BatchStatus) -> Status {
    Status::with_details(
        Code::from_i32(status.code),
        status.message,
        status.details.into(),
    )
}
