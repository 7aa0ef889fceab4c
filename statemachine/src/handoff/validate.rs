//! Input validation for handoff commands: the precise refusal for each broken rule.

use super::types::{OfferArgs, Receipt, ReceiptStatus};
use crate::error::Refusal;
use crate::limits::{
    MAX_ADDRESS_BYTES, MAX_AGENT_BYTES, MAX_ARTIFACTS, MAX_KEY_BYTES, MAX_PAYLOAD_BYTES,
    MAX_TEXT_BYTES,
};
use crate::validate::{bounded, bounded_bytes, required, ttl};

pub(super) fn key(value: &str) -> Result<(), Refusal> {
    required("key", value, MAX_KEY_BYTES)
}

/// A reply's token: bounded only (an empty one names no take: `LEASE_LOST`, judged later).
pub(super) fn token(value: &str) -> Result<(), Refusal> {
    bounded("token", value, MAX_KEY_BYTES)
}

pub(super) fn agent(field: &str, value: &str) -> Result<(), Refusal> {
    required(field, value, MAX_AGENT_BYTES)
}

pub(super) fn offer(args: &OfferArgs) -> Result<(), Refusal> {
    key(&args.key)?;
    agent("from", &args.from)?;
    agent("to", &args.to)?;
    required("reply_to", &args.reply_to, MAX_ADDRESS_BYTES)?;
    ttl(args.ttl_ms)?;
    bounded_bytes("payload", &args.payload, MAX_PAYLOAD_BYTES)
}

pub(super) fn receipt(receipt: &Receipt) -> Result<(), Refusal> {
    bounded("receipt.summary", &receipt.summary, MAX_TEXT_BYTES)?;
    bounded("receipt.failure", &receipt.failure, MAX_TEXT_BYTES)?;
    match receipt.status {
        ReceiptStatus::Done => {
            if receipt.summary.is_empty() {
                return Err(Refusal::invalid(
                    "receipt.summary",
                    "is required when status is done",
                ));
            }
            if !receipt.failure.is_empty() {
                return Err(Refusal::invalid(
                    "receipt.failure",
                    "must be empty when status is done",
                ));
            }
        }
        ReceiptStatus::Failed | ReceiptStatus::Refused => {
            if receipt.failure.is_empty() {
                return Err(Refusal::invalid(
                    "receipt.failure",
                    "is required when status is failed or refused",
                ));
            }
        }
    }
    if receipt.artifacts.len() > MAX_ARTIFACTS {
        return Err(Refusal::invalid(
            "receipt.artifacts",
            format!("must hold at most {MAX_ARTIFACTS} entries"),
        ));
    }
    for artifact in &receipt.artifacts {
        bounded("receipt.artifacts", artifact, MAX_ADDRESS_BYTES)?;
    }
    Ok(())
}
