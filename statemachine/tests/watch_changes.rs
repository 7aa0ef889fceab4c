//! The changes every command reports for watches (docs/watch.md): each transition reports
//! exactly its changes, in order; expiries (by sweep or judged lazily) report what they expired;
//! a holder whose lease ends without asking gets a `lost` change naming it and its fence; a
//! refusal that changed nothing and a retry answered from the session table report none.
#![allow(clippy::unwrap_used)]

use baton_statemachine::board::{self, TaskSpec as BoardSpec};
use baton_statemachine::effect::{self, Action, EffectLease, Outcome, Resolution, RetrySafety};
use baton_statemachine::handoff::{self, OfferArgs, Receipt, ReceiptStatus, TicketState};
use baton_statemachine::queue::{self, Queue, TaskSpec, Worker};
use baton_statemachine::{
    apply, apply_with_changes, checkpoint, sink, Change, ChangeFilter, ChangeKind, ChangeValue,
    Command, Envelope, Origin, Primitive, Refusal, Reply, Response, Stamp, State,
};

const T0: u64 = 1_000_000;

/// A store and one client numbering its requests 1, 2, 3, ...
struct World {
    state: State,
    seq: u64,
}

/// `(kind, key, holder, fence)` of each change: what most assertions compare.
type Summary = Vec<(ChangeKind, String, String, u64)>;

fn summary(changes: &[Change]) -> Summary {
    changes
        .iter()
        .map(|c| (c.kind, c.key.clone(), c.holder.clone(), c.fence))
        .collect()
}

fn s(kind: ChangeKind, key: &str, holder: &str, fence: u64) -> (ChangeKind, String, String, u64) {
    (kind, key.to_string(), holder.to_string(), fence)
}

impl World {
    fn new() -> Self {
        World {
            state: State::default(),
            seq: 0,
        }
    }

    fn envelope(&mut self, now_ms: u64, command: Command) -> Envelope {
        self.seq += 1;
        Envelope {
            stamp: Stamp {
                now_ms,
                entropy: u128::from(self.seq) << 64 | 0xabc,
            },
            origin: Some(Origin {
                client_id: 7,
                seq: self.seq,
                acked_below: 0,
            }),
            command,
        }
    }

    /// Applies a client command; returns its answer and its changes.
    fn send(&mut self, now_ms: u64, command: Command) -> (Result<Reply, Refusal>, Vec<Change>) {
        let envelope = self.envelope(now_ms, command);
        let (response, changes) = apply_with_changes(&mut self.state, &envelope);
        match response {
            Response::Answer(answer) => (answer, changes),
            other => panic!("unexpected response {other:?}"),
        }
    }

    fn ok(&mut self, now_ms: u64, command: Command) -> (Reply, Vec<Change>) {
        let (answer, changes) = self.send(now_ms, command);
        (answer.unwrap(), changes)
    }

    fn refused(&mut self, now_ms: u64, command: Command) -> (Refusal, Vec<Change>) {
        let (answer, changes) = self.send(now_ms, command);
        (answer.unwrap_err(), changes)
    }

    fn sweep(&mut self, now_ms: u64) -> Vec<Change> {
        let envelope = Envelope {
            stamp: Stamp { now_ms, entropy: 1 },
            origin: None,
            command: Command::Sweep,
        };
        apply_with_changes(&mut self.state, &envelope).1
    }
}

// ---------------------------------------------------------------- handoff

fn offer(key: &str, ttl_ms: i64) -> Command {
    Command::Handoff(handoff::Command::Offer(OfferArgs {
        key: key.into(),
        from: "A".into(),
        to: "B".into(),
        payload: b"p".to_vec(),
        reply_to: "A".into(),
        ttl_ms,
    }))
}

fn take(key: &str, to: &str) -> Command {
    Command::Handoff(handoff::Command::Take {
        key: key.into(),
        to: to.into(),
    })
}

fn reply(key: &str, token: &str) -> Command {
    Command::Handoff(handoff::Command::Reply {
        key: key.into(),
        token: token.into(),
        receipt: Receipt {
            status: ReceiptStatus::Done,
            summary: "ok".into(),
            failure: String::new(),
            artifacts: vec![],
        },
    })
}

fn token_of(reply: Reply) -> String {
    match reply {
        Reply::Handle(handle) => handle.token,
        other => panic!("want a handle, got {other:?}"),
    }
}

