//! Property tests for the side-effect gate, the fenced sink, the checkpoint CAS and the task
//! board: random command sequences (3 action keys over 2 resources, 3 tasks, 2 sink resources,
//! 2 checkpoint runs) with a wobbling leader clock and interleaved sweeps, each applied through
//! `apply` and mirrored by a small reference model written from the contract. After every step the
//! store must agree with the model, and in particular:
//!
//! - fences per resource strictly increase across grants;
//! - a key whose intent expired unresolved is never granted again until it is resolved (it reads
//!   uncertain);
//! - a sink write with a fence below the seen fence never changes the stored value;
//! - a run's checkpoint seq never decreases;
//! - board fences per task strictly increase and a task has at most one live lease.
#![allow(clippy::unwrap_used)]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use baton_statemachine::board::{self, check, BoardProblemCode, TaskSpec, TaskState};
use baton_statemachine::effect::{
    self, Action, EffectLease, KeyStatus, Outcome, Resolution, Resolved, RetrySafety,
};
use baton_statemachine::{
    apply, checkpoint, is_overdue, sink, Command, Envelope, Origin, Refusal, Reply, Response,
    Stamp, State,
};
use proptest::prelude::*;
use proptest::sample::Index;

const T0: u64 = 1_000_000;
/// Action keys, their resources and retry safety.
const KEYS: [(&str, &str, RetrySafety); 3] = [
    ("a", "r1", RetrySafety::Safe),
    ("b", "r1", RetrySafety::Unsafe),
    ("c", "r2", RetrySafety::Safe),
];
const SINKS: [&str; 2] = ["s1", "s2"];
const RUNS: [&str; 2] = ["x", "y"];
/// Tasks and their dependencies: t3 waits for t1.
const TASKS: [(&str, &[&str]); 3] = [("t1", &[]), ("t2", &[]), ("t3", &["t1"])];

#[derive(Debug, Clone, Copy)]
enum Holder {
    Complete,
    Release,
    Abandon,
    Renew,
    MarkUncertain,
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        key: usize,
        ttl_ms: i64,
    },
    /// A holder action on `key` presenting some lease ever granted (possibly another key's).
    Holder {
        kind: Holder,
        key: usize,
        lease: Index,
        ttl_ms: i64,
    },
    BeginReconcile {
        key: usize,
        ttl_ms: i64,
    },
    Resolve {
        key: usize,
        happened: bool,
        force: bool,
    },
    Write {
        sink: usize,
        fence: u64,
        value: u8,
    },
    Save {
        run: usize,
        seq: u64,
        data: u8,
    },
    Claim {
        task: usize,
        ttl_ms: i64,
    },
    /// Release (0), complete (1) or renew (2) a task with some token ever minted, or a bogus one.
    BoardHolder {
        kind: u8,
        task: usize,
        token: Option<Index>,
        ttl_ms: i64,
    },
    Sweep,
}

#[derive(Debug, Clone)]
struct Step {
    /// Leader stamp relative to the store clock; negative = a leader behind the store clock.
    dt_ms: i64,
    op: Op,
}

