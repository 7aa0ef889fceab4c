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
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error, strum::EnumIter,
)]
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
    /// Someone else holds it: a concurrent taker or claimer won (or a cancel came too late).
    #[error("already taken by another holder")]
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
    #[error("the token is not the current holder's (or the lease has ended)")]
    LeaseLost,
    /// Already in a terminal state (a closed or withdrawn ticket, a finished queue task).
    #[error("already settled: closed, withdrawn or finished")]
    AlreadySettled,
    /// No task with this id was seeded.
    #[error("no task with this id")]
    UnknownTask,
    /// The task is done; it can never be claimed again.
    #[error("the task is already done")]
    AlreadyDone,
    /// A dependency of the task is not done yet.
    #[error("a dependency of the task is not done")]
    Blocked,
    /// No side-effect action with this key has ever been acquired.
    #[error("no action with this key")]
    UnknownAction,
    /// The presented fence is not the latest: a newer holder exists (or existed).
    #[error("the fence is stale: a newer holder exists")]
    FenceStale,
    /// The presented holder is not the one of the key's current attempt.
    #[error("the caller is not the holder of the current attempt")]
    NotHolder,
    /// The lease, the action and the key disagree about the resource.
    #[error("the lease's resource is not the action's")]
    ResourceMismatch,
    /// The key's attempt is not in progress any more (completed, uncertain, abandoned, expired).
    #[error("the attempt is not in progress")]
    NotInProgress,
    /// The key is not uncertain, so there is nothing to reconcile.
    #[error("the action is not uncertain")]
    NotUncertain,
    /// Another reconciler holds this key's reconcile slot.
    #[error("another reconciler is already at work")]
    ReconcileTaken,
    /// An unsafe action's "did not happen" needs an explicit force to become retryable.
    #[error("an unsafe action is not retryable without an explicit force")]
    UnsafeNotRetryable,
    /// The checkpoint's seq is not newer than the stored one.
    #[error("the checkpoint seq is not newer than the stored one")]
    StaleSeq,
    /// Nothing is stored under this name.
    #[error("nothing stored under this name")]
    NotFound,
    /// The idempotency key was used before with different content.
    #[error("the idempotency key was used with different content")]
    IdempotencyConflict,
    /// No queue with this name.
    #[error("no queue with this name")]
    UnknownQueue,
    /// No worker registered with this identity.
    #[error("no worker registered with this identity")]
    UnknownWorker,
    /// The request contradicts a fixed property (e.g. a worker's concurrency-key support, or a
    /// queue's namespace).
    #[error("the request conflicts with existing state")]
    StateConflict,
    /// The task's attempt has started; it can no longer be cancelled.
    #[error("the task has already started")]
    AlreadyStarted,
    /// The attempt has not been started; start it before reporting its result.
    #[error("the attempt has not been started")]
    NotStarted,
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
            Refusal::UnknownTask => "UNKNOWN_TASK",
            Refusal::AlreadyDone => "ALREADY_DONE",
            Refusal::Blocked => "BLOCKED",
            Refusal::UnknownAction => "UNKNOWN_ACTION",
            Refusal::FenceStale => "FENCE_STALE",
            Refusal::NotHolder => "NOT_HOLDER",
            Refusal::ResourceMismatch => "RESOURCE_MISMATCH",
            Refusal::NotInProgress => "NOT_IN_PROGRESS",
            Refusal::NotUncertain => "NOT_UNCERTAIN",
            Refusal::ReconcileTaken => "RECONCILE_TAKEN",
            Refusal::UnsafeNotRetryable => "UNSAFE_NOT_RETRYABLE",
            Refusal::StaleSeq => "STALE_SEQ",
            Refusal::NotFound => "NOT_FOUND",
            Refusal::IdempotencyConflict => "IDEMPOTENCY_CONFLICT",
            Refusal::UnknownQueue => "UNKNOWN_QUEUE",
            Refusal::UnknownWorker => "UNKNOWN_WORKER",
            Refusal::StateConflict => "STATE_CONFLICT",
            Refusal::AlreadyStarted => "ALREADY_STARTED",
            Refusal::NotStarted => "NOT_STARTED",
        }
    }

    /// Every refusal, [`Refusal::Invalid`] with empty fields: for exhaustive mapping tables
    /// and tests.
    pub fn all() -> impl Iterator<Item = Refusal> {
        <Refusal as strum::IntoEnumIterator>::iter()
    }

    /// The refusal a wire code names (`field` and `rule` are used for `INVALID_ARGUMENT`).
    pub fn from_code(code: &str, field: &str, rule: &str) -> Option<Refusal> {
        if code == "INVALID_ARGUMENT" {
            return Some(Refusal::invalid(field, rule));
        }
        Refusal::all().find(|refusal| refusal.code() == code)
    }

    /// Builds an [`Refusal::Invalid`].
    pub fn invalid(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Refusal::Invalid {
            field: field.into(),
            rule: rule.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes as hosts match on them (the contract spells most of them out): renaming one
    /// breaks every host, so each is pinned here, and a variant added without a code here fails.
    const WIRE_CODES: &[&str] = &[
        "INVALID_ARGUMENT",
        "UNKNOWN_KEY",
        "TAKEN",
        "EXPIRED",
        "NOT_ADDRESSEE",
        "NOT_SOURCE",
        "LEASE_LOST",
        "ALREADY_SETTLED",
        "UNKNOWN_TASK",
        "ALREADY_DONE",
        "BLOCKED",
        "UNKNOWN_ACTION",
        "FENCE_STALE",
        "NOT_HOLDER",
        "RESOURCE_MISMATCH",
        "NOT_IN_PROGRESS",
        "NOT_UNCERTAIN",
        "RECONCILE_TAKEN",
        "UNSAFE_NOT_RETRYABLE",
        "STALE_SEQ",
        "NOT_FOUND",
        "IDEMPOTENCY_CONFLICT",
        "UNKNOWN_QUEUE",
        "UNKNOWN_WORKER",
        "STATE_CONFLICT",
        "ALREADY_STARTED",
        "NOT_STARTED",
    ];

    #[test]
    fn every_refusal_has_its_pinned_wire_code() {
        let codes: Vec<&str> = Refusal::all().map(|refusal| refusal.code()).collect();
        assert_eq!(codes, WIRE_CODES);
    }

    #[test]
    fn codes_are_unique_and_round_trip() {
        let mut seen = std::collections::BTreeSet::new();
        for refusal in Refusal::all().filter(|r| !matches!(r, Refusal::Invalid { .. })) {
            assert!(
                seen.insert(refusal.code()),
                "duplicate code {}",
                refusal.code()
            );
            assert_eq!(Refusal::from_code(refusal.code(), "", ""), Some(refusal));
        }
        assert!(seen.insert("INVALID_ARGUMENT"));
        assert_eq!(
            Refusal::from_code("INVALID_ARGUMENT", "ttl", "must be > 0"),
            Some(Refusal::invalid("ttl", "must be > 0"))
        );
        assert_eq!(Refusal::from_code("NOT_LEADER", "", ""), None);
    }
}
