//! Property tests for the keyed-concurrency task queue (seed 004, contract.md section 5): random
//! command sequences over 2 namespaces, 3 queues, 3 concurrency keys plus "no key", a worker with
//! concurrency-key support and one without, a wobbling leader clock, exact client retries and
//! interleaved sweeps. After every step the invariants below must hold:
//!
//! - never two active attempts on one `(namespace, key)`, and the permit holder is exactly the
//!   task whose last attempt is active;
//! - tokens per key are non-zero and strictly increase in the order they are handed out;
//! - every submitted task exists exactly once, replays create nothing, conflicts change nothing;
//! - each task's state agrees with its attempts (at most one active attempt, the last; active iff
//!   LEASED or RUNNING), and its history only grows;
//! - a lease that hands out fewer tasks than its limit left nothing leasable behind (busy keys
//!   never block free ones), and a worker without support never gets a keyed task;
//! - after a sweep nothing overdue is left;
//! - a lease hands out exactly the oldest leasable tasks (checked against a full scan), and the
//!   indexes kept up step by step equal those rebuilt from a snapshot.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use baton_statemachine::queue::{
    self, Assignment, Attempt, AttemptOutcome, Task, TaskFilter, TaskQueue, TaskSpec, TaskState,
    MAX_LEASE_SWEEP,
};
use baton_statemachine::{
    apply, Command, Envelope, Origin, Refusal, Reply, Response, Stamp, State,
};
use proptest::prelude::*;
use proptest::sample::Index;

const T0: u64 = 1_000_000;
/// `(queue, namespace)`.
const QUEUES: [(&str, &str); 3] = [("q1", "ns1"), ("q2", "ns1"), ("qx", "ns2")];
/// Concurrency keys; the last one is "none".
const KEYS: [&str; 4] = ["k1", "k2", "k3", ""];
/// `(worker, supports concurrency keys)`.
const WORKERS: [(&str, bool); 2] = [("w", true), ("old", false)];
const LEASE_TTLS: [i64; 3] = [2_000, 5_000, 15_000];
const TASK_TTLS: [i64; 4] = [3_000, 20_000, 120_000, 600_000];

#[derive(Debug, Clone)]
enum Op {
    Submit {
        queue: usize,
        idem: usize,
        key: usize,
        payload: u8,
        max_attempts: u32,
        ttl: usize,
    },
    /// Submit an earlier submission again: unchanged (a replay) or with one field changed.
    Resubmit {
        pick: Index,
        change: u8,
    },
    Lease {
        worker: usize,
        /// Bit set over [`QUEUES`]; 0 = every queue.
        queues: u8,
        limit: u32,
        ttl: usize,
    },
    Start(Target),
    Renew(Target, usize),
    Complete(Target),
    Fail(Target, bool),
    Unknown(Target),
    Cancel(Index),
    Sweep,
    /// The client resends its previous request with the same origin.
    Retry,
}

#[derive(Debug, Clone)]
struct Target {
    /// Pick among the tasks with an active attempt (when there are any).
    active: bool,
    task: Index,
    /// 0: the last attempt; 1: the one before; 2: the one after.
    attempt: u8,
    /// false: the last attempt's worker; true: the other worker.
    other_worker: bool,
}

fn target() -> impl Strategy<Value = Target> {
    (
        prop::bool::weighted(0.85),
        any::<Index>(),
        prop_oneof![8 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
        prop::bool::weighted(0.1),
    )
        .prop_map(|(active, task, attempt, other_worker)| Target {
            active,
            task,
            attempt,
            other_worker,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, 0..12usize, 0..4usize, 0..2u8, 1..=3u32, 0..TASK_TTLS.len()).prop_map(
            |(queue, idem, key, payload, max_attempts, ttl)| Op::Submit {
                queue,
                idem,
                key,
                payload,
                max_attempts,
                ttl
            }
        ),
        2 => (any::<Index>(), 0..5u8).prop_map(|(pick, change)| Op::Resubmit { pick, change }),
        8 => (
            prop_oneof![3 => Just(0usize), 1 => Just(1usize)],
            0..8u8,
            1..=4u32,
            0..LEASE_TTLS.len()
        )
            .prop_map(
            |(worker, queues, limit, ttl)| Op::Lease {
                worker,
                queues,
                limit,
                ttl
            }
        ),
        6 => target().prop_map(Op::Start),
        2 => (target(), 0..LEASE_TTLS.len()).prop_map(|(t, ttl)| Op::Renew(t, ttl)),
        5 => target().prop_map(Op::Complete),
        3 => (target(), any::<bool>()).prop_map(|(t, r)| Op::Fail(t, r)),
        1 => target().prop_map(Op::Unknown),
        1 => any::<Index>().prop_map(Op::Cancel),
        2 => Just(Op::Sweep),
        1 => Just(Op::Retry),
    ]
}

/// A clock step: mostly forward, sometimes zero, sometimes a stamp behind the store clock.
fn step() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(0i64),
        8 => 1..600i64,
        2 => 600..3_000i64,
        1 => 3_000..20_000i64,
        1 => -3_000..0i64,
    ]
}

