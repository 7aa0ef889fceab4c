//! The desk: every handoff ticket, and what each command does to them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::types::{Handle, OfferArgs, Receipt, Ticket, TicketState};
use super::validate;
use crate::change::{ticket_bytes, Change, ChangeKind, ChangeValue, Journal, Primitive};
use crate::command::Stamp;
use crate::error::Refusal;
use crate::sweep::Weight;
use crate::time::{deadline_after, is_overdue};

/// A ticket plus what clients never see: the token of its current take. The ticket is shared
/// so that a listing can take every ticket under the state lock by pointer and encode them after
/// releasing it; a command that changes a ticket a listing still holds copies it first. The
/// token is shared for the same reason as the keys (see [`Desk`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    ticket: Arc<Ticket>,
    token: Option<Arc<str>>,
}

/// All handoff tickets (current generation per key) and an index of live deadlines.
///
/// Keys are shared between the map and the deadline index (`Arc<str>`, written into snapshots as
/// plain strings): a copy of the desk, which a snapshot build takes under the state lock, then
/// copies pointers rather than every key twice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Desk {
    records: BTreeMap<Arc<str>, Record>,
    /// `(deadline_ms, key)` of every offered or accepted ticket, so a sweep touches only what is due.
    live_deadlines: BTreeSet<(u64, Arc<str>)>,
    /// Changes of the command being applied (transient).
    #[serde(skip)]
    journal: Journal,
}

impl Desk {
    /// Raises every ticket's generation by `by` ([`crate::State::raise_fences`]): a ticket taken
    /// now gets a fence above the raised generation, and so does the next one offered on a key.
    pub(crate) fn raise_generations(&mut self, by: u64) {
        for record in self.records.values_mut() {
            let ticket = Arc::make_mut(&mut record.ticket);
            ticket.generation = ticket.generation.saturating_add(by);
        }
    }

    /// Offers a ticket. A live ticket with the same key is returned unchanged (a replay); a
    /// settled one is replaced by the next generation; an unknown key starts at generation 1
    /// (above `fence_floor` after a restore: [`crate::State::fence_floor`]).
    pub fn offer(
        &mut self,
        clock_ms: u64,
        fence_floor: u64,
        args: OfferArgs,
    ) -> Result<Ticket, Refusal> {
        validate::offer(&args)?;
        self.expire_if_overdue(&args.key, clock_ms);
        let (key, previous_generation) = match self.records.get_key_value(args.key.as_str()) {
            Some((_, record)) if !record.ticket.state.is_terminal() => {
                return Ok(Ticket::clone(&record.ticket));
            }
            Some((key, record)) => (Arc::clone(key), record.ticket.generation),
            // A key new to the store starts at the floor (crate::State::fence_floor).
            None => (Arc::from(args.key.as_str()), fence_floor),
        };
        let deadline_ms = deadline_after(clock_ms, args.ttl_ms);
        let ticket = Ticket {
            key: args.key,
            from: args.from,
            to: args.to,
            payload: args.payload,
            reply_to: args.reply_to,
            ttl_ms: args.ttl_ms,
            generation: previous_generation + 1,
            deadline_ms,
            state: TicketState::Offered,
            holder: None,
            receipt_at_ms: None,
            receipt: None,
        };
        self.live_deadlines.insert((deadline_ms, Arc::clone(&key)));
        self.records.insert(
            key,
            Record {
                ticket: Arc::new(ticket.clone()),
                token: None,
            },
        );
        self.journal
            .push(change(ChangeKind::Offered, String::new(), &ticket));
        Ok(ticket)
    }

    /// Takes a ticket as its addressee: responsibility moves from `from` to `to` in this one
    /// step, and the store mints the token that the reply must present.
    pub fn take(
        &mut self,
        stamp: &Stamp,
        clock_ms: u64,
        key: &str,
        to: &str,
    ) -> Result<Handle, Refusal> {
        self.check_addressee(key, to)?;
        self.expire_if_overdue(key, clock_ms);
        let record = self.record_mut(key)?;
        if let Some(refusal) = take_refusal(&record.ticket.state) {
            return Err(refusal);
        }
        let token = stamp.token();
        let ticket = Arc::make_mut(&mut record.ticket);
        ticket.state = TicketState::Accepted;
        ticket.holder = Some(to.to_string());
        record.token = Some(Arc::from(token.as_str()));
        let handle = Handle {
            token,
            fence: record.ticket.generation,
            until_ms: record.ticket.deadline_ms,
        };
        let taken = change(ChangeKind::Taken, to.to_string(), &record.ticket);
        self.journal.push(taken);
        Ok(handle)
    }

