//! The handoff vocabulary: tickets, receipts, handles and the commands that change them.

use serde::{Deserialize, Serialize};

/// A ticket's lifecycle state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TicketState {
    /// Offered and waiting to be taken: the source is responsible.
    Offered,
    /// Taken: the addressee is responsible until it replies.
    Accepted,
    /// Settled by a receipt.
    Closed,
    /// The deadline passed before it was taken, or after it was taken but before the reply.
    Expired,
    /// Cancelled by its source before anyone took it.
    Withdrawn,
    /// A state name outside the vocabulary. The store never produces it; it exists so that
    /// [`check`](super::check) can judge snapshots read from any store, including a broken one.
    Unrecognized(String),
}

impl TicketState {
    /// The state's wire name (`offered`, `accepted`, ...).
    pub fn as_str(&self) -> &str {
        match self {
            TicketState::Offered => "offered",
            TicketState::Accepted => "accepted",
            TicketState::Closed => "closed",
            TicketState::Expired => "expired",
            TicketState::Withdrawn => "withdrawn",
            TicketState::Unrecognized(name) => name,
        }
    }

    /// Parses a wire name; unknown names become [`TicketState::Unrecognized`].
    pub fn parse(name: &str) -> Self {
        match name {
            "offered" => TicketState::Offered,
            "accepted" => TicketState::Accepted,
            "closed" => TicketState::Closed,
            "expired" => TicketState::Expired,
            "withdrawn" => TicketState::Withdrawn,
            other => TicketState::Unrecognized(other.to_string()),
        }
    }

    /// Whether the ticket can no longer change within this generation.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            TicketState::Closed | TicketState::Expired | TicketState::Withdrawn
        )
    }

    /// Whether the ticket's deadline still governs it (offered or accepted).
    pub fn is_live(&self) -> bool {
        matches!(self, TicketState::Offered | TicketState::Accepted)
    }
}

/// How the addressee settled the ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReceiptStatus {
    /// The work was done; a summary is required and no failure text is allowed.
    Done,
    /// The addressee tried and failed; the failure text is required.
    Failed,
    /// The addressee refused without trying; the failure text is required.
    Refused,
}

impl ReceiptStatus {
    /// The status's wire name (`done`, `failed`, `refused`).
    pub fn as_str(&self) -> &'static str {
        match self {
            ReceiptStatus::Done => "done",
            ReceiptStatus::Failed => "failed",
            ReceiptStatus::Refused => "refused",
        }
    }

    /// Parses a wire name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "done" => Some(ReceiptStatus::Done),
            "failed" => Some(ReceiptStatus::Failed),
            "refused" => Some(ReceiptStatus::Refused),
            _ => None,
        }
    }
}

/// The addressee's account of the handed-off work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The outcome.
    pub status: ReceiptStatus,
    /// One-line conclusion; required when `done`.
    pub summary: String,
    /// Why it failed or was refused; required for `failed` / `refused`, forbidden for `done`.
    pub failure: String,
    /// References to what the work produced, carried as-is.
    pub artifacts: Vec<String>,
}

/// A ticket of the current generation, as clients see it (the token is never part of it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    /// The caller-chosen idempotency key.
    pub key: String,
    /// The source: responsible before the take, and the only one who may cancel.
    pub from: String,
    /// The addressee: the only one who may take it.
    pub to: String,
    /// Opaque bytes carried as-is.
    pub payload: Vec<u8>,
    /// Where the receipt goes, declared by the source (required).
    pub reply_to: String,
    /// The time limit the source gave, in milliseconds (always > 0 for store-made tickets).
    pub ttl_ms: i64,
    /// Store-minted, strictly increasing per key; a re-offer after settlement is a new one.
    pub generation: u64,
    /// `clock + ttl` on the store clock at offer time, in Unix milliseconds (0 would mean none,
    /// which the contract forbids).
    pub deadline_ms: u64,
    /// Lifecycle state.
    pub state: TicketState,
    /// The addressee while (and only while) the ticket is accepted.
    pub holder: Option<String>,
    /// Store time at which the receipt was accepted (only when closed).
    pub receipt_at_ms: Option<u64>,
    /// The receipt (only when closed).
    pub receipt: Option<Receipt>,
}

/// Proof of a successful take; the token is the only credential a reply is accepted with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handle {
    /// Store-minted 128-bit random token, hex.
    pub token: String,
    /// The generation taken (the fence).
    pub fence: u64,
    /// The deadline, in Unix milliseconds on the store clock: the first instant at which a reply
    /// is refused (`EXPIRED`), so the reply must be applied before it.
    pub until_ms: u64,
}

/// The fields a source gives when offering; everything else is minted by the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferArgs {
    /// Idempotency key.
    pub key: String,
    /// Source.
    pub from: String,
    /// Addressee.
    pub to: String,
    /// Opaque payload.
    pub payload: Vec<u8>,
    /// Receipt address.
    pub reply_to: String,
    /// Time limit in milliseconds; must be > 0.
    pub ttl_ms: i64,
}

/// A handoff command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Offer a ticket (or replay the live one with the same key).
    Offer(OfferArgs),
    /// Take the ticket as its addressee.
    Take {
        /// Ticket key.
        key: String,
        /// Who takes it.
        to: String,
    },
    /// Settle a taken ticket with a receipt.
    Reply {
        /// Ticket key.
        key: String,
        /// The token minted by the take.
        token: String,
        /// The receipt.
        receipt: Receipt,
    },
    /// Withdraw an offered ticket.
    Cancel {
        /// Ticket key.
        key: String,
        /// Who cancels it (must be the source).
        by: String,
    },
}

impl Command {
    /// The command's name, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Offer(_) => "offer",
            Command::Take { .. } => "take",
            Command::Reply { .. } => "reply",
            Command::Cancel { .. } => "cancel",
        }
    }
}
