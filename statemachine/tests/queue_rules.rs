//! The keyed-concurrency task queue (seed 004, contract.md sections 0 and 5), one rule per test,
//! driven through the public API: `apply` with `Command::Queue(...)` at a hand-set store clock.
//!
//! The world has two namespaces: `ns1` holds queues `q1` and `q2`, `ns2` holds `qx`. Workers `w`
//! and `w2` declared `concurrency_keys = true`; `old` did not.
#![allow(clippy::unwrap_used)]

use baton_statemachine::limits::MAX_PAYLOAD_BYTES;
use baton_statemachine::queue::{
    self, Assignment, AttemptOutcome, SubmitReceipt, Task, TaskFilter, TaskSpec, TaskState,
    MAX_KEY_CHARS, MAX_LEASE_BYTES, MAX_LEASE_SWEEP,
};
use baton_statemachine::{
    apply, apply_with_changes, ChangeKind, Command, Envelope, Origin, Refusal, Reply, Response,
    Stamp, State,
};

const T0: u64 = 1_000_000;
const NS: &str = "ns1";
const NS2: &str = "ns2";
const Q1: &str = "q1";
const Q2: &str = "q2";
const QX: &str = "qx";
/// Capable workers.
const W: &str = "w";
const W2: &str = "w2";
/// A worker that did not declare concurrency-key support.
const OLD: &str = "old";
/// The default lease length.
const LEASE: i64 = 10_000;
/// The back-off after the first started attempt failed.
const FIRST_BACKOFF: u64 = 500;
const K: &str = "object/42";
const L: &str = "object/43";

/// A store, its clock and one client that numbers its requests 1, 2, 3, ...
struct World {
    state: State,
    now: u64,
    seq: u64,
    last: Option<Envelope>,
}

impl World {
    fn bare() -> Self {
        World {
            state: State::default(),
            now: T0,
            seq: 0,
            last: None,
        }
    }

