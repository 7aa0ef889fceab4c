//! A record of acknowledged operations and the check that none of them was lost.
//!
//! Only an answer the store gave counts as an acknowledgement. An infrastructure failure is
//! ambiguous (the command may or may not have been applied) and is counted separately; a
//! contract refusal where none is possible is a violation in its own right.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use baton_rpc::Client;
use baton_statemachine::handoff::{self, Handle, Receipt, Ticket, TicketState};

/// One acknowledged operation.
#[derive(Debug, Clone)]
pub enum Ack {
    /// `offer` answered with this generation.
    Offer {
        /// The ticket's key.
        key: String,
        /// The generation the offer returned.
        generation: u64,
        /// How far the workload goes with the ticket at most: 0 the offer only, 1 a take, 2 a
        /// take and a reply. The store has no business going further.
        steps: usize,
    },
    /// `take` answered with this handle.
    Take {
        /// The ticket's key.
        key: String,
        /// Who took it.
        holder: String,
        /// The handle returned.
        handle: Handle,
    },
    /// `reply` succeeded with this receipt.
    Reply {
        /// The ticket's key.
        key: String,
        /// The receipt sent.
        receipt: Receipt,
    },
}

impl Ack {
    fn key(&self) -> &str {
        match self {
            Ack::Offer { key, .. } | Ack::Take { key, .. } | Ack::Reply { key, .. } => key,
        }
    }
}

/// Everything a workload saw.
#[derive(Debug, Default)]
pub struct History {
    /// Acknowledged operations with the moment their answer arrived.
    pub acks: Vec<(Instant, Ack)>,
    /// Operations that failed with an infrastructure error: outcome unknown, not acks.
    pub ambiguous: Vec<String>,
    /// Contract refusals the workload could not legitimately get.
    pub unexpected_refusals: Vec<String>,
}

/// A history shared by concurrent workload tasks.
pub type SharedHistory = Arc<Mutex<History>>;

/// Locks a shared history (a panicking writer leaves it usable).
pub fn lock(history: &SharedHistory) -> MutexGuard<'_, History> {
    history
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the acknowledgements say about one key, folded in order.
#[derive(Debug, Default)]
struct Expected {
    generation: Option<u64>,
    steps: usize,
    take: Option<(String, Handle)>,
    receipt: Option<Receipt>,
}

impl History {
    /// Records an acknowledgement now.
    pub fn ack(&mut self, ack: Ack) {
        self.acks.push((Instant::now(), ack));
    }

    /// Number of acknowledgements received at or after `since`.
    pub fn acks_since(&self, since: Instant) -> usize {
        self.acks.iter().filter(|(at, _)| *at >= since).count()
    }

    /// The longest stretch within `[from, to]` without any acknowledgement.
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let mut times: Vec<Instant> = self
            .acks
            .iter()
            .map(|(at, _)| *at)
            .filter(|at| *at >= from && *at <= to)
            .collect();
        times.sort();
        let mut previous = from;
        let mut longest = Duration::ZERO;
        for at in times.into_iter().chain(std::iter::once(to)) {
            longest = longest.max(at.duration_since(previous));
            previous = at;
        }
        longest
    }

    /// Compares every acknowledged operation with a snapshot read afterwards; returns one line
    /// per violation (empty when nothing acknowledged was lost).
    ///
    /// - an acked offer's ticket exists, is not withdrawn or expired, has the acked generation
    ///   (each key is offered once, with a TTL that outlasts the run), and went no further than
    ///   the workload's steps for it (no take or reply nobody sent);
    /// - an acked take's ticket is accepted by that holder, or closed, at the handle's fence;
    /// - an acked reply's ticket is closed with exactly that receipt.
    pub fn verify(&self, tickets: &[Ticket]) -> Vec<String> {
        let mut expected: BTreeMap<&str, Expected> = BTreeMap::new();
        for (_, ack) in &self.acks {
            let entry = expected.entry(ack.key()).or_default();
            match ack {
                Ack::Offer {
                    generation, steps, ..
                } => {
                    entry.generation = Some(*generation);
                    entry.steps = *steps;
                }
                Ack::Take { holder, handle, .. } => {
                    entry.take = Some((holder.clone(), handle.clone()))
                }
                Ack::Reply { receipt, .. } => entry.receipt = Some(receipt.clone()),
            }
        }
        let by_key: BTreeMap<&str, &Ticket> = tickets.iter().map(|t| (t.key.as_str(), t)).collect();
        let mut violations = Vec::new();
        for (key, want) in expected {
            let Some(ticket) = by_key.get(key) else {
                violations.push(format!("{key}: acknowledged but missing from the snapshot"));
                continue;
            };
            if let Some(generation) = want.generation {
                if ticket.generation != generation {
                    violations.push(format!(
                        "{key}: offer acked generation {generation}, snapshot has {}",
                        ticket.generation
                    ));
                }
                let reached = match ticket.state {
                    TicketState::Accepted => 1,
                    TicketState::Closed => 2,
                    _ => 0,
                };
                if reached > want.steps {
                    violations.push(format!(
                        "{key}: snapshot state {} but the workload sent {} step(s) after the offer",
                        ticket.state.as_str(),
                        want.steps
                    ));
                }
                if !matches!(
                    ticket.state,
                    TicketState::Offered | TicketState::Accepted | TicketState::Closed
                ) {
                    violations.push(format!(
                        "{key}: offer acked, snapshot state {}",
                        ticket.state.as_str()
                    ));
                }
            }
            if let Some((holder, handle)) = &want.take {
                let held = ticket.state == TicketState::Accepted
                    && ticket.holder.as_deref() == Some(holder);
                if !(held || ticket.state == TicketState::Closed) {
                    violations.push(format!(
                        "{key}: take by {holder} acked, snapshot state {} holder {:?}",
                        ticket.state.as_str(),
                        ticket.holder
                    ));
                }
                if ticket.generation != handle.fence {
                    violations.push(format!(
                        "{key}: take acked at fence {}, snapshot generation {}",
                        handle.fence, ticket.generation
                    ));
                }
            }
            if let Some(receipt) = &want.receipt {
                if ticket.state != TicketState::Closed || ticket.receipt.as_ref() != Some(receipt) {
                    violations.push(format!(
                        "{key}: reply acked, snapshot state {} receipt {:?}",
                        ticket.state.as_str(),
                        ticket.receipt
                    ));
                }
            }
        }
        violations
    }

    /// Counts of acknowledged offers, takes and replies.
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for (_, ack) in &self.acks {
            match ack {
                Ack::Offer { .. } => counts.0 += 1,
                Ack::Take { .. } => counts.1 += 1,
                Ack::Reply { .. } => counts.2 += 1,
            }
        }
        counts
    }
}

