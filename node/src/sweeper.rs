//! The leader's sweeps: expiries materialised in the log as soon as they fall due.
//!
//! Deadlines are judged lazily at apply time, so no command ever acts on a lapsed lease; the
//! sweep writes the expiries down (and reports them to watches as `lost` / `expired`) so that
//! holders hear of them promptly and snapshots carry no overdue leftovers. While this node leads
//! it sleeps until the earliest thing the state watches falls due
//! ([`baton_statemachine::State::next_due_ms`]) and proposes a [`Command::SweepAtMost`] of at
//! most [`SWEEP_BATCH`] expiries, fewer when their changes would not fit its [`budget`] (see
//! [`SweepBudget`]). A sweep that left expiries due is followed by the next at once;
//! otherwise the next waits at least [`SWEEP_SPACING`], so leases that fall due one by one cost
//! at most a few sweep entries a second. With nothing due
//! nothing is proposed, except a sweep every [`SESSION_SWEEP_EVERY`] to forget idle client
//! sessions (followed by the next at once while a sweep's bound left some idle): an idle cluster
//! stays idle.
//!
//! A command applied meanwhile may bring an earlier deadline, so a leading sweeper also wakes
//! whenever the applied state changes; every sweeper wakes when the node's role or leader
//! changes, and at least every `sweep_interval`.

use std::time::Duration;

use baton_statemachine::sweep::{SweepBudget, SWEEP_BATCH};
use baton_statemachine::Command;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::admission::Admission;
use crate::config::WatchTuning;
use crate::node::NodeRef;
use crate::stamp::wall_clock_ms;

/// The sweep runs at least this often even with nothing due, to forget idle client sessions.
pub const SESSION_SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The shortest time between the starts of two sweeps unless the first left expiries due (or the
/// `sweep_interval`, when that is shorter): at most 20 sweep entries a second while expiries
/// trickle in, and a lease waits at most this long (plus the sweep's commit) once it falls due.
pub const SWEEP_SPACING: Duration = Duration::from_millis(50);

/// The entry a new leader commits before it serves reads: a sweep that takes no expiries (the
/// sweeper takes those, in entries it sizes), so it stays small whatever is due.
pub fn barrier_command() -> Command {
    Command::SweepAtMost { expiries: 0 }
}

/// The budget of each sweep this node proposes: four fifths of what one watch stream may owe
/// before it is cut `SLOW_CONSUMER` — by changes the smaller of the history's count and
/// `max_backlog`, by bytes half the history's bytes — and at most [`SWEEP_BATCH`] expiries. The
/// history then holds a whole sweep entry (a bigger one would be skipped, and every watch before
/// it end `COMPACTED`), and a watch that keeps up is not cut over one (the fifth left is room for
/// client commands batched into the same entry). With the default
/// limits it is 40,000 changes and 25.6 MiB: a board lease or a ticket without payload makes one
/// small change, so their sweeps keep the full [`SWEEP_BATCH`].
pub fn budget(watch: &WatchTuning) -> SweepBudget {
    SweepBudget {
        expiries: SWEEP_BATCH,
        changes: watch.history.events.min(watch.max_backlog) / 5 * 4,
        bytes: watch.history.bytes / 2 / 5 * 4,
    }
}

/// What the sweeper knows when it decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Situation {
    /// Whether this node leads and may propose.
    leading: bool,
    /// The state's [`baton_statemachine::State::next_due_ms`].
    next_due_ms: Option<u64>,
    /// The time a sweep proposed now would be judged at: the wall clock, or the store clock when
    /// that is ahead (Unix ms).
    now_ms: u64,
    /// This node's wall clock (Unix ms): what the store clock advances by while it leads, so a
    /// deadline past `now_ms` cannot come due before the wall clock reaches it.
    wall_ms: u64,
    /// Since the last sweep started.
    since_last: Duration,
    /// Whether the last sweep left expiries due (its budget or bound was reached).
    backlog: bool,
    /// Whether the last sweep left idle client sessions (its bound on them was reached: apply
    /// rules 1 on, `baton_statemachine::rules`).
    sessions_left: bool,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Propose a sweep now.
    Sweep,
    /// Look again after this long (or when the state changes).
    Wait(Duration),
}