struct Harness {
    state: State,
    wall: u64,
    seq: u64,
    /// `(namespace, idempotency key)` -> (task id, spec).
    submissions: BTreeMap<(String, String), (u64, TaskSpec)>,
    /// The last token handed out per `(namespace, key)`.
    last_token: BTreeMap<(String, String), u64>,
    /// Every task as it was after the previous step.
    previous: BTreeMap<u64, Task>,
    /// The previous client request and its response.
    last_request: Option<(Envelope, Response)>,
    /// Every entry applied and its answer, for a follower to replay.
    log: Vec<(Envelope, Response)>,
}

impl Harness {
    fn new() -> Self {
        let mut h = Harness {
            state: State::default(),
            wall: T0,
            seq: 0,
            submissions: BTreeMap::new(),
            last_token: BTreeMap::new(),
            previous: BTreeMap::new(),
            last_request: None,
            log: Vec::new(),
        };
        for (name, namespace) in QUEUES {
            let command = queue::Command::CreateQueue(queue::Queue {
                name: name.into(),
                namespace: namespace.into(),
            });
            assert!(h.send(command).is_ok());
        }
        for (id, concurrency_keys) in WORKERS {
            let command = queue::Command::RegisterWorker(queue::Worker {
                id: id.into(),
                concurrency_keys,
            });
            assert!(h.send(command).is_ok());
        }
        h
    }

    /// Applies `envelope` and logs it with its answer.
    fn apply(&mut self, envelope: Envelope) -> Response {
        let response = apply(&mut self.state, &envelope);
        self.log.push((envelope, response.clone()));
        response
    }

    /// A follower applying the same log answers every entry alike and ends in the same state:
    /// nothing in apply depends on anything but the state and the entry.
    fn replay_on_a_follower(&self) {
        let mut follower = State::default();
        for (envelope, response) in &self.log {
            assert_eq!(&apply(&mut follower, envelope), response);
        }
        assert_eq!(follower, self.state);
    }

    fn q(&self) -> &TaskQueue {
        &self.state.queue
    }

    fn clock(&self) -> u64 {
        self.state.clock_ms
    }

