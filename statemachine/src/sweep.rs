//! Which due expiries one bounded sweep takes.
//!
//! A mass expiry (a million leases falling due at once) must not become one huge apply: every
//! replica would hold its state for seconds while heartbeats and clients wait. The leader proposes
//! [`crate::Command::SweepAtMost`] instead, each taking at most a bounded number of expiries, back
//! to back while more are due. The bound travels in the command, so every replica, whatever its
//! version, takes exactly the same expiries.
//!
//! Which ones: the `max` that fell due first, across every primitive. Ties in time go in the order
//! the sweep runs the primitives (handoff tickets, board leases, effect intents, effect holds,
//! queue leases, queue back-offs, queue total deadlines), and within one primitive in its index
//! order (time, then key), so the choice depends on the state alone.
//!
//! How many: at most [`SWEEP_BATCH`], and fewer when their changes would not fit a
//! [`SweepBudget`] — the leader weighs the expiries it is about to propose
//! ([`State::sweep_bound`]) so that a watch can follow the entry, and writes the resulting count
//! into the command like any bound.

use std::iter::Peekable;

use crate::change::CHANGE_OVERHEAD;
use crate::state::State;

/// How many expiries a leader's sweep takes at most: the bound it writes into
/// [`crate::Command::SweepAtMost`]. Replicas read the bound from the command, never from here,
/// so changing it changes no replay. About 60 ms of apply per node for board leases on the
/// benchmark machine with a million live leases (docs/benchmarks.md): short enough for client
/// commands to interleave and well inside the default 200 ms minimum election timeout; half of
/// it was measurably slower in all (each sweep also costs a log round trip).
pub const SWEEP_BATCH: u32 = 40_000;

/// How big the leader lets one sweep's log entry grow, so that every node's watch history can
/// hold it whole and a watch that keeps up is never cut over it: a mass expiry of leases that
/// each make several changes (a keyed queue lease makes three), or of tickets with large
/// payloads, would otherwise make one entry with more changes or bytes than the history keeps,
/// and every watch positioned before it would end `COMPACTED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepBudget {
    /// Most expiries ([`SWEEP_BATCH`] on a leader).
    pub expiries: u32,
    /// Most changes, as watches count them.
    pub changes: usize,
    /// Most bytes, as [`crate::Change::approx_bytes`] counts them.
    pub bytes: usize,
}

/// How many expiries a leader's sweep takes ([`State::sweep_bound`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepBound {
    /// The bound to write into [`crate::Command::SweepAtMost`]: the expiries weighed.
    pub expiries: u32,
    /// Whether expiries due were left for the next sweep (the budget or its bound was reached):
    /// the leader sweeps again at once.
    pub more_due: bool,
}

impl State {
    /// The bound of a [`crate::Command::SweepAtMost`] proposed at `now_ms` whose entry stays
    /// within `budget`: the expiries due that fell due first, taken as the sweep takes them, while
    /// their changes fit (at least one, so every sweep makes progress). It counts only what it
    /// weighed: anything falling due between now and the sweep's stamp waits for the next sweep
    /// rather than riding along unweighed. The leader sizes each sweep with it once; replicas
    /// apply the bound, never the budget, so every replica takes exactly the same expiries
    /// whatever its state's size estimates say.
    pub fn sweep_bound(&self, now_ms: u64, budget: SweepBudget) -> SweepBound {
        let clock_ms = now_ms.max(self.clock_ms);
        let max = usize::try_from(budget.expiries).unwrap_or(usize::MAX);
        let limit = Weight {
            changes: budget.changes,
            bytes: budget.bytes,
        };
        let (taken, more_due) = take_first(self, clock_ms, max, Some(limit));
        SweepBound {
            expiries: u32::try_from(taken.iter().sum::<usize>()).unwrap_or(u32::MAX),
            more_due,
        }
    }
}

/// What one expiry adds to its sweep entry's changes, as the watch history counts them: an
/// estimate that errs high (a change the expiry may not make is counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Weight {
    /// Changes.
    pub(crate) changes: usize,
    /// Bytes, as [`crate::Change::approx_bytes`] counts them.
    pub(crate) bytes: usize,
}

impl Weight {
    /// An expiry of something no longer there: it makes no change.
    pub(crate) const NONE: Weight = Weight {
        changes: 0,
        bytes: 0,
    };

    /// One change whose key, holder and value take `bytes`.
    pub(crate) fn change(bytes: usize) -> Weight {
        Weight {
            changes: 1,
            bytes: CHANGE_OVERHEAD + bytes,
        }
    }