#[test]
fn a_ticket_reports_offered_taken_closed_and_a_new_generation() {
    let mut w = World::new();
    let (_, changes) = w.ok(T0, offer("t", 10_000));
    assert_eq!(summary(&changes), vec![s(ChangeKind::Offered, "t", "", 1)]);
    let change = &changes[0];
    assert_eq!(change.primitive, Primitive::Handoff);
    match &change.value {
        ChangeValue::Ticket(t) => {
            assert_eq!(t.state, TicketState::Offered);
            assert_eq!(t.to, "B");
            assert_eq!(t.payload, b"p");
        }
        other => panic!("want a ticket, got {other:?}"),
    }

    // A replay of the live ticket changes nothing.
    assert!(w.ok(T0, offer("t", 10_000)).1.is_empty());

    let (handle, changes) = w.ok(T0 + 1, take("t", "B"));
    assert_eq!(summary(&changes), vec![s(ChangeKind::Taken, "t", "B", 1)]);
    let token = token_of(handle);

    let (_, changes) = w.ok(T0 + 2, reply("t", &token));
    assert_eq!(summary(&changes), vec![s(ChangeKind::Closed, "t", "B", 1)]);
    match &changes[0].value {
        ChangeValue::Ticket(t) => {
            assert_eq!(t.state, TicketState::Closed);
            assert_eq!(t.holder, None);
        }
        other => panic!("want a ticket, got {other:?}"),
    }

    let (_, changes) = w.ok(T0 + 3, offer("t", 10_000));
    assert_eq!(summary(&changes), vec![s(ChangeKind::Offered, "t", "", 2)]);
    let (_, changes) = w.ok(
        T0 + 4,
        Command::Handoff(handoff::Command::Cancel {
            key: "t".into(),
            by: "A".into(),
        }),
    );
    assert_eq!(
        summary(&changes),
        vec![s(ChangeKind::Withdrawn, "t", "", 2)]
    );
}

#[test]
fn handoff_refusals_that_change_nothing_report_nothing() {
    let mut w = World::new();
    w.ok(T0, offer("t", 10_000));
    let (refusal, changes) = w.refused(T0, take("t", "C"));
    assert_eq!(refusal, Refusal::NotAddressee);
    assert!(changes.is_empty());
    let (refusal, changes) = w.refused(T0, reply("t", "not-a-token"));
    assert_eq!(refusal, Refusal::LeaseLost);
    assert!(changes.is_empty());
    w.ok(T0, take("t", "B"));
    let (refusal, changes) = w.refused(T0, take("t", "B"));
    assert_eq!(refusal, Refusal::Taken);
    assert!(changes.is_empty());
    let (refusal, changes) = w.refused(T0, take("nope", "B"));
    assert_eq!(refusal, Refusal::UnknownKey);
    assert!(changes.is_empty());
}

#[test]
fn a_retry_answered_from_the_session_table_reports_nothing() {
    let mut w = World::new();
    let envelope = w.envelope(T0, offer("t", 10_000));
    let (first, changes) = apply_with_changes(&mut w.state, &envelope);
    assert_eq!(changes.len(), 1);
    let (again, changes) = apply_with_changes(&mut w.state, &envelope);
    assert_eq!(first, again);
    assert!(changes.is_empty(), "{changes:?}");
}

#[test]
fn an_offered_ticket_expires_and_a_taken_one_is_lost_by_its_holder() {
    let mut w = World::new();
    w.ok(T0, offer("offered", 1_000));
    w.ok(T0, offer("taken", 2_000));
    w.ok(T0, take("taken", "B"));

    assert!(w.sweep(T0 + 999).is_empty(), "nothing is due yet");
    assert_eq!(
        summary(&w.sweep(T0 + 1_000)),
        vec![s(ChangeKind::Expired, "offered", "", 1)]
    );
    let changes = w.sweep(T0 + 5_000);
    assert_eq!(
        summary(&changes),
        vec![s(ChangeKind::Lost, "taken", "B", 1)]
    );
    match &changes[0].value {
        ChangeValue::Ticket(t) => {
            assert_eq!(t.state, TicketState::Expired);
            assert_eq!(t.holder, None);
        }
        other => panic!("want a ticket, got {other:?}"),
    }
    assert!(w.sweep(T0 + 9_000).is_empty(), "an expiry is reported once");
}

#[test]
fn a_refusal_judged_after_a_lazy_expiry_reports_the_expiry() {
    let mut w = World::new();
    w.ok(T0, offer("late-take", 1_000));
    let (refusal, changes) = w.refused(T0 + 1_000, take("late-take", "B"));
    assert_eq!(refusal, Refusal::Expired);
    assert_eq!(
        summary(&changes),
        vec![s(ChangeKind::Expired, "late-take", "", 1)]
    );

    w.ok(T0, offer("late-reply", 1_000));
    let token = token_of(w.ok(T0 + 10, take("late-reply", "B")).0);
    let (refusal, changes) = w.refused(T0 + 2_000, reply("late-reply", &token));
    assert_eq!(refusal, Refusal::Expired);
    assert_eq!(
        summary(&changes),
        vec![s(ChangeKind::Lost, "late-reply", "B", 1)]
    );
    assert!(w.sweep(T0 + 3_000).is_empty(), "already materialised");
}

// ---------------------------------------------------------------- board

fn seed(ids: &[&str]) -> Command {
    Command::Board(board::Command::Seed(
        ids.iter()
            .map(|id| BoardSpec {
                id: (*id).into(),
                deps: vec![],
            })
            .collect(),
    ))
}

fn claim(id: &str, agent: &str, ttl_ms: i64) -> Command {
    Command::Board(board::Command::Claim {
        id: id.into(),
        agent: agent.into(),
        ttl_ms,
    })
}