    fn send(&mut self, command: queue::Command) -> Result<Reply, Refusal> {
        self.seq += 1;
        let envelope = Envelope {
            stamp: Stamp {
                now_ms: self.wall,
                entropy: u128::from(self.seq),
            },
            origin: Some(Origin {
                client_id: 1,
                seq: self.seq,
                acked_below: 0,
            }),
            command: Command::Queue(command),
        };
        let response = self.apply(envelope.clone());
        self.last_request = Some((envelope, response.clone()));
        match response {
            Response::Answer(result) => result,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn task_ids(&self) -> Vec<u64> {
        self.q()
            .list(&TaskFilter::default())
            .map(|t| t.id)
            .collect()
    }

    fn pick_task(&self, index: &Index) -> Option<Task> {
        let ids = self.task_ids();
        if ids.is_empty() {
            return None;
        }
        self.q().get(ids[index.index(ids.len())]).cloned()
    }

    /// A task with an active attempt when `active` and there is one, otherwise any task.
    fn pick_target(&self, active: bool, index: &Index) -> Option<Task> {
        let live: Vec<u64> = self
            .q()
            .list(&TaskFilter::default())
            .filter(|t| t.state.is_active())
            .map(|t| t.id)
            .collect();
        if active && !live.is_empty() {
            return self.q().get(live[index.index(live.len())]).cloned();
        }
        self.pick_task(index)
    }

    fn step(&mut self, delta: i64, op: &Op) {
        self.wall = self.wall.saturating_add_signed(delta);
        match op {
            Op::Submit {
                queue,
                idem,
                key,
                payload,
                max_attempts,
                ttl,
            } => {
                let (name, namespace) = QUEUES[*queue];
                let spec = TaskSpec {
                    queue: name.into(),
                    // Idempotency keys never collide across namespaces, so the test holds
                    // whatever scope the store gives them.
                    idempotency_key: format!("{namespace}/i{idem}"),
                    handler: "object.update".into(),
                    handler_version: "v1".into(),
                    payload_version: "v1".into(),
                    payload: vec![*payload],
                    concurrency_key: KEYS[*key].into(),
                    business_key: String::new(),
                    max_attempts: *max_attempts,
                    ttl_ms: TASK_TTLS[*ttl],
                };
                self.submit(spec);
            }
            Op::Resubmit { pick, change } => {
                if self.submissions.is_empty() {
                    return;
                }
                let n = pick.index(self.submissions.len());
                let (_, (_, original)) = self.submissions.iter().nth(n).unwrap();
                let mut spec = original.clone();
                match change {
                    0 | 1 => {}
                    2 => {
                        let i = KEYS
                            .iter()
                            .position(|k| *k == spec.concurrency_key)
                            .unwrap();
                        spec.concurrency_key = KEYS[(i + 1) % KEYS.len()].into();
                    }
                    3 => {
                        // Another queue of the same namespace where there is one.
                        spec.queue = match spec.queue.as_str() {
                            "q1" => "q2".into(),
                            "q2" => "q1".into(),
                            _ => "qx".into(),
                        };
                    }
                    _ => spec.payload.push(9),
                }
                self.submit(spec);
            }
            Op::Lease {
                worker,
                queues,
                limit,
                ttl,
            } => self.lease(*worker, *queues, *limit, LEASE_TTLS[*ttl]),
            Op::Start(t) => self.report(t, |id, attempt, worker| queue::Command::Start {
                task_id: id,
                attempt,
                worker,
            }),
            Op::Renew(t, ttl) => {
                let ttl = LEASE_TTLS[*ttl];
                self.report(t, move |id, attempt, worker| queue::Command::Renew {
                    task_id: id,
                    attempt,
                    worker,
                    lease_ttl_ms: ttl,
                })
            }
            Op::Complete(t) => self.report(t, |id, attempt, worker| queue::Command::Complete {
                task_id: id,
                attempt,
                worker,
                result: b"ok".to_vec(),
            }),
            Op::Fail(t, retryable) => {
                let retryable = *retryable;
                self.report(t, move |id, attempt, worker| queue::Command::Fail {
                    task_id: id,
                    attempt,
                    worker,
                    error: "boom".into(),
                    retryable,
                })
            }
            Op::Unknown(t) => self.report(t, |id, attempt, worker| queue::Command::ReportUnknown {
                task_id: id,
                attempt,
                worker,
                note: "unknown".into(),
            }),
            Op::Cancel(index) => {
                if let Some(task) = self.pick_task(index) {
                    let before = self.q().clone();
                    let result = self.send(queue::Command::Cancel { task_id: task.id });
                    let expected = match judged_state(&task, self.clock()) {
                        TaskState::Waiting | TaskState::RetryWait | TaskState::Leased => Ok(()),
                        TaskState::Running => Err(Refusal::AlreadyStarted),
                        _ => Err(Refusal::AlreadySettled),
                    };
                    assert_eq!(
                        result.as_ref().map(|_| ()).map_err(Clone::clone),
                        expected,
                        "cancel of {task:?} at {}",
                        self.clock()
                    );
                    self.judge_task_command(&before, &task, false, false, result, |t| {
                        t.state == TaskState::Cancelled
                            && t.attempts
                                .last()
                                .is_none_or(|a| a.outcome != AttemptOutcome::Active)
                    });
                }
            }
            Op::Sweep => self.sweep(),
            Op::Retry => self.retry(),
        }
    }

    fn submit(&mut self, spec: TaskSpec) {
        let namespace = QUEUES
            .iter()
            .find(|(q, _)| *q == spec.queue)
            .unwrap()
            .1
            .to_string();
        let submission = (namespace.clone(), spec.idempotency_key.clone());
        let known = self.submissions.get(&submission).cloned();
        let before = self.q().clone();
        let count = self.task_ids().len();
        let result = self.send(queue::Command::Submit(spec.clone()));
        match (known, result) {
            (None, Ok(Reply::Submitted(receipt))) => {
                assert!(!receipt.replayed);
                let task = &receipt.task;
                assert!(before.get(task.id).is_none(), "a new id");
                assert_eq!(task.spec, spec);
                assert_eq!(task.namespace, namespace);
                assert_eq!(task.state, TaskState::Waiting);
                assert_eq!(task.deadline_ms, self.clock() + spec.ttl_ms as u64);
                assert_eq!(self.task_ids().len(), count + 1);
                self.submissions.insert(submission, (task.id, spec));
            }
            (Some((id, original)), Ok(Reply::Submitted(receipt))) => {
                assert_eq!(original, spec, "a replay only for the same content");
                assert!(receipt.replayed);
                assert_eq!(receipt.task.id, id);
                assert_eq!(self.q(), &before, "a replay creates nothing");
            }
            (Some((_, original)), Err(Refusal::IdempotencyConflict)) => {
                assert_ne!(original, spec, "a conflict only for different content");
                assert_eq!(self.q(), &before, "a conflict changes nothing");
            }
            (known, result) => panic!("submit {spec:?} (known: {known:?}) answered {result:?}"),
        }
    }

    fn lease(&mut self, worker: usize, mask: u8, limit: u32, ttl: i64) {
        let (worker, capable) = WORKERS[worker];
        let queues: Vec<String> = QUEUES
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, (q, _))| q.to_string())
            .collect();
        // The read-only probe the node asks before proposing a lease.
        let probe = self
            .q()
            .has_leasable(self.wall.max(self.clock()), worker, &queues);
        let before = self.q().clone();
        let result = self.send(queue::Command::Lease {
            worker: worker.into(),
            queues: queues.clone(),
            limit,
            lease_ttl_ms: ttl,
        });
        let Ok(Reply::Assignments(got)) = result else {
            panic!("lease answered {result:?}");
        };
        assert!(got.len() as u32 <= limit);
        let ids: Vec<u64> = got.iter().map(|a| a.task_id).collect();
        assert_eq!(
            ids,
            expected_lease(before.clone(), self.clock(), capable, &queues, limit),
            "the lease chose other tasks than the oldest leasable ones"
        );
        assert!(
            probe || got.is_empty(),
            "has_leasable said no, the lease found {got:?}"
        );
        let clock = self.clock();
        let mut batch_keys = BTreeSet::new();
        for a in &got {
            self.check_assignment(a, worker, capable, clock + ttl as u64, &queues);
            if !a.concurrency_key.is_empty() {
                assert!(
                    batch_keys.insert((a.namespace.clone(), a.concurrency_key.clone())),
                    "two tasks on one key in one batch"
                );
            }
        }
        // A lease fails at most MAX_LEASE_SWEEP candidates past their total deadline and stops
        // at the next; and a key whose oldest waiting task it failed so is free for the next
        // task only from the next lease (or sweep) on. Behind these the sweeper's work, not
        // head-of-line blocking.
        let asked = |task: &Task| queues.is_empty() || queues.contains(&task.spec.queue);
        let past_deadline_left = self.q().list(&TaskFilter::default()).any(|task| {
            task.state == TaskState::Waiting && task.deadline_ms <= clock && asked(task)
        });
        let past_deadline_failed = before.list(&TaskFilter::default()).any(|task| {
            task.state == TaskState::Waiting
                && asked(task)
                && self
                    .q()
                    .get(task.id)
                    .is_some_and(|t| t.state == TaskState::Failed)
        });
        if (got.len() as u32) < limit && !past_deadline_left && !past_deadline_failed {
            // Nothing leasable may be left behind in the queues asked for.
            for task in self.q().list(&TaskFilter::default()) {
                let asked = queues.is_empty() || queues.contains(&task.spec.queue);
                if !asked || task.state != TaskState::Waiting {
                    continue;
                }
                let key = &task.spec.concurrency_key;
                assert!(!key.is_empty(), "unkeyed task {} left behind", task.id);
                if capable {
                    assert!(
                        self.q().permit_holder(&task.namespace, key).is_some(),
                        "task {} on a free key left behind (head-of-line blocking)",
                        task.id
                    );
                }
            }
        }
    }