    fn new() -> Self {
        let mut w = World::bare();
        for (name, namespace) in [(Q1, NS), (Q2, NS), (QX, NS2)] {
            w.send(create(name, namespace)).unwrap();
        }
        for (id, capable) in [(W, true), (W2, true), (OLD, false)] {
            w.send(register(id, capable)).unwrap();
        }
        w
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    fn envelope(&mut self, command: queue::Command) -> Envelope {
        self.seq += 1;
        Envelope {
            stamp: Stamp {
                now_ms: self.now,
                entropy: u128::from(self.seq),
            },
            origin: Some(Origin {
                client_id: 7,
                seq: self.seq,
                acked_below: 0,
            }),
            command: Command::Queue(command),
        }
    }

    fn send(&mut self, command: queue::Command) -> Result<Reply, Refusal> {
        let envelope = self.envelope(command);
        let response = apply(&mut self.state, &envelope);
        self.last = Some(envelope);
        answer(response)
    }

    /// Sends the previous envelope again, same origin: an exact client retry.
    fn resend_last(&mut self) -> Response {
        let envelope = self.last.clone().unwrap();
        apply(&mut self.state, &envelope)
    }

    /// Expects `command` to be refused with `expected` and nothing else to change (see
    /// [`World::assert_only_answered`]).
    fn refused(&mut self, command: queue::Command, expected: Refusal) {
        let before = self.state.clone();
        let name = command.name();
        assert_eq!(self.send(command), Err(expected.clone()), "{name}");
        self.assert_only_answered(before, Err(expected), name);
    }

    /// Expects `command` to be refused as invalid, naming `field`, and nothing else to change.
    fn invalid(&mut self, command: queue::Command, field: &str) {
        let before = self.state.clone();
        let name = command.name();
        let answer = self.send(command);
        match &answer {
            Err(Refusal::Invalid { field: f, rule }) => {
                assert_eq!(f, field, "{name}: wrong field (rule {rule:?})");
                assert!(!rule.is_empty());
            }
            other => panic!("{name}: expected invalid {field}, got {other:?}"),
        }
        self.assert_only_answered(before, answer, name);
    }

    /// Compares the whole state after the last request with `before`: it may differ only by what
    /// executing any request does (contract §0), the store clock moved up to the request's stamp
    /// and the session table remembering `answer` for a retry.
    fn assert_only_answered(&self, mut before: State, answer: Result<Reply, Refusal>, name: &str) {
        let envelope = self.last.as_ref().unwrap();
        let origin = envelope.origin.as_ref().unwrap();
        before.clock_ms = before.clock_ms.max(envelope.stamp.now_ms);
        let clock_ms = before.clock_ms;
        before
            .sessions
            .record(origin, Response::Answer(answer), clock_ms);
        assert_eq!(
            self.state, before,
            "a refused {name} must change nothing but the store clock and the session table"
        );
    }

    fn try_submit(&mut self, spec: TaskSpec) -> Result<SubmitReceipt, Refusal> {
        self.send(queue::Command::Submit(spec)).map(|r| match r {
            Reply::Submitted(receipt) => *receipt,
            other => panic!("submit answered {other:?}"),
        })
    }

    /// Submits a new task and returns its id.
    fn submit(&mut self, spec: TaskSpec) -> u64 {
        let receipt = self.try_submit(spec).unwrap();
        assert!(!receipt.replayed);
        assert_eq!(receipt.task.state, TaskState::Waiting);
        assert!(receipt.task.attempts.is_empty());
        receipt.task.id
    }

    fn lease_from(&mut self, worker: &str, queues: &[&str], limit: u32) -> Vec<Assignment> {
        match self.send(lease_cmd(worker, queues, limit, LEASE)) {
            Ok(Reply::Assignments(list)) => list,
            other => panic!("lease answered {other:?}"),
        }
    }

    fn lease(&mut self, worker: &str, limit: u32) -> Vec<Assignment> {
        self.lease_from(worker, &[], limit)
    }

    /// Leases exactly one task and checks it is `id`.
    fn lease_only(&mut self, worker: &str, id: u64) -> Assignment {
        let got = self.lease(worker, 100);
        assert_eq!(ids(&got), vec![id], "lease by {worker}");
        got.into_iter().next().unwrap()
    }

    fn task_reply(&mut self, command: queue::Command) -> Result<Task, Refusal> {
        self.send(command).map(|r| match r {
            Reply::QueueTask(task) => *task,
            other => panic!("answered {other:?}"),
        })
    }

    fn start(&mut self, a: &Assignment, worker: &str) -> Result<Task, Refusal> {
        self.task_reply(start_cmd(a.task_id, a.attempt, worker))
    }

    fn renew(&mut self, a: &Assignment, ttl: i64) -> Result<Task, Refusal> {
        self.task_reply(renew_cmd(a.task_id, a.attempt, W, ttl))
    }

    fn complete(&mut self, a: &Assignment, worker: &str) -> Result<Task, Refusal> {
        self.task_reply(complete_cmd(a.task_id, a.attempt, worker))
    }

    fn fail(&mut self, a: &Assignment, worker: &str, retryable: bool) -> Result<Task, Refusal> {
        self.task_reply(fail_cmd(a.task_id, a.attempt, worker, retryable))
    }

    fn unknown(&mut self, a: &Assignment, worker: &str) -> Result<Task, Refusal> {
        self.task_reply(unknown_cmd(a.task_id, a.attempt, worker))
    }

    fn cancel(&mut self, id: u64) -> Result<Task, Refusal> {
        self.task_reply(queue::Command::Cancel { task_id: id })
    }

    /// Starts and completes `a` as the worker it was leased to.
    fn finish(&mut self, a: &Assignment) {
        let worker = self
            .task(a.task_id)
            .active_attempt()
            .unwrap()
            .worker
            .clone();
        self.start(a, &worker).unwrap();
        let task = self.complete(a, &worker).unwrap();
        assert_eq!(task.state, TaskState::Succeeded);
    }

    /// The leader's sweep at the current clock.
    fn sweep(&mut self) -> u64 {
        let envelope = Envelope {
            stamp: Stamp {
                now_ms: self.now,
                entropy: 0,
            },
            origin: None,
            command: Command::Sweep,
        };
        match apply(&mut self.state, &envelope) {
            Response::Answer(Ok(Reply::Swept { expired })) => expired,
            other => panic!("sweep answered {other:?}"),
        }
    }

    fn task(&self, id: u64) -> Task {
        self.state.queue.get(id).cloned().expect("task exists")
    }

    fn holder(&self, namespace: &str, key: &str) -> Option<u64> {
        self.state.queue.permit_holder(namespace, key)
    }

    fn highest(&self, namespace: &str, key: &str) -> u64 {
        self.state.queue.highest_token(namespace, key)
    }

    fn task_count(&self) -> usize {
        self.state.queue.list(&TaskFilter::default()).count()
    }
}

fn answer(response: Response) -> Result<Reply, Refusal> {
    match response {
        Response::Answer(result) => result,
        other => panic!("unexpected {other:?}"),
    }
}

fn ids(list: &[Assignment]) -> Vec<u64> {
    list.iter().map(|a| a.task_id).collect()
}

fn tokens(task: &Task) -> Vec<Option<u64>> {
    task.attempts.iter().map(|a| a.token).collect()
}

fn outcomes(task: &Task) -> Vec<AttemptOutcome> {
    task.attempts.iter().map(|a| a.outcome).collect()
}

fn spec(queue: &str, idempotency_key: &str, concurrency_key: &str) -> TaskSpec {
    TaskSpec {
        queue: queue.into(),
        idempotency_key: idempotency_key.into(),
        handler: "object.update".into(),
        handler_version: "v1".into(),
        payload_version: "v1".into(),
        payload: br#"{"operation_ref":"update-001"}"#.to_vec(),
        concurrency_key: concurrency_key.into(),
        business_key: "order-7".into(),
        max_attempts: 3,
        ttl_ms: 600_000,
    }
}

fn create(name: &str, namespace: &str) -> queue::Command {
    queue::Command::CreateQueue(queue::Queue {
        name: name.into(),
        namespace: namespace.into(),
    })
}

fn register(id: &str, concurrency_keys: bool) -> queue::Command {
    queue::Command::RegisterWorker(queue::Worker {
        id: id.into(),
        concurrency_keys,
    })
}

fn lease_cmd(worker: &str, queues: &[&str], limit: u32, lease_ttl_ms: i64) -> queue::Command {
    queue::Command::Lease {
        worker: worker.into(),
        queues: queues.iter().map(|q| q.to_string()).collect(),
        limit,
        lease_ttl_ms,
    }
}

fn start_cmd(task_id: u64, attempt: u32, worker: &str) -> queue::Command {
    queue::Command::Start {
        task_id,
        attempt,
        worker: worker.into(),
    }
}

fn renew_cmd(task_id: u64, attempt: u32, worker: &str, lease_ttl_ms: i64) -> queue::Command {
    queue::Command::Renew {
        task_id,
        attempt,
        worker: worker.into(),
        lease_ttl_ms,
    }
}

fn complete_cmd(task_id: u64, attempt: u32, worker: &str) -> queue::Command {
    queue::Command::Complete {
        task_id,
        attempt,
        worker: worker.into(),
        result: b"ok".to_vec(),
    }
}

fn fail_cmd(task_id: u64, attempt: u32, worker: &str, retryable: bool) -> queue::Command {
    queue::Command::Fail {
        task_id,
        attempt,
        worker: worker.into(),
        error: "boom".into(),
        retryable,
    }
}

fn unknown_cmd(task_id: u64, attempt: u32, worker: &str) -> queue::Command {
    queue::Command::ReportUnknown {
        task_id,
        attempt,
        worker: worker.into(),
        note: "timed out talking to the object store".into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Queues and workers
// ---------------------------------------------------------------------------------------------

#[test]
fn creating_a_queue_again_is_idempotent_in_another_namespace_a_state_conflict() {
    let mut w = World::new();
    let before = w.state.queue.clone();
    assert_eq!(
        w.send(create(Q1, NS)),
        Ok(Reply::Queue(queue::Queue {
            name: Q1.into(),
            namespace: NS.into()
        }))
    );
    assert_eq!(w.state.queue, before, "re-creating changes nothing");
    w.refused(create(Q1, NS2), Refusal::StateConflict);
    assert_eq!(
        w.state
            .queue
            .queues()
            .find(|q| q.name == Q1)
            .unwrap()
            .namespace,
        NS
    );
}

#[test]
fn a_queue_needs_a_name_and_a_namespace() {
    let mut w = World::new();
    w.invalid(create("", NS), "queue.name");
    w.invalid(create("q9", ""), "queue.namespace");
}

#[test]
fn re_registering_a_worker_with_a_different_capability_is_a_state_conflict() {
    let mut w = World::new();
    // Reconnecting with the same capability is fine and changes nothing.
    let before = w.state.queue.clone();
    assert_eq!(
        w.send(register(W, true)),
        Ok(Reply::Worker(queue::Worker {
            id: W.into(),
            concurrency_keys: true
        }))
    );
    assert_eq!(w.send(register(OLD, false)).map(|_| ()), Ok(()));
    assert_eq!(w.state.queue, before);
    // Changing it, either way, is refused: an upgraded process needs a new identity.
    w.refused(register(W, false), Refusal::StateConflict);
    w.refused(register(OLD, true), Refusal::StateConflict);
    assert!(w.state.queue.worker(W).unwrap().concurrency_keys);
    assert!(!w.state.queue.worker(OLD).unwrap().concurrency_keys);
    w.invalid(register("", true), "worker");
}

#[test]
fn lease_arguments_are_validated_and_refusals_change_nothing() {
    let mut w = World::new();
    w.submit(spec(Q1, "a", K));
    w.refused(lease_cmd("nobody", &[], 1, LEASE), Refusal::UnknownWorker);
    w.refused(lease_cmd(W, &["nowhere"], 1, LEASE), Refusal::UnknownQueue);
    w.invalid(lease_cmd(W, &[], 0, LEASE), "limit");
    w.invalid(lease_cmd(W, &[], 1, 0), "ttl");
    w.invalid(lease_cmd(W, &[], 1, -5), "ttl");
    w.invalid(lease_cmd("", &[], 1, LEASE), "worker");
}

// ---------------------------------------------------------------------------------------------
// Submission: validation (seed §2)
// ---------------------------------------------------------------------------------------------

#[test]
fn concurrency_keys_of_1_to_191_characters_counted_as_characters_are_accepted() {
    let mut w = World::new();
    let accepted = [
        "x".to_string(),
        "a".repeat(MAX_KEY_CHARS),
        // 191 two-byte and 191 four-byte characters: the limit counts characters, not bytes.
        "é".repeat(MAX_KEY_CHARS),
        "😀".repeat(MAX_KEY_CHARS),
        "object 42".into(),
        "a\u{3000}b".into(),
        "object/A".into(),
        "object/a".into(),
        "caf\u{e9}".into(),
        "cafe\u{301}".into(),
        // U+200B is a format character, neither a control character nor Unicode White_Space.
        "\u{200b}zero-width".into(),
    ];
    for (i, key) in accepted.iter().enumerate() {
        let id = w.submit(spec(Q1, &format!("ok-{i}"), key));
        assert_eq!(&w.task(id).spec.concurrency_key, key, "frozen byte-exactly");
    }
    assert_eq!(MAX_KEY_CHARS, 191);
}

#[test]
fn concurrency_keys_breaking_a_rule_are_refused_naming_the_field_and_change_nothing() {
    let mut w = World::new();
    let refused = [
        // Too long, by characters (the 192-character ASCII key is only 192 bytes).
        "a".repeat(MAX_KEY_CHARS + 1),
        "é".repeat(MAX_KEY_CHARS + 1),
        "😀".repeat(MAX_KEY_CHARS + 1),
        // Control characters anywhere.
        "a\u{0}b".into(),
        "a\tb".into(),
        "a\nb".into(),
        "a\rb".into(),
        "\u{1b}[0m".into(),
        "a\u{7f}b".into(),
        "a\u{85}b".into(),
        "a\u{9f}b".into(),
        // Leading or trailing Unicode whitespace.
        " a".into(),
        "a ".into(),
        "\u{3000}a".into(),
        "a\u{a0}".into(),
        "\u{2003}x".into(),
        "x\u{2028}".into(),
        "\u{1680}x".into(),
        "x\u{205f}".into(),
        " ".into(),
    ];
    for key in refused {
        w.invalid(
            queue::Command::Submit(spec(Q1, "k", &key)),
            "concurrency_key",
        );
    }
    assert_eq!(w.task_count(), 0);
}

#[test]
fn an_empty_concurrency_key_means_none() {
    let mut w = World::new();
    let id = w.submit(spec(Q1, "a", ""));
    let a = w.lease_only(OLD, id);
    assert_eq!(a.token, None, "no key, no token");
    assert_eq!(a.concurrency_key, "");
    assert_eq!(tokens(&w.task(id)), vec![None]);
    assert_eq!(w.highest(NS, ""), 0, "no permit row for the empty key");
    assert_eq!(w.holder(NS, ""), None);
}

#[test]
fn max_attempts_ttl_and_required_fields_are_validated_and_change_nothing() {
    let mut w = World::new();
    let mut s = spec(Q1, "a", K);
    s.max_attempts = 0;
    w.invalid(queue::Command::Submit(s), "max_attempts");
    for ttl in [0, -1, i64::MIN] {
        let mut s = spec(Q1, "a", K);
        s.ttl_ms = ttl;
        w.invalid(queue::Command::Submit(s), "ttl");
    }
    w.invalid(queue::Command::Submit(spec(Q1, "", K)), "idempotency_key");
    let mut s = spec(Q1, "a", K);
    s.handler = String::new();
    w.invalid(queue::Command::Submit(s), "handler");
    w.refused(
        queue::Command::Submit(spec("nowhere", "a", K)),
        Refusal::UnknownQueue,
    );
    assert_eq!(w.task_count(), 0);
    // The same idempotency key is still free afterwards.
    w.submit(spec(Q1, "a", K));
}

#[test]
fn an_invalid_resubmission_does_not_count_as_a_replay_or_conflict() {
    let mut w = World::new();
    let id = w.submit(spec(Q1, "a", K));
    let mut s = spec(Q1, "a", K);
    s.ttl_ms = 0;
    w.invalid(queue::Command::Submit(s), "ttl");
    assert_eq!(w.task_count(), 1);
    assert_eq!(w.try_submit(spec(Q1, "a", K)).unwrap().task.id, id);
}

// ---------------------------------------------------------------------------------------------
// Submission: idempotency (seed §2)
// ---------------------------------------------------------------------------------------------

#[test]
fn the_same_key_and_content_returns_the_original_receipt_as_a_replay() {
    let mut w = World::new();
    let first = w.try_submit(spec(Q1, "a", K)).unwrap();
    assert!(!first.replayed);
    w.advance(1_000);
    let before = w.state.queue.clone();
    let again = w.try_submit(spec(Q1, "a", K)).unwrap();
    assert!(again.replayed);
    assert_eq!(again.task, first.task, "the original receipt");
    assert_eq!(w.state.queue, before, "a replay creates nothing");
    assert_eq!(w.task_count(), 1);

    // Later replays, while it runs and after it finished, still create nothing.
    let a = w.lease_only(W, first.task.id);
    let again = w.try_submit(spec(Q1, "a", K)).unwrap();
    assert!(again.replayed);
    assert_eq!(again.task.id, first.task.id);
    assert_eq!(again.task.submitted_at_ms, first.task.submitted_at_ms);
    w.finish(&a);
    let again = w.try_submit(spec(Q1, "a", K)).unwrap();
    assert!(again.replayed);
    assert_eq!(again.task.id, first.task.id);
    assert_eq!(again.task.state, TaskState::Succeeded);
    assert_eq!(w.task_count(), 1);
    assert!(w.lease(W, 10).is_empty(), "nothing new to lease");
}

#[test]
fn the_same_key_with_different_content_is_an_idempotency_conflict() {
    let mut w = World::new();
    w.submit(spec(Q1, "a", K));
    w.submit(spec(Q1, "plain", ""));
    let mut variants: Vec<(&str, TaskSpec)> = vec![
        ("another concurrency key", spec(Q1, "a", L)),
        ("no concurrency key", spec(Q1, "a", "")),
        (
            "a case-different key",
            spec(Q1, "a", "object/42".to_uppercase().as_str()),
        ),
        ("a key added", spec(Q1, "plain", K)),
        ("another queue of the namespace", spec(Q2, "a", K)),
    ];
    let mut s = spec(Q1, "a", K);
    s.payload = b"{}".to_vec();
    variants.push(("another payload", s));
    let mut s = spec(Q1, "a", K);
    s.handler = "object.delete".into();
    variants.push(("another handler", s));
    let mut s = spec(Q1, "a", K);
    s.max_attempts = 4;
    variants.push(("another max_attempts", s));
    let mut s = spec(Q1, "a", K);
    s.business_key = "order-8".into();
    variants.push(("another business key", s));
    for (what, s) in variants {
        let before = w.state.queue.clone();
        assert_eq!(w.try_submit(s), Err(Refusal::IdempotencyConflict), "{what}");
        assert_eq!(w.state.queue, before, "{what}: nothing changed");
    }
    assert_eq!(w.task_count(), 2);
}

#[test]
fn the_same_idempotency_key_in_another_namespace_is_another_submission() {
    // docs/task-queue.md: idempotency keys are scoped per namespace.
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(QX, "a", K));
    assert_ne!(a, b);
    assert_eq!(w.try_submit(spec(QX, "a", K)).unwrap().task.id, b);
    assert_eq!(
        w.try_submit(spec(Q2, "a", K)),
        Err(Refusal::IdempotencyConflict)
    );
}

#[test]
fn composed_and_decomposed_keys_are_different_content() {
    let mut w = World::new();
    w.submit(spec(Q1, "a", "caf\u{e9}"));
    assert_eq!(
        w.try_submit(spec(Q1, "a", "cafe\u{301}")),
        Err(Refusal::IdempotencyConflict)
    );
}

// ---------------------------------------------------------------------------------------------
// One active attempt per (namespace, key); leasing
// ---------------------------------------------------------------------------------------------

#[test]
fn one_active_attempt_per_namespace_and_key_across_queues() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q2, "b", K));
    let c = w.submit(spec(QX, "c", K));
    let got = w.lease(W, 100);
    assert_eq!(ids(&got), vec![a, c], "b shares a's key and namespace");
    assert_eq!(w.holder(NS, K), Some(a));
    assert_eq!(w.holder(NS2, K), Some(c));
    assert_eq!(got[0].token, Some(1));
    assert_eq!(got[1].token, Some(1), "another namespace: another resource");
    assert_eq!(got[0].namespace, NS);
    assert_eq!(got[1].namespace, NS2);
    // Another worker leasing only from b's queue gets nothing either.
    assert!(w.lease_from(W2, &[Q2], 100).is_empty());
    assert_eq!(w.task(b).state, TaskState::Waiting);
    // Started or not, the permit covers the attempt.
    w.start(&got[0], W).unwrap();
    assert!(w.lease(W2, 100).is_empty());
    w.complete(&got[0], W).unwrap();
    let next = w.lease_only(W2, b);
    assert_eq!(next.token, Some(2));
}

