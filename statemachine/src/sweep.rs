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

use std::iter::Peekable;

use crate::state::State;

/// How many expiries a leader's sweep takes at most: the bound it writes into
/// [`crate::Command::SweepAtMost`]. Replicas read the bound from the command, never from here,
/// so changing it changes no replay. About 60 ms of apply per node for board leases on the
/// benchmark machine with a million live leases (docs/benchmarks.md): short enough for client
/// commands to interleave and well inside the default 200 ms minimum election timeout; half of
/// it was measurably slower in all (each sweep also costs a log round trip).
pub const SWEEP_BATCH: u32 = 40_000;

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

/// One source of due times, earliest first.
type Due<'a> = Peekable<Box<dyn Iterator<Item = u64> + 'a>>;

impl Plan {
    /// The (at most) `max` expiries due at `clock_ms` that fell due first.
    pub(crate) fn first_due(state: &State, clock_ms: u64, max: usize) -> Plan {
        let mut sources: [Due<'_>; 7] = [
            due(state.handoff.due(clock_ms)),
            due(state.board.due(clock_ms)),
            due(state.effects.due_intents(clock_ms)),
            due(state.effects.due_holds(clock_ms)),
            due(state.queue.due_leases(clock_ms)),
            due(state.queue.due_retries(clock_ms)),
            due(state.queue.due_deadlines(clock_ms)),
        ];
        let mut taken = [0usize; 7];
        for _ in 0..max {
            // The earliest head; on equal times the first source (the sweep's order).
            let next = sources
                .iter_mut()
                .enumerate()
                .filter_map(|(source, due)| due.peek().map(|at| (*at, source)))
                .min();
            let Some((_, source)) = next else {
                break;
            };
            sources[source].next();
            taken[source] += 1;
        }
        let [tickets, claims, intents, holds, leases, retries, deadlines] = taken;
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

fn due<'a>(times: impl Iterator<Item = u64> + 'a) -> Due<'a> {
    let boxed: Box<dyn Iterator<Item = u64> + 'a> = Box::new(times);
    boxed.peekable()
}