fn claim_token(reply: Reply) -> String {
    match reply {
        Reply::Task(task) => task.lease.unwrap().token,
        other => panic!("want a task, got {other:?}"),
    }
}

#[test]
fn board_claims_report_their_agent_and_fence_and_never_the_token() {
    let mut w = World::new();
    let (_, changes) = w.ok(T0, seed(&["a", "b"]));
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Seeded, "a", "", 0),
            s(ChangeKind::Seeded, "b", "", 0)
        ]
    );
    let (reply, changes) = w.ok(T0, claim("a", "ann", 10_000));
    let token = claim_token(reply);
    assert_eq!(
        summary(&changes),
        vec![s(ChangeKind::Claimed, "a", "ann", 1)]
    );
    match &changes[0].value {
        ChangeValue::Task(task) => {
            let lease = task.lease.as_ref().unwrap();
            assert_eq!(lease.agent, "ann");
            assert!(lease.token.is_empty(), "the token is the claimer's secret");
        }
        other => panic!("want a task, got {other:?}"),
    }
    let renew = Command::Board(board::Command::Renew {
        id: "a".into(),
        token: token.clone(),
        ttl_ms: 10_000,
    });
    assert_eq!(
        summary(&w.ok(T0 + 1, renew).1),
        vec![s(ChangeKind::Renewed, "a", "ann", 1)]
    );
    let release = Command::Board(board::Command::Release {
        id: "a".into(),
        token: token.clone(),
    });
    assert_eq!(
        summary(&w.ok(T0 + 2, release.clone()).1),
        vec![s(ChangeKind::Released, "a", "ann", 1)]
    );
    let (refusal, changes) = w.refused(T0 + 3, release);
    assert_eq!(refusal, Refusal::LeaseLost);
    assert!(changes.is_empty());

    let token = claim_token(w.ok(T0 + 4, claim("a", "bob", 10_000)).0);
    let (refusal, changes) = w.refused(T0 + 5, claim("a", "cid", 10_000));
    assert_eq!(refusal, Refusal::Taken);
    assert!(changes.is_empty());
    let complete = Command::Board(board::Command::Complete {
        id: "a".into(),
        token,
    });
    assert_eq!(
        summary(&w.ok(T0 + 6, complete).1),
        vec![s(ChangeKind::Completed, "a", "bob", 2)]
    );
}

#[test]
fn a_board_claim_that_runs_out_or_is_re_seeded_is_lost_by_its_agent() {
    let mut w = World::new();
    w.ok(T0, seed(&["a", "b", "c"]));
    w.ok(T0, claim("a", "ann", 1_000));
    w.ok(T0, claim("b", "bob", 1_000));
    w.ok(T0, claim("c", "cid", 60_000));

    // By sweep.
    let changes = w.sweep(T0 + 1_000);
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Lost, "a", "ann", 1),
            s(ChangeKind::Lost, "b", "bob", 1)
        ]
    );
    match &changes[0].value {
        ChangeValue::Task(task) => assert!(task.lease.is_none()),
        other => panic!("want a task, got {other:?}"),
    }

    // Judged lazily by a takeover: the old claim is lost, then the new one granted.
    w.ok(T0 + 2_000, claim("a", "ann", 1_000));
    let (_, changes) = w.ok(T0 + 3_000, claim("a", "dan", 1_000));
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Lost, "a", "ann", 2),
            s(ChangeKind::Claimed, "a", "dan", 3)
        ]
    );

    // A re-seed clears a live claim.
    let (_, changes) = w.ok(T0 + 3_001, seed(&["c"]));
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Lost, "c", "cid", 1),
            s(ChangeKind::Seeded, "c", "", 0)
        ]
    );
}

/// The task a board change carries.
fn task_in(change: &Change) -> &board::Task {
    match &change.value {
        ChangeValue::Task(task) => task,
        other => panic!("want a task, got {other:?}"),
    }
}

/// A change shares the task with the board while it holds no lease; a later claim, release or
/// expiry must never show through in a change reported earlier.
#[test]
fn a_reported_board_change_keeps_the_task_as_it_was() {
    let mut w = World::new();
    let (_, seeded) = w.ok(T0, seed(&["a"]));
    let (reply, claimed) = w.ok(T0, claim("a", "ann", 1_000));
    let token = claim_token(reply);
    let expired = w.sweep(T0 + 1_000);
    w.ok(T0 + 2_000, claim("a", "bob", 60_000));
    let release = Command::Board(board::Command::Release {
        id: "a".into(),
        token,
    });
    assert_eq!(w.refused(T0 + 2_001, release).0, Refusal::LeaseLost);

    let seeded = task_in(&seeded[0]);
    assert_eq!(seeded.state, board::TaskState::Open);
    assert!(seeded.lease.is_none());
    assert_eq!(seeded.max_fence, 0);
    let claimed = task_in(&claimed[0]);
    assert_eq!(claimed.state, board::TaskState::Claimed);
    assert_eq!(claimed.lease.as_ref().unwrap().agent, "ann");
    assert_eq!(claimed.max_fence, 1);
    let lost = task_in(&expired[0]);
    assert_eq!(lost.state, board::TaskState::Open);
    assert!(lost.lease.is_none(), "bob's later claim does not show");
    assert_eq!(lost.max_fence, 1);

    let now = w.state.board.get("a").unwrap();
    assert_eq!(now.lease.as_ref().unwrap().agent, "bob");
    assert_eq!(now.max_fence, 2);
}

