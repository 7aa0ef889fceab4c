//! The fenced sink and the checkpoint CAS (contract.md sections 3 and 4, seed 001 `pgstore.Downstream`
//! and `pgstore.SnapStore`), one rule per test, driven through `apply`.
#![allow(clippy::unwrap_used)]

use baton_statemachine::checkpoint::{self, Checkpoint};
use baton_statemachine::limits::{MAX_KEY_BYTES, MAX_PAYLOAD_BYTES};
use baton_statemachine::sink::{self, SinkValue};
use baton_statemachine::{
    apply, Command, Envelope, Origin, Refusal, Reply, Response, Stamp, State,
};

const T0: u64 = 1_000_000;

struct World {
    state: State,
    seq: u64,
}

impl World {
    fn new() -> Self {
        World {
            state: State::default(),
            seq: 0,
        }
    }

    fn send(&mut self, now_ms: u64, command: Command) -> Result<Reply, Refusal> {
        self.seq += 1;
        let envelope = Envelope {
            stamp: Stamp {
                now_ms,
                entropy: u128::from(self.seq),
            },
            origin: Some(Origin {
                client_id: 3,
                seq: self.seq,
                acked_below: 0,
            }),
            command,
        };
        match apply(&mut self.state, &envelope) {
            Response::Answer(result) => result,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn write(&mut self, resource: &str, fence: u64, value: &[u8]) -> Result<Reply, Refusal> {
        self.send(
            T0,
            Command::Sink(sink::Command::Write {
                resource: resource.into(),
                fence,
                value: value.to_vec(),
            }),
        )
    }

    fn save(&mut self, now_ms: u64, run: &str, seq: u64, data: &[u8]) -> Result<Reply, Refusal> {
        self.send(
            now_ms,
            Command::Checkpoint(checkpoint::Command::SaveIfNewer {
                run: run.into(),
                seq,
                data: data.to_vec(),
            }),
        )
    }

    fn stored(&self, resource: &str) -> SinkValue {
        self.state.sink.read(resource).cloned().expect("written")
    }

    fn load(&self, run: &str) -> Option<Checkpoint> {
        self.state.checkpoints.load(run).cloned()
    }
}

fn is_invalid(result: &Result<Reply, Refusal>, field: &str) -> bool {
    matches!(result, Err(Refusal::Invalid { field: f, rule }) if f == field && !rule.is_empty())
}

// ---------------------------------------------------------------------------------------------
// fenced sink

#[test]
fn a_first_write_is_accepted_and_sets_the_seen_fence() {
    let mut w = World::new();
    assert_eq!(w.state.sink.seen_fence("db"), 0);
    assert!(w.state.sink.read("db").is_none());
    assert_eq!(
        w.write("db", 3, b"v3").unwrap(),
        Reply::Written {
            seen_fence: 3,
            writes: 1
        }
    );
    assert_eq!(
        w.stored("db"),
        SinkValue {
            seen_fence: 3,
            value: b"v3".to_vec(),
            writes: 1
        }
    );
    assert_eq!(w.state.sink.seen_fence("db"), 3);
}

#[test]
fn a_stale_fence_is_refused_and_nothing_is_written() {
    let mut w = World::new();
    w.write("db", 5, b"v5").unwrap();
    let before = w.state.sink.clone();
    for fence in [4, 1] {
        assert_eq!(w.write("db", fence, b"old"), Err(Refusal::FenceStale));
        assert_eq!(
            w.state.sink, before,
            "value, seen fence and write count unchanged"
        );
    }
    let stored = w.stored("db");
    assert_eq!(stored.value, b"v5");
    assert_eq!(stored.writes, 1);
    assert_eq!(stored.seen_fence, 5);
}

#[test]
fn an_equal_fence_is_allowed() {
    let mut w = World::new();
    w.write("db", 5, b"batch-1").unwrap();
    assert_eq!(
        w.write("db", 5, b"batch-2").unwrap(),
        Reply::Written {
            seen_fence: 5,
            writes: 2
        }
    );
    assert_eq!(w.stored("db").value, b"batch-2");
}

#[test]
fn a_higher_fence_raises_the_seen_fence_and_locks_out_the_older_writer() {
    let mut w = World::new();
    w.write("db", 1, b"old holder").unwrap();
    assert_eq!(
        w.write("db", 7, b"new holder").unwrap(),
        Reply::Written {
            seen_fence: 7,
            writes: 2
        }
    );
    assert_eq!(w.state.sink.seen_fence("db"), 7);
    assert_eq!(w.write("db", 1, b"late write"), Err(Refusal::FenceStale));
    assert_eq!(w.write("db", 6, b"late write"), Err(Refusal::FenceStale));
    assert_eq!(w.stored("db").value, b"new holder");
}

#[test]
fn fences_are_per_resource() {
    let mut w = World::new();
    w.write("a", 9, b"a9").unwrap();
    w.write("b", 1, b"b1").unwrap();
    assert_eq!(w.state.sink.seen_fence("a"), 9);
    assert_eq!(w.state.sink.seen_fence("b"), 1);
}

#[test]
fn fence_zero_is_invalid_even_on_a_fresh_resource() {
    let mut w = World::new();
    let result = w.write("db", 0, b"x");
    assert!(is_invalid(&result, "fence"), "got {result:?}");
    assert!(w.state.sink.read("db").is_none(), "nothing written");
    w.write("db", 2, b"v2").unwrap();
    let before = w.state.sink.clone();
    assert!(is_invalid(&w.write("db", 0, b"x"), "fence"));
    assert_eq!(w.state.sink, before);
}

#[test]
fn sink_write_validates_resource_and_value() {
    let mut w = World::new();
    assert!(is_invalid(&w.write("", 1, b"x"), "resource"));
    assert!(is_invalid(
        &w.write(&"r".repeat(MAX_KEY_BYTES + 1), 1, b"x"),
        "resource"
    ));
    assert!(is_invalid(
        &w.write("db", 1, &vec![0; MAX_PAYLOAD_BYTES + 1]),
        "value"
    ));
    assert_eq!(w.state.sink, sink::Sink::default());
}

// ---------------------------------------------------------------------------------------------
// checkpoint CAS

#[test]
fn seq_zero_is_refused_naming_seq() {
    let mut w = World::new();
    let result = w.save(T0, "run", 0, b"x");
    assert!(is_invalid(&result, "seq"), "got {result:?}");
    assert_eq!(
        w.load("run"),
        None,
        "seq 0 never lands, not even on an empty run"
    );
    w.save(T0, "run", 1, b"one").unwrap();
    let before = w.state.checkpoints.clone();
    assert!(is_invalid(&w.save(T0, "run", 0, b"x"), "seq"));
    assert_eq!(w.state.checkpoints, before);
}

#[test]
fn a_higher_seq_is_stored_with_the_store_clock() {
    let mut w = World::new();
    assert_eq!(w.save(T0 + 5, "run", 1, b"one").unwrap(), Reply::Done);
    assert_eq!(
        w.load("run"),
        Some(Checkpoint {
            seq: 1,
            data: b"one".to_vec(),
            saved_at_ms: T0 + 5
        })
    );
    w.save(T0 + 9, "run", 4, b"four").unwrap();
    assert_eq!(
        w.load("run"),
        Some(Checkpoint {
            seq: 4,
            data: b"four".to_vec(),
            saved_at_ms: T0 + 9
        })
    );
}

#[test]
fn a_seq_not_above_the_stored_one_is_stale_and_changes_nothing() {
    let mut w = World::new();
    w.save(T0, "run", 5, b"five").unwrap();
    let before = w.state.checkpoints.clone();
    for seq in [5, 4, 1] {
        assert_eq!(w.save(T0 + 1, "run", seq, b"older"), Err(Refusal::StaleSeq));
        assert_eq!(w.state.checkpoints, before);
    }
    assert_eq!(w.load("run").unwrap().data, b"five");
    assert_eq!(w.load("run").unwrap().seq, 5);
}

#[test]
fn runs_are_independent() {
    let mut w = World::new();
    w.save(T0, "a", 10, b"a10").unwrap();
    w.save(T0, "b", 1, b"b1").unwrap();
    assert_eq!(w.load("a").unwrap().seq, 10);
    assert_eq!(w.load("b").unwrap().seq, 1);
}

#[test]
fn load_of_an_unknown_run_is_none_and_an_empty_save_is_some() {
    let mut w = World::new();
    assert_eq!(w.load("never"), None);
    // "ran and saved nothing" is distinguishable from "never ran"
    w.save(T0, "empty", 1, b"").unwrap();
    assert_eq!(
        w.load("empty"),
        Some(Checkpoint {
            seq: 1,
            data: Vec::new(),
            saved_at_ms: T0
        })
    );
    assert_eq!(w.load("never"), None);
}

#[test]
fn checkpoint_validates_run_and_data() {
    let mut w = World::new();
    assert!(is_invalid(&w.save(T0, "", 1, b"x"), "run"));
    assert!(is_invalid(
        &w.save(T0, &"r".repeat(MAX_KEY_BYTES + 1), 1, b"x"),
        "run"
    ));
    assert!(is_invalid(
        &w.save(T0, "run", 1, &vec![0; MAX_PAYLOAD_BYTES + 1]),
        "data"
    ));
    assert_eq!(w.load("run"), None);
}