#[test]
fn one_lease_batch_takes_at_most_one_task_per_key() {
    let mut w = World::new();
    let k: Vec<u64> = (0..5)
        .map(|i| w.submit(spec(Q1, &format!("k{i}"), K)))
        .collect();
    let free = w.submit(spec(Q2, "free", ""));
    let got = w.lease(W, 2);
    assert_eq!(ids(&got), vec![k[0], free]);
    for id in &k[1..] {
        assert_eq!(w.task(*id).state, TaskState::Waiting);
    }
}

/// A lease answer must reach its worker whole: large tasks are handed out only as many as fit
/// in [`MAX_LEASE_BYTES`], in order, and one task of the largest payload always goes alone.
#[test]
fn one_lease_hands_out_no_more_bytes_than_an_answer_can_carry() {
    let mut w = World::new();
    let big = |w: &mut World, name: &str, bytes: usize| {
        let mut task = spec(Q1, name, "");
        task.payload = vec![b'x'; bytes];
        w.submit(task)
    };
    let third = MAX_LEASE_BYTES / 3;
    let bigs: Vec<u64> = (0..5)
        .map(|i| big(&mut w, &format!("b{i}"), third))
        .collect();
    let small = w.submit(spec(Q1, "small", ""));

    // Two thirds and their strings fit; a third third would pass the bound. Order is kept: the
    // small task behind them does not jump the queue.
    let first = w.lease(W, 100);
    assert_eq!(ids(&first), bigs[..2].to_vec());
    let sent: usize = first.iter().map(|a| a.payload.len()).sum();
    assert!(sent <= MAX_LEASE_BYTES, "{sent}");
    for id in &bigs[2..] {
        assert_eq!(w.task(*id).state, TaskState::Waiting);
    }
    assert_eq!(ids(&w.lease(W, 100)), bigs[2..4].to_vec());
    assert_eq!(ids(&w.lease(W, 100)), vec![bigs[4], small]);

    // The largest payload there is goes alone, even beyond the bound's share.
    let huge: Vec<u64> = (0..3)
        .map(|i| big(&mut w, &format!("h{i}"), MAX_PAYLOAD_BYTES))
        .collect();
    for id in huge {
        assert_eq!(ids(&w.lease(W, 100)), vec![id]);
    }
}

