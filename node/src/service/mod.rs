//! The gRPC services a node serves. Handlers are thin: decode, propose or read, encode.

mod batch;
mod board;
mod checkpoint;
mod cluster;
mod effect;
mod handoff;
mod queue;
mod sink;
mod watch;

pub use batch::BatchService;
pub use board::BoardService;
pub use checkpoint::CheckpointService;
pub use cluster::ClusterService;
pub use effect::EffectService;
pub use handoff::HandoffService;
pub use queue::QueueService;
pub use sink::SinkService;
pub use watch::{WatchOutput, WatchService};

use baton_rpc::error::{infra, infra_status, refusal_status};
use baton_rpc::proto::RequestHeader;
use baton_statemachine::{Origin, Refusal, Reply};
use tonic::Status;

use crate::stamp::wall_clock_ms;
use crate::store::Applied;

/// A reply of the wrong kind for the command: the session table's answer to another request
/// under the same client id and seq (a client that reuses them); never a contract answer, and
/// not worth retrying (the same seq gets the same answer). Named by its kind only: what it
/// carries (another request's token) is not for this caller.
fn unexpected(reply: Reply) -> Status {
    infra_status(
        tonic::Code::FailedPrecondition,
        infra::SEQ_REUSED,
        format!(
            "the store's answer to this request is a {} reply, not one for this method: \
             header.client_id and header.seq were used for another request",
            reply.kind()
        ),
    )
}

/// Success of a command that returns nothing ([`Reply::Done`]); any other reply is
/// [`unexpected`].
fn done(reply: Reply) -> Result<(), Status> {
    match reply {
        Reply::Done => Ok(()),
        other => Err(unexpected(other)),
    }
}

/// Bad input found while decoding, as the refusal status the state machine would have sent.
fn refused(refusal: Refusal) -> Status {
    refusal_status(&refusal)
}

/// The store's "now" for judging a read: the store clock, or this node's clock if it is ahead.
fn now_ms(applied: &Applied) -> u64 {
    applied.state.clock_ms.max(wall_clock_ms())
}

/// The Raft log index a read reflects.
fn revision(applied: &Applied) -> u64 {
    applied.last_applied.map(|id| id.index).unwrap_or(0)
}

/// The request header as the state machine's origin; a missing header is bad input.
fn origin(header: Option<RequestHeader>) -> Result<Origin, Status> {
    let header =
        header.ok_or_else(|| refusal_status(&Refusal::invalid("header", "is required")))?;
    // The last seq has no successor: once forgotten it could not be told from a new request.
    if header.seq == 0 || header.seq == u64::MAX {
        return Err(refusal_status(&Refusal::invalid(
            "header.seq",
            "must be > 0 and < 2^64 - 1",
        )));
    }
    // Zero is what a client that never set the field sends: every such client would share one
    // session, and one's request would be answered with another's remembered reply.
    if header.client_id == 0 {
        return Err(refusal_status(&Refusal::invalid(
            "header.client_id",
            "must be non-zero (a random identity drawn once per client instance)",
        )));
    }
    Ok(Origin {
        client_id: header.client_id,
        seq: header.seq,
        acked_below: header.acked_below.min(header.seq),
    })
}
