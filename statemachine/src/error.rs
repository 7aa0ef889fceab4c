//! Contract refusals: the sentinels hosts match on.

use serde::{Deserialize, Serialize};

/// A contract refusal: the store understood the command and said no.
///
/// A refused command changes nothing (except materialising an expiry that had already happened,
/// which `take`, `reply` and `cancel` do on purpose so the expiry becomes visible). Each variant
/// has a stable machine code ([`Refusal::code`]) that travels in the gRPC status, so clients in
/// any language match on the code, never on the message.
///
/// Infrastructure failures (no leader, timeouts, unreachable nodes) are deliberately absent:
/// they are not answers from the contract and must never be mistaken for one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The input broke a validation rule; `field` names the input, `rule` the rule it broke.
    #[error("invalid {field}: {rule}")]
    Invalid {
        /// The offending field, e.g. `ttl` or `receipt.summary`.
        field: String,
        /// The rule it broke, e.g. `must be > 0`.
        rule: String,
    },
    /// No ticket with this key exists.
    #[error("no ticket with this key")]
    UnknownKey,
    /// The ticket has already been taken (a concurrent taker won, or cancel came too late).
    #[error("the ticket has already been taken")]
    Taken,
    /// The ticket's deadline has passed; late takes and replies are refused (fail-closed).
    #[error("the ticket's deadline has passed")]
    Expired,
    /// Only the ticket's addressee (`to`) may take it.
    #[error("the taker is not the ticket's addressee")]
    NotAddressee,
    /// Only the ticket's source (`from`) may cancel it.
    #[error("the canceller is not the ticket's source")]
    NotSource,
    /// The presented token is not the current one: the caller no longer holds the ticket.
    #[error("the token does not match the current holder's")]
    LeaseLost,
    /// The ticket is already closed or withdrawn.
    #[error("the ticket is already settled")]
    AlreadySettled,
}

impl Refusal {
    /// The stable machine code carried on the wire (e.g. `TAKEN`).
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Invalid { .. } => "INVALID_ARGUMENT",
            Refusal::UnknownKey => "UNKNOWN_KEY",
            Refusal::Taken => "TAKEN",
            Refusal::Expired => "EXPIRED",
            Refusal::NotAddressee => "NOT_ADDRESSEE",
            Refusal::NotSource => "NOT_SOURCE",
            Refusal::LeaseLost => "LEASE_LOST",
            Refusal::AlreadySettled => "ALREADY_SETTLED",
        }
    }

    /// Builds an [`Refusal::Invalid`].
    pub fn invalid(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Refusal::Invalid {
            field: field.into(),
            rule: rule.into(),
        }
    }
}