fn count_in(w: &World, state: TaskState) -> usize {
    w.state
        .queue
        .list(&TaskFilter::default())
        .filter(|t| t.state == state)
        .count()
}

/// A lease is a client command: a mass expiry must not become one huge apply through it. It
/// materialises at most [`MAX_LEASE_SWEEP`] expired leases; the sweeper takes the rest.
#[test]
fn a_lease_materialises_a_bounded_number_of_expired_leases() {
    let mut w = World::new();
    let n = 3 * MAX_LEASE_SWEEP;
    for i in 0..n {
        w.submit(spec(Q1, &format!("t{i}"), ""));
    }
    for _ in 0..3 {
        assert_eq!(w.lease(W, MAX_LEASE_SWEEP as u32).len(), MAX_LEASE_SWEEP);
    }
    w.advance(LEASE as u64);
    assert_eq!(w.lease(W, 1).len(), 1);
    assert_eq!(
        count_in(&w, TaskState::Leased),
        n - MAX_LEASE_SWEEP + 1,
        "the first {MAX_LEASE_SWEEP} expiries taken, one of them leased again"
    );
    assert_eq!(w.sweep(), (n - MAX_LEASE_SWEEP) as u64);
    assert_eq!(count_in(&w, TaskState::Leased), 1);
}

/// The total deadlines a lease leaves to the sweeper still bind: a waiting task past its
/// deadline is failed when a lease comes to it, never leased.
#[test]
fn a_lease_fails_a_task_past_its_deadline_that_no_sweep_reached() {
    let mut w = World::new();
    for i in 0..MAX_LEASE_SWEEP {
        let mut early = spec(Q1, &format!("early-{i}"), "");
        early.ttl_ms = 1_000;
        w.submit(early);
    }
    let mut late = spec(Q1, "late", "");
    late.ttl_ms = 2_000;
    let late = w.submit(late);
    w.advance(5_000);
    assert!(w.lease(W, 10).is_empty());
    let task = w.task(late);
    assert_eq!(task.state, TaskState::Failed, "{task:?}");
    assert!(task.attempts.is_empty());
    assert_eq!(count_in(&w, TaskState::Failed), MAX_LEASE_SWEEP + 1);
}

/// Failing candidates past their deadline is bounded too: behind the swept ones, one lease fails
/// at most [`MAX_LEASE_SWEEP`] more, and leaves the rest to later leases and the sweeper.
#[test]
fn a_lease_fails_a_bounded_number_of_tasks_past_their_deadline() {
    let mut w = World::new();
    let n = 3 * MAX_LEASE_SWEEP;
    for i in 0..n {
        let mut task = spec(Q1, &format!("t{i}"), "");
        // Deadlines in submission order, so the sweep takes the oldest first.
        task.ttl_ms = 1_000 + i as i64;
        w.submit(task);
    }
    w.advance(10_000);
    assert!(w.lease(W, 10).is_empty());
    assert_eq!(count_in(&w, TaskState::Failed), 2 * MAX_LEASE_SWEEP);
    assert_eq!(count_in(&w, TaskState::Waiting), MAX_LEASE_SWEEP);
}

#[test]
fn keys_differing_only_in_case_or_normalisation_are_separate_permits() {
    let mut w = World::new();
    let keys = ["object/A", "object/a", "caf\u{e9}", "cafe\u{301}"];
    let submitted: Vec<u64> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| w.submit(spec(Q1, &format!("t{i}"), key)))
        .collect();
    // A byte-identical key in the same namespace (another queue) is excluded as usual.
    let same = w.submit(spec(Q2, "same", "object/A"));

    let got = w.lease(W, 100);
    assert_eq!(
        ids(&got),
        submitted,
        "one call grants all four; none blocks another"
    );
    for ((a, key), id) in got.iter().zip(keys).zip(&submitted) {
        assert_eq!(a.concurrency_key, key, "frozen byte-exactly");
        assert_eq!(
            a.token,
            Some(1),
            "{key:?} has its own permit and token counter"
        );
        assert_eq!(w.holder(NS, key), Some(*id), "{key:?}");
        assert_eq!(w.highest(NS, key), 1, "{key:?}");
    }
    assert_eq!(w.task(same).state, TaskState::Waiting);
    assert!(w.task(same).attempts.is_empty());

    // Finishing one key frees only that key.
    w.finish(&got[1]);
    assert_eq!(w.holder(NS, "object/a"), None);
    assert_eq!(w.holder(NS, "object/A"), Some(submitted[0]));
    assert!(w.lease(W2, 100).is_empty(), "object/A is still held");
    w.finish(&got[0]);
    let next = w.lease_only(W2, same);
    assert_eq!(next.token, Some(2));
}

#[test]
fn a_busy_key_leaves_the_task_waiting_without_consuming_attempts() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let mut s = spec(Q2, "b", K);
    s.max_attempts = 1;
    let b = w.submit(s);
    let first = w.lease_only(W, a);
    w.start(&first, W).unwrap();
    for _ in 0..10 {
        w.advance(100);
        assert!(w.lease(W2, 100).is_empty());
        w.sweep();
    }
    let task = w.task(b);
    assert_eq!(task.state, TaskState::Waiting);
    assert!(task.attempts.is_empty(), "no attempt while the key is busy");
    assert_eq!(task.started_attempts(), 0);
    w.complete(&first, W).unwrap();
    // Its only attempt is still available.
    let lease = w.lease_only(W2, b);
    assert_eq!(lease.attempt, 1);
    w.start(&lease, W2).unwrap();
    assert_eq!(w.complete(&lease, W2).unwrap().state, TaskState::Succeeded);
}

#[test]
fn leasing_skips_busy_keys_before_applying_its_limit() {
    let mut w = World::new();
    let holder = w.submit(spec(Q1, "holder", K));
    let a = w.lease_only(W, holder);
    let blocked: Vec<u64> = (0..5)
        .map(|i| w.submit(spec(Q1, &format!("blocked-{i}"), K)))
        .collect();
    let free = w.submit(spec(Q1, "free", ""));
    let other = w.submit(spec(Q2, "other", L));

    let got = w.lease(W2, 1);
    assert_eq!(ids(&got), vec![free], "no head-of-line blocking");
    let got = w.lease(W2, 1);
    assert_eq!(ids(&got), vec![other]);
    assert_eq!(got[0].token, Some(1));
    assert!(w.lease(W2, 1).is_empty(), "only busy keys remain");
    for id in &blocked {
        assert_eq!(w.task(*id).state, TaskState::Waiting);
        assert!(w.task(*id).attempts.is_empty());
    }
    // The read-only probe agrees.
    assert!(!w.state.queue.has_leasable(w.now, W2, &[]));
    w.finish(&a);
    assert!(w.state.queue.has_leasable(w.now, W2, &[]));
    let next = w.lease(W2, 100);
    assert_eq!(ids(&next), vec![blocked[0]]);
    assert_eq!(next[0].token, Some(2));
}