    fn check_assignment(
        &mut self,
        a: &Assignment,
        worker: &str,
        capable: bool,
        until: u64,
        queues: &[String],
    ) {
        let task = self.q().get(a.task_id).cloned().unwrap();
        assert!(queues.is_empty() || queues.contains(&task.spec.queue));
        assert_eq!(a.queue, task.spec.queue);
        assert_eq!(a.namespace, task.namespace);
        assert_eq!(a.concurrency_key, task.spec.concurrency_key);
        assert_eq!(a.payload, task.spec.payload);
        assert_eq!(a.lease_until_ms, until);
        assert_eq!(task.state, TaskState::Leased);
        let last = task.attempts.last().unwrap();
        assert_eq!(last.number, a.attempt);
        assert_eq!(last.worker, worker);
        assert_eq!(last.token, a.token);
        assert_eq!(last.outcome, AttemptOutcome::Active);
        // The task was waiting before: leasing never takes a running or finished task, nor one
        // whose back-off has not ended.
        if let Some(before) = self.previous.get(&a.task_id) {
            if let Some(at) = before.retry_at_ms {
                assert!(
                    at <= self.clock(),
                    "task {} leased during its back-off",
                    a.task_id
                );
            }
            assert!(
                matches!(before.state, TaskState::Waiting | TaskState::RetryWait)
                    || before
                        .active_attempt()
                        .is_some_and(|at| at.lease_until_ms <= self.clock()),
                "leased task {} was {:?}",
                a.task_id,
                before.state
            );
        }
        if a.concurrency_key.is_empty() {
            assert_eq!(a.token, None);
            return;
        }
        assert!(
            capable,
            "a worker without support got keyed task {}",
            a.task_id
        );
        let token = a.token.expect("a keyed assignment carries a token");
        assert_ne!(token, 0);
        let key = (a.namespace.clone(), a.concurrency_key.clone());
        let last_token = self.last_token.get(&key).copied().unwrap_or(0);
        assert!(
            token > last_token,
            "token {token} after {last_token} on {key:?}"
        );
        self.last_token.insert(key, token);
    }

