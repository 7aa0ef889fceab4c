//! Versioned apply rules (`baton_statemachine::rules`): a state applies commands by the rules in
//! force, which only an `AdoptRules` entry changes, never back; and each rule change holds only
//! from the entry that adopted it on, so a log replays the same on every build that knows it.
#![allow(clippy::unwrap_used)]

use baton_statemachine::rules::{self, IDLE_SESSIONS_PER_SWEEP, RULES};
use baton_statemachine::{
    apply, checkpoint, Command, Envelope, Origin, Reply, Response, Stamp, State,
    SESSION_IDLE_TTL_MS,
};

const T0: u64 = 1_000_000;

fn envelope(now_ms: u64, origin: Option<Origin>, command: Command) -> Envelope {
    Envelope {
        stamp: Stamp {
            now_ms,
            entropy: u128::from(now_ms),
        },
        origin,
        command,
    }
}

fn adopt(state: &mut State, rules: u32) -> Response {
    apply(state, &envelope(T0, None, Command::AdoptRules { rules }))
}

/// `clients` clients, each remembered by one checkpoint save at `T0`.
fn with_clients(clients: u64) -> State {
    let mut state = State::default();
    for client_id in 1..=clients {
        let save = Command::Checkpoint(checkpoint::Command::SaveIfNewer {
            run: format!("run-{client_id}"),
            seq: 1,
            data: vec![],
        });
        let origin = Origin {
            client_id,
            seq: 1,
            acked_below: 1,
        };
        let answer = apply(&mut state, &envelope(T0, Some(origin), save));
        assert_eq!(answer, Response::Answer(Ok(Reply::Done)));
    }
    state
}

fn sweep(state: &mut State, now_ms: u64) {
    let command = Command::SweepAtMost { expiries: 1_000 };
    assert!(matches!(
        apply(state, &envelope(now_ms, None, command)),
        Response::Answer(Ok(Reply::Swept { .. }))
    ));
}

#[test]
fn rules_are_adopted_by_an_entry_and_never_go_back() {
    let mut state = State::default();
    assert_eq!(state.rules, 0, "a state starts under the unversioned rules");
    assert_eq!(adopt(&mut state, RULES), Response::Answer(Ok(Reply::Done)));
    assert_eq!(state.rules, RULES);
    assert_eq!(adopt(&mut state, 0), Response::Answer(Ok(Reply::Done)));
    assert_eq!(state.rules, RULES, "an older adoption changes nothing");
}

#[test]
fn a_build_knows_which_adoptions_are_beyond_it() {
    let beyond = |rules| rules::beyond_this_build(&Command::AdoptRules { rules });
    assert_eq!(beyond(RULES), None);
    assert_eq!(beyond(0), None);
    assert_eq!(beyond(RULES + 1), Some(RULES + 1));
    assert_eq!(rules::beyond_this_build(&Command::Sweep), None);
}

/// Rules 0: one sweep forgets every idle client session. Rules 1: at most
/// `IDLE_SESSIONS_PER_SWEEP`, the longest idle first, the rest by the next sweeps.
#[test]
fn from_rules_1_a_sweep_forgets_a_bounded_number_of_idle_sessions() {
    let clients = IDLE_SESSIONS_PER_SWEEP as u64 + 5;
    let idle = T0 + SESSION_IDLE_TTL_MS + 1;

    let mut unversioned = with_clients(clients);
    sweep(&mut unversioned, idle);
    assert_eq!(unversioned.sessions.len(), 0);

    let mut bounded = with_clients(clients);
    adopt(&mut bounded, 1);
    sweep(&mut bounded, idle);
    assert_eq!(bounded.sessions.len(), 5);
    assert!(bounded.sessions.idle_due(bounded.clock_ms));
    sweep(&mut bounded, idle);
    assert_eq!(bounded.sessions.len(), 0);
    assert!(!bounded.sessions.idle_due(bounded.clock_ms));
}