/// The probe a long poll asks before proposing wakes for an expiry only when the lease it
/// would propose could hand out something because of it: a lapsed lease of a task in another
/// queue woke every idle poller, each proposing an empty lease (a log entry) per round trip
/// until the leader's sweep landed.
#[test]
fn a_long_poll_wakes_only_for_expiries_that_may_give_it_a_task() {
    let mut w = World::new();
    let elsewhere = w.submit(spec(Q2, "elsewhere", ""));
    w.lease_only(W, elsewhere);
    w.advance(LEASE as u64);
    let q1: Vec<String> = vec![Q1.into()];
    assert!(
        !w.state.queue.has_leasable(w.now, W2, &q1),
        "woken for another queue's unkeyed task"
    );
    assert!(w.state.queue.has_leasable(w.now, W2, &[Q2.into()]));
    assert!(w.state.queue.has_leasable(w.now, W2, &[]));
    assert!(w.lease_from(W2, &[Q1], 10).is_empty());

    // A keyed task's lapse may free a key a task of Q1 waits on: that wakes Q1's pollers.
    let mut w = World::new();
    let holder = w.submit(spec(Q2, "holder", K));
    let waiting = w.submit(spec(Q1, "waiting", K));
    w.lease_only(W, holder);
    assert!(
        !w.state.queue.has_leasable(w.now, W2, &q1),
        "the key is held"
    );
    w.advance(LEASE as u64);
    assert!(w.state.queue.has_leasable(w.now, W2, &q1));
    assert_eq!(ids(&w.lease_from(W2, &[Q1], 10)), vec![waiting]);

    // An ended back-off of a Q1 task wakes them.
    let mut w = World::new();
    let retried = w.submit(spec(Q1, "retried", ""));
    let a = w.lease_only(W, retried);
    w.start(&a, W).unwrap();
    w.fail(&a, W, true).unwrap();
    assert!(!w.state.queue.has_leasable(w.now, W2, &q1), "backing off");
    w.advance(FIRST_BACKOFF);
    assert!(w.state.queue.has_leasable(w.now, W2, &q1));
    assert_eq!(ids(&w.lease_from(W2, &[Q1], 10)), vec![retried]);
}

#[test]
fn a_worker_without_concurrency_key_support_never_receives_keyed_tasks() {
    let mut w = World::new();
    let keyed = w.submit(spec(Q1, "keyed", K));
    let keyed_other = w.submit(spec(QX, "keyed-other", L));
    let plain = w.submit(spec(Q1, "plain", ""));
    // The keyed tasks come first, but the old worker's limit is spent on what it can take.
    let got = w.lease(OLD, 1);
    assert_eq!(ids(&got), vec![plain]);
    assert_eq!(got[0].token, None);
    assert!(w.lease(OLD, 100).is_empty());
    assert!(!w.state.queue.has_leasable(w.now, OLD, &[]));
    for id in [keyed, keyed_other] {
        assert_eq!(w.task(id).state, TaskState::Waiting);
        assert!(w.task(id).attempts.is_empty());
    }
    assert_eq!(w.holder(NS, K), None, "skipping takes no permit");
    assert_eq!(w.highest(NS, K), 0, "skipping mints no token");
    let got = w.lease(W, 100);
    assert_eq!(ids(&got), vec![keyed, keyed_other]);
    assert!(got.iter().all(|a| a.token == Some(1)));
}

#[test]
fn an_assignment_carries_the_frozen_key_and_its_token() {
    let mut w = World::new();
    let id = w.submit(spec(Q1, "a", K));
    let a = w.lease_only(W, id);
    assert_eq!(a.concurrency_key, K);
    assert_eq!(a.namespace, NS);
    assert_eq!(a.queue, Q1);
    assert_eq!(a.attempt, 1);
    assert_eq!(a.token, Some(1));
    assert_eq!(a.lease_until_ms, w.now + LEASE as u64);
    let task = w.task(id);
    assert_eq!(task.state, TaskState::Leased);
    assert_eq!(task.attempts[0].token, Some(1));
    assert_eq!(task.attempts[0].worker, W);
}

// ---------------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------------

#[test]
fn tokens_are_non_zero_strictly_increasing_across_attempts_and_tasks_and_never_reset() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q2, "b", K));

    let a1 = w.lease_only(W, a);
    assert_eq!(a1.token, Some(1), "the first token is 1, never 0");
    w.start(&a1, W).unwrap();
    w.fail(&a1, W, true).unwrap();
    let b1 = w.lease_only(W, b);
    assert_eq!(b1.token, Some(2));
    w.finish(&b1);
    w.advance(FIRST_BACKOFF);
    let a2 = w.lease_only(W, a);
    assert_eq!((a2.attempt, a2.token), (2, Some(3)));
    w.advance(LEASE as u64);
    w.sweep();
    let a3 = w.lease_only(W, a);
    assert_eq!((a3.attempt, a3.token), (3, Some(4)));
    w.finish(&a3);

    assert_eq!(tokens(&w.task(a)), vec![Some(1), Some(3), Some(4)]);
    assert_eq!(tokens(&w.task(b)), vec![Some(2)]);
    assert_eq!(w.highest(NS, K), 4);
    assert_eq!(w.holder(NS, K), None);

    // Every task on the key is finished; the key's sequence still continues.
    w.advance(60_000);
    let c = w.submit(spec(QX, "c", K));
    let d = w.submit(spec(Q1, "d", K));
    let got = w.lease(W, 100);
    assert_eq!(ids(&got), vec![c, d]);
    assert_eq!(got[0].token, Some(1), "ns2's key is another resource");
    assert_eq!(got[1].token, Some(5), "never reset");
    // Another key in the same namespace has its own sequence.
    let e = w.submit(spec(Q1, "e", L));
    assert_eq!(w.lease_only(W, e).token, Some(1));
}

#[test]
fn unkeyed_tasks_carry_no_token_and_do_not_exclude_each_other() {
    let mut w = World::new();
    let ids_in: Vec<u64> = (0..3)
        .map(|i| w.submit(spec(Q1, &format!("p{i}"), "")))
        .collect();
    let got = w.lease(W, 100);
    assert_eq!(ids(&got), ids_in);
    assert!(got.iter().all(|a| a.token.is_none()));
    assert_eq!(w.state.queue.active_leases(), 3);
}

// ---------------------------------------------------------------------------------------------
// The release table (seed §3)
// ---------------------------------------------------------------------------------------------

#[test]
fn renew_keeps_the_attempt_and_token_and_extends_the_permit() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q2, "b", K));
    let lease = w.lease_only(W, a);
    let t_lease = w.now;
    // Renewing before the start works too: the permit covers LEASED.
    w.advance(8_000);
    let task = w.renew(&lease, LEASE).unwrap();
    assert_eq!(task.state, TaskState::Leased);
    assert_eq!(task.attempts.len(), 1);
    assert_eq!(task.attempts[0].token, Some(1));
    assert_eq!(task.attempts[0].lease_until_ms, w.now + LEASE as u64);
    w.start(&lease, W).unwrap();
    // Past the original lease, the permit is still held.
    w.now = t_lease + LEASE as u64 + 5_000;
    assert_eq!(w.sweep(), 0);
    assert!(w.lease(W2, 100).is_empty());
    assert_eq!(w.holder(NS, K), Some(a));
    let task = w.renew(&lease, 20_000).unwrap();
    assert_eq!(task.attempts.len(), 1);
    assert_eq!(task.attempts[0].token, Some(1));
    assert_eq!(task.state, TaskState::Running);
    assert_eq!(w.highest(NS, K), 1, "a renewal mints no token");
    w.advance(19_999);
    w.sweep();
    assert_eq!(w.holder(NS, K), Some(a));
    // The renewed lease runs out: the permit goes with it.
    w.advance(1);
    w.sweep();
    assert_eq!(w.holder(NS, K), None);
    assert_eq!(w.lease_only(W2, b).token, Some(2));
}

#[test]
fn resume_and_reconnect_keep_the_attempt_and_token() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let lease = w.lease_only(W, a);
    let started = w.start(&lease, W).unwrap();
    w.advance(1_000);
    // The worker process reconnects with the same identity and capability, then resumes.
    w.send(register(W, true)).unwrap();
    let resumed = w.start(&lease, W).unwrap();
    assert_eq!(resumed, started, "a resume changes nothing");
    assert_eq!(w.holder(NS, K), Some(a));
    assert_eq!(w.highest(NS, K), 1);
    assert_eq!(w.task(a).attempts.len(), 1);
    assert_eq!(w.complete(&lease, W).unwrap().state, TaskState::Succeeded);
}