    /// The refusal [`Desk::take`] would answer at `clock_ms` without changing anything; `None`
    /// when the take would succeed, or when judging it would first expire the ticket (a change).
    /// The leader answers such refusals without a log entry.
    pub fn take_refused(&self, clock_ms: u64, key: &str, to: &str) -> Option<Refusal> {
        if let Err(refusal) = self.check_addressee(key, to) {
            return Some(refusal);
        }
        let ticket = &self.records.get(key)?.ticket;
        if ticket.state.is_live() && is_overdue(ticket.deadline_ms, clock_ms) {
            return None;
        }
        take_refusal(&ticket.state)
    }

    /// A take's checks that come before any expiry: valid input, a known key, the addressee.
    fn check_addressee(&self, key: &str, to: &str) -> Result<(), Refusal> {
        validate::key(key)?;
        validate::agent("to", to)?;
        let record = self.records.get(key).ok_or(Refusal::UnknownKey)?;
        if record.ticket.to != to {
            return Err(Refusal::NotAddressee);
        }
        Ok(())
    }

    /// Settles a taken ticket with a receipt, accepted only with the take's token and only
    /// before the deadline (late receipts are refused: fail-closed). Judged in the contract's
    /// order: unknown key, wrong token, past the deadline, and only then an inconsistent receipt
    /// (a late or foreign reply is told so, whatever its receipt says).
    pub fn reply(
        &mut self,
        clock_ms: u64,
        key: &str,
        token: &str,
        receipt: Receipt,
    ) -> Result<(), Refusal> {
        let settles = self.judge_reply(clock_ms, key, token);
        if settles == Err(Refusal::Expired) {
            // Taken, and overdue: it expires now (if the sweep has not expired it already).
            self.expire_if_overdue(key, clock_ms);
        }
        settles?;
        validate::receipt(&receipt)?;
        let record = self.record_mut(key)?;
        let deadline = record.ticket.deadline_ms;
        let ticket = Arc::make_mut(&mut record.ticket);
        let holder = ticket.holder.take().unwrap_or_default();
        ticket.state = TicketState::Closed;
        ticket.receipt_at_ms = Some(clock_ms);
        ticket.receipt = Some(receipt);
        let closed = change(ChangeKind::Closed, holder, &record.ticket);
        self.forget_deadline(deadline, key);
        self.journal.push(closed);
        Ok(())
    }

    /// Whether a reply to `key` with `token` at `clock_ms` could settle the ticket, judging
    /// everything but the receipt, in [`Desk::reply`]'s order: unknown key, wrong token, past
    /// the deadline, settled. Changes nothing, so that a reply whose receipt cannot even be
    /// decoded is still told these first (contract §1).
    pub fn judge_reply(&self, clock_ms: u64, key: &str, token: &str) -> Result<(), Refusal> {
        validate::key(key)?;
        validate::token(token)?;
        let record = self.records.get(key).ok_or(Refusal::UnknownKey)?;
        if record.token.as_deref() != Some(token) {
            return Err(Refusal::LeaseLost);
        }
        match record.ticket.state {
            TicketState::Accepted if is_overdue(record.ticket.deadline_ms, clock_ms) => {
                Err(Refusal::Expired)
            }
            TicketState::Accepted => Ok(()),
            TicketState::Expired => Err(Refusal::Expired),
            _ => Err(Refusal::AlreadySettled),
        }
    }

    /// Withdraws an offered ticket; only its source may, and only before anyone took it.
    pub fn cancel(&mut self, clock_ms: u64, key: &str, by: &str) -> Result<(), Refusal> {
        validate::key(key)?;
        validate::agent("by", by)?;
        let record = self.records.get(key).ok_or(Refusal::UnknownKey)?;
        if record.ticket.from != by {
            return Err(Refusal::NotSource);
        }
        self.expire_if_overdue(key, clock_ms);
        let record = self.record_mut(key)?;
        match record.ticket.state {
            TicketState::Offered => {}
            TicketState::Accepted => return Err(Refusal::Taken),
            _ => return Err(Refusal::AlreadySettled),
        }
        let deadline = record.ticket.deadline_ms;
        Arc::make_mut(&mut record.ticket).state = TicketState::Withdrawn;
        let withdrawn = change(ChangeKind::Withdrawn, String::new(), &record.ticket);
        self.forget_deadline(deadline, key);
        self.journal.push(withdrawn);
        Ok(())
    }

    /// Expires every live ticket whose deadline has passed at `clock_ms`; returns how many.
    pub fn sweep(&mut self, clock_ms: u64) -> u64 {
        self.sweep_first(clock_ms, usize::MAX)
    }