// ---------------------------------------------------------------- side-effect gate

fn action(key: &str, resource: &str) -> Action {
    Action {
        key: key.into(),
        resource: resource.into(),
        safety: RetrySafety::Safe,
    }
}

fn acquire(key: &str, resource: &str, ttl_ms: i64) -> Command {
    Command::Effect(effect::Command::Acquire {
        action: action(key, resource),
        ttl_ms,
    })
}

fn granted(reply: Reply) -> EffectLease {
    match reply {
        Reply::Outcome(outcome) => match *outcome {
            Outcome::Granted(lease) => lease,
            other => panic!("want a grant, got {other:?}"),
        },
        other => panic!("want an outcome, got {other:?}"),
    }
}

#[test]
fn effect_attempts_report_grant_renew_complete_and_release() {
    let mut w = World::new();
    let (reply, changes) = w.ok(T0, acquire("mail-1", "smtp", 10_000));
    let lease = granted(reply);
    assert_eq!(
        summary(&changes),
        vec![s(ChangeKind::Granted, "mail-1", "", 1)]
    );
    // The holder identity is the lease's credential (with the public fence, all `complete` or
    // `abandon` ask for): neither the change nor the key's view it carries may show it.
    assert!(
        !format!("{changes:?}").contains(&lease.holder),
        "{changes:?}"
    );
    // Contended and in-progress answers change nothing.
    assert!(w.ok(T0, acquire("mail-2", "smtp", 10_000)).1.is_empty());
    assert!(w.ok(T0, acquire("mail-1", "smtp", 10_000)).1.is_empty());

    let renew = Command::Effect(effect::Command::Renew {
        action: action("mail-1", "smtp"),
        lease: lease.clone(),
        ttl_ms: 10_000,
    });
    assert_eq!(
        summary(&w.ok(T0 + 1, renew).1),
        vec![s(ChangeKind::Renewed, "mail-1", "", 1)]
    );
    let complete = Command::Effect(effect::Command::Complete {
        action: action("mail-1", "smtp"),
        lease: lease.clone(),
        result: "sent".into(),
    });
    assert_eq!(
        summary(&w.ok(T0 + 2, complete.clone()).1),
        vec![s(ChangeKind::Completed, "mail-1", "", 1)]
    );
    assert!(
        w.ok(T0 + 3, complete).1.is_empty(),
        "a repeated completion changes nothing"
    );
    let release = Command::Effect(effect::Command::Release {
        action: action("mail-1", "smtp"),
        lease: lease.clone(),
    });
    assert_eq!(
        summary(&w.ok(T0 + 4, release.clone()).1),
        vec![s(ChangeKind::Released, "mail-1", "", 1)]
    );
    assert!(
        w.ok(T0 + 5, release).1.is_empty(),
        "the hold is already free"
    );

    let stale = Command::Effect(effect::Command::Abandon {
        action: action("mail-1", "smtp"),
        lease: EffectLease { fence: 7, ..lease },
        reason: "x".into(),
    });
    let (refusal, changes) = w.refused(T0 + 6, stale);
    assert_eq!(refusal, Refusal::FenceStale);
    assert!(changes.is_empty());
}

#[test]
fn an_effect_intent_that_runs_out_is_lost_and_its_hold_expires() {
    let mut w = World::new();
    let lease = granted(w.ok(T0, acquire("pay-1", "bank", 1_000)).0);
    let changes = w.sweep(T0 + 1_000);
    // The holder learns of its loss by key and fence: its identity is never published.
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Lost, "pay-1", "", lease.fence),
            s(ChangeKind::HoldExpired, "pay-1", "", lease.fence),
        ]
    );
    match &changes[0].value {
        ChangeValue::Action(view) => {
            assert_eq!(view.status, effect::KeyStatus::Uncertain);
            assert_eq!(view.resource, "bank");
        }
        other => panic!("want an action view, got {other:?}"),
    }

    // Reconcile and resolve.
    let (reply, changes) = w.ok(
        T0 + 2_000,
        Command::Effect(effect::Command::BeginReconcile {
            action: action("pay-1", "bank"),
            ttl_ms: 5_000,
        }),
    );
    assert!(
        matches!(reply, Reply::Reconcile(_)),
        "want a reconcile slot, got {reply:?}"
    );
    assert_eq!(
        summary(&changes),
        vec![s(ChangeKind::Reconciling, "pay-1", "", 0)]
    );
    let (_, changes) = w.ok(
        T0 + 2_001,
        Command::Effect(effect::Command::ResolveUncertain {
            action: action("pay-1", "bank"),
            resolution: Resolution {
                happened: true,
                result: "paid".into(),
                force_retryable: false,
            },
        }),
    );
    assert_eq!(
        summary(&changes),
        vec![s(ChangeKind::Resolved, "pay-1", "", 0)]
    );
}