    /// Sends a worker report about a picked task's (possibly wrong) attempt.
    fn report(&mut self, t: &Target, make: impl FnOnce(u64, u32, String) -> queue::Command) {
        let Some(task) = self.pick_target(t.active, &t.task) else {
            return;
        };
        let last = task.attempts.last().map_or(1, |a| a.number);
        let attempt = match t.attempt {
            0 => last,
            1 => last.saturating_sub(1),
            _ => last + 1,
        };
        let holder = task.attempts.last().map_or("w", |a| a.worker.as_str());
        let worker = if t.other_worker {
            WORKERS.iter().find(|(w, _)| *w != holder).unwrap().0
        } else {
            holder
        };
        let command = make(task.id, attempt, worker.to_string());
        let (recorded, retryable, renew_ttl) = match &command {
            queue::Command::Complete { .. } => (Some(AttemptOutcome::Succeeded), false, None),
            queue::Command::Fail { retryable, .. } => {
                (Some(AttemptOutcome::Failed), *retryable, None)
            }
            queue::Command::ReportUnknown { .. } => (Some(AttemptOutcome::Unknown), false, None),
            queue::Command::Renew { lease_ttl_ms, .. } => (None, false, Some(*lease_ttl_ms)),
            _ => (None, false, None),
        };
        let needs_start = matches!(
            command,
            queue::Command::Complete { .. } | queue::Command::ReportUnknown { .. }
        );
        let is_start = matches!(command, queue::Command::Start { .. });
        let before = self.q().clone();
        let result = self.send(command);
        let clock = self.clock();

        // What the answer must be: only the live attempt's own worker may report on it; a
        // result already recorded for that attempt is answered again; anything else lost it.
        let last = task.attempts.last();
        let same = |a: &&Attempt| a.number == attempt && a.worker == worker;
        let live = last
            .filter(same)
            .filter(|a| a.outcome == AttemptOutcome::Active && a.lease_until_ms > clock);
        let duplicate = last
            .filter(same)
            .is_some_and(|a| Some(a.outcome) == recorded);
        // Past the total deadline an attempt never starts: the task fails instead.
        let starts_too_late = is_start
            && live.is_some_and(|a| a.started_at_ms.is_none())
            && task.deadline_ms <= clock;
        let expected = match live {
            Some(a) if needs_start && a.started_at_ms.is_none() => Err(Refusal::NotStarted),
            Some(_) if starts_too_late => Err(Refusal::LeaseLost),
            Some(_) => Ok(()),
            None if duplicate => Ok(()),
            None => Err(Refusal::LeaseLost),
        };
        assert_eq!(
            result.as_ref().map(|_| ()).map_err(Clone::clone),
            expected,
            "task {} attempt {attempt} by {worker} at {clock}: {task:?}",
            task.id
        );
        if let (Some(was), Ok(_)) = (live, &result) {
            let now = self.q().get(task.id).unwrap();
            let current = now.attempts.last().unwrap();
            assert_eq!((current.number, current.token), (was.number, was.token));
            let expect = match (recorded, renew_ttl) {
                (Some(AttemptOutcome::Succeeded), _) => TaskState::Succeeded,
                (Some(AttemptOutcome::Unknown), _) => TaskState::NeedsReview,
                (Some(_), _) => {
                    let started = task.started_attempts();
                    if retryable && started < task.spec.max_attempts && task.deadline_ms > clock {
                        TaskState::RetryWait
                    } else {
                        TaskState::Failed
                    }
                }
                (None, Some(ttl)) => {
                    assert_eq!(current.lease_until_ms, clock + ttl as u64);
                    task.state
                }
                (None, None) => {
                    let at = was.started_at_ms.unwrap_or(clock);
                    assert_eq!(current.started_at_ms, Some(at), "a resume keeps the start");
                    TaskState::Running
                }
            };
            assert_eq!(now.state, expect);
            if recorded.is_some() {
                assert_eq!(Some(current.outcome), recorded);
                assert_eq!(current.ended_at_ms, Some(clock));
            }
        }
        self.judge_task_command(&before, &task, true, starts_too_late, result, |_| true);
    }

