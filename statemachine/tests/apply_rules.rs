//! Versioned apply rules (`baton_statemachine::rules`): a state applies commands by the rules in
//! force, which only an `AdoptRules` entry changes, never back; and each rule change holds only
//! from the entry that adopted it on, so a log replays the same on every build that knows it.
//! One test per rule change, run under the rules before it and after.
#![allow(clippy::unwrap_used)]

use baton_statemachine::limits::{MAX_KEY_BYTES, MAX_RESOURCE_BYTES};
use baton_statemachine::queue::MAX_KEY_CHARS;
use baton_statemachine::rules::{self, IDLE_SESSIONS_PER_SWEEP, RULES};
use baton_statemachine::{
    apply, checkpoint, sink, Command, Envelope, Origin, Refusal, Reply, Response, Stamp, State,
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
fn a_build_knows_its_rules_and_older_ones_only() {
    assert_eq!(rules::known(0), Ok(()));
    assert_eq!(rules::known(RULES), Ok(()));
    let unknown = rules::known(RULES + 1).unwrap_err();
    assert!(unknown.contains("run a newer build"), "{unknown}");
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

fn sink_write(state: &mut State, resource: &str) -> Response {
    let write = Command::Sink(sink::Command::Write {
        resource: resource.into(),
        fence: 1,
        value: b"v".to_vec(),
    });
    apply(state, &envelope(T0, None, write))
}

fn refused_as_too_long(response: &Response) -> bool {
    matches!(response, Response::Answer(Err(Refusal::Invalid { field, .. })) if field == "resource")
}

/// Rules 0: a fenced-sink resource name is a key, at most 512 bytes, so a queue namespace and a
/// long concurrency key fenced as `"{namespace}/{key}"` do not fit. From rules 1, names up to
/// `MAX_RESOURCE_BYTES` do.
#[test]
fn from_rules_1_a_namespaced_concurrency_key_fits_the_sink() {
    let namespace = "n".repeat(MAX_KEY_BYTES);
    let key = "键".repeat(MAX_KEY_CHARS);
    let resource = format!("{namespace}/{key}");
    assert!(resource.len() > MAX_KEY_BYTES && resource.len() <= MAX_RESOURCE_BYTES);

    let mut state = State::default();
    assert!(refused_as_too_long(&sink_write(&mut state, &resource)));
    assert!(state.sink.read(&resource).is_none());

    adopt(&mut state, 1);
    assert!(matches!(
        sink_write(&mut state, &resource),
        Response::Answer(Ok(Reply::Written { .. }))
    ));
    let too_long = "r".repeat(MAX_RESOURCE_BYTES + 1);
    assert!(refused_as_too_long(&sink_write(&mut state, &too_long)));
    assert!(state.sink.read(&too_long).is_none());
}
