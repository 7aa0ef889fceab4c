//! The whole replicated state and the one function that changes it.

use serde::{Deserialize, Serialize};

use crate::command::{Command, Envelope, Reply, Response, Stamp};
use crate::error::Refusal;
use crate::handoff::{self, Desk};
use crate::session::{SessionLookup, Sessions};

/// Everything the store knows. Snapshots are this, serialized.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The store clock in Unix milliseconds: the largest leader stamp of any command executed so
    /// far (a retry answered from the session table executes nothing). It never runs backwards,
    /// even when a new leader's wall clock is behind the old one's.
    pub clock_ms: u64,
    /// Client sessions, for exactly-once answers to retries.
    pub sessions: Sessions,
    /// Handoff tickets.
    pub handoff: Desk,
}

/// Applies one log entry. Deterministic: the result depends only on `state` and `envelope`.
///
/// A repeated `(client_id, seq)` gets the response of its first application and changes nothing,
/// not even the store clock: only a command that is executed advances it.
pub fn apply(state: &mut State, envelope: &Envelope) -> Response {
    let Some(origin) = &envelope.origin else {
        return Response::Answer(execute(state, &envelope.stamp, &envelope.command));
    };
    match state.sessions.lookup(origin) {
        SessionLookup::Seen(first) => first,
        SessionLookup::Forgotten => Response::SessionExpired,
        SessionLookup::New => {
            let response = Response::Answer(execute(state, &envelope.stamp, &envelope.command));
            state.sessions.record(origin, response.clone(), state.clock_ms);
            response
        }
    }
}

fn execute(state: &mut State, stamp: &Stamp, command: &Command) -> Result<Reply, Refusal> {
    state.clock_ms = state.clock_ms.max(stamp.now_ms);
    let clock = state.clock_ms;
    match command {
        Command::Handoff(command) => handoff_command(&mut state.handoff, stamp, clock, command.clone()),
        Command::Sweep => {
            state.sessions.expire_idle(clock);
            Ok(Reply::Swept {
                expired: state.handoff.sweep(clock),
            })
        }
    }
}

fn handoff_command(desk: &mut Desk, stamp: &Stamp, clock: u64, command: handoff::Command) -> Result<Reply, Refusal> {
    match command {
        handoff::Command::Offer(args) => desk.offer(clock, args).map(Reply::Ticket),
        handoff::Command::Take { key, to } => desk.take(stamp, clock, &key, &to).map(Reply::Handle),
        handoff::Command::Reply { key, token, receipt } => {
            desk.reply(clock, &key, &token, receipt).map(|()| Reply::Done)
        }
        handoff::Command::Cancel { key, by } => desk.cancel(clock, &key, &by).map(|()| Reply::Done),
    }
}

impl State {
    /// Whether a sweep at `now_ms` has anything to do (used by the leader to skip idle sweeps).
    pub fn sweep_due(&self, now_ms: u64) -> bool {
        self.handoff.has_overdue(now_ms.max(self.clock_ms))
    }
}