#[test]
fn an_effect_intent_judged_expired_lazily_is_lost_then_marked() {
    let mut w = World::new();
    let lease = granted(w.ok(T0, acquire("pay-2", "bank", 1_000)).0);
    let mark = Command::Effect(effect::Command::MarkUncertain {
        action: action("pay-2", "bank"),
        lease: lease.clone(),
        reason: "timeout".into(),
    });
    // Before the deadline: the holder marks the key uncertain.
    let mut early = World {
        state: w.state.clone(),
        seq: w.seq,
    };
    assert_eq!(
        summary(&early.ok(T0 + 10, mark.clone()).1),
        vec![s(ChangeKind::Uncertain, "pay-2", "", 1)]
    );
    // After it: the intent is judged expired first (lost), and marking finds nothing to do.
    let (_, changes) = w.ok(T0 + 1_000, mark);
    assert_eq!(summary(&changes), vec![s(ChangeKind::Lost, "pay-2", "", 1)]);
}

// ---------------------------------------------------------------- sink and checkpoint

#[test]
fn sink_writes_and_checkpoint_saves_report_their_fence_and_value() {
    let mut w = World::new();
    let write = |fence: u64, value: &[u8]| {
        Command::Sink(sink::Command::Write {
            resource: "r".into(),
            fence,
            value: value.to_vec(),
        })
    };
    let (_, changes) = w.ok(T0, write(3, b"v3"));
    assert_eq!(summary(&changes), vec![s(ChangeKind::Written, "r", "", 3)]);
    assert_eq!(changes[0].primitive, Primitive::Sink);
    match &changes[0].value {
        ChangeValue::Sink(v) => {
            assert_eq!(v.value, b"v3");
            assert_eq!(v.writes, 1);
        }
        other => panic!("want a sink value, got {other:?}"),
    }
    let (refusal, changes) = w.refused(T0, write(2, b"v2"));
    assert_eq!(refusal, Refusal::FenceStale);
    assert!(changes.is_empty());

    let save = |seq: u64| {
        Command::Checkpoint(checkpoint::Command::SaveIfNewer {
            run: "run".into(),
            seq,
            data: b"d".to_vec(),
        })
    };
    let (_, changes) = w.ok(T0, save(5));
    assert_eq!(summary(&changes), vec![s(ChangeKind::Saved, "run", "", 5)]);
    assert_eq!(changes[0].primitive, Primitive::Checkpoint);
    let (refusal, changes) = w.refused(T0, save(5));
    assert_eq!(refusal, Refusal::StaleSeq);
    assert!(changes.is_empty());
}

// ---------------------------------------------------------------- queue

fn q(command: queue::Command) -> Command {
    Command::Queue(command)
}

fn queue_world() -> World {
    let mut w = World::new();
    for (name, namespace) in [("q1", "ns"), ("q2", "ns"), ("qx", "other")] {
        w.ok(
            T0,
            q(queue::Command::CreateQueue(Queue {
                name: name.into(),
                namespace: namespace.into(),
            })),
        );
    }
    w.ok(
        T0,
        q(queue::Command::RegisterWorker(Worker {
            id: "w".into(),
            concurrency_keys: true,
        })),
    );
    w
}

fn submit(w: &mut World, queue: &str, idempotency_key: &str, key: &str) -> (u64, Vec<Change>) {
    let (reply, changes) = w.ok(
        T0,
        q(queue::Command::Submit(TaskSpec {
            queue: queue.into(),
            idempotency_key: idempotency_key.into(),
            handler: "h".into(),
            handler_version: "1".into(),
            payload_version: "1".into(),
            payload: b"payload".to_vec(),
            concurrency_key: key.into(),
            business_key: String::new(),
            max_attempts: 3,
            ttl_ms: 600_000,
        })),
    );
    match reply {
        Reply::Submitted(receipt) => (receipt.task.id, changes),
        other => panic!("want a receipt, got {other:?}"),
    }
}

fn lease(w: &mut World, now_ms: u64, ttl_ms: i64) -> (Vec<queue::Assignment>, Vec<Change>) {
    let (reply, changes) = w.ok(
        now_ms,
        q(queue::Command::Lease {
            worker: "w".into(),
            queues: vec!["q1".into()],
            limit: 10,
            lease_ttl_ms: ttl_ms,
        }),
    );
    match reply {
        Reply::Assignments(assignments) => (assignments, changes),
        other => panic!("want assignments, got {other:?}"),
    }
}