#[test]
fn a_duplicate_result_does_not_release_twice_nor_touch_a_later_attempts_permit() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q2, "b", K));
    let la = w.lease_only(W, a);
    w.start(&la, W).unwrap();
    let done = w.complete(&la, W).unwrap();
    // An exact retry (same origin) is answered from the session table.
    assert_eq!(
        w.resend_last(),
        Response::Answer(Ok(Reply::QueueTask(Box::new(done.clone()))))
    );
    let lb = w.lease_only(W2, b);
    assert_eq!(lb.token, Some(2));
    // A's old receipt replayed with a new request id: answered, nothing released.
    let before = w.state.queue.clone();
    assert_eq!(w.complete(&la, W), Ok(done));
    assert_eq!(w.state.queue, before);
    assert_eq!(w.holder(NS, K), Some(b));
    // Other late reports about A's finished attempt are lease lost and release nothing.
    w.refused(fail_cmd(a, la.attempt, W, true), Refusal::LeaseLost);
    w.refused(fail_cmd(a, la.attempt, W, false), Refusal::LeaseLost);
    w.refused(unknown_cmd(a, la.attempt, W), Refusal::LeaseLost);
    w.refused(start_cmd(a, la.attempt, W), Refusal::LeaseLost);
    assert_eq!(w.state.queue, before);
    assert_eq!(w.holder(NS, K), Some(b));
    assert!(w.lease(W, 100).is_empty());
}

#[test]
fn a_duplicate_failure_from_an_earlier_attempt_does_not_touch_the_later_attempt() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q2, "b", K));
    let a1 = w.lease_only(W, a);
    w.start(&a1, W).unwrap();
    let failed = w.fail(&a1, W, true).unwrap();
    assert_eq!(failed.state, TaskState::RetryWait);
    // Duplicate failure of the same attempt during back-off: answered, nothing changes.
    let before = w.state.queue.clone();
    assert_eq!(w.fail(&a1, W, true), Ok(failed));
    assert_eq!(w.state.queue, before);
    // B takes the key during A's back-off.
    let b1 = w.lease_only(W2, b);
    w.advance(FIRST_BACKOFF);
    assert!(w.lease(W, 100).is_empty(), "A is waiting for the busy key");
    assert_eq!(w.task(a).state, TaskState::Waiting);
    w.finish(&b1);
    let a2 = w.lease_only(W, a);
    assert_eq!((a2.attempt, a2.token), (2, Some(3)));
    // Attempt 1's failure replayed now concerns a stale attempt: refused, attempt 2 untouched.
    let before = w.state.queue.clone();
    assert_eq!(w.fail(&a1, W, true), Err(Refusal::LeaseLost));
    assert_eq!(w.fail(&a1, W, false), Err(Refusal::LeaseLost));
    assert_eq!(w.complete(&a1, W), Err(Refusal::LeaseLost));
    assert_eq!(w.state.queue, before);
    assert_eq!(w.holder(NS, K), Some(a));
    assert_eq!(w.task(a).active_attempt().unwrap().number, 2);
}

#[test]
fn cancel_before_start_releases_the_permit_and_the_next_attempt_gets_a_larger_token() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q2, "b", K));
    let la = w.lease_only(W, a);
    let task = w.cancel(a).unwrap();
    assert_eq!(task.state, TaskState::Cancelled);
    assert_eq!(outcomes(&task), vec![AttemptOutcome::Cancelled]);
    assert_eq!(task.attempts[0].token, Some(1), "history keeps the token");
    assert_eq!(w.holder(NS, K), None);
    assert_eq!(w.state.queue.active_leases(), 0);
    assert_eq!(w.lease_only(W2, b).token, Some(2));
    // The cancelled attempt's worker has lost its lease.
    assert_eq!(w.start(&la, W), Err(Refusal::LeaseLost));
    w.refused(
        queue::Command::Cancel { task_id: a },
        Refusal::AlreadySettled,
    );
}

#[test]
fn cancel_of_a_waiting_or_backing_off_task_cancels_it() {
    let mut w = World::new();
    let holder = w.submit(spec(Q1, "holder", K));
    let waiting = w.submit(spec(Q1, "waiting", K));
    let lh = w.lease_only(W, holder);
    let task = w.cancel(waiting).unwrap();
    assert_eq!(task.state, TaskState::Cancelled);
    assert!(task.attempts.is_empty());
    assert_eq!(
        w.holder(NS, K),
        Some(holder),
        "another task's permit is untouched"
    );

    w.start(&lh, W).unwrap();
    w.fail(&lh, W, true).unwrap();
    assert_eq!(w.cancel(holder).unwrap().state, TaskState::Cancelled);
    w.advance(60_000);
    w.sweep();
    assert_eq!(
        w.task(holder).state,
        TaskState::Cancelled,
        "no retry after cancel"
    );
    assert!(w.lease(W, 100).is_empty());
}

#[test]
fn cancel_while_running_is_already_started_and_changes_nothing() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let la = w.lease_only(W, a);
    w.start(&la, W).unwrap();
    w.refused(
        queue::Command::Cancel { task_id: a },
        Refusal::AlreadyStarted,
    );
    assert_eq!(w.holder(NS, K), Some(a));
    w.refused(
        queue::Command::Cancel { task_id: 999 },
        Refusal::UnknownTask,
    );
}

#[test]
fn completion_releases_the_permit_and_the_next_attempt_gets_a_larger_token() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q1, "b", K));
    let la = w.lease_only(W, a);
    w.start(&la, W).unwrap();
    w.advance(10);
    let task = w.complete(&la, W).unwrap();
    assert_eq!(task.state, TaskState::Succeeded);
    assert_eq!(task.result, b"ok");
    assert_eq!(outcomes(&task), vec![AttemptOutcome::Succeeded]);
    assert_eq!(task.attempts[0].ended_at_ms, Some(w.now));
    assert_eq!(w.holder(NS, K), None);
    assert_eq!(w.lease_only(W, b).token, Some(2));
}

#[test]
fn a_non_retryable_failure_releases_the_permit_for_good() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q1, "b", K));
    let la = w.lease_only(W, a);
    w.start(&la, W).unwrap();
    let task = w.fail(&la, W, false).unwrap();
    assert_eq!(task.state, TaskState::Failed);
    assert_eq!(task.last_error, "boom");
    assert_eq!(outcomes(&task), vec![AttemptOutcome::Failed]);
    assert_eq!(w.holder(NS, K), None);
    assert_eq!(w.lease_only(W, b).token, Some(2));
    w.advance(60_000);
    w.sweep();
    assert_eq!(w.task(a).state, TaskState::Failed);
}

#[test]
fn a_retryable_failure_releases_the_permit_during_back_off() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q2, "b", K));
    let la = w.lease_only(W, a);
    w.start(&la, W).unwrap();
    let task = w.fail(&la, W, true).unwrap();
    assert_eq!(task.state, TaskState::RetryWait);
    assert_eq!(task.retry_at_ms, Some(w.now + FIRST_BACKOFF));
    assert_eq!(
        w.holder(NS, K),
        None,
        "the back-off does not hold the resource"
    );
    // During the back-off, another task on the same key runs; A itself is not leasable yet.
    let lb = w.lease_only(W2, b);
    assert_eq!(lb.token, Some(2));
    w.start(&lb, W2).unwrap();
    w.advance(FIRST_BACKOFF);
    w.sweep();
    assert_eq!(w.task(a).state, TaskState::Waiting);
    assert!(w.lease(W, 100).is_empty());
    w.complete(&lb, W2).unwrap();
    let a2 = w.lease_only(W, a);
    assert_eq!((a2.attempt, a2.token), (2, Some(3)));
}

#[test]
fn a_retryable_failure_without_attempts_left_fails_the_task() {
    let mut w = World::new();
    let mut s = spec(Q1, "a", K);
    s.max_attempts = 2;
    let a = w.submit(s);
    for attempt in 1..=2 {
        let l = w.lease_only(W, a);
        assert_eq!(l.attempt, attempt);
        w.start(&l, W).unwrap();
        w.fail(&l, W, true).unwrap();
        w.advance(60_000);
        w.sweep();
    }
    let task = w.task(a);
    assert_eq!(task.state, TaskState::Failed);
    assert_eq!(tokens(&task), vec![Some(1), Some(2)]);
    assert_eq!(w.holder(NS, K), None);
}

