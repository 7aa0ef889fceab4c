//! `State::prejudge` is what lets the leader answer a contended claim or take without a log
//! entry. It is only sound if, whenever it answers, applying the command through the log at that
//! point would have given the same answer and changed nothing but the store clock and the session
//! table. These properties drive random histories of board and handoff commands (with time
//! moving, leases expiring, retries of earlier requests) and check exactly that before every step.
#![allow(clippy::unwrap_used)]

use baton_statemachine::board::{self, TaskSpec};
use baton_statemachine::handoff::{self, OfferArgs, Receipt, ReceiptStatus};
use baton_statemachine::{
    apply, apply_with_changes, Command, Envelope, Origin, Reply, Response, Stamp, State,
};
use proptest::prelude::*;

const T0: u64 = 1_000_000;
const TASKS: [&str; 3] = ["a", "b", "c"];
const AGENTS: [&str; 2] = ["w1", "w2"];

/// One step of a random history.
#[derive(Debug, Clone)]
enum Step {
    /// Let time pass.
    Wait(u64),
    Claim {
        task: usize,
        agent: usize,
        ttl_ms: i64,
    },
    Release {
        task: usize,
    },
    Complete {
        task: usize,
    },
    Renew {
        task: usize,
        ttl_ms: i64,
    },
    /// Re-seed a task: it loses its lease and depends on `dep` (if any) from then on.
    Seed {
        task: usize,
        dep: Option<usize>,
    },
    Offer {
        key: usize,
        ttl_ms: i64,
    },
    Take {
        key: usize,
        to: usize,
    },
    Reply {
        key: usize,
    },
    Cancel {
        key: usize,
    },
    /// Send one of the earlier requests again, with its original origin.
    Retry(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u64..400).prop_map(Step::Wait),
        (0..3usize, 0..2usize, prop_oneof![Just(0i64), 1i64..600]).prop_map(
            |(task, agent, ttl_ms)| Step::Claim {
                task,
                agent,
                ttl_ms
            }
        ),
        (0..3usize).prop_map(|task| Step::Release { task }),
        (0..3usize).prop_map(|task| Step::Complete { task }),
        (0..3usize, 1i64..600).prop_map(|(task, ttl_ms)| Step::Renew { task, ttl_ms }),
        (0..3usize, proptest::option::of(0..3usize)).prop_map(|(task, dep)| Step::Seed {
            task,
            dep: dep.filter(|dep| *dep != task),
        }),
        (0..3usize, 1i64..600).prop_map(|(key, ttl_ms)| Step::Offer { key, ttl_ms }),
        (0..4usize, 0..2usize).prop_map(|(key, to)| Step::Take { key, to }),
        (0..3usize).prop_map(|key| Step::Reply { key }),
        (0..3usize).prop_map(|key| Step::Cancel { key }),
        (0..64usize).prop_map(Step::Retry),
    ]
}

/// A store, its client and what the client learnt (tokens), plus every request sent.
struct World {
    state: State,
    now: u64,
    seq: u64,
    board_tokens: [Option<String>; 3],
    ticket_tokens: [Option<String>; 3],
    sent: Vec<(Origin, Command)>,
}

impl World {
    fn new() -> Self {
        let mut world = World {
            state: State::default(),
            now: T0,
            seq: 0,
            board_tokens: Default::default(),
            ticket_tokens: Default::default(),
            sent: Vec::new(),
        };
        // "c" depends on "a", so claims of "c" are blocked until "a" is done.
        let specs = vec![
            TaskSpec {
                id: "a".into(),
                deps: vec![],
            },
            TaskSpec {
                id: "b".into(),
                deps: vec![],
            },
            TaskSpec {
                id: "c".into(),
                deps: vec!["a".into()],
            },
        ];
        world.send(Command::Board(board::Command::Seed(specs)));
        world
    }