#[test]
fn queue_setup_and_submissions_report_created_registered_submitted_and_leasable() {
    let mut w = World::new();
    let create = q(queue::Command::CreateQueue(Queue {
        name: "q1".into(),
        namespace: "ns".into(),
    }));
    assert_eq!(
        summary(&w.ok(T0, create.clone()).1),
        vec![s(ChangeKind::QueueCreated, "q1", "", 0)]
    );
    assert!(
        w.ok(T0, create).1.is_empty(),
        "an existing queue is a no-op"
    );

    let mut w = queue_world();
    let (a, changes) = submit(&mut w, "q1", "a", "");
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Submitted, &a.to_string(), "", 0),
            s(ChangeKind::Leasable, &a.to_string(), "", 0)
        ]
    );
    match &changes[1].value {
        ChangeValue::QueueTask(task) => {
            assert_eq!(task.spec.queue, "q1");
            assert!(task.spec.payload.is_empty(), "changes carry summaries");
        }
        other => panic!("want a queue task, got {other:?}"),
    }
    let (_, changes) = w.send(
        T0,
        q(queue::Command::Submit(TaskSpec {
            queue: "nope".into(),
            idempotency_key: "z".into(),
            handler: "h".into(),
            handler_version: String::new(),
            payload_version: String::new(),
            payload: vec![],
            concurrency_key: String::new(),
            business_key: String::new(),
            max_attempts: 1,
            ttl_ms: 1_000,
        })),
    );
    assert!(changes.is_empty());
}

#[test]
fn a_keyed_attempt_reports_leased_started_succeeded_and_frees_its_key() {
    let mut w = queue_world();
    let (a, _) = submit(&mut w, "q1", "a", "k");
    let (b, changes) = submit(&mut w, "q2", "b", "k");
    let (a_key, b_key) = (a.to_string(), b.to_string());
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Submitted, &b_key, "", 0),
            s(ChangeKind::Leasable, &b_key, "", 0)
        ],
        "k is free while nobody holds it"
    );

    let (assignments, changes) = lease(&mut w, T0, 10_000);
    assert_eq!(assignments.len(), 1);
    assert_eq!(assignments[0].token, Some(1));
    assert_eq!(
        summary(&changes),
        vec![s(ChangeKind::Leased, &a_key, "w", 1)]
    );

    // While k is held, a new submission with k is not leasable.
    let (c, changes) = submit(&mut w, "q1", "c", "k");
    assert_eq!(
        summary(&changes),
        vec![s(ChangeKind::Submitted, &c.to_string(), "", 0)]
    );

    let start = q(queue::Command::Start {
        task_id: a,
        attempt: 1,
        worker: "w".into(),
    });
    assert_eq!(
        summary(&w.ok(T0 + 1, start.clone()).1),
        vec![s(ChangeKind::Started, &a_key, "w", 1)]
    );
    assert!(w.ok(T0 + 2, start).1.is_empty(), "a resume changes nothing");

    let wrong = q(queue::Command::Complete {
        task_id: a,
        attempt: 1,
        worker: "intruder".into(),
        result: vec![],
    });
    let (refusal, changes) = w.refused(T0 + 3, wrong);
    assert_eq!(refusal, Refusal::LeaseLost);
    assert!(changes.is_empty());

    let complete = q(queue::Command::Complete {
        task_id: a,
        attempt: 1,
        worker: "w".into(),
        result: b"r".to_vec(),
    });
    let (_, changes) = w.ok(T0 + 4, complete.clone());
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Succeeded, &a_key, "w", 1),
            s(ChangeKind::KeyFreed, "k", "w", 1)
        ]
    );
    match &changes[1].value {
        ChangeValue::Permit(permit) => {
            assert_eq!(permit.namespace, "ns");
            assert_eq!(permit.highest_token, 1);
            assert_eq!(permit.queues, vec!["q1".to_string(), "q2".to_string()]);
        }
        other => panic!("want a permit, got {other:?}"),
    }
    assert!(
        w.ok(T0 + 5, complete).1.is_empty(),
        "a duplicate result changes nothing"
    );
}

