//! The bounded sweep (`Command::SweepAtMost`, docs/design.md "Expiry"): one sweep materialises at
//! most its bound of expiries, the ones that fell due first across every primitive (equal times in
//! the sweep's primitive order, then by key), and leaves the rest to the next sweep; a series of
//! bounded sweeps ends exactly where one unbounded `Command::Sweep` does, and an unbounded
//! `SweepAtMost` is that `Sweep`. `State::next_due_ms` is the moment a sweep becomes due. A sweep
//! the leader sizes with `State::sweep_bound` makes no more changes and bytes than its budget.
#![allow(clippy::unwrap_used)]

use baton_statemachine::board::{self, TaskSpec as BoardSpec};
use baton_statemachine::effect::{self, Action, RetrySafety};
use baton_statemachine::handoff::{self, OfferArgs};
use baton_statemachine::queue::{self, Queue, TaskSpec, Worker};
use baton_statemachine::sweep::{SweepBound, SweepBudget};
use baton_statemachine::{
    apply, apply_with_changes, Change, ChangeKind, Command, Envelope, Origin, Primitive, Reply,
    Response, Stamp, State,
};
use proptest::prelude::*;

const T0: u64 = 1_000_000;

/// A store and one client numbering its requests 1, 2, 3, ...
struct World {
    state: State,
    seq: u64,
}

impl World {
    fn new() -> Self {
        let mut world = World {
            state: State::default(),
            seq: 0,
        };
        let tasks = (0..8)
            .map(|n| BoardSpec {
                id: format!("b{n}"),
                deps: vec![],
            })
            .collect();
        world.send(T0, Command::Board(board::Command::Seed(tasks)));
        world.send(
            T0,
            Command::Queue(queue::Command::CreateQueue(Queue {
                name: "q".into(),
                namespace: "ns".into(),
            })),
        );
        world.send(
            T0,
            Command::Queue(queue::Command::RegisterWorker(Worker {
                id: "w".into(),
                concurrency_keys: true,
            })),
        );
        world
    }

    /// A new world after `ops`, each sent the given number of ms after the one before.
    fn after(ops: &[(u64, Op)]) -> Self {
        let mut w = World::new();
        let mut now = T0;
        for (dt, op) in ops {
            now += dt;
            w.send(now, command(op));
        }
        w
    }

    /// Applies a client command (refusals are fine: they change nothing).
    fn send(&mut self, now_ms: u64, command: Command) -> Response {
        self.seq += 1;
        let envelope = Envelope {
            stamp: Stamp {
                now_ms,
                entropy: u128::from(self.seq) << 64 | 0x5eed,
            },
            origin: Some(Origin {
                client_id: 7,
                seq: self.seq,
                acked_below: self.seq,
            }),
            command,
        };
        apply(&mut self.state, &envelope)
    }

    fn claim(&mut self, now_ms: u64, id: &str, ttl_ms: i64) {
        let claim = board::Command::Claim {
            id: id.into(),
            agent: format!("agent-{id}"),
            ttl_ms,
        };
        ok(self.send(now_ms, Command::Board(claim)));
    }

    fn offer(&mut self, now_ms: u64, key: &str, ttl_ms: i64) {
        ok(self.send(now_ms, offer(key, ttl_ms)));
    }

    fn acquire(&mut self, now_ms: u64, key: &str, resource: &str, ttl_ms: i64) {
        ok(self.send(now_ms, acquire(key, resource, ttl_ms)));
    }

    fn submit_and_lease(&mut self, now_ms: u64, key: &str, lease_ttl_ms: i64) {
        ok(self.send(now_ms, submit(key, "", 60_000, 1)));
        ok(self.send(now_ms, lease(1, lease_ttl_ms)));
    }
}

fn ok(response: Response) {
    assert!(
        matches!(response, Response::Answer(Ok(_))),
        "refused: {response:?}"
    );
}

fn offer(key: &str, ttl_ms: i64) -> Command {
    Command::Handoff(handoff::Command::Offer(OfferArgs {
        key: key.into(),
        from: "a".into(),
        to: "b".into(),
        payload: vec![],
        reply_to: "inbox".into(),
        ttl_ms,
    }))
}