/// What [`verify_live`] found.
#[derive(Debug, Clone, Copy)]
pub struct Verified {
    /// Tickets in the snapshot.
    pub tickets: usize,
    /// Acknowledged operations, all present.
    pub acks: usize,
    /// Operations whose outcome is unknown.
    pub ambiguous: usize,
}

/// Reads one linearizable snapshot through `client` and requires that the workload got at
/// least one acknowledgement, saw no impossible refusal, that every acknowledged operation is in
/// the snapshot ([`History::verify`]) and that the snapshot passes the contract's `check` at the
/// store's "now".
pub async fn verify_live(client: &Client, history: &SharedHistory) -> Result<Verified, String> {
    let snapshot = client
        .tickets()
        .await
        .map_err(|e| format!("cannot read the tickets: {e}"))?;
    let problems = handoff::check(&snapshot.tickets, snapshot.now_ms);
    let history = lock(history);
    if history.acks.is_empty() {
        // Nothing acknowledged: nothing could be found lost, so nothing was checked.
        return Err(format!(
            "no operation was acknowledged ({} unknown): nothing to verify",
            history.ambiguous.len()
        ));
    }
    if !history.unexpected_refusals.is_empty() {
        return Err(format!(
            "contract refusals on keys nobody else touches: {}",
            crate::first(&history.unexpected_refusals, 10)
        ));
    }
    let violations = history.verify(&snapshot.tickets);
    if !violations.is_empty() {
        return Err(format!(
            "acknowledged operations lost: {}",
            crate::first(&violations, 10)
        ));
    }
    if !problems.is_empty() {
        return Err(format!(
            "check found problems: {}",
            crate::first(&problems, 5)
        ));
    }
    Ok(Verified {
        tickets: snapshot.tickets.len(),
        acks: history.acks.len(),
        ambiguous: history.ambiguous.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(state: TicketState, generation: u64, holder: Option<&str>) -> Ticket {
        let closed = state == TicketState::Closed;
        Ticket {
            key: "k".into(),
            from: "source-0".into(),
            to: "worker-0".into(),
            payload: Vec::new(),
            reply_to: "source-0".into(),
            ttl_ms: 600_000,
            generation,
            deadline_ms: 2_000_000_000_000,
            state,
            holder: holder.map(Into::into),
            receipt_at_ms: closed.then_some(1),
            receipt: closed.then(|| crate::workload::receipt_for("k")),
        }
    }

    fn offered(steps: usize) -> History {
        let mut history = History::default();
        history.ack(Ack::Offer {
            key: "k".into(),
            generation: 1,
            steps,
        });
        history
    }

    /// A take, a reply or a re-offer nobody sent is reported, not only what was lost.
    #[test]
    fn changes_nobody_sent_are_reported() {
        let accepted = ticket(TicketState::Accepted, 1, Some("worker-0"));
        let closed = ticket(TicketState::Closed, 1, None);
        assert!(offered(0)
            .verify(&[ticket(TicketState::Offered, 1, None)])
            .is_empty());
        assert_eq!(offered(0).verify(std::slice::from_ref(&accepted)).len(), 1);
        assert_eq!(offered(1).verify(std::slice::from_ref(&closed)).len(), 1);
        // A take sent but unanswered may have been applied; a reply after it, too.
        assert!(offered(1).verify(&[accepted]).is_empty());
        assert!(offered(2).verify(&[closed]).is_empty());
        // Offered once: a later generation is a re-offer nobody sent.
        let reoffered = ticket(TicketState::Offered, 2, None);
        assert_eq!(offered(2).verify(&[reoffered]).len(), 1);
    }
}
