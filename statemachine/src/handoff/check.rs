//! The snapshot judge: does a set of tickets contradict itself?
//!
//! It lives beside the state machine (not only in tests) so any store's snapshot can be judged at
//! any time, by the client library against a live cluster or by a property test. It judges
//! whether the state is self-consistent, not whether a policy was right. `now_ms` is passed in so
//! the expiry rules are deterministic to test.

use std::collections::BTreeMap;

use super::types::{Ticket, TicketState};
use crate::time::is_overdue;

/// The machine-readable kind of a problem.
///
/// Codes order by their stable name ([`ProblemCode::as_str`]), not by declaration order: the
/// contract sorts problems by `(key, code)` with the code being its wire string, so every
/// implementation of the judge (in any language) agrees on the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemCode {
    /// A ticket has an empty key.
    EmptyKey,
    /// Two tickets share a key.
    DuplicateKey,
    /// A state outside the vocabulary.
    UnknownState,
    /// A ticket has no deadline (unbounded handoffs are forbidden).
    NoDeadline,
    /// Accepted without a holder, or a holder left on a ticket that is not accepted.
    HolderMismatch,
    /// A ticket without a store-minted generation.
    MissingGeneration,
    /// A closed ticket without its receipt (or its time), or a receipt on a ticket not closed.
    ReceiptWithoutClose,
    /// An offered ticket past its deadline that nobody marked expired: the source still
    /// nominally holds responsibility nobody is exercising.
    OverdueHolder,
    /// An accepted ticket past its deadline whose reply never came and was never reconciled.
    OverdueReply,
    /// A ticket whose TTL is not positive.
    TtlNonPositive,
}

impl ProblemCode {
    /// The stable code (`empty_key`, `overdue_reply`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            ProblemCode::EmptyKey => "empty_key",
            ProblemCode::DuplicateKey => "duplicate_key",
            ProblemCode::UnknownState => "unknown_state",
            ProblemCode::NoDeadline => "no_deadline",
            ProblemCode::HolderMismatch => "holder_mismatch",
            ProblemCode::MissingGeneration => "missing_generation",
            ProblemCode::ReceiptWithoutClose => "receipt_without_close",
            ProblemCode::OverdueHolder => "overdue_holder",
            ProblemCode::OverdueReply => "overdue_reply",
            ProblemCode::TtlNonPositive => "ttl_non_positive",
        }
    }
}

impl Ord for ProblemCode {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for ProblemCode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// One violated invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The ticket concerned.
    pub key: String,
    /// What kind of problem.
    pub code: ProblemCode,
    /// A human explanation.
    pub text: String,
}

/// Judges a snapshot's invariants; problems come sorted by `(key, code)` so the result is
/// deterministic.
pub fn check(tickets: &[Ticket], now_ms: u64) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut report = |key: &str, code: ProblemCode, text: String| {
        problems.push(Problem {
            key: key.to_string(),
            code,
            text,
        })
    };

    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for ticket in tickets {
        *seen.entry(ticket.key.as_str()).or_default() += 1;
    }
    for (key, count) in &seen {
        if *count > 1 {
            report(
                key,
                ProblemCode::DuplicateKey,
                format!("{count} tickets share this key"),
            );
        }
    }

    for t in tickets {
        let key = t.key.as_str();
        if key.is_empty() {
            report(key, ProblemCode::EmptyKey, "ticket has an empty key".into());
        }
        if let TicketState::Unrecognized(name) = &t.state {
            report(
                key,
                ProblemCode::UnknownState,
                format!("state {name:?} is not in the vocabulary"),
            );
        }
        if t.deadline_ms == 0 {
            report(
                key,
                ProblemCode::NoDeadline,
                "ticket has no deadline".into(),
            );
        }
        if t.ttl_ms <= 0 {
            report(
                key,
                ProblemCode::TtlNonPositive,
                format!("ttl {} ms is not positive", t.ttl_ms),
            );
        }
        if t.generation == 0 {
            report(
                key,
                ProblemCode::MissingGeneration,
                "ticket has no generation".into(),
            );
        }
        let accepted = t.state == TicketState::Accepted;
        if accepted && t.holder.is_none() {
            report(
                key,
                ProblemCode::HolderMismatch,
                "accepted ticket has no holder".into(),
            );
        }
        if !accepted && t.holder.is_some() {
            report(
                key,
                ProblemCode::HolderMismatch,
                format!("{} ticket still names a holder", t.state.as_str()),
            );
        }
        // A reply sets the receipt and its time together; a client drops a receipt it cannot
        // read, so a missing one is also how a garbled receipt shows.
        let closed = t.state == TicketState::Closed;
        let missing = match (t.receipt_at_ms.is_some(), t.receipt.is_some()) {
            (true, true) => None,
            (false, true) => Some("receipt time"),
            (true, false) => Some("receipt"),
            (false, false) => Some("receipt or receipt time"),
        };
        if let (true, Some(missing)) = (closed, missing) {
            report(
                key,
                ProblemCode::ReceiptWithoutClose,
                format!("closed ticket has no {missing}"),
            );
        }
        if !closed && (t.receipt_at_ms.is_some() || t.receipt.is_some()) {
            report(
                key,
                ProblemCode::ReceiptWithoutClose,
                format!("{} ticket carries a receipt", t.state.as_str()),
            );
        }
        if t.deadline_ms != 0 && is_overdue(t.deadline_ms, now_ms) {
            match t.state {
                TicketState::Offered => report(
                    key,
                    ProblemCode::OverdueHolder,
                    "offered ticket is past its deadline but not expired".into(),
                ),
                TicketState::Accepted => report(
                    key,
                    ProblemCode::OverdueReply,
                    "accepted ticket is past its deadline without a reply".into(),
                ),
                _ => {}
            }
        }
    }
    problems.sort_by(|a, b| (&a.key, a.code).cmp(&(&b.key, b.code)));
    problems
}