#[test]
fn a_queue_lease_that_runs_out_is_lost_by_its_worker_and_the_task_is_leasable_again() {
    let mut w = queue_world();
    let (a, _) = submit(&mut w, "q1", "a", "k");
    let (u, _) = submit(&mut w, "q1", "u", "");
    let (a_key, u_key) = (a.to_string(), u.to_string());
    let (assignments, _) = lease(&mut w, T0, 1_000);
    assert_eq!(assignments.len(), 2);

    // Never started: back to waiting, the key freed, leasable again.
    let changes = w.sweep(T0 + 1_000);
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Lost, &a_key, "w", 1),
            s(ChangeKind::KeyFreed, "k", "w", 1),
            s(ChangeKind::Leasable, &a_key, "", 0),
            s(ChangeKind::Lost, &u_key, "w", 1),
            s(ChangeKind::Leasable, &u_key, "", 0),
        ]
    );
    match &changes[0].value {
        ChangeValue::QueueTask(task) => assert_eq!(task.state, queue::TaskState::Waiting),
        other => panic!("want a queue task, got {other:?}"),
    }

    // Leased again (token 2), started, then its lease runs out while running: it backs off,
    // and when the back-off ends it waits again and is leasable.
    let (assignments, changes) = lease(&mut w, T0 + 2_000, 1_000);
    assert_eq!(assignments[0].token, Some(2));
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Leased, &a_key, "w", 2),
            s(ChangeKind::Leased, &u_key, "w", 2)
        ]
    );
    w.ok(
        T0 + 2_001,
        q(queue::Command::Start {
            task_id: a,
            attempt: 2,
            worker: "w".into(),
        }),
    );
    let fail = q(queue::Command::Fail {
        task_id: u,
        attempt: 2,
        worker: "w".into(),
        error: "boom".into(),
        retryable: false,
    });
    assert_eq!(
        summary(&w.ok(T0 + 2_002, fail).1),
        vec![s(ChangeKind::Failed, &u_key, "w", 2)]
    );
    let changes = w.sweep(T0 + 3_000);
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Lost, &a_key, "w", 2),
            s(ChangeKind::RetryWait, &a_key, "w", 2),
            s(ChangeKind::KeyFreed, "k", "w", 2)
        ]
    );
    match &changes[0].value {
        ChangeValue::QueueTask(task) => assert_eq!(task.state, queue::TaskState::RetryWait),
        other => panic!("want a queue task, got {other:?}"),
    }
    let changes = w.sweep(T0 + 3_000 + queue::backoff_ms(1));
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Requeued, &a_key, "", 0),
            s(ChangeKind::Leasable, &a_key, "", 0)
        ]
    );
}

/// A lease that runs out past its task's total deadline ends the task: a started attempt's
/// needs review, a never-started one's fails. After the worker's `lost`, the new state is
/// reported too, so a watch of `needs_review` or `failed` sees these as well.
#[test]
fn a_lease_running_out_past_the_deadline_reports_needs_review_or_failed_after_lost() {
    let mut w = queue_world();
    let (a, _) = submit(&mut w, "q1", "a", "k");
    let (u, _) = submit(&mut w, "q1", "u", "");
    let (a_key, u_key) = (a.to_string(), u.to_string());
    lease(&mut w, T0, 1_000);
    w.ok(
        T0 + 1,
        q(queue::Command::Start {
            task_id: a,
            attempt: 1,
            worker: "w".into(),
        }),
    );
    let changes = w.sweep(T0 + 600_000);
    assert_eq!(
        summary(&changes),
        vec![
            s(ChangeKind::Lost, &a_key, "w", 1),
            s(ChangeKind::NeedsReview, &a_key, "w", 1),
            s(ChangeKind::KeyFreed, "k", "w", 1),
            s(ChangeKind::Lost, &u_key, "w", 1),
            s(ChangeKind::Failed, &u_key, "w", 1),
        ]
    );
    let only = |kind| ChangeFilter::all().kinds([kind]);
    for (kind, key) in [
        (ChangeKind::NeedsReview, &a_key),
        (ChangeKind::Failed, &u_key),
    ] {
        let seen: Vec<_> = changes.iter().filter(|c| only(kind).matches(c)).collect();
        assert_eq!(seen.len(), 1, "{kind:?}");
        assert_eq!(&seen[0].key, key);
    }
}

#[test]
fn a_retryable_failure_and_a_cancel_report_their_new_state() {
    let mut w = queue_world();
    let (a, _) = submit(&mut w, "q1", "a", "");
    let (b, _) = submit(&mut w, "q1", "b", "");
    let (a_key, b_key) = (a.to_string(), b.to_string());
    lease(&mut w, T0, 10_000);
    let fail = q(queue::Command::Fail {
        task_id: a,
        attempt: 1,
        worker: "w".into(),
        error: "flaky".into(),
        retryable: true,
    });
    assert_eq!(
        summary(&w.ok(T0 + 1, fail).1),
        vec![s(ChangeKind::RetryWait, &a_key, "w", 1)]
    );
    let cancel = q(queue::Command::Cancel { task_id: b });
    assert_eq!(
        summary(&w.ok(T0 + 2, cancel.clone()).1),
        vec![s(ChangeKind::Cancelled, &b_key, "w", 1)]
    );
    let (refusal, changes) = w.refused(T0 + 3, cancel);
    assert_eq!(refusal, Refusal::AlreadySettled);
    assert!(changes.is_empty());

    // Cancelling the task in back-off concerns no attempt: no holder is named.
    let cancel = q(queue::Command::Cancel { task_id: a });
    assert_eq!(
        summary(&w.ok(T0 + 4, cancel).1),
        vec![s(ChangeKind::Cancelled, &a_key, "", 0)]
    );
}

// ---------------------------------------------------------------- filters and determinism