fn holder_kind() -> impl Strategy<Value = Holder> {
    prop_oneof![
        Just(Holder::Complete),
        Just(Holder::Release),
        Just(Holder::Abandon),
        Just(Holder::Renew),
        Just(Holder::MarkUncertain),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    let ttl = 1i64..400;
    prop_oneof![
        6 => (key.clone(), ttl.clone()).prop_map(|(key, ttl_ms)| Op::Acquire { key, ttl_ms }),
        8 => (holder_kind(), key.clone(), any::<Index>(), ttl.clone())
            .prop_map(|(kind, key, lease, ttl_ms)| Op::Holder { kind, key, lease, ttl_ms }),
        2 => (key.clone(), ttl.clone()).prop_map(|(key, ttl_ms)| Op::BeginReconcile { key, ttl_ms }),
        3 => (key, any::<bool>(), any::<bool>())
            .prop_map(|(key, happened, force)| Op::Resolve { key, happened, force }),
        3 => (0..SINKS.len(), 1u64..8, any::<u8>())
            .prop_map(|(sink, fence, value)| Op::Write { sink, fence, value }),
        3 => (0..RUNS.len(), 0u64..8, any::<u8>())
            .prop_map(|(run, seq, data)| Op::Save { run, seq, data }),
        4 => (0..TASKS.len(), ttl.clone()).prop_map(|(task, ttl_ms)| Op::Claim { task, ttl_ms }),
        4 => (0u8..3, 0..TASKS.len(), prop_oneof![4 => any::<Index>().prop_map(Some), 1 => Just(None)], ttl)
            .prop_map(|(kind, task, token, ttl_ms)| Op::BoardHolder { kind, task, token, ttl_ms }),
        2 => Just(Op::Sweep),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (prop_oneof![1 => -300i64..0, 6 => 0i64..300], op()).prop_map(|(dt_ms, op)| Step { dt_ms, op })
}

fn action(key: usize) -> Action {
    let (key, resource, safety) = KEYS[key];
    Action {
        key: key.into(),
        resource: resource.into(),
        safety,
    }
}

/// The model's view of one action key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyModel {
    Idle,
    InProgress { until: u64 },
    Uncertain,
    Completed(String),
}

/// The model's view of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TaskModel {
    Open,
    Claimed {
        token: String,
        fence: u64,
        until: u64,
    },
    Done,
}

#[derive(Default)]
struct Model {
    clock: u64,
    keys: BTreeMap<&'static str, KeyModel>,
    /// The key's latest attempt (fence, holder), as the three-way check sees it.
    attempts: BTreeMap<&'static str, (u64, String)>,
    /// Keys whose intent ran out while nobody resolved them.
    expired_unresolved: BTreeSet<&'static str>,
    /// Resource -> (holder, until) of its hold.
    holds: BTreeMap<&'static str, (String, u64)>,
    max_fence: BTreeMap<&'static str, u64>,
    leases: Vec<EffectLease>,
    sink: BTreeMap<&'static str, (u64, Vec<u8>, u64)>,
    checkpoints: BTreeMap<&'static str, u64>,
    tasks: BTreeMap<&'static str, TaskModel>,
    task_fence: BTreeMap<&'static str, u64>,
    tokens: Vec<String>,
}

impl Model {
    fn new() -> Self {
        let mut model = Model {
            clock: T0,
            ..Model::default()
        };
        for (id, _) in TASKS {
            model.tasks.insert(id, TaskModel::Open);
        }
        model
    }

    /// Lazy expiry as the contract defines it, at the new store clock.
    fn advance(&mut self, clock: u64) {
        self.clock = clock;
        for (key, status) in self.keys.iter_mut() {
            if let KeyModel::InProgress { until } = status {
                if is_overdue(*until, clock) {
                    *status = KeyModel::Uncertain;
                    self.expired_unresolved.insert(key);
                }
            }
        }
        self.holds
            .retain(|_, (_, until)| !is_overdue(*until, clock));
        for task in self.tasks.values_mut() {
            if let TaskModel::Claimed { until, .. } = task {
                if is_overdue(*until, clock) {
                    *task = TaskModel::Open;
                }
            }
        }
    }

    /// The first failure of the three-way check, in the store's order: resource, fence, holder.
    fn three_way(&self, act: &Action, lease: &EffectLease) -> Result<(), Refusal> {
        let key = key_name(&act.key);
        if !self.keys.contains_key(key) {
            return Err(Refusal::UnknownAction);
        }
        if lease.resource != act.resource {
            return Err(Refusal::ResourceMismatch);
        }
        let latest = self
            .max_fence
            .get(lease.resource.as_str())
            .copied()
            .unwrap_or(0);
        if lease.fence != latest {
            return Err(Refusal::FenceStale);
        }
        match self.attempts.get(key) {
            Some((fence, holder)) if *fence == lease.fence && *holder == lease.holder => {}
            _ => return Err(Refusal::NotHolder),
        }
        Ok(())
    }

