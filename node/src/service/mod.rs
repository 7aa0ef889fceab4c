//! The gRPC services a node serves. Handlers are thin: decode, propose or read, encode.

mod cluster;
mod handoff;
mod raft;

pub use cluster::ClusterService;
pub use handoff::HandoffService;
pub use raft::RaftService;

use baton_rpc::error::refusal_status;
use baton_rpc::proto::RequestHeader;
use baton_statemachine::{Origin, Refusal};
use tonic::Status;

/// The request header as the state machine's origin; a missing header is bad input.
fn origin(header: Option<RequestHeader>) -> Result<Origin, Status> {
    let header =
        header.ok_or_else(|| refusal_status(&Refusal::invalid("header", "is required")))?;
    if header.seq == 0 {
        return Err(refusal_status(&Refusal::invalid(
            "header.seq",
            "must be > 0",
        )));
    }
    Ok(Origin {
        client_id: header.client_id,
        seq: header.seq,
        acked_below: header.acked_below.min(header.seq),
    })
}