    /// Expires the `max` live tickets that fell due first (fewer when fewer are due), in deadline
    /// order (then key); returns how many.
    pub(crate) fn sweep_first(&mut self, clock_ms: u64, max: usize) -> u64 {
        let mut expired = 0;
        for _ in 0..max {
            if !self.has_overdue(clock_ms) {
                break;
            }
            let Some((_, key)) = self.live_deadlines.pop_first() else {
                break;
            };
            if let Some(record) = self.records.get_mut(&*key) {
                self.journal.push(expire(record));
                expired += 1;
            }
        }
        expired
    }

    /// The deadlines and keys of the live tickets due at `clock_ms`, earliest first (what
    /// [`Desk::sweep_first`] takes in turn).
    pub(crate) fn due(&self, clock_ms: u64) -> impl Iterator<Item = (u64, &str)> + '_ {
        self.live_deadlines
            .iter()
            .map(|(deadline, key)| (*deadline, &**key))
            .take_while(move |(deadline, _)| is_overdue(*deadline, clock_ms))
    }

    /// What expiring ticket `key` adds to a sweep's changes: one change carrying the ticket.
    pub(crate) fn expiry_weight(&self, key: &str) -> Weight {
        self.records.get(key).map_or(Weight::NONE, |record| {
            let ticket = &record.ticket;
            Weight::change(key.len() + ticket.to.len() + ticket_bytes(ticket))
        })
    }

    /// Whether a sweep at `clock_ms` would expire anything.
    pub fn has_overdue(&self, clock_ms: u64) -> bool {
        self.live_deadlines
            .first()
            .is_some_and(|(deadline, _)| is_overdue(*deadline, clock_ms))
    }

    /// The current generation of one ticket.
    pub fn get(&self, key: &str) -> Option<&Ticket> {
        self.records.get(key).map(|record| &*record.ticket)
    }

    /// Every ticket's current generation, ordered by key.
    pub fn tickets(&self) -> impl Iterator<Item = &Ticket> {
        self.records.values().map(|record| &*record.ticket)
    }

    /// [`Desk::tickets`] as shared pointers: cheap to take while holding the state, to read
    /// after letting it go.
    pub fn shared_tickets(&self) -> impl Iterator<Item = &Arc<Ticket>> {
        self.records.values().map(|record| &record.ticket)
    }

    /// Number of tickets (any state).
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the desk holds no ticket.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Number of offered or accepted tickets.
    pub fn live(&self) -> usize {
        self.live_deadlines.len()
    }

    fn record_mut(&mut self, key: &str) -> Result<&mut Record, Refusal> {
        self.records.get_mut(key).ok_or(Refusal::UnknownKey)
    }

    /// Lazy expiry: a live ticket judged past its deadline becomes `expired` right here, so the
    /// refusal the caller gets and the state everyone reads afterwards agree.
    fn expire_if_overdue(&mut self, key: &str, clock_ms: u64) {
        let Some(record) = self.records.get(key) else {
            return;
        };
        let deadline = record.ticket.deadline_ms;
        if !record.ticket.state.is_live() || !is_overdue(deadline, clock_ms) {
            return;
        }
        self.forget_deadline(deadline, key);
        if let Some(record) = self.records.get_mut(key) {
            self.journal.push(expire(record));
        }
    }

    /// Takes the live ticket `key` ending at `deadline` off the deadline index.
    fn forget_deadline(&mut self, deadline: u64, key: &str) {
        if let Some((shared, _)) = self.records.get_key_value(key) {
            let entry = (deadline, Arc::clone(shared));
            self.live_deadlines.remove(&entry);
        }
    }

    /// The changes recorded since the last call (drained after every command).
    pub(crate) fn take_changes(&mut self) -> Vec<Change> {
        self.journal.take()
    }
}

/// Why a ticket in `state` cannot be taken; `None` when it is on offer.
fn take_refusal(state: &TicketState) -> Option<Refusal> {
    match state {
        TicketState::Offered => None,
        TicketState::Expired => Some(Refusal::Expired),
        TicketState::Accepted => Some(Refusal::Taken),
        _ => Some(Refusal::AlreadySettled),
    }
}

/// Expires a live ticket. A taken one is a lease lost by its holder (the addressee); an offered
/// one simply expired.
fn expire(record: &mut Record) -> Change {
    let ticket = Arc::make_mut(&mut record.ticket);
    let holder = ticket.holder.take();
    ticket.state = TicketState::Expired;
    match holder {
        Some(holder) => change(ChangeKind::Lost, holder, &record.ticket),
        None => change(ChangeKind::Expired, String::new(), &record.ticket),
    }
}

fn change(kind: ChangeKind, holder: String, ticket: &Ticket) -> Change {
    Change {
        primitive: Primitive::Handoff,
        key: ticket.key.clone(),
        kind,
        holder,
        fence: ticket.generation,
        value: ChangeValue::Ticket(Box::new(ticket.clone())),
    }
}