#[test]
fn filters_select_by_primitive_key_prefix_addressee_queue_holder_and_kind() {
    let mut w = queue_world();
    let mut all = Vec::new();
    all.extend(w.ok(T0, offer("jobs/1", 10_000)).1);
    let (handle, taken) = w.ok(T0, take("jobs/1", "B"));
    all.extend(taken);
    all.extend(w.ok(T0, reply("jobs/1", &token_of(handle))).1);
    all.extend(
        w.ok(
            T0,
            Command::Handoff(handoff::Command::Offer(OfferArgs {
                key: "other".into(),
                from: "A".into(),
                to: "C".into(),
                payload: vec![],
                reply_to: "A".into(),
                ttl_ms: 10_000,
            })),
        )
        .1,
    );
    all.extend(submit(&mut w, "q1", "a", "k").1);
    all.extend(submit(&mut w, "qx", "x", "").1);
    all.extend(lease(&mut w, T0, 1_000).1);
    all.extend(w.sweep(T0 + 1_000));

    let keys = |filter: ChangeFilter| -> Vec<(ChangeKind, String)> {
        filter.validate().unwrap();
        all.iter()
            .filter(|c| filter.matches(c))
            .map(|c| (c.kind, c.key.clone()))
            .collect()
    };
    assert_eq!(keys(ChangeFilter::all()).len(), all.len());
    assert_eq!(
        keys(ChangeFilter::all().primitive(Primitive::Handoff)).len(),
        4
    );
    assert_eq!(
        keys(ChangeFilter::all().tickets_to("B")),
        vec![
            (ChangeKind::Offered, "jobs/1".to_string()),
            (ChangeKind::Taken, "jobs/1".to_string()),
            (ChangeKind::Closed, "jobs/1".to_string()),
        ]
    );
    assert_eq!(keys(ChangeFilter::all().prefix("jobs/")).len(), 3);
    assert_eq!(keys(ChangeFilter::all().key("other")).len(), 1);
    assert_eq!(
        keys(ChangeFilter::all().leasable_in("q1")),
        vec![
            (ChangeKind::Leasable, "1".to_string()),
            (ChangeKind::KeyFreed, "k".to_string()),
            (ChangeKind::Leasable, "1".to_string()),
        ]
    );
    assert_eq!(
        keys(ChangeFilter::all().leasable_in("qx")),
        vec![(ChangeKind::Leasable, "2".to_string())]
    );
    assert_eq!(
        keys(ChangeFilter::all().holder("w").kinds([ChangeKind::Lost])),
        vec![(ChangeKind::Lost, "1".to_string())]
    );
    assert_eq!(
        keys(ChangeFilter::all().holder("B")),
        vec![
            (ChangeKind::Taken, "jobs/1".to_string()),
            (ChangeKind::Closed, "jobs/1".to_string()),
        ]
    );

    for bad in [
        ChangeFilter::all().key("a").prefix("a"),
        ChangeFilter::all().key(""),
        ChangeFilter::all()
            .tickets_to("B")
            .primitive(Primitive::Board),
        ChangeFilter::all()
            .leasable_in("q1")
            .primitive(Primitive::Handoff),
        ChangeFilter::all().holder(""),
        // An empty prefix would match everything: the filter means something else.
        ChangeFilter::all().prefix(""),
        // Ticket events and queue events: together they can never match.
        ChangeFilter::all().tickets_to("B").leasable_in("q1"),
    ] {
        assert!(
            matches!(bad.validate(), Err(Refusal::Invalid { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn every_kind_and_primitive_has_a_wire_name_that_parses_back() {
    for kind in ChangeKind::ALL {
        assert_eq!(ChangeKind::parse(kind.as_str()), Some(kind));
    }
    for primitive in Primitive::ALL {
        assert_eq!(Primitive::parse(primitive.as_str()), Some(primitive));
    }
    assert_eq!(ChangeKind::parse("nope"), None);
}

#[test]
fn a_replica_replaying_the_log_reports_the_same_changes_and_state_equality_ignores_them() {
    let mut w = queue_world();
    let mut log = Vec::new();
    let mut changes = Vec::new();
    let commands = [
        offer("t", 1_000),
        take("t", "B"),
        seed(&["a"]),
        claim("a", "ann", 500),
        acquire("e", "r", 700),
    ];
    for (i, command) in commands.into_iter().enumerate() {
        let envelope = w.envelope(T0 + i as u64, command);
        changes.push(apply_with_changes(&mut w.state, &envelope).1);
        log.push(envelope);
    }
    let sweep = Envelope {
        stamp: Stamp {
            now_ms: T0 + 5_000,
            entropy: 9,
        },
        origin: None,
        command: Command::Sweep,
    };
    changes.push(apply_with_changes(&mut w.state, &sweep).1);
    log.push(sweep);

    let mut replica = queue_world().state;
    let mut plain = queue_world().state;
    for (envelope, expected) in log.iter().zip(&changes) {
        let (response, got) = apply_with_changes(&mut replica, envelope);
        assert_eq!(&got, expected);
        assert_eq!(apply(&mut plain, envelope), response);
    }
    assert_eq!(replica, w.state);
    assert_eq!(plain, w.state);
    assert_eq!(
        changes.last().map(|c| summary(c).len()),
        Some(4),
        "ticket lost, claim lost, intent lost, hold expired: {:?}",
        changes.last()
    );
}