    /// A release passes the three-way check, or holds the resource for this key although the
    /// attempt is gone (an uncertain key resolved while its hold was kept).
    fn release_check(&self, act: &Action, lease: &EffectLease) -> Result<(), Refusal> {
        match self.three_way(act, lease) {
            Err(Refusal::NotHolder)
                if lease.key == act.key
                    && self
                        .holds
                        .get(resource_name(&lease.resource))
                        .is_some_and(|(holder, _)| *holder == lease.holder) =>
            {
                Ok(())
            }
            other => other,
        }
    }

    fn free_hold_if(&mut self, resource: &str, holder: &str) {
        let resource = resource_name(resource);
        if self.holds.get(resource).is_some_and(|(h, _)| h == holder) {
            self.holds.remove(resource);
        }
    }
}

fn key_name(key: &str) -> &'static str {
    KEYS.iter().find(|(k, _, _)| *k == key).unwrap().0
}

fn resource_name(resource: &str) -> &'static str {
    KEYS.iter().find(|(_, r, _)| *r == resource).unwrap().1
}

fn answer(response: Response) -> Result<Reply, Refusal> {
    match response {
        Response::Answer(result) => result,
        other => panic!("unexpected {other:?}"),
    }
}

fn run(steps: &[Step]) -> Result<(), TestCaseError> {
    let mut state = State::default();
    let mut model = Model::new();
    let mut seq = 0u64;
    // Every entry applied and its answer, for a follower to replay at the end.
    let log = RefCell::new(Vec::new());
    let logged = |state: &mut State, envelope: Envelope| {
        let response = apply(state, &envelope);
        log.borrow_mut().push((envelope, response.clone()));
        answer(response)
    };
    let mut send = |state: &mut State, now_ms: u64, command: Command| {
        seq += 1;
        logged(
            state,
            Envelope {
                stamp: Stamp {
                    now_ms,
                    entropy: u128::from(seq)
                        .wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
                },
                origin: Some(Origin {
                    client_id: 1,
                    seq,
                    acked_below: seq.saturating_sub(8),
                }),
                command,
            },
        )
    };
    let seed = TASKS
        .iter()
        .map(|(id, deps)| TaskSpec {
            id: (*id).into(),
            deps: deps.iter().map(|d| (*d).into()).collect(),
        })
        .collect();
    prop_assert!(send(&mut state, T0, Command::Board(board::Command::Seed(seed))).is_ok());

    for step in steps {
        let now_ms = model.clock.saturating_add_signed(step.dt_ms);
        let clock = model.clock.max(now_ms);
        model.advance(clock);
        match &step.op {
            Op::Acquire { key, ttl_ms } => {
                let act = action(*key);
                let name = KEYS[*key].0;
                let resource = KEYS[*key].1;
                let reply = send(
                    &mut state,
                    now_ms,
                    Command::Effect(effect::Command::Acquire {
                        action: act,
                        ttl_ms: *ttl_ms,
                    }),
                );
                let outcome = match reply {
                    Ok(Reply::Outcome(outcome)) => *outcome,
                    other => return Err(TestCaseError::fail(format!("acquire: {other:?}"))),
                };
                let status = model.keys.get(name).cloned();
                let held = model.holds.contains_key(resource);
                match outcome {
                    Outcome::Granted(lease) => {
                        prop_assert!(
                            !model.expired_unresolved.contains(name),
                            "{name}: granted again after its intent expired unresolved"
                        );
                        prop_assert!(
                            matches!(status, None | Some(KeyModel::Idle)),
                            "{name}: granted while {status:?}"
                        );
                        prop_assert!(!held, "{resource}: granted while held");
                        let previous = model.max_fence.get(resource).copied().unwrap_or(0);
                        prop_assert!(lease.fence > previous, "fence did not increase");
                        prop_assert_eq!(lease.fence, previous + 1);
                        prop_assert_eq!(state.effects.resource_fence(resource), lease.fence);
                        prop_assert_eq!(lease.until_ms, clock + *ttl_ms as u64);
                        model.max_fence.insert(resource, lease.fence);
                        model.keys.insert(
                            name,
                            KeyModel::InProgress {
                                until: lease.until_ms,
                            },
                        );
                        model
                            .attempts
                            .insert(name, (lease.fence, lease.holder.clone()));
                        model
                            .holds
                            .insert(resource, (lease.holder.clone(), lease.until_ms));
                        model.leases.push(lease);
                    }
                    Outcome::Completed(result) => {
                        prop_assert_eq!(status, Some(KeyModel::Completed(result)))
                    }
                    Outcome::Uncertain => prop_assert_eq!(status, Some(KeyModel::Uncertain)),
                    Outcome::InProgress => prop_assert!(
                        matches!(status, Some(KeyModel::InProgress { .. })),
                        "{name}: in progress while {status:?}"
                    ),
                    Outcome::Contended => {
                        prop_assert!(matches!(status, None | Some(KeyModel::Idle)));
                        prop_assert!(held, "{resource}: contended while free");
                    }
                }
            }
            Op::Holder {
                kind,
                key,
                lease,
                ttl_ms,
            } => {
                let act = action(*key);
                let name = KEYS[*key].0;
                // Before any grant, a lease nobody was ever given.
                let lease = if model.leases.is_empty() {
                    EffectLease {
                        key: act.key.clone(),
                        resource: act.resource.clone(),
                        fence: 1,
                        holder: "0".repeat(32),
                        until_ms: clock + 1,
                    }
                } else {
                    lease.get(&model.leases).clone()
                };
                let command = match kind {
                    Holder::Complete => effect::Command::Complete {
                        action: act.clone(),
                        lease: lease.clone(),
                        result: format!("r{seq}", seq = model.leases.len()),
                    },
                    Holder::Release => effect::Command::Release {
                        action: act.clone(),
                        lease: lease.clone(),
                    },
                    Holder::Abandon => effect::Command::Abandon {
                        action: act.clone(),
                        lease: lease.clone(),
                        reason: "prop".into(),
                    },
                    Holder::Renew => effect::Command::Renew {
                        action: act.clone(),
                        lease: lease.clone(),
                        ttl_ms: *ttl_ms,
                    },
                    Holder::MarkUncertain => effect::Command::MarkUncertain {
                        action: act.clone(),
                        lease: lease.clone(),
                        reason: "prop".into(),
                    },
                };
                let expected_check = match kind {
                    Holder::Release => model.release_check(&act, &lease),
                    _ => model.three_way(&act, &lease),
                };
                let status = model.keys.get(name).cloned();
                let reply = send(&mut state, now_ms, Command::Effect(command.clone()));
                if let (Holder::Complete, Some(KeyModel::Completed(first))) = (kind, &status) {
                    // First completion wins: any repeat is answered with the recorded result.
                    prop_assert_eq!(reply, Ok(Reply::EffectResult(first.clone())));
                    continue;
                }
                if let Err(refusal) = &expected_check {
                    prop_assert_eq!(
                        reply.as_ref().err(),
                        Some(refusal),
                        "{:?}: the three-way check must refuse",
                        command
                    );
                    continue;
                }
                let resource = resource_name(&lease.resource);
                match (kind, reply) {
                    (Holder::Complete, Ok(Reply::EffectResult(result))) => match status {
                        Some(KeyModel::InProgress { .. }) | Some(KeyModel::Uncertain) => {
                            model.keys.insert(name, KeyModel::Completed(result));
                            model.expired_unresolved.remove(name);
                        }
                        other => {
                            return Err(TestCaseError::fail(format!(
                                "complete accepted on {other:?}"
                            )))
                        }
                    },
                    (Holder::Release, Ok(Reply::Done)) => {
                        model.free_hold_if(resource, &lease.holder)
                    }
                    (Holder::Abandon, Ok(Reply::Done)) => {
                        prop_assert!(
                            matches!(status, Some(KeyModel::InProgress { .. })),
                            "abandon accepted on {:?}",
                            status
                        );
                        model.keys.insert(name, KeyModel::Idle);
                        model.attempts.remove(name);
                        model.free_hold_if(resource, &lease.holder);
                    }
                    (Holder::Abandon, Err(Refusal::NotInProgress)) => prop_assert!(
                        !matches!(status, Some(KeyModel::InProgress { .. })),
                        "abandon refused on {:?}",
                        status
                    ),
                    (Holder::Renew, Ok(Reply::EffectLease(renewed))) => {
                        prop_assert!(
                            matches!(status, Some(KeyModel::InProgress { .. })),
                            "renew accepted on {:?}",
                            status
                        );
                        prop_assert_eq!(
                            model.holds.get(resource).map(|(h, _)| h),
                            Some(&lease.holder)
                        );
                        prop_assert_eq!(renewed.fence, lease.fence);
                        prop_assert_eq!(&renewed.holder, &lease.holder);
                        prop_assert_eq!(renewed.until_ms, clock + *ttl_ms as u64);
                        model.keys.insert(
                            name,
                            KeyModel::InProgress {
                                until: renewed.until_ms,
                            },
                        );
                        model
                            .holds
                            .insert(resource, (lease.holder.clone(), renewed.until_ms));
                    }
                    (Holder::Renew, Err(Refusal::NotInProgress)) => prop_assert!(
                        !matches!(status, Some(KeyModel::InProgress { .. })),
                        "renew refused on {:?}",
                        status
                    ),
                    (Holder::Renew, Err(Refusal::NotHolder)) => {
                        prop_assert!(
                            matches!(status, Some(KeyModel::InProgress { .. })),
                            "renew refused NOT_HOLDER on {:?}",
                            status
                        );
                        prop_assert_ne!(
                            model.holds.get(resource).map(|(h, _)| h),
                            Some(&lease.holder)
                        );
                    }
                    (Holder::MarkUncertain, Ok(Reply::Done)) => {
                        prop_assert!(
                            matches!(
                                status,
                                Some(KeyModel::InProgress { .. }) | Some(KeyModel::Uncertain)
                            ),
                            "mark_uncertain accepted on {:?}",
                            status
                        );
                        model.keys.insert(name, KeyModel::Uncertain);
                    }
                    (Holder::MarkUncertain, Err(Refusal::NotInProgress)) => prop_assert!(
                        matches!(status, Some(KeyModel::Completed(_))),
                        "mark_uncertain refused on {:?}",
                        status
                    ),
                    (kind, other) => {
                        return Err(TestCaseError::fail(format!(
                            "{kind:?} on {status:?} answered {other:?}"
                        )))
                    }
                }
            }
            Op::BeginReconcile { key, ttl_ms } => {
                let name = KEYS[*key].0;
                let status = model.keys.get(name).cloned();
                let reply = send(
                    &mut state,
                    now_ms,
                    Command::Effect(effect::Command::BeginReconcile {
                        action: action(*key),
                        ttl_ms: *ttl_ms,
                    }),
                );
                match reply {
                    Ok(Reply::Reconcile(_)) | Err(Refusal::ReconcileTaken) => {
                        prop_assert_eq!(status, Some(KeyModel::Uncertain))
                    }
                    Err(Refusal::NotUncertain) => {
                        prop_assert!(status.is_some() && status != Some(KeyModel::Uncertain))
                    }
                    Err(Refusal::UnknownAction) => prop_assert!(status.is_none()),
                    other => return Err(TestCaseError::fail(format!("reconcile: {other:?}"))),
                }
            }
            Op::Resolve {
                key,
                happened,
                force,
            } => {
                let name = KEYS[*key].0;
                let status = model.keys.get(name).cloned();
                let resolution = Resolution {
                    happened: *happened,
                    result: format!("resolved-{name}"),
                    force_retryable: *force,
                };
                let reply = send(
                    &mut state,
                    now_ms,
                    Command::Effect(effect::Command::ResolveUncertain {
                        action: action(*key),
                        resolution,
                    }),
                );
                match (status, reply) {
                    (Some(KeyModel::Completed(first)), Ok(Reply::Resolved(resolved))) => {
                        prop_assert_eq!(resolved, Resolved::Completed(first))
                    }
                    (Some(KeyModel::Uncertain), Ok(Reply::Resolved(Resolved::Completed(r)))) => {
                        prop_assert!(*happened);
                        model.keys.insert(name, KeyModel::Completed(r));
                        model.expired_unresolved.remove(name);
                    }
                    (Some(KeyModel::Uncertain), Ok(Reply::Resolved(Resolved::Retryable))) => {
                        prop_assert!(!*happened);
                        prop_assert!(KEYS[*key].2 == RetrySafety::Safe || *force);
                        model.keys.insert(name, KeyModel::Idle);
                        model.attempts.remove(name);
                        model.expired_unresolved.remove(name);
                    }
                    (Some(KeyModel::Uncertain), Err(Refusal::UnsafeNotRetryable)) => {
                        prop_assert!(!*happened && !*force);
                        prop_assert!(KEYS[*key].2 == RetrySafety::Unsafe);
                    }
                    (
                        Some(KeyModel::Idle | KeyModel::InProgress { .. }),
                        Err(Refusal::NotUncertain),
                    ) => {}
                    (None, Err(Refusal::UnknownAction)) => {}
                    (status, other) => {
                        return Err(TestCaseError::fail(format!(
                            "resolve on {status:?} answered {other:?}"
                        )))
                    }
                }
            }
            Op::Write { sink, fence, value } => {
                let resource = SINKS[*sink];
                let before = state.sink.read(resource).cloned();
                let (seen, _, writes) = model.sink.get(resource).cloned().unwrap_or_default();
                let reply = send(
                    &mut state,
                    now_ms,
                    Command::Sink(sink::Command::Write {
                        resource: resource.into(),
                        fence: *fence,
                        value: vec![*value],
                    }),
                );
                if *fence < seen {
                    prop_assert_eq!(reply, Err(Refusal::FenceStale));
                    prop_assert_eq!(state.sink.read(resource).cloned(), before);
                } else {
                    prop_assert_eq!(
                        reply,
                        Ok(Reply::Written {
                            seen_fence: *fence,
                            writes: writes + 1
                        })
                    );
                    model
                        .sink
                        .insert(resource, (*fence, vec![*value], writes + 1));
                }
            }
            Op::Save { run, seq, data } => {
                let name = RUNS[*run];
                let stored = model.checkpoints.get(name).copied();
                let before = state.checkpoints.load(name).cloned();
                let reply = send(
                    &mut state,
                    now_ms,
                    Command::Checkpoint(checkpoint::Command::SaveIfNewer {
                        run: name.into(),
                        seq: *seq,
                        data: vec![*data],
                    }),
                );
                if *seq == 0 {
                    prop_assert!(
                        matches!(&reply, Err(Refusal::Invalid { field, .. }) if field == "seq"),
                        "seq 0 answered {:?}",
                        reply
                    );
                    prop_assert_eq!(state.checkpoints.load(name).cloned(), before);
                } else if stored.is_some_and(|s| *seq <= s) {
                    prop_assert_eq!(reply, Err(Refusal::StaleSeq));
                    prop_assert_eq!(state.checkpoints.load(name).cloned(), before);
                } else {
                    prop_assert_eq!(reply, Ok(Reply::Done));
                    model.checkpoints.insert(name, *seq);
                }
            }
            Op::Claim { task, ttl_ms } => {
                let (id, deps) = TASKS[*task];
                let status = model.tasks[id].clone();
                let blocked = deps.iter().any(|d| model.tasks[d] != TaskModel::Done);
                let reply = send(
                    &mut state,
                    now_ms,
                    Command::Board(board::Command::Claim {
                        id: id.into(),
                        agent: "agent".into(),
                        ttl_ms: *ttl_ms,
                    }),
                );
                let expected = match status {
                    TaskModel::Done => Some(Refusal::AlreadyDone),
                    _ if blocked => Some(Refusal::Blocked),
                    TaskModel::Claimed { .. } => Some(Refusal::Taken),
                    TaskModel::Open => None,
                };
                match (expected, reply) {
                    (Some(refusal), reply) => prop_assert_eq!(reply, Err(refusal)),
                    (None, Ok(Reply::Task(task))) => {
                        let lease = task.lease.unwrap();
                        let previous = model.task_fence.get(id).copied().unwrap_or(0);
                        prop_assert!(lease.fence > previous, "task fence did not increase");
                        prop_assert_eq!(lease.fence, previous + 1);
                        prop_assert_eq!(lease.until_ms, clock + *ttl_ms as u64);
                        model.task_fence.insert(id, lease.fence);
                        model.tasks.insert(
                            id,
                            TaskModel::Claimed {
                                token: lease.token.clone(),
                                fence: lease.fence,
                                until: lease.until_ms,
                            },
                        );
                        model.tokens.push(lease.token);
                    }
                    (None, other) => {
                        return Err(TestCaseError::fail(format!("claim answered {other:?}")))
                    }
                }
            }
            Op::BoardHolder {
                kind,
                task,
                token,
                ttl_ms,
            } => {
                let id = TASKS[*task].0;
                let token = match token {
                    Some(index) if !model.tokens.is_empty() => index.get(&model.tokens).clone(),
                    _ => "f".repeat(32),
                };
                let current =
                    matches!(&model.tasks[id], TaskModel::Claimed { token: t, .. } if *t == token);
                let command = match kind {
                    0 => board::Command::Release {
                        id: id.into(),
                        token: token.clone(),
                    },
                    1 => board::Command::Complete {
                        id: id.into(),
                        token: token.clone(),
                    },
                    _ => board::Command::Renew {
                        id: id.into(),
                        token: token.clone(),
                        ttl_ms: *ttl_ms,
                    },
                };
                let reply = send(&mut state, now_ms, Command::Board(command));
                if !current {
                    prop_assert_eq!(reply, Err(Refusal::LeaseLost));
                    continue;
                }
                prop_assert!(
                    reply.is_ok(),
                    "holder action with the live token: {reply:?}"
                );
                match kind {
                    0 => {
                        model.tasks.insert(id, TaskModel::Open);
                    }
                    1 => {
                        model.tasks.insert(id, TaskModel::Done);
                    }
                    _ => {
                        if let Some(TaskModel::Claimed { until, fence, .. }) =
                            model.tasks.get_mut(id)
                        {
                            *until = clock + *ttl_ms as u64;
                            prop_assert_eq!(Some(*fence), model.task_fence.get(id).copied());
                        }
                    }
                }
            }
            Op::Sweep => {
                let reply = logged(
                    &mut state,
                    Envelope {
                        stamp: Stamp { now_ms, entropy: 0 },
                        origin: None,
                        command: Command::Sweep,
                    },
                );
                prop_assert!(
                    matches!(reply, Ok(Reply::Swept { .. })),
                    "sweep answered {:?}",
                    reply
                );
                prop_assert!(!state.sweep_due(clock), "a sweep leaves nothing due");
                prop_assert!(
                    check(&state.board.tasks().cloned().collect::<Vec<_>>(), clock).is_empty()
                );
            }
        }
        compare(&state, &model)?;
    }
    // A follower applying the same log answers every entry alike and ends in the same state:
    // nothing in apply depends on anything but the state and the entry.
    let mut follower = State::default();
    for (envelope, response) in log.borrow().iter() {
        prop_assert_eq!(&apply(&mut follower, envelope), response);
    }
    prop_assert_eq!(follower, state);
    Ok(())
}