/// Decides when to sweep next; `every` is the `sweep_interval`.
fn next(situation: Situation, every: Duration) -> Next {
    if !situation.leading {
        return Next::Wait(every);
    }
    let spacing = if situation.backlog || situation.sessions_left {
        Duration::ZERO
    } else {
        SWEEP_SPACING
            .min(every)
            .saturating_sub(situation.since_last)
    };
    let sessions_in = if situation.sessions_left {
        Duration::ZERO
    } else {
        SESSION_SWEEP_EVERY.saturating_sub(situation.since_last)
    };
    let due_in = situation
        .next_due_ms
        .map_or(Duration::MAX, |due| {
            // Not due yet: only a stamp of this node's wall clock can make it so (the store
            // clock stands still while it is ahead), so waiting for the store clock's distance
            // would wake again and again for as long as the wall clock is behind.
            let from = if due <= situation.now_ms {
                situation.now_ms
            } else {
                situation.wall_ms
            };
            Duration::from_millis(due.saturating_sub(from))
        })
        .min(sessions_in);
    match due_in.max(spacing) {
        Duration::ZERO => Next::Sweep,
        wait => Next::Wait(wait.min(every)),
    }
}

/// Runs the sweeps while this node leads, each within `budget`, until `stop` turns true.
pub async fn run(
    node: NodeRef,
    admission: Admission,
    every: Duration,
    budget: SweepBudget,
    mut stop: watch::Receiver<bool>,
) {
    let mut applied = node.state_machine.subscribe();
    let mut server = node.raft.server_metrics();
    let (mut watching, mut watching_server) = (true, true);
    let mut last_sweep = Instant::now();
    let (mut backlog, mut sessions_left) = (false, false);
    loop {
        // Seen from here on: a change applied after this wakes the wait below.
        applied.borrow_and_update();
        let situation = {
            let leading = server.borrow_and_update().current_leader == Some(node.id);
            // A leader handing over or shutting down must not propose.
            let leading = leading && !admission.is_closed();
            let (next_due_ms, clock_ms) = {
                let applied = node.state_machine.read();
                (applied.state.next_due_ms(), applied.state.clock_ms)
            };
            let wall_ms = wall_clock_ms();
            Situation {
                leading,
                next_due_ms,
                now_ms: wall_ms.max(clock_ms),
                wall_ms,
                since_last: last_sweep.elapsed(),
                backlog,
                sessions_left,
            }
        };
        match next(situation, every) {
            Next::Wait(wait) => {
                // Only a leader cares when a new deadline arrives.
                let wake_on_change = watching && situation.leading;
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    changed = applied.changed(), if wake_on_change => watching = changed.is_ok(),
                    changed = server.changed(), if watching_server => {
                        watching_server = changed.is_ok();
                    }
                    _ = stop.changed() => return,
                }
            }
            Next::Sweep => {
                last_sweep = Instant::now();
                (backlog, sessions_left) = (false, false);
                let (bound, now_ms) = {
                    let applied = node.state_machine.read();
                    let now_ms = wall_clock_ms().max(applied.state.clock_ms);
                    (applied.state.sweep_bound(now_ms, budget), now_ms)
                };
                let command = Command::SweepAtMost {
                    expiries: bound.expiries,
                };
                // A leader cut off from its followers waits for this entry forever (openraft
                // 0.9 has no check-quorum): a shutdown must not wait with it.
                let proposed = tokio::select! {
                    proposed = node.propose(None, command) => proposed,
                    _ = stop.changed() => return,
                };
                match proposed {
                    Ok(reply) => {
                        tracing::debug!(?reply, bound = bound.expiries, "swept");
                        backlog = bound.more_due;
                        // The sweep was stamped at `now_ms` or later: a session idle at `now_ms`
                        // and still remembered was left by its bound (apply rules 1 on).
                        sessions_left = node.state_machine.read().state.sessions.idle_due(now_ms);
                    }
                    Err(status) => tracing::debug!(%status, "sweep not applied"),
                }
                if *stop.borrow() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: Duration = Duration::from_secs(1);
    const NOW: u64 = 1_000_000;

    fn leader(next_due_ms: Option<u64>, since_last_ms: u64, backlog: bool) -> Situation {
        Situation {
            leading: true,
            next_due_ms,
            now_ms: NOW,
            wall_ms: NOW,
            since_last: Duration::from_millis(since_last_ms),
            backlog,
            sessions_left: false,
        }
    }

    fn wait(ms: u64) -> Next {
        Next::Wait(Duration::from_millis(ms))
    }

    #[test]
    fn a_leader_sleeps_until_the_earliest_deadline_not_a_fixed_tick() {
        assert_eq!(
            next(leader(Some(NOW + 230), 5_000, false), EVERY),
            wait(230)
        );
        assert_eq!(next(leader(Some(NOW), 5_000, false), EVERY), Next::Sweep);
        assert_eq!(
            next(leader(Some(NOW - 10), 5_000, false), EVERY),
            Next::Sweep
        );
    }

    #[test]
    fn a_leader_whose_wall_clock_is_behind_the_store_clock_waits_for_its_wall_clock() {
        // The store clock (NOW) is 500 ms ahead of this leader's wall clock: a deadline 200 ms
        // past the store clock comes due when the wall clock reaches it, 700 ms from now (not
        // every 200 ms until then); one the store clock has passed is due at once.
        let behind = Situation {
            wall_ms: NOW - 500,
            ..leader(Some(NOW + 200), 5_000, false)
        };
        assert_eq!(next(behind, EVERY), wait(700));
        let due = Situation {
            next_due_ms: Some(NOW - 10),
            ..behind
        };
        assert_eq!(next(due, EVERY), Next::Sweep);
    }

    #[test]
    fn an_idle_leader_proposes_nothing_but_the_session_sweep() {
        assert_eq!(next(leader(None, 5_000, false), EVERY), Next::Wait(EVERY));
        assert_eq!(
            next(leader(Some(NOW + 90_000), 5_000, false), EVERY),
            Next::Wait(EVERY)
        );
        assert_eq!(next(leader(None, 59_700, false), EVERY), wait(300));
        assert_eq!(next(leader(None, 60_000, false), EVERY), Next::Sweep);
    }

    #[test]
    fn sweeps_are_spaced_unless_the_last_one_left_expiries_due() {
        assert_eq!(next(leader(Some(NOW - 10), 20, false), EVERY), wait(30));
        assert_eq!(next(leader(Some(NOW - 10), 20, true), EVERY), Next::Sweep);
        assert_eq!(next(leader(Some(NOW - 10), 0, true), EVERY), Next::Sweep);
        // A sweep interval shorter than the spacing shortens it.
        let short = Duration::from_millis(10);
        assert_eq!(next(leader(Some(NOW - 10), 4, false), short), wait(6));
    }

    #[test]
    fn a_sweep_that_left_idle_sessions_is_followed_by_the_next_at_once() {
        for since_last_ms in [0, 20, 5_000] {
            let left = Situation {
                sessions_left: true,
                ..leader(None, since_last_ms, false)
            };
            assert_eq!(next(left, EVERY), Next::Sweep, "{since_last_ms} ms after");
        }
    }

    #[test]
    fn a_follower_only_looks_again_every_interval() {
        let follower = Situation {
            leading: false,
            ..leader(Some(NOW - 10), 5_000, true)
        };
        assert_eq!(next(follower, EVERY), Next::Wait(EVERY));
    }
}