#[test]
fn an_unknown_outcome_releases_the_permit_and_keeps_the_history() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q2, "b", K));
    let la = w.lease_only(W, a);
    // Unknown before start makes no sense: the worker must have started.
    w.refused(unknown_cmd(a, 1, W), Refusal::NotStarted);
    w.start(&la, W).unwrap();
    let task = w.unknown(&la, W).unwrap();
    assert_eq!(task.state, TaskState::NeedsReview);
    assert_eq!(outcomes(&task), vec![AttemptOutcome::Unknown]);
    assert_eq!(
        task.attempts[0].note,
        "timed out talking to the object store"
    );
    assert_eq!(task.attempts[0].token, Some(1));
    assert!(task.attempts[0].started_at_ms.is_some());
    assert_eq!(w.holder(NS, K), None, "review does not lock the key");
    // A duplicate report changes nothing.
    let before = w.state.queue.clone();
    assert_eq!(w.unknown(&la, W), Ok(task.clone()));
    assert_eq!(w.state.queue, before);
    let lb = w.lease_only(W2, b);
    assert_eq!(lb.token, Some(2));
    // The task under review is never leased again, nor failed by its deadline.
    w.finish(&lb);
    w.advance(1_000_000);
    w.sweep();
    assert!(w.lease(W, 100).is_empty());
    assert_eq!(w.task(a), task);
    w.refused(
        queue::Command::Cancel { task_id: a },
        Refusal::AlreadySettled,
    );
}

#[test]
fn complete_before_start_is_not_started_and_changes_nothing() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    w.lease_only(W, a);
    w.refused(complete_cmd(a, 1, W), Refusal::NotStarted);
    assert_eq!(w.task(a).state, TaskState::Leased);
    assert_eq!(w.holder(NS, K), Some(a));
}

#[test]
fn a_wrong_worker_or_a_stale_attempt_is_lease_lost_and_changes_nothing() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let la = w.lease_only(W, a);
    for command in [
        start_cmd(a, 1, W2),
        renew_cmd(a, 1, W2, LEASE),
        fail_cmd(a, 1, W2, false),
        start_cmd(a, 2, W),
        start_cmd(a, 0, W),
        renew_cmd(a, 2, W, LEASE),
        fail_cmd(a, 2, W, false),
    ] {
        w.refused(command, Refusal::LeaseLost);
    }
    w.start(&la, W).unwrap();
    for command in [
        complete_cmd(a, 1, W2),
        unknown_cmd(a, 1, W2),
        fail_cmd(a, 1, OLD, true),
        complete_cmd(a, 2, W),
        unknown_cmd(a, 2, W),
    ] {
        w.refused(command, Refusal::LeaseLost);
    }
    w.refused(start_cmd(999, 1, W), Refusal::UnknownTask);
    assert_eq!(w.holder(NS, K), Some(a));
    assert_eq!(w.task(a).state, TaskState::Running);
    // Once recorded, the result is answered again only to the attempt's own worker.
    w.complete(&la, W).unwrap();
    w.refused(complete_cmd(a, 1, W2), Refusal::LeaseLost);
    w.refused(complete_cmd(a, 2, W), Refusal::LeaseLost);
}

#[test]
fn a_report_after_the_lease_ran_out_is_lease_lost_and_the_expiry_releases_the_permit() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q2, "b", K));
    let la = w.lease_only(W, a);
    w.start(&la, W).unwrap();
    w.advance(LEASE as u64);
    // No sweep yet: the late completion itself must see the expiry.
    assert_eq!(w.complete(&la, W), Err(Refusal::LeaseLost));
    assert_eq!(w.renew(&la, LEASE), Err(Refusal::LeaseLost));
    let task = w.task(a);
    assert_eq!(task.state, TaskState::RetryWait);
    assert_eq!(outcomes(&task), vec![AttemptOutcome::Expired]);
    assert_eq!(w.holder(NS, K), None);
    assert_eq!(w.lease_only(W2, b).token, Some(2));
}

#[test]
fn lease_expiry_before_start_releases_the_permit_and_requeues_without_using_an_attempt() {
    let mut w = World::new();
    let mut s = spec(Q1, "a", K);
    s.max_attempts = 1;
    let a = w.submit(s);
    let la = w.lease_only(W, a);
    w.advance(LEASE as u64 - 1);
    assert_eq!(w.sweep(), 0);
    assert_eq!(w.holder(NS, K), Some(a));
    w.advance(1);
    assert_eq!(w.sweep(), 1);
    let task = w.task(a);
    assert_eq!(task.state, TaskState::Waiting);
    assert_eq!(outcomes(&task), vec![AttemptOutcome::Expired]);
    assert_eq!(task.started_attempts(), 0);
    assert_eq!(w.holder(NS, K), None);
    assert_eq!(w.start(&la, W), Err(Refusal::LeaseLost));
    let again = w.lease_only(W2, a);
    assert_eq!((again.attempt, again.token), (2, Some(2)));
    w.start(&again, W2).unwrap();
    assert_eq!(w.complete(&again, W2).unwrap().state, TaskState::Succeeded);
}

#[test]
fn leasing_recovers_expired_leases_itself_without_a_sweep() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let b = w.submit(spec(Q2, "b", K));
    w.lease_only(W, a);
    w.advance(LEASE as u64);
    let got = w.lease(W2, 100);
    assert_eq!(
        ids(&got),
        vec![a],
        "the oldest waiting task, on a fresh permit"
    );
    assert_eq!(got[0].token, Some(2));
    assert_eq!(w.task(b).state, TaskState::Waiting);
}

#[test]
fn lease_expiry_of_a_started_attempt_retries_then_needs_review_when_attempts_run_out() {
    let mut w = World::new();
    let mut s = spec(Q1, "a", K);
    s.max_attempts = 2;
    let a = w.submit(s);
    let b = w.submit(spec(Q2, "b", K));

    let a1 = w.lease_only(W, a);
    w.start(&a1, W).unwrap();
    w.advance(LEASE as u64);
    w.sweep();
    let task = w.task(a);
    assert_eq!(task.state, TaskState::RetryWait);
    assert_eq!(w.holder(NS, K), None);

    // B uses the key during the back-off.
    let b1 = w.lease_only(W2, b);
    w.finish(&b1);
    w.advance(FIRST_BACKOFF * 2);
    let a2 = w.lease_only(W, a);
    assert_eq!((a2.attempt, a2.token), (2, Some(3)));
    w.start(&a2, W).unwrap();
    w.advance(LEASE as u64);
    w.sweep();
    let task = w.task(a);
    assert_eq!(
        task.state,
        TaskState::NeedsReview,
        "the effect of attempt 2 is unknown"
    );
    assert_eq!(
        outcomes(&task),
        vec![AttemptOutcome::Expired, AttemptOutcome::Expired]
    );
    assert_eq!(tokens(&task), vec![Some(1), Some(3)]);
    assert_eq!(w.holder(NS, K), None);
    assert_eq!(w.state.queue.active_leases(), 0);
    w.advance(60_000);
    w.sweep();
    assert!(w.lease(W, 100).is_empty());
    assert_eq!(w.task(a).state, TaskState::NeedsReview);
}

#[test]
fn the_total_deadline_fails_waiting_tasks_even_while_their_key_is_busy() {
    let mut w = World::new();
    let a = w.submit(spec(Q1, "a", K));
    let mut s = spec(Q2, "b", K);
    s.ttl_ms = 5_000;
    let b = w.submit(s);
    let mut s = spec(Q2, "c", "");
    s.ttl_ms = 5_000;
    let c = w.submit(s);
    let la = w.lease(W, 1);
    assert_eq!(ids(&la), vec![a]);
    w.start(&la[0], W).unwrap();
    w.advance(4_999);
    w.sweep();
    assert_eq!(w.task(b).state, TaskState::Waiting);
    w.advance(1);
    assert_eq!(w.sweep(), 2);
    for id in [b, c] {
        let task = w.task(id);
        assert_eq!(task.state, TaskState::Failed);
        assert!(task.attempts.is_empty());
        assert!(!task.last_error.is_empty());
    }
    assert_eq!(w.task(a).state, TaskState::Running);
    assert_eq!(w.holder(NS, K), Some(a));
    w.complete(&la[0], W).unwrap();
    assert!(
        w.lease(W, 100).is_empty(),
        "the overdue task is never leased"
    );
}