    /// A command about one task: success leaves the expected state (a worker's repeated report
    /// about an attempt that already ended is answered and changes nothing); a refusal changes
    /// nothing but the materialised expiry of the task's own overdue lease (or, for a start past
    /// the total deadline, `starts_too_late`, its failure).
    fn judge_task_command(
        &self,
        before: &TaskQueue,
        task: &Task,
        report: bool,
        starts_too_late: bool,
        result: Result<Reply, Refusal>,
        expect: impl Fn(&Task) -> bool,
    ) {
        match result {
            Ok(Reply::QueueTask(reply)) => {
                let now = self.q().get(task.id).unwrap();
                assert_eq!(&*reply, now, "the reply is the task as it stands");
                if !report || task.active_attempt().is_some() {
                    assert!(expect(now), "unexpected state {:?}", now.state);
                } else {
                    // A repeat of a result already recorded: answered, never applied twice.
                    assert_eq!(self.q(), before, "a duplicate result changed the queue");
                }
            }
            Ok(other) => panic!("answered {other:?}"),
            Err(refusal) => {
                assert!(
                    matches!(
                        refusal,
                        Refusal::LeaseLost
                            | Refusal::NotStarted
                            | Refusal::AlreadyStarted
                            | Refusal::AlreadySettled
                    ),
                    "unexpected refusal {refusal:?}"
                );
                let was = before.get(task.id).unwrap();
                let judged = if starts_too_late {
                    TaskState::Failed
                } else {
                    judged_state(was, self.clock())
                };
                if judged == was.state {
                    assert_eq!(self.q(), before, "a refused command changed the queue");
                    return;
                }
                // The only change allowed: the task's own overdue lease or deadline was
                // materialised.
                let now = self.q().get(task.id).unwrap();
                if now == was && !starts_too_late {
                    assert_eq!(self.q(), before, "a refused command changed the queue");
                    return;
                }
                assert_eq!(now.state, judged);
                if starts_too_late && !now.spec.concurrency_key.is_empty() {
                    let key = &now.spec.concurrency_key;
                    assert_eq!(self.q().permit_holder(&now.namespace, key), None);
                }
                assert_eq!(now.attempts.len(), was.attempts.len());
                if was.active_attempt().is_some() {
                    assert_eq!(
                        now.attempts.last().unwrap().outcome,
                        AttemptOutcome::Expired
                    );
                }
                for other in before.list(&TaskFilter::default()) {
                    if other.id != task.id {
                        assert_eq!(Some(other), self.q().get(other.id));
                    }
                }
            }
        }
    }

    fn sweep(&mut self) {
        let envelope = Envelope {
            stamp: Stamp {
                now_ms: self.wall,
                entropy: 0,
            },
            origin: None,
            command: Command::Sweep,
        };
        let response = self.apply(envelope);
        assert!(matches!(
            response,
            Response::Answer(Ok(Reply::Swept { .. }))
        ));
        let clock = self.clock();
        assert!(
            !self.q().has_overdue(clock),
            "a sweep leaves nothing overdue"
        );
        for task in self.q().list(&TaskFilter::default()) {
            if let Some(a) = task.active_attempt() {
                assert!(
                    a.lease_until_ms > clock,
                    "overdue lease on task {}",
                    task.id
                );
            }
            if task.state == TaskState::RetryWait {
                assert!(task.retry_at_ms.unwrap() > clock);
            }
            if matches!(task.state, TaskState::Waiting | TaskState::RetryWait) {
                assert!(
                    task.deadline_ms > clock,
                    "overdue task {} still open",
                    task.id
                );
            }
        }
    }

