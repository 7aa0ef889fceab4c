//! The snapshot layout. Snapshots written by one version must load in the others: during a
//! rolling upgrade a follower installs whatever its leader built, and a restarted node reads the
//! snapshot an earlier binary wrote. This pins the bytes of a state that went through every
//! primitive's commands to the bytes an earlier version wrote for it.
#![allow(clippy::unwrap_used)]

use baton_statemachine::board::{self, TaskSpec};
use baton_statemachine::effect::{self, Action, EffectLease, Outcome, RetrySafety};
use baton_statemachine::handoff::{self, OfferArgs, Receipt, ReceiptStatus};
use baton_statemachine::{
    apply, checkpoint, queue, sink, Command, Envelope, Origin, Reply, Response, Stamp, State,
};

const T0: u64 = 1_800_000_000_000;
const TTL_MS: i64 = 60_000;
/// Entries per primitive in the state whose layout is pinned.
const ENTRIES: usize = 30;
/// Clients the requests come from, so the session table holds many clients and replies.
const CLIENTS: u64 = 16;

fn encode(state: &State) -> Vec<u8> {
    bincode::serde::encode_to_vec(state, bincode::config::standard()).unwrap()
}

fn decode(bytes: &[u8]) -> State {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .unwrap()
        .0
}

/// Applies commands as a leader would stamp them.
struct Driver {
    state: State,
    now: u64,
    sent: u64,
}

impl Driver {
    fn new() -> Self {
        Driver {
            state: State::default(),
            now: T0,
            sent: 0,
        }
    }

    fn send(&mut self, command: Command) -> Response {
        self.sent += 1;
        self.now += 1;
        let seq = self.sent / CLIENTS + 1;
        let envelope = Envelope {
            stamp: Stamp {
                now_ms: self.now,
                entropy: u128::from(self.sent) * 0x9e37_79b9_7f4a_7c15,
            },
            origin: Some(Origin {
                client_id: self.sent % CLIENTS + 1,
                seq,
                // Each client acknowledges all but its last few answers, so replies are trimmed.
                acked_below: seq.saturating_sub(8),
            }),
            command,
        };
        apply(&mut self.state, &envelope)
    }

    fn reply(&mut self, command: Command) -> Reply {
        match self.send(command) {
            Response::Answer(Ok(reply)) => reply,
            other => panic!("refused: {other:?}"),
        }
    }
}

fn task_id(n: usize) -> String {
    format!("task-{n:05}")
}

fn ticket_key(n: usize) -> String {
    format!("ticket-{n:05}")
}

fn claim(id: String) -> Command {
    Command::Board(board::Command::Claim {
        id,
        agent: "agent".into(),
        ttl_ms: TTL_MS,
    })
}

fn offer(key: String) -> Command {
    Command::Handoff(handoff::Command::Offer(OfferArgs {
        key,
        from: "a".into(),
        to: "b".into(),
        payload: vec![7; 32],
        reply_to: "a".into(),
        ttl_ms: TTL_MS,
    }))
}

fn submit(n: usize) -> Command {
    Command::Queue(queue::Command::Submit(queue::TaskSpec {
        queue: "jobs".into(),
        idempotency_key: format!("job-{n:05}"),
        handler: "h".into(),
        handler_version: "1".into(),
        payload_version: "1".into(),
        payload: vec![1; 16],
        concurrency_key: if n.is_multiple_of(3) {
            format!("key-{}", n % 90)
        } else {
            String::new()
        },
        business_key: String::new(),
        max_attempts: 3,
        ttl_ms: TTL_MS * 10,
    }))
}

fn lease(limit: u32) -> Command {
    Command::Queue(queue::Command::Lease {
        worker: "w".into(),
        queues: vec!["jobs".into()],
        limit,
        lease_ttl_ms: TTL_MS,
    })
}

fn action(n: usize) -> Action {
    Action {
        key: format!("action-{n:05}"),
        resource: format!("resource-{n:05}"),
        safety: RetrySafety::Safe,
    }
}

/// Writes version `version` to `count` fenced-sink resources and checkpoint runs.
fn write_and_save(d: &mut Driver, count: usize, version: u8) {
    for n in 0..count {
        d.reply(Command::Sink(sink::Command::Write {
            resource: format!("res-{n}"),
            fence: u64::from(version),
            value: vec![version],
        }));
        d.reply(Command::Checkpoint(checkpoint::Command::SaveIfNewer {
            run: format!("run-{n}"),
            seq: u64::from(version),
            data: vec![version],
        }));
    }
}

/// What [`load`] leaves held: board tokens, ticket tokens, leased queue tasks, effect leases.
struct Held {
    claims: Vec<(String, String)>,
    takes: Vec<(String, String)>,
    leased: Vec<(u64, u32)>,
    effects: Vec<(Action, EffectLease)>,
}