#[test]
fn leasing_fails_overdue_waiting_tasks_instead_of_handing_them_out() {
    let mut w = World::new();
    let mut s = spec(Q1, "a", K);
    s.ttl_ms = 5_000;
    let a = w.submit(s);
    w.advance(5_000);
    assert!(w.lease(W, 100).is_empty());
    assert_eq!(w.task(a).state, TaskState::Failed);
    assert_eq!(w.highest(NS, K), 0);
}

/// A task with a total deadline of 5 s whose first attempt failed retryably at 4.8 s: its
/// back-off ends past the deadline.
fn backing_off_near_its_deadline(w: &mut World) -> u64 {
    let mut s = spec(Q1, "a", K);
    s.ttl_ms = 5_000;
    let a = w.submit(s);
    let la = w.lease_only(W, a);
    w.start(&la, W).unwrap();
    w.advance(4_800);
    assert_eq!(w.fail(&la, W, true).unwrap().state, TaskState::RetryWait);
    a
}

#[test]
fn the_total_deadline_fails_a_task_in_back_off() {
    let mut w = World::new();
    let a = backing_off_near_its_deadline(&mut w);
    w.advance(200);
    w.sweep();
    let task = w.task(a);
    assert_eq!(task.state, TaskState::Failed);
    assert_eq!(task.retry_at_ms, None);
    assert!(w.lease(W, 100).is_empty());
    // A failure reported after the deadline fails for good even if retryable.
    let mut s = spec(Q1, "b", K);
    s.ttl_ms = 5_000;
    let b = w.submit(s);
    let lb = w.lease_only(W, b);
    w.start(&lb, W).unwrap();
    w.advance(5_000);
    w.renew(&lb, LEASE).unwrap();
    assert_eq!(w.fail(&lb, W, true).unwrap().state, TaskState::Failed);
    assert_eq!(w.holder(NS, K), None);
}

#[test]
fn a_cancel_after_the_total_deadline_finds_the_task_failed_with_or_without_a_sweep() {
    // Deadlines are judged at apply time (contract section 0): the answer must not depend on
    // whether the leader's sweep happened to run first.
    for swept in [false, true] {
        let mut w = World::new();
        let mut s = spec(Q1, "waiting", K);
        s.ttl_ms = 5_000;
        let waiting = w.submit(s);
        let mut s = spec(Q2, "backing-off", L);
        s.ttl_ms = 5_000;
        let backing_off = w.submit(s);
        let lb = w.lease_from(W, &[Q2], 1);
        assert_eq!(ids(&lb), vec![backing_off]);
        w.start(&lb[0], W).unwrap();
        w.advance(4_800);
        assert_eq!(w.fail(&lb[0], W, true).unwrap().state, TaskState::RetryWait);
        w.advance(200);
        if swept {
            w.sweep();
        }
        for id in [waiting, backing_off] {
            assert_eq!(w.cancel(id), Err(Refusal::AlreadySettled), "swept: {swept}");
            let task = w.task(id);
            assert_eq!(task.state, TaskState::Failed, "swept: {swept}");
            assert_eq!(task.last_error, "the task's total deadline passed");
        }
    }
}

#[test]
fn the_attempt_history_keeps_every_attempt_with_its_token() {
    let mut w = World::new();
    let mut s = spec(Q1, "a", K);
    s.max_attempts = 3;
    let a = w.submit(s);
    let other = w.submit(spec(Q2, "other", K));

    // 1: leased, expired before start.
    let l1 = w.lease_only(W, a);
    w.advance(LEASE as u64);
    w.sweep();
    // 2: started, failed retryably.
    let l2 = w.lease_only(W2, a);
    w.start(&l2, W2).unwrap();
    w.advance(100);
    w.fail(&l2, W2, true).unwrap();
    // Another task on the key in between.
    let lo = w.lease_only(W, other);
    w.finish(&lo);
    w.advance(FIRST_BACKOFF);
    // 3: started, lease ran out: retried.
    let l3 = w.lease_only(W, a);
    w.start(&l3, W).unwrap();
    w.advance(LEASE as u64);
    w.sweep();
    w.advance(FIRST_BACKOFF * 2);
    // 4: started, unknown effect.
    let l4 = w.lease_only(W2, a);
    w.start(&l4, W2).unwrap();
    w.unknown(&l4, W2).unwrap();

    let task = w.task(a);
    assert_eq!(task.state, TaskState::NeedsReview);
    assert_eq!(
        task.attempts.iter().map(|a| a.number).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    assert_eq!(
        task.attempts
            .iter()
            .map(|a| a.worker.as_str())
            .collect::<Vec<_>>(),
        vec![W, W2, W, W2]
    );
    assert_eq!(
        outcomes(&task),
        vec![
            AttemptOutcome::Expired,
            AttemptOutcome::Failed,
            AttemptOutcome::Expired,
            AttemptOutcome::Unknown
        ]
    );
    assert_eq!(tokens(&task), vec![l1.token, l2.token, l3.token, l4.token]);
    assert_eq!(tokens(&task), vec![Some(1), Some(2), Some(4), Some(5)]);
    assert_eq!(task.started_attempts(), 3);
    assert!(task.attempts.iter().all(|a| a.ended_at_ms.is_some()));
    assert_eq!(w.highest(NS, K), 5);
}

/// Contract §0 "store clock": a leader whose wall clock is behind the store clock (a new leader
/// after a failover) shortens neither a task's total deadline nor a lease or its renewal, and its
/// sweep ends no live lease.
#[test]
fn deadlines_use_the_store_clock_not_a_lagging_leader_stamp() {
    let mut w = World::new();
    w.advance(5_000);
    w.sweep();
    let store_clock = w.now;
    w.now = T0 + 1_000;
    let id = w.submit(spec(Q1, "late-leader", K));
    assert_eq!(w.task(id).deadline_ms, store_clock + 600_000);
    let a = w.lease_only(W, id);
    assert_eq!(a.lease_until_ms, store_clock + LEASE as u64);
    let renewed = w.renew(&a, 2 * LEASE).unwrap();
    assert_eq!(
        renewed.attempts[0].lease_until_ms,
        store_clock + 2 * LEASE as u64
    );
    // Past the lease by the lagging clock's reckoning, not by the store's: nothing ends.
    w.now = store_clock + 2 * LEASE as u64 - 1;
    assert_eq!(w.sweep(), 0);
    assert_eq!(w.holder(NS, K), Some(id));
}

/// The total deadline counts while a task is leased: past it, the attempt never starts (its
/// worker hears `LEASE_LOST` and runs nothing), and the task fails as when the lease runs out
/// unstarted.
#[test]
fn an_attempt_never_starts_after_the_total_deadline() {
    let mut w = World::new();
    let mut s = spec(Q1, "a", K);
    s.ttl_ms = 5_000;
    let a = w.submit(s);
    let la = w.lease_only(W, a);
    w.advance(5_000);
    assert_eq!(w.start(&la, W), Err(Refusal::LeaseLost));
    let task = w.task(a);
    assert_eq!(task.state, TaskState::Failed);
    assert_eq!(outcomes(&task), vec![AttemptOutcome::Expired]);
    assert_eq!(w.holder(NS, K), None, "the key is free");
}

/// A back-off that ends past the total deadline fails the task; it is never requeued and
/// announced leasable first.
#[test]
fn a_back_off_ending_past_the_total_deadline_fails_without_a_requeue() {
    let mut w = World::new();
    let a = backing_off_near_its_deadline(&mut w);
    w.advance(FIRST_BACKOFF);
    let sweep = Envelope {
        stamp: Stamp {
            now_ms: w.now,
            entropy: 0,
        },
        origin: None,
        command: Command::Sweep,
    };
    let (_, changes) = apply_with_changes(&mut w.state, &sweep);
    let kinds: Vec<ChangeKind> = changes.iter().map(|c| c.kind).collect();
    assert!(
        !kinds.contains(&ChangeKind::Requeued) && !kinds.contains(&ChangeKind::Leasable),
        "{kinds:?}"
    );
    assert!(kinds.contains(&ChangeKind::Failed), "{kinds:?}");
    assert_eq!(w.task(a).state, TaskState::Failed);
}