    fn retry(&mut self) {
        let Some((envelope, first)) = self.last_request.clone() else {
            return;
        };
        let before = self.state.clone();
        let again = self.apply(envelope);
        assert_eq!(again, first, "a retry gets the first answer");
        assert_eq!(self.state, before, "a retry changes nothing");
    }

    /// The invariants that hold after every step.
    fn check(&mut self) {
        let q = self.q().clone();
        let all = TaskFilter::default();

        // The indexes kept up step by step equal the ones rebuilt when a snapshot is read back.
        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&q, config).unwrap();
        let (read_back, _): (TaskQueue, usize) =
            bincode::serde::decode_from_slice(&bytes, config).unwrap();
        assert_eq!(
            read_back, q,
            "the incremental indexes differ from a rebuild"
        );
        let tasks: Vec<&Task> = q.list(&all).collect();

        // Every submission exists exactly once, with its content.
        let ids: BTreeSet<u64> = tasks.iter().map(|t| t.id).collect();
        assert_eq!(ids.len(), tasks.len());
        let submitted: BTreeSet<u64> = self.submissions.values().map(|(id, _)| *id).collect();
        assert_eq!(ids, submitted, "tasks lost or invented");
        for (id, spec) in self.submissions.values() {
            assert_eq!(&q.get(*id).unwrap().spec, spec);
        }

        let mut active_per_key: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
        let mut tokens_per_key: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
        let mut active = 0;
        for task in &tasks {
            let namespace = QUEUES
                .iter()
                .find(|(q, _)| *q == task.spec.queue)
                .unwrap()
                .1;
            assert_eq!(task.namespace, namespace);
            let keyed = !task.spec.concurrency_key.is_empty();
            let key = (task.namespace.clone(), task.spec.concurrency_key.clone());

            // The history: numbered 1..n, only the last may be active.
            for (i, a) in task.attempts.iter().enumerate() {
                assert_eq!(a.number as usize, i + 1);
                let last = i + 1 == task.attempts.len();
                if a.outcome == AttemptOutcome::Active {
                    assert!(last, "task {}: an earlier attempt is still active", task.id);
                    assert!(a.ended_at_ms.is_none());
                } else {
                    assert!(a.ended_at_ms.is_some());
                }
                if keyed {
                    let token = a.token.expect("a keyed attempt has a token");
                    assert_ne!(token, 0);
                    tokens_per_key.entry(key.clone()).or_default().push(token);
                    assert!(WORKERS.iter().any(|(w, c)| *w == a.worker && *c));
                } else {
                    assert_eq!(a.token, None);
                }
            }
            let tokens: Vec<u64> = task.attempts.iter().filter_map(|a| a.token).collect();
            assert!(tokens.windows(2).all(|w| w[0] < w[1]), "task {}", task.id);

            // The state agrees with the history.
            let current = task.active_attempt();
            assert_eq!(
                current.is_some(),
                task.state.is_active(),
                "task {}",
                task.id
            );
            match task.state {
                TaskState::Leased => assert!(current.unwrap().started_at_ms.is_none()),
                TaskState::Running => assert!(current.unwrap().started_at_ms.is_some()),
                _ => {}
            }
            assert_eq!(
                task.retry_at_ms.is_some(),
                task.state == TaskState::RetryWait
            );
            assert!(task.started_attempts() <= task.spec.max_attempts);
            if task.state == TaskState::Succeeded {
                assert_eq!(
                    task.attempts.last().unwrap().outcome,
                    AttemptOutcome::Succeeded
                );
            }
            if task.state == TaskState::NeedsReview {
                let last = task.attempts.last().unwrap();
                assert!(
                    last.started_at_ms.is_some(),
                    "review only for a started attempt"
                );
            }
            if current.is_some() {
                active += 1;
                if keyed {
                    active_per_key.entry(key.clone()).or_default().push(task.id);
                }
            }
            // The history only grows; a finished task never changes again.
            if let Some(was) = self.previous.get(&task.id) {
                assert!(task.attempts.len() >= was.attempts.len());
                for (old, new) in was.attempts.iter().zip(&task.attempts) {
                    assert_eq!(
                        (old.number, &old.worker, old.token, old.leased_at_ms),
                        (new.number, &new.worker, new.token, new.leased_at_ms)
                    );
                    if old.outcome != AttemptOutcome::Active {
                        assert_eq!(old, new, "an ended attempt changed");
                    }
                    if old.started_at_ms.is_some() {
                        assert_eq!(old.started_at_ms, new.started_at_ms);
                    }
                }
                if was.state.is_terminal() {
                    assert_eq!(was, *task, "a finished task changed");
                }
            }
        }
        assert_eq!(q.active_leases(), active);