fn take(key: &str) -> Command {
    Command::Handoff(handoff::Command::Take {
        key: key.into(),
        to: "b".into(),
    })
}

fn acquire(key: &str, resource: &str, ttl_ms: i64) -> Command {
    Command::Effect(effect::Command::Acquire {
        action: Action {
            key: key.into(),
            resource: resource.into(),
            safety: RetrySafety::Safe,
        },
        ttl_ms,
    })
}

fn submit(key: &str, concurrency_key: &str, ttl_ms: i64, max_attempts: u32) -> Command {
    Command::Queue(queue::Command::Submit(TaskSpec {
        queue: "q".into(),
        idempotency_key: key.into(),
        handler: "h".into(),
        handler_version: String::new(),
        payload_version: String::new(),
        payload: b"payload".to_vec(),
        concurrency_key: concurrency_key.into(),
        business_key: String::new(),
        max_attempts,
        ttl_ms,
    }))
}

fn lease(limit: u32, lease_ttl_ms: i64) -> Command {
    Command::Queue(queue::Command::Lease {
        worker: "w".into(),
        queues: vec![],
        limit,
        lease_ttl_ms,
    })
}

/// Runs a leader-proposed command (no origin) at `now_ms`; returns how many it expired and the
/// changes it made.
fn leader(state: &mut State, now_ms: u64, command: Command) -> (u64, Vec<Change>) {
    let envelope = Envelope {
        stamp: Stamp { now_ms, entropy: 0 },
        origin: None,
        command,
    };
    match apply_with_changes(state, &envelope) {
        (Response::Answer(Ok(Reply::Swept { expired })), changes) => (expired, changes),
        (other, _) => panic!("sweep answered {other:?}"),
    }
}

fn sweep_at_most(state: &mut State, now_ms: u64, expiries: u32) -> (u64, Vec<Change>) {
    leader(state, now_ms, Command::SweepAtMost { expiries })
}

/// `(primitive, kind, key)` of each change.
fn summary(changes: &[Change]) -> Vec<(Primitive, ChangeKind, String)> {
    changes
        .iter()
        .map(|c| (c.primitive, c.kind, c.key.clone()))
        .collect()
}

fn s(primitive: Primitive, kind: ChangeKind, key: &str) -> (Primitive, ChangeKind, String) {
    (primitive, kind, key.to_string())
}

#[test]
fn a_bounded_sweep_takes_the_oldest_due_first_and_leaves_the_rest_to_the_next() {
    let mut w = World::new();
    w.claim(T0, "b1", 50);
    w.claim(T0, "b2", 10);
    w.claim(T0, "b3", 30);
    w.claim(T0, "b4", 40);
    w.claim(T0, "b5", 1_000);
    w.offer(T0, "h1", 20);
    // One acquire: an execution intent and a resource hold, both ending at 25.
    w.acquire(T0, "e1", "r1", 25);
    // Queue task 1's attempt: its lease ends at 35.
    w.submit_and_lease(T0, "t1", 35);
    let now = T0 + 60;
    assert_eq!(w.state.next_due_ms(), Some(T0 + 10));

    // Due, oldest first: b2 (10), h1 (20), intent e1 (25), hold r1 (25), b3 (30), task 1's
    // lease (35), b4 (40), b1 (50). Each sweep reports its changes in the sweep's primitive order.
    let (expired, changes) = sweep_at_most(&mut w.state, now, 3);
    assert_eq!(expired, 3);
    assert_eq!(
        summary(&changes),
        vec![
            s(Primitive::Handoff, ChangeKind::Expired, "h1"),
            s(Primitive::Board, ChangeKind::Lost, "b2"),
            s(Primitive::Effect, ChangeKind::Lost, "e1"),
        ]
    );
    assert!(w.state.sweep_due(now), "more is due");

    let (expired, changes) = sweep_at_most(&mut w.state, now, 3);
    assert_eq!(expired, 3);
    assert_eq!(
        summary(&changes),
        vec![
            s(Primitive::Board, ChangeKind::Lost, "b3"),
            s(Primitive::Effect, ChangeKind::HoldExpired, "e1"),
            s(Primitive::Queue, ChangeKind::Lost, "1"),
            s(Primitive::Queue, ChangeKind::Leasable, "1"),
        ]
    );

    let (expired, changes) = sweep_at_most(&mut w.state, now, 3);
    assert_eq!(expired, 2, "only two were left");
    assert_eq!(
        summary(&changes),
        vec![
            s(Primitive::Board, ChangeKind::Lost, "b4"),
            s(Primitive::Board, ChangeKind::Lost, "b1"),
        ]
    );
    assert!(!w.state.sweep_due(now));
    assert_eq!(sweep_at_most(&mut w.state, now, 3), (0, vec![]));
    assert_eq!(
        w.state.board.get("b5").unwrap().state,
        board::TaskState::Claimed,
        "a lease not due yet is left alone"
    );
    assert_eq!(w.state.next_due_ms(), Some(T0 + 1_000));
}