    fn command(&self, step: &Step) -> Option<(Origin, Command)> {
        let fresh = Origin {
            client_id: 1,
            seq: self.seq + 1,
            acked_below: 0,
        };
        let command = match step {
            Step::Wait(_) => return None,
            Step::Retry(i) => return self.sent.get(*i).cloned(),
            Step::Claim {
                task,
                agent,
                ttl_ms,
            } => Command::Board(board::Command::Claim {
                id: TASKS[*task].into(),
                agent: AGENTS[*agent].into(),
                ttl_ms: *ttl_ms,
            }),
            Step::Release { task } => Command::Board(board::Command::Release {
                id: TASKS[*task].into(),
                token: self.board_tokens[*task]
                    .clone()
                    .unwrap_or_else(|| "none".into()),
            }),
            Step::Complete { task } => Command::Board(board::Command::Complete {
                id: TASKS[*task].into(),
                token: self.board_tokens[*task]
                    .clone()
                    .unwrap_or_else(|| "none".into()),
            }),
            Step::Renew { task, ttl_ms } => Command::Board(board::Command::Renew {
                id: TASKS[*task].into(),
                token: self.board_tokens[*task]
                    .clone()
                    .unwrap_or_else(|| "none".into()),
                ttl_ms: *ttl_ms,
            }),
            Step::Seed { task, dep } => Command::Board(board::Command::Seed(vec![TaskSpec {
                id: TASKS[*task].into(),
                deps: dep.iter().map(|dep| TASKS[*dep].into()).collect(),
            }])),
            Step::Cancel { key } => Command::Handoff(handoff::Command::Cancel {
                key: format!("k{key}"),
                by: "src".into(),
            }),
            Step::Offer { key, ttl_ms } => Command::Handoff(handoff::Command::Offer(OfferArgs {
                key: format!("k{key}"),
                from: "src".into(),
                to: AGENTS[*key % 2].into(),
                payload: vec![],
                reply_to: "src".into(),
                ttl_ms: *ttl_ms,
            })),
            // Key 3 is never offered: takes of it are refused UNKNOWN_KEY.
            Step::Take { key, to } => Command::Handoff(handoff::Command::Take {
                key: format!("k{key}"),
                to: AGENTS[*to].into(),
            }),
            Step::Reply { key } => Command::Handoff(handoff::Command::Reply {
                key: format!("k{key}"),
                token: self.ticket_tokens[*key]
                    .clone()
                    .unwrap_or_else(|| "none".into()),
                receipt: Receipt {
                    status: ReceiptStatus::Done,
                    summary: "ok".into(),
                    failure: String::new(),
                    artifacts: vec![],
                },
            }),
        };
        Some((fresh, command))
    }

    fn send(&mut self, command: Command) -> Response {
        self.seq += 1;
        let origin = Origin {
            client_id: 1,
            seq: self.seq,
            acked_below: 0,
        };
        self.apply(origin, command)
    }

    fn apply(&mut self, origin: Origin, command: Command) -> Response {
        if origin.seq > self.seq {
            self.seq = origin.seq;
        }
        let envelope = Envelope {
            stamp: Stamp {
                now_ms: self.now,
                entropy: u128::from(origin.seq) << 64 | u128::from(self.now),
            },
            origin: Some(origin),
            command: command.clone(),
        };
        let response = apply(&mut self.state, &envelope);
        self.sent.push((origin, command.clone()));
        self.learn(&command, &response);
        response
    }

    fn learn(&mut self, command: &Command, response: &Response) {
        match (command, response) {
            (
                Command::Board(board::Command::Claim { id, .. }),
                Response::Answer(Ok(Reply::Task(task))),
            ) => {
                let i = TASKS.iter().position(|t| t == id).unwrap();
                self.board_tokens[i] = task.lease.as_ref().map(|lease| lease.token.clone());
            }
            (
                Command::Handoff(handoff::Command::Take { key, .. }),
                Response::Answer(Ok(Reply::Handle(handle))),
            ) => {
                let i: usize = key[1..].parse().unwrap();
                self.ticket_tokens[i] = Some(handle.token.clone());
            }
            _ => {}
        }
    }
}