    /// `n` such changes.
    pub(crate) fn times(self, n: usize) -> Weight {
        Weight {
            changes: self.changes * n,
            bytes: self.bytes * n,
        }
    }

    /// Both together.
    pub(crate) fn plus(self, other: Weight) -> Weight {
        Weight {
            changes: self.changes + other.changes,
            bytes: self.bytes + other.bytes,
        }
    }

    fn exceeds(&self, limit: &Weight) -> bool {
        self.changes > limit.changes || self.bytes > limit.bytes
    }
}

/// How many due expiries of each kind one bounded sweep materialises.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Handoff tickets.
    pub(crate) tickets: usize,
    /// Board leases.
    pub(crate) claims: usize,
    /// Side-effect execution intents.
    pub(crate) intents: usize,
    /// Side-effect resource holds.
    pub(crate) holds: usize,
    /// Queue attempt leases.
    pub(crate) leases: usize,
    /// Queue back-offs that ended.
    pub(crate) retries: usize,
    /// Queue total deadlines of tasks not running.
    pub(crate) deadlines: usize,
}

impl Plan {
    /// The (at most) `max` expiries due at `clock_ms` that fell due first.
    pub(crate) fn first_due(state: &State, clock_ms: u64, max: usize) -> Plan {
        let ([tickets, claims, intents, holds, leases, retries, deadlines], _) =
            take_first(state, clock_ms, max, None);
        Plan {
            tickets,
            claims,
            intents,
            holds,
            leases,
            retries,
            deadlines,
        }
    }
}

/// One source of due expiries, earliest first, each with its weight (none when not weighed).
type Due<'a> = Peekable<Box<dyn Iterator<Item = (u64, Weight)> + 'a>>;

/// How many of each source's expiries the first `max` due at `clock_ms` take, in the sweep's
/// order (while their weights fit `limit`, when given: the expiries are then weighed), and
/// whether any due were left out.
fn take_first(
    state: &State,
    clock_ms: u64,
    max: usize,
    limit: Option<Weight>,
) -> ([usize; 7], bool) {
    let weigh = limit.is_some();
    let (h, b, e, q) = (&state.handoff, &state.board, &state.effects, &state.queue);
    let mut sources: [Due<'_>; 7] = [
        due(h.due(clock_ms), weigh, |key| h.expiry_weight(key)),
        due(b.due(clock_ms), weigh, |id| b.expiry_weight(id)),
        due(e.due_intents(clock_ms), weigh, |key| e.intent_weight(key)),
        due(e.due_holds(clock_ms), weigh, |resource| {
            e.hold_weight(resource)
        }),
        due(q.due_leases(clock_ms), weigh, {
            let mut weigh_lease = q.lease_weigher();
            move |id| weigh_lease(*id)
        }),
        due(q.due_retries(clock_ms), weigh, |id| q.retry_weight(*id)),
        due(q.due_deadlines(clock_ms), weigh, |id| {
            q.deadline_weight(*id)
        }),
    ];
    let mut taken = [0usize; 7];
    let mut spent = Weight::NONE;
    for n in 0..max {
        // The earliest head; on equal times the first source (the sweep's order).
        let next = sources
            .iter_mut()
            .enumerate()
            .filter_map(|(source, due)| due.peek().map(|(at, _)| (*at, source)))
            .min();
        let Some((_, source)) = next else {
            break;
        };
        let Some((_, weight)) = sources[source].next() else {
            break;
        };
        spent = spent.plus(weight);
        if n > 0 && limit.is_some_and(|limit| spent.exceeds(&limit)) {
            return (taken, true);
        }
        taken[source] += 1;
    }
    let more_due = sources.iter_mut().any(|due| due.peek().is_some());
    (taken, more_due)
}

/// `items` as a [`Due`] source, each weighed by `weight` when `weigh`.
fn due<'a, K: ?Sized + 'a>(
    items: impl Iterator<Item = (u64, &'a K)> + 'a,
    weigh: bool,
    mut weight: impl FnMut(&K) -> Weight + 'a,
) -> Due<'a> {
    let weighed = items.map(move |(at, key)| {
        let weight = if weigh { weight(key) } else { Weight::NONE };
        (at, weight)
    });
    let boxed: Box<dyn Iterator<Item = (u64, Weight)> + 'a> = Box::new(weighed);
    boxed.peekable()
}