#[test]
fn equal_deadlines_go_in_the_sweep_order_then_by_key() {
    let mut w = World::new();
    w.claim(T0, "b2", 10);
    w.claim(T0, "b1", 10);
    w.offer(T0, "h9", 10);
    let now = T0 + 10;
    let keys =
        |changes: &[Change]| -> Vec<String> { changes.iter().map(|c| c.key.clone()).collect() };
    assert_eq!(keys(&sweep_at_most(&mut w.state, now, 1).1), ["h9"]);
    assert_eq!(keys(&sweep_at_most(&mut w.state, now, 1).1), ["b1"]);
    assert_eq!(keys(&sweep_at_most(&mut w.state, now, 1).1), ["b2"]);
    assert_eq!(sweep_at_most(&mut w.state, now, 1).0, 0);
}

#[test]
fn a_bounded_sweep_of_nothing_due_changes_only_the_clock() {
    let mut w = World::new();
    w.claim(T0, "b1", 100);
    let mut before = w.state.clone();
    let (expired, changes) = sweep_at_most(&mut w.state, T0 + 99, 10);
    assert_eq!((expired, changes.len()), (0, 0));
    before.clock_ms = T0 + 99;
    assert_eq!(w.state, before);
}

#[test]
fn the_next_due_time_is_the_earliest_thing_the_sweep_watches() {
    let mut w = World::new();
    assert_eq!(w.state.next_due_ms(), None);
    w.claim(T0, "b1", 500);
    w.acquire(T0, "e1", "r1", 300);
    assert_eq!(w.state.next_due_ms(), Some(T0 + 300));
    w.offer(T0 + 10, "h1", 100);
    assert_eq!(w.state.next_due_ms(), Some(T0 + 110));
    assert!(!w.state.sweep_due(T0 + 109));
    assert!(w.state.sweep_due(T0 + 110));
    // A waiting queue task's total deadline counts; a running attempt's is judged when its
    // lease ends, so only the lease counts for it.
    ok(w.send(T0 + 10, submit("t1", "", 50, 1)));
    assert_eq!(w.state.next_due_ms(), Some(T0 + 60));
    ok(w.send(T0 + 10, lease(1, 70)));
    assert_eq!(w.state.next_due_ms(), Some(T0 + 80));
}

/// One step of a random history: a time step and a command that sets up something to expire.
#[derive(Debug, Clone)]
enum Op {
    Claim {
        task: u8,
        ttl: u16,
    },
    Offer {
        key: u8,
        ttl: u16,
    },
    Take {
        key: u8,
    },
    Acquire {
        key: u8,
        resource: u8,
        ttl: u16,
    },
    Submit {
        key: u8,
        keyed: u8,
        ttl: u16,
        attempts: u8,
    },
    Lease {
        limit: u8,
        ttl: u16,
    },
    Start {
        task: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..8u8, 1..200u16).prop_map(|(task, ttl)| Op::Claim { task, ttl }),
        (0..6u8, 1..200u16).prop_map(|(key, ttl)| Op::Offer { key, ttl }),
        (0..6u8).prop_map(|key| Op::Take { key }),
        (0..6u8, 0..3u8, 1..200u16).prop_map(|(key, resource, ttl)| Op::Acquire {
            key,
            resource,
            ttl
        }),
        (0..12u8, 0..3u8, 1..400u16, 1..3u8).prop_map(|(key, keyed, ttl, attempts)| {
            Op::Submit {
                key,
                keyed,
                ttl,
                attempts,
            }
        }),
        (1..4u8, 1..200u16).prop_map(|(limit, ttl)| Op::Lease { limit, ttl }),
        (1..12u8).prop_map(|task| Op::Start { task }),
    ]
}

