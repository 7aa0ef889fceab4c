//! Protobuf <-> state-machine types. Decoding input from the wire validates enum-like strings
//! and required messages, returning the same typed refusal the state machine would.

use baton_statemachine::handoff::{Handle, Receipt, ReceiptStatus, Ticket, TicketState};
use baton_statemachine::Refusal;

use crate::proto;

/// A state-machine receipt as protobuf.
pub fn receipt_to_proto(receipt: &Receipt) -> proto::Receipt {
    proto::Receipt {
        status: receipt.status.as_str().to_string(),
        summary: receipt.summary.clone(),
        failure: receipt.failure.clone(),
        artifacts: receipt.artifacts.clone(),
    }
}

/// A protobuf receipt as a state-machine receipt; a missing receipt or an unknown status is an
/// `INVALID_ARGUMENT` refusal.
pub fn receipt_from_proto(receipt: Option<proto::Receipt>) -> Result<Receipt, Refusal> {
    let receipt = receipt.ok_or_else(|| Refusal::invalid("receipt", "is required"))?;
    let status = ReceiptStatus::parse(&receipt.status).ok_or_else(|| {
        Refusal::invalid("receipt.status", "must be one of done, failed, refused")
    })?;
    Ok(Receipt {
        status,
        summary: receipt.summary,
        failure: receipt.failure,
        artifacts: receipt.artifacts,
    })
}

/// A ticket as protobuf.
pub fn ticket_to_proto(ticket: &Ticket) -> proto::Ticket {
    proto::Ticket {
        key: ticket.key.clone(),
        from: ticket.from.clone(),
        to: ticket.to.clone(),
        payload: ticket.payload.clone(),
        reply_to: ticket.reply_to.clone(),
        ttl_ms: ticket.ttl_ms,
        generation: ticket.generation,
        deadline_ms: ticket.deadline_ms,
        state: ticket.state.as_str().to_string(),
        holder: ticket.holder.clone(),
        receipt_at_ms: ticket.receipt_at_ms,
        receipt: ticket.receipt.as_ref().map(receipt_to_proto),
    }
}

/// A protobuf ticket as a state-machine ticket. Nothing is rejected: an unknown state or receipt
/// status is kept visible (as [`TicketState::Unrecognized`] / a dropped receipt) so that `check`
/// can report what a broken store sent.
pub fn ticket_from_proto(ticket: proto::Ticket) -> Ticket {
    Ticket {
        key: ticket.key,
        from: ticket.from,
        to: ticket.to,
        payload: ticket.payload,
        reply_to: ticket.reply_to,
        ttl_ms: ticket.ttl_ms,
        generation: ticket.generation,
        deadline_ms: ticket.deadline_ms,
        state: TicketState::parse(&ticket.state),
        holder: ticket.holder,
        receipt_at_ms: ticket.receipt_at_ms,
        receipt: ticket
            .receipt
            .and_then(|r| receipt_from_proto(Some(r)).ok()),
    }
}

/// A take's handle as protobuf.
pub fn handle_to_proto(handle: &Handle) -> proto::Handle {
    proto::Handle {
        token: handle.token.clone(),
        fence: handle.fence,
        until_ms: handle.until_ms,
    }
}

/// A protobuf handle as a state-machine handle.
pub fn handle_from_proto(handle: proto::Handle) -> Handle {
    Handle {
        token: handle.token,
        fence: handle.fence,
        until_ms: handle.until_ms,
    }
}