        // One active attempt per (namespace, key), and it is the permit's holder.
        for (namespace, key) in every_key() {
            let k = (namespace.to_string(), key.to_string());
            let holders = active_per_key.get(&k).cloned().unwrap_or_default();
            assert!(
                holders.len() <= 1,
                "two active attempts on {k:?}: {holders:?}"
            );
            assert_eq!(
                q.permit_holder(namespace, key),
                holders.first().copied(),
                "{k:?}"
            );
            let highest = q.highest_token(namespace, key);
            assert_eq!(
                highest,
                self.last_token.get(&k).copied().unwrap_or(0),
                "{k:?}"
            );
            let mut tokens = tokens_per_key.get(&k).cloned().unwrap_or_default();
            let n = tokens.len();
            tokens.sort_unstable();
            tokens.dedup();
            assert_eq!(tokens.len(), n, "a token issued twice on {k:?}");
            assert!(tokens.last().is_none_or(|t| *t <= highest));
        }

        self.previous = tasks.iter().map(|t| (t.id, (*t).clone())).collect();
    }
}

/// The state a task is in at `clock` once its overdue lease and total deadline are judged, as
/// every command must see it whether or not a sweep materialised them.
/// What a lease at `clock` must hand out, worked out the slow way: every expiry due is
/// materialised first, then the waiting tasks of the queues asked for are taken oldest first,
/// passing over keyed tasks for a worker without support, keys held or out of tokens, and a key
/// this lease already took, until `limit`.
fn expected_lease(
    mut q: TaskQueue,
    clock: u64,
    capable: bool,
    queues: &[String],
    limit: u32,
) -> Vec<u64> {
    // A lease first materialises a few due expiries of each kind, the rest is the sweeper's.
    q.sweep_first(clock, MAX_LEASE_SWEEP, MAX_LEASE_SWEEP, MAX_LEASE_SWEEP);
    let waiting = TaskFilter {
        state: Some(TaskState::Waiting),
        ..TaskFilter::default()
    };
    // Its candidates: the waiting tasks without a key, and of each free key's tasks in a queue
    // the oldest, in id order.
    let mut heads = BTreeSet::new();
    let mut keys_taken = BTreeSet::new();
    let mut past_deadline = 0;
    let mut chosen = Vec::new();
    for task in q.list(&waiting) {
        if chosen.len() as u32 == limit {
            break;
        }
        if !queues.is_empty() && !queues.contains(&task.spec.queue) {
            continue;
        }
        let key = &task.spec.concurrency_key;
        let namespaced = (task.namespace.clone(), key.clone());
        if !key.is_empty()
            && (!capable
                || q.permit_holder(&task.namespace, key).is_some()
                || !heads.insert((namespaced.clone(), task.spec.queue.clone())))
        {
            continue;
        }
        // A candidate past its total deadline is failed, not leased, a few per lease.
        if task.deadline_ms <= clock {
            if past_deadline == MAX_LEASE_SWEEP {
                break;
            }
            past_deadline += 1;
            continue;
        }
        let free = key.is_empty()
            || (!keys_taken.contains(&namespaced)
                && q.highest_token(&task.namespace, key) < u64::MAX
                && keys_taken.insert(namespaced));
        if free {
            chosen.push(task.id);
        }
    }
    chosen
}

fn judged_state(task: &Task, clock: u64) -> TaskState {
    let out_of_time = task.deadline_ms <= clock;
    let mut state = task.state;
    if let Some(current) = task.active_attempt() {
        if current.lease_until_ms <= clock {
            state = match (current.started_at_ms.is_some(), out_of_time) {
                (false, false) => TaskState::Waiting,
                (false, true) => TaskState::Failed,
                (true, false) if task.started_attempts() < task.spec.max_attempts => {
                    TaskState::RetryWait
                }
                (true, _) => TaskState::NeedsReview,
            };
        }
    }
    if out_of_time && matches!(state, TaskState::Waiting | TaskState::RetryWait) {
        state = TaskState::Failed;
    }
    state
}

fn every_key() -> impl Iterator<Item = (&'static str, &'static str)> {
    ["ns1", "ns2"]
        .into_iter()
        .flat_map(|ns| KEYS[..3].iter().map(move |k| (ns, *k)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn the_queues_invariants_hold_after_every_step(
        ops in prop::collection::vec((step(), op()), 1..=80)
    ) {
        let mut h = Harness::new();
        for (delta, op) in &ops {
            h.step(*delta, op);
            h.check();
        }
        h.replay_on_a_follower();
    }
}