/// Every primitive loaded with about [`ENTRIES`] entries.
fn load(d: &mut Driver) -> Held {
    let specs = (0..ENTRIES)
        .map(|n| TaskSpec {
            id: task_id(n),
            deps: vec![],
        })
        .collect();
    d.reply(Command::Board(board::Command::Seed(specs)));
    let mut claims = Vec::new();
    for n in (0..ENTRIES).step_by(2) {
        let Reply::Task(task) = d.reply(claim(task_id(n))) else {
            panic!("a claim answered no task");
        };
        claims.push((task.id.clone(), task.lease.unwrap().token));
    }
    let mut takes = Vec::new();
    for n in 0..ENTRIES {
        d.reply(offer(ticket_key(n)));
        if n % 3 == 0 {
            let Reply::Handle(handle) = d.reply(Command::Handoff(handoff::Command::Take {
                key: ticket_key(n),
                to: "b".into(),
            })) else {
                panic!("a take answered no handle");
            };
            takes.push((ticket_key(n), handle.token));
        }
    }
    write_and_save(d, ENTRIES / 10, 1);
    d.reply(Command::Queue(queue::Command::CreateQueue(queue::Queue {
        name: "jobs".into(),
        namespace: "ns".into(),
    })));
    d.reply(Command::Queue(queue::Command::RegisterWorker(
        queue::Worker {
            id: "w".into(),
            concurrency_keys: true,
        },
    )));
    for n in 0..ENTRIES {
        d.reply(submit(n));
    }
    let Reply::Assignments(leased) = d.reply(lease(200)) else {
        panic!("a lease answered no assignments");
    };
    let leased = leased.iter().map(|a| (a.task_id, a.attempt)).collect();
    let mut effects = Vec::new();
    for n in 0..ENTRIES / 2 {
        let Reply::Outcome(outcome) = d.reply(Command::Effect(effect::Command::Acquire {
            action: action(n),
            ttl_ms: TTL_MS,
        })) else {
            panic!("an acquire answered no outcome");
        };
        let Outcome::Granted(lease) = *outcome else {
            panic!("an acquire was not granted: {outcome:?}");
        };
        effects.push((action(n), lease));
    }
    Held {
        claims,
        takes,
        leased,
        effects,
    }
}

/// Changes every primitive after the copy: releases and new claims, replies and new offers, queue
/// completions and leases, newer sink writes and checkpoints, then a mass expiry.
fn move_on(d: &mut Driver, held: Held) {
    let Held {
        claims,
        takes,
        leased,
        effects,
    } = held;
    for (id, token) in claims.iter().step_by(2) {
        d.reply(Command::Board(board::Command::Release {
            id: id.clone(),
            token: token.clone(),
        }));
    }
    for (id, token) in claims.iter().skip(1).step_by(4) {
        d.reply(Command::Board(board::Command::Complete {
            id: id.clone(),
            token: token.clone(),
        }));
    }
    for n in (1..ENTRIES).step_by(2) {
        d.reply(claim(task_id(n)));
    }
    for (key, token) in &takes {
        d.reply(Command::Handoff(handoff::Command::Reply {
            key: key.clone(),
            token: token.clone(),
            receipt: Receipt {
                status: ReceiptStatus::Done,
                summary: "ok".into(),
                failure: String::new(),
                artifacts: vec![],
            },
        }));
    }
    for n in ENTRIES..ENTRIES + ENTRIES / 2 {
        d.reply(offer(ticket_key(n)));
    }
    for (task_id, attempt) in leased {
        d.reply(Command::Queue(queue::Command::Start {
            task_id,
            attempt,
            worker: "w".into(),
        }));
        d.reply(Command::Queue(queue::Command::Complete {
            task_id,
            attempt,
            worker: "w".into(),
            result: vec![2],
        }));
    }
    d.reply(lease(300));
    write_and_save(d, ENTRIES / 10, 2);
    for (action, lease) in effects.iter().step_by(2) {
        d.reply(Command::Effect(effect::Command::Complete {
            action: action.clone(),
            lease: lease.clone(),
            result: "done".into(),
        }));
    }
    // Every live claim, ticket and queue lease falls due; one sweep expires them all.
    d.now += 2 * TTL_MS as u64;
    let Reply::Swept { expired } = d.reply(Command::Sweep) else {
        panic!("a sweep answered no count");
    };
    assert!(
        expired as usize > ENTRIES / 3,
        "the sweep expired only {expired}"
    );
}

/// A small state that went through every primitive's commands ([`load`] and [`move_on`]).
fn small_state() -> State {
    let mut d = Driver::new();
    let held = load(&mut d);
    move_on(&mut d, held);
    d.state
}

/// What the release at 05eb95c encoded for [`small_state`].
const LAYOUT_05EB95C: &[u8] = include_bytes!("data/small-state-05eb95c.bin");

/// The same commands must still encode to the bytes an earlier version wrote, and those bytes must
/// read back as the same state. A change that moves, adds or retypes a stored field fails here
/// (as does one that changes what these commands do); a new layout must go on reading this image.
#[test]
fn the_snapshot_layout_is_the_one_earlier_versions_wrote() {
    let state = small_state();
    assert!(
        encode(&state) == LAYOUT_05EB95C,
        "the snapshot layout changed"
    );
    assert_eq!(decode(LAYOUT_05EB95C), state);
}