/// The state with the two things a refusal through the log may change set aside.
fn without_clock_and_sessions(state: &State) -> State {
    let mut state = state.clone();
    state.clock_ms = 0;
    state.sessions = Default::default();
    state
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_prejudged_answer_is_what_the_log_would_answer_and_changes_nothing(
        steps in proptest::collection::vec(step(), 1..80)
    ) {
        let mut world = World::new();
        let mut prejudged = 0;
        for step in &steps {
            if let Step::Wait(ms) = step {
                world.now += ms;
                continue;
            }
            let Some((origin, command)) = world.command(step) else { continue };
            let verdict = world.state.prejudge(Some(&origin), &command, world.now);
            if let Some(expected) = verdict {
                prejudged += 1;
                let before = without_clock_and_sessions(&world.state);
                let mut through_log = world.state.clone();
                let envelope = Envelope {
                    stamp: Stamp { now_ms: world.now, entropy: 7 },
                    origin: Some(origin),
                    command: command.clone(),
                };
                let (response, changes) = apply_with_changes(&mut through_log, &envelope);
                prop_assert_eq!(&response, &expected, "prejudged {:?}", command);
                prop_assert!(changes.is_empty(), "a prejudged command changed {:?}", changes);
                prop_assert_eq!(without_clock_and_sessions(&through_log), before);
            }
            world.apply(origin, command);
        }
        // Not a timing assertion: most histories must exercise the fast path at least once, or
        // the property above proves nothing.
        prop_assume!(prejudged > 0);
    }
}

/// A claim of task `id` by `agent` for 100 ms.
fn claim(id: &str, agent: &str) -> Command {
    Command::Board(board::Command::Claim {
        id: id.into(),
        agent: agent.into(),
        ttl_ms: 100,
    })
}

/// The first request of a second client.
fn second_client() -> Origin {
    Origin {
        client_id: 2,
        seq: 1,
        acked_below: 0,
    }
}

#[test]
fn a_held_task_and_a_taken_ticket_are_prejudged_and_a_lapsed_lease_is_not() {
    let mut world = World::new();
    assert!(matches!(
        world.send(claim("a", "w1")),
        Response::Answer(Ok(_))
    ));
    let origin = second_client();
    assert_eq!(
        world
            .state
            .prejudge(Some(&origin), &claim("a", "w2"), world.now + 99),
        Some(Response::Answer(Err(baton_statemachine::Refusal::Taken)))
    );
    // At the deadline the lease has lapsed: the claim must go through the log (it expires the
    // old lease and grants a new one).
    assert_eq!(
        world
            .state
            .prejudge(Some(&origin), &claim("a", "w2"), world.now + 100),
        None
    );
    // A free task is never prejudged.
    let free = claim("b", "w2");
    assert_eq!(world.state.prejudge(Some(&origin), &free, world.now), None);
    // A retry is answered with its first response.
    let (first_origin, first_command) = world.sent[1].clone();
    let first = apply(
        &mut world.state.clone(),
        &Envelope {
            stamp: Stamp {
                now_ms: world.now,
                entropy: 1,
            },
            origin: Some(first_origin),
            command: first_command.clone(),
        },
    );
    assert_eq!(
        world
            .state
            .prejudge(Some(&first_origin), &first_command, world.now),
        Some(first)
    );
}

/// The clock a prejudgement uses is the later of the leader's and the store's: a leader whose
/// clock lags the store clock (an entry stamped by an earlier leader with a faster clock) must
/// not refuse a claim the log would grant because, by the store clock, the lease has lapsed.
#[test]
fn a_lease_lapsed_by_the_store_clock_is_not_prejudged_on_a_lagging_leader_clock() {
    let mut world = World::new();
    assert!(matches!(
        world.send(claim("a", "w1")),
        Response::Answer(Ok(_))
    ));
    // Another entry moves the store clock past a's lease.
    let lapsed = world.now + 150;
    world.now = lapsed;
    assert!(matches!(
        world.send(claim("b", "w1")),
        Response::Answer(Ok(_))
    ));

    // A new leader whose clock reads earlier judges the claim of a.
    let lagging = lapsed - 100;
    let origin = second_client();
    assert_eq!(
        world
            .state
            .prejudge(Some(&origin), &claim("a", "w2"), lagging),
        None,
        "prejudged on the lagging clock"
    );
    // What the log does with that claim, stamped with the lagging clock: it grants.
    world.now = lagging;
    let granted = world.apply(origin, claim("a", "w2"));
    assert!(matches!(granted, Response::Answer(Ok(_))), "{granted:?}");
}