/// The store agrees with the model (expiries not yet materialised are judged at the clock).
fn compare(state: &State, model: &Model) -> Result<(), TestCaseError> {
    let clock = model.clock;
    prop_assert_eq!(
        state.clock_ms,
        clock,
        "the store clock never runs backwards"
    );
    for (name, _, _) in KEYS {
        let view = state.effects.show(name);
        let Some(expected) = model.keys.get(name) else {
            prop_assert!(view.is_none());
            continue;
        };
        let view = view.unwrap();
        let effective = match (view.status, view.intent_until_ms) {
            (KeyStatus::InProgress, Some(until)) if is_overdue(until, clock) => {
                KeyStatus::Uncertain
            }
            (status, _) => status,
        };
        match expected {
            KeyModel::Idle => prop_assert_eq!(effective, KeyStatus::Idle),
            KeyModel::InProgress { until } => {
                prop_assert_eq!(effective, KeyStatus::InProgress);
                prop_assert_eq!(view.intent_until_ms, Some(*until));
            }
            KeyModel::Uncertain => prop_assert_eq!(effective, KeyStatus::Uncertain),
            KeyModel::Completed(result) => {
                prop_assert_eq!(effective, KeyStatus::Completed);
                prop_assert_eq!(view.result.as_ref(), Some(result));
            }
        }
        if model.expired_unresolved.contains(name) {
            prop_assert!(
                matches!(effective, KeyStatus::Uncertain),
                "{name}: intent expired unresolved must read uncertain"
            );
        }
    }
    for (_, resource, _) in KEYS {
        prop_assert_eq!(
            state.effects.resource_fence(resource),
            model.max_fence.get(resource).copied().unwrap_or(0)
        );
    }
    for resource in SINKS {
        let expected = model.sink.get(resource);
        let stored = state.sink.read(resource);
        prop_assert_eq!(
            stored.map(|v| (v.seen_fence, v.value.clone(), v.writes)),
            expected.cloned()
        );
    }
    for run in RUNS {
        prop_assert_eq!(
            state.checkpoints.load(run).map(|c| c.seq),
            model.checkpoints.get(run).copied(),
            "checkpoint seq never decreases"
        );
    }
    let mut live = 0;
    for (id, _) in TASKS {
        let task = state.board.get(id).unwrap();
        let lease = task
            .lease
            .as_ref()
            .filter(|lease| !is_overdue(lease.until_ms, clock));
        match &model.tasks[id] {
            TaskModel::Claimed {
                token,
                fence,
                until,
            } => {
                live += 1;
                let lease = lease.expect("a live lease");
                prop_assert_eq!(&lease.token, token);
                prop_assert_eq!(lease.fence, *fence);
                prop_assert_eq!(lease.until_ms, *until);
                prop_assert_eq!(&task.state, &TaskState::Claimed);
            }
            TaskModel::Open => prop_assert!(lease.is_none(), "{id}: open with a live lease"),
            TaskModel::Done => {
                prop_assert_eq!(&task.state, &TaskState::Done);
                prop_assert!(task.lease.is_none());
            }
        }
        prop_assert_eq!(
            task.max_fence,
            model.task_fence.get(id).copied().unwrap_or(0)
        );
    }
    prop_assert!(state.board.leases() >= live);
    let tasks: Vec<_> = state.board.tasks().cloned().collect();
    let problems: Vec<_> = check(&tasks, clock)
        .into_iter()
        .filter(|p| p.code != BoardProblemCode::OverdueLease)
        .collect();
    prop_assert!(problems.is_empty(), "board check: {problems:?}");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn gate_sink_checkpoint_and_board_agree_with_the_model(
        steps in prop::collection::vec(step(), 1..60)
    ) {
        run(&steps)?;
    }
}