fn command(op: &Op) -> Command {
    match op {
        Op::Claim { task, ttl } => Command::Board(board::Command::Claim {
            id: format!("b{task}"),
            agent: format!("agent-{}", task % 3),
            ttl_ms: i64::from(*ttl),
        }),
        Op::Offer { key, ttl } => offer(&format!("h{key}"), i64::from(*ttl)),
        Op::Take { key } => take(&format!("h{key}")),
        Op::Acquire { key, resource, ttl } => {
            acquire(&format!("e{key}"), &format!("r{resource}"), i64::from(*ttl))
        }
        Op::Submit {
            key,
            keyed,
            ttl,
            attempts,
        } => {
            let concurrency_key = ["", "k1", "k2"][usize::from(*keyed)];
            submit(
                &format!("t{key}"),
                concurrency_key,
                i64::from(*ttl),
                u32::from(*attempts),
            )
        }
        Op::Lease { limit, ttl } => lease(u32::from(*limit), i64::from(*ttl)),
        Op::Start { task } => Command::Queue(queue::Command::Start {
            task_id: u64::from(*task),
            attempt: 1,
            worker: "w".into(),
        }),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever is due across the primitives: bounded sweeps repeated at one store time leave the
    /// same state as one unbounded sweep, with the same changes (but for a task that failed on
    /// its total deadline, see below); every bounded sweep but the last takes exactly its bound;
    /// an unbounded `SweepAtMost` is the old `Sweep`.
    #[test]
    fn bounded_sweeps_end_where_one_full_sweep_does(
        ops in prop::collection::vec((0..40u64, op()), 1..60),
        later in 0..300u64,
        bound in 1..6u32,
    ) {
        let w = World::after(&ops);
        let now = w.state.clock_ms + later;
        if let Some(due) = w.state.next_due_ms() {
            if due > w.state.clock_ms {
                prop_assert!(!w.state.sweep_due(due - 1));
            }
            prop_assert!(w.state.sweep_due(due));
        }

        let mut full = w.state.clone();
        let (all, full_changes) = leader(&mut full, now, Command::Sweep);
        let mut unbounded = w.state.clone();
        let (same, same_changes) = sweep_at_most(&mut unbounded, now, u32::MAX);
        prop_assert_eq!(same, all);
        prop_assert_eq!(&same_changes, &full_changes);
        prop_assert_eq!(&unbounded, &full);

        let mut bounded = w.state.clone();
        let mut total = 0;
        let mut changes = Vec::new();
        loop {
            let (expired, more) = sweep_at_most(&mut bounded, now, bound);
            prop_assert!(expired <= u64::from(bound));
            total += expired;
            changes.extend(more);
            if expired < u64::from(bound) {
                break;
            }
        }
        prop_assert!(!bounded.sweep_due(now));
        prop_assert_eq!(&bounded, &full);
        // The same expiries and the same changes, in whatever order the bounds cut them (a
        // queue task whose back-off ended past its total deadline is failed either way, never
        // requeued first).
        prop_assert_eq!(total, all);
        let mut expected = summary(&full_changes);
        for change in summary(&changes) {
            let found = expected.iter().position(|c| *c == change);
            prop_assert!(found.is_some(), "{:?} only in the bounded sweeps", change);
            expected.swap_remove(found.unwrap_or_default());
        }
        prop_assert!(expected.is_empty(), "missing from the bounded sweeps: {:?}", expected);
    }
}

/// `(changes, bytes)` a sweep made, as the watch history counts them.
fn size(changes: &[Change]) -> (usize, usize) {
    (
        changes.len(),
        changes.iter().map(Change::approx_bytes).sum(),
    )
}

#[test]
fn sweeps_of_large_tickets_and_keyed_leases_are_sized_to_the_budget() {
    let mut w = World::new();
    // 300 tickets of 2 KiB payload and 100 keyed queue leases, all due at once.
    for n in 0..300 {
        let mut command = offer(&format!("big-{n:03}"), 100);
        if let Command::Handoff(handoff::Command::Offer(args)) = &mut command {
            args.payload = vec![7; 2048];
        }
        ok(w.send(T0, command));
    }
    for n in 0..100 {
        ok(w.send(
            T0,
            submit(&format!("keyed-{n:03}"), &format!("k{n:03}"), 60_000, 3),
        ));
    }
    ok(w.send(T0, lease(100, 200)));
    let now = T0 + 1_000;
    let budget = SweepBudget {
        expiries: 1_000,
        changes: 120,
        bytes: 100 << 10,
    };

    // Tickets first (they fell due first): ~2.2 KiB each, so the bytes bound them.
    let mut state = w.state.clone();
    let sized = state.sweep_bound(now, budget);
    assert!(sized.more_due);
    let bound = sized.expiries;
    assert!((40..=46).contains(&bound), "bound {bound}");
    let (expired, changes) = sweep_at_most(&mut state, now, bound);
    assert_eq!(expired, u64::from(bound));
    let (count, bytes) = size(&changes);
    assert!(
        count <= budget.changes && bytes <= budget.bytes,
        "{count} changes, {bytes} bytes"
    );
    assert!(
        bytes > budget.bytes * 9 / 10,
        "the estimate is far too high: {bytes} bytes"
    );

    // Every ticket swept, then keyed leases: three changes each, so the count bounds them.
    let mut rounds = 0;
    while state.handoff.has_overdue(now) {
        let bound = state.sweep_bound(now, budget).expiries;
        let (_, changes) = sweep_at_most(&mut state, now, bound);
        let (count, bytes) = size(&changes);
        assert!(count <= budget.changes && bytes <= budget.bytes);
        rounds += 1;
        assert!(rounds < 20);
    }
    let bound = state.sweep_bound(now, budget).expiries;
    let (expired, changes) = sweep_at_most(&mut state, now, bound);
    let kinds = summary(&changes);
    assert!(
        kinds
            .iter()
            .any(|(_, kind, _)| *kind == ChangeKind::KeyFreed),
        "{kinds:?}"
    );
    assert!(changes.len() <= budget.changes, "{} changes", changes.len());
    assert!(expired >= 30, "only {expired} leases in a 120-change sweep");

    // Nothing due at all: a sweep of nothing (it still forgets idle sessions).
    let mut idle = World::new();
    ok(idle.send(T0, offer("one", 60_000)));
    let nothing = SweepBound {
        expiries: 0,
        more_due: false,
    };
    assert_eq!(idle.state.sweep_bound(T0 + 1, budget), nothing);
    // Only what was weighed: one due now, a thousand due a moment later stay for the next sweep.
    for n in 0..1_000 {
        ok(idle.send(T0 + 1, offer(&format!("later-{n:04}"), 60_100)));
    }
    let now = T0 + 60_001;
    let one = idle.state.sweep_bound(now, budget);
    assert_eq!(
        one,
        SweepBound {
            expiries: 1,
            more_due: false
        }
    );
    let (expired, _) = sweep_at_most(&mut idle.state, now + 200, one.expiries);
    assert_eq!(expired, 1, "the sweep took more than was weighed");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever is due: a sweep bounded by `sweep_bound` makes at most the budget's changes and
    /// bytes (a single expiry excepted: every sweep takes one) and leaves something due only when
    /// the bound says so; with room for everything it takes what a full `Sweep` takes.
    #[test]
    fn a_sized_sweep_stays_within_its_budget(
        ops in prop::collection::vec((0..40u64, op()), 1..60),
        later in 0..300u64,
        changes in 1..12usize,
        bytes in 200..3_000usize,
    ) {
        let w = World::after(&ops);
        let now = w.state.clock_ms + later;
        let budget = SweepBudget { expiries: 1_000, changes, bytes };
        let sweep = w.state.sweep_bound(now, budget);
        let bound = sweep.expiries;
        prop_assert_eq!(bound >= 1, w.state.sweep_due(now));
        let mut sized = w.state.clone();
        let (_, made) = sweep_at_most(&mut sized, now, bound);
        // Left due only when the bound said so (the converse may not hold: failing a task on its
        // total deadline also ends a back-off the bound counted as left).
        prop_assert!(!sized.sweep_due(now) || sweep.more_due);
        let (count, made_bytes) = size(&made);
        if bound > 1 {
            prop_assert!(count <= changes, "{} changes over a budget of {}", count, changes);
            prop_assert!(made_bytes <= bytes, "{} bytes over a budget of {}", made_bytes, bytes);
        }
        // With room for everything: every due expiry, none left.
        let roomy = SweepBudget { expiries: 1_000, changes: usize::MAX, bytes: usize::MAX };
        let all = w.state.sweep_bound(now, roomy);
        prop_assert!(!all.more_due);
        let mut full = w.state.clone();
        leader(&mut full, now, Command::Sweep);
        let mut sized = w.state.clone();
        sweep_at_most(&mut sized, now, all.expiries);
        prop_assert_eq!(&sized, &full);
    }
}

/// A back-off that ends past its task's total deadline fails the task, which takes that
/// deadline off the ones to come: the deadlines the bound counts are then one fewer, and the
/// sweep never reaches a deadline the leader did not weigh (here a waiting task with long keys,
/// whose failure would carry the sweep past its budget).
#[test]
fn a_back_off_failed_past_its_deadline_uses_up_that_deadline_in_the_bound() {
    let mut w = World::new();
    ok(w.send(T0, submit("short", "", 100, 3)));
    let leased = match w.send(T0, lease(1, 60_000)) {
        Response::Answer(Ok(Reply::Assignments(got))) => got,
        other => panic!("lease answered {other:?}"),
    };
    let (task_id, attempt) = (leased[0].task_id, leased[0].attempt);
    let worker = || "w".to_string();
    let start = queue::Command::Start {
        task_id,
        attempt,
        worker: worker(),
    };
    ok(w.send(T0 + 10, Command::Queue(start)));
    let fail = queue::Command::Fail {
        task_id,
        attempt,
        worker: worker(),
        error: "again".into(),
        retryable: true,
    };
    ok(w.send(T0 + 90, Command::Queue(fail)));
    // Back-off to T0 + 590, past the deadline at T0 + 100. Then a task with long keys, waiting,
    // due at T0 + 1,000.
    let mut large = submit(&"l".repeat(400), "", 1_000, 3);
    if let Command::Queue(queue::Command::Submit(spec)) = &mut large {
        spec.business_key = "b".repeat(400);
    }
    ok(w.send(T0, large));
    let now = T0 + 2_000;
    // The least budget the short task's deadline and back-off fit in; the long task does not.
    let budget = (0..)
        .map(|kib| SweepBudget {
            expiries: 1_000,
            changes: 100,
            bytes: kib * 64,
        })
        .find(|budget| w.state.sweep_bound(now, *budget).expiries >= 2)
        .unwrap();
    let bound = w.state.sweep_bound(now, budget);
    assert_eq!(bound.expiries, 2, "the short task's deadline and back-off");
    let (_, changes) = sweep_at_most(&mut w.state, now, bound.expiries);
    let (count, bytes) = size(&changes);
    assert!(
        count <= budget.changes && bytes <= budget.bytes,
        "{count} changes, {bytes} bytes: {:?}",
        summary(&changes)
    );
    assert_eq!(
        w.state.queue.get(task_id).unwrap().state,
        queue::TaskState::Failed
    );
}
