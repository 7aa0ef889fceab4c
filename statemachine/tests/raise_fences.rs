//! `State::raise_fences`, what a restore from a backup applies (contract §0: fences, generations
//! and permit tokens are never reset, never reused): after a raise by `N`, every primitive's next
//! fence is above its highest before plus `N`, live board claims, tickets and queue attempts go on,
//! and a live side-effect attempt is fenced off (its outcome after the save is unknown).
#![allow(clippy::unwrap_used)]

use baton_statemachine::board::{self, TaskSpec};
use baton_statemachine::effect::{self, Action, EffectLease, Outcome, RetrySafety};
use baton_statemachine::handoff::{self, OfferArgs};
use baton_statemachine::queue::{self, Queue, Worker};
use baton_statemachine::{
    apply, Command, Envelope, Origin, Refusal, Reply, Response, Stamp, State, MAX_FENCE_RAISE,
};

const T0: u64 = 1_000_000;
const RAISE: u64 = 1_000;

/// A store and one client numbering its requests 1, 2, 3, ...
#[derive(Default)]
struct World {
    state: State,
    seq: u64,
}

impl World {
    fn send(&mut self, now_ms: u64, command: Command) -> Result<Reply, Refusal> {
        self.seq += 1;
        let envelope = Envelope {
            stamp: Stamp {
                now_ms,
                entropy: u128::from(self.seq) << 64 | 0x5eed,
            },
            origin: Some(Origin {
                client_id: 3,
                seq: self.seq,
                acked_below: 0,
            }),
            command,
        };
        match apply(&mut self.state, &envelope) {
            Response::Answer(answer) => answer,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn claim(&mut self, now_ms: u64) -> board::Lease {
        let claim = board::Command::Claim {
            id: "task".into(),
            agent: "agent".into(),
            ttl_ms: 60_000,
        };
        match self.send(now_ms, Command::Board(claim)) {
            Ok(Reply::Task(task)) => task.lease.unwrap(),
            other => panic!("claim answered {other:?}"),
        }
    }

    fn acquire(&mut self, now_ms: u64, key: &str) -> Outcome {
        let acquire = effect::Command::Acquire {
            action: action(key),
            ttl_ms: 100,
        };
        match self.send(now_ms, Command::Effect(acquire)) {
            Ok(Reply::Outcome(outcome)) => *outcome,
            other => panic!("acquire answered {other:?}"),
        }
    }

    fn lease_token(&mut self, now_ms: u64) -> (u64, u32, Option<u64>) {
        let lease = queue::Command::Lease {
            worker: "w".into(),
            queues: Vec::new(),
            limit: 1,
            lease_ttl_ms: 60_000,
        };
        match self.send(now_ms, Command::Queue(lease)) {
            Ok(Reply::Assignments(got)) => {
                let a = got.first().expect("one task leased");
                (a.task_id, a.attempt, a.token)
            }
            other => panic!("lease answered {other:?}"),
        }
    }

    /// Queue `q` in namespace `ns`, and worker `w` with concurrency keys.
    fn queue_and_worker(&mut self, now_ms: u64) {
        for command in [
            queue::Command::CreateQueue(Queue {
                name: "q".into(),
                namespace: "ns".into(),
            }),
            queue::Command::RegisterWorker(Worker {
                id: "w".into(),
                concurrency_keys: true,
            }),
        ] {
            self.send(now_ms, Command::Queue(command)).unwrap();
        }
    }

    /// Worker `w` starts and completes a leased attempt.
    fn start_and_complete(&mut self, now_ms: u64, task_id: u64, attempt: u32) {
        for command in [
            queue::Command::Start {
                task_id,
                attempt,
                worker: "w".into(),
            },
            queue::Command::Complete {
                task_id,
                attempt,
                worker: "w".into(),
                result: Vec::new(),
            },
        ] {
            self.send(now_ms, Command::Queue(command)).unwrap();
        }
    }

    fn submit(&mut self, now_ms: u64, idempotency_key: &str) {
        let spec = queue::TaskSpec {
            queue: "q".into(),
            idempotency_key: idempotency_key.into(),
            handler: "h".into(),
            handler_version: "v1".into(),
            payload_version: "v1".into(),
            payload: Vec::new(),
            concurrency_key: "object/1".into(),
            business_key: String::new(),
            max_attempts: 3,
            ttl_ms: 600_000,
        };
        self.send(now_ms, Command::Queue(queue::Command::Submit(spec)))
            .unwrap();
    }
}

/// An offer of ticket `ticket` from a to b.
fn offer_ticket() -> handoff::Command {
    handoff::Command::Offer(OfferArgs {
        key: "ticket".into(),
        from: "a".into(),
        to: "b".into(),
        payload: Vec::new(),
        reply_to: "a".into(),
        ttl_ms: 60_000,
    })
}

fn action(key: &str) -> Action {
    Action {
        key: key.into(),
        resource: "printer".into(),
        safety: RetrySafety::Safe,
    }
}

#[test]
fn after_a_raise_every_primitive_mints_above_the_raised_fences() {
    let mut w = World::default();
    let at = T0;
    // Board: fence 1, released; a second claim (fence 2) stays live across the raise.
    let seed = board::Command::Seed(vec![TaskSpec {
        id: "task".into(),
        deps: Vec::new(),
    }]);
    w.send(at, Command::Board(seed)).unwrap();
    let first = w.claim(at);
    let release = board::Command::Release {
        id: "task".into(),
        token: first.token,
    };
    w.send(at, Command::Board(release)).unwrap();
    let live_claim = w.claim(at);
    assert_eq!(live_claim.fence, 2);
    // Handoff: a ticket at generation 1, offered, not taken.
    let offer = offer_ticket();
    w.send(at, Command::Handoff(offer)).unwrap();
    // Side effects: an attempt holding the resource at fence 1.
    let Outcome::Granted(effect_lease) = w.acquire(at, "print-1") else {
        panic!("not granted");
    };
    assert_eq!(effect_lease.fence, 1);
    // Queue: a keyed attempt holding permit token 1.
    w.queue_and_worker(at);
    w.submit(at, "first");
    let (task_id, attempt, token) = w.lease_token(at);
    assert_eq!(token, Some(1));

    w.state.raise_fences(RAISE);

    // The live claim goes on; the next claim is above the raised fence.
    let renew = board::Command::Renew {
        id: "task".into(),
        token: live_claim.token.clone(),
        ttl_ms: 60_000,
    };
    w.send(at + 1, Command::Board(renew)).unwrap();
    let release = board::Command::Release {
        id: "task".into(),
        token: live_claim.token,
    };
    w.send(at + 1, Command::Board(release)).unwrap();
    assert_eq!(w.claim(at + 1).fence, 2 + RAISE + 1);
    // The ticket's taker fences with the raised generation.
    let take = handoff::Command::Take {
        key: "ticket".into(),
        to: "b".into(),
    };
    match w.send(at + 1, Command::Handoff(take)) {
        Ok(Reply::Handle(handle)) => assert_eq!(handle.fence, 1 + RAISE),
        other => panic!("take answered {other:?}"),
    }
    // The live side-effect attempt is fenced off; the next holder is above the raise.
    let complete = effect::Command::Complete {
        action: action("print-1"),
        lease: effect_lease.clone(),
        result: "printed".into(),
    };
    assert_eq!(
        w.send(at + 1, Command::Effect(complete)),
        Err(Refusal::FenceStale)
    );
    match w.acquire(at + 200, "print-2") {
        Outcome::Granted(EffectLease { fence, .. }) => assert_eq!(fence, 1 + RAISE + 1),
        other => panic!("acquire answered {other:?}"),
    }
    assert_eq!(w.acquire(at + 200, "print-1"), Outcome::Uncertain);
    // The live queue attempt goes on; the key's next permit is above the raise.
    w.start_and_complete(at + 1, task_id, attempt);
    // Task ids go on above the raise too: a late report of the old cluster names a task id the
    // restored one has not given to another task.
    w.submit(at + 1, "second");
    let (second, _, token) = w.lease_token(at + 1);
    assert_eq!(token, Some(1 + RAISE + 1));
    assert_eq!(second, task_id + RAISE + 1);
}

#[test]
fn a_raise_is_at_most_the_largest_allowed_and_minting_goes_on() {
    let mut w = World::default();
    w.queue_and_worker(T0);
    w.submit(T0, "first");
    let (task_id, attempt, _) = w.lease_token(T0);
    w.state.raise_fences(u64::MAX);
    assert_eq!(
        w.state.queue.highest_token("ns", "object/1"),
        1 + MAX_FENCE_RAISE
    );
    w.start_and_complete(T0 + 1, task_id, attempt);
    w.submit(T0 + 1, "second");
    let (second, _, token) = w.lease_token(T0 + 1);
    assert_eq!(token, Some(2 + MAX_FENCE_RAISE));
    assert_eq!(second, task_id + MAX_FENCE_RAISE + 1);
}

/// The old cluster may have created a resource, task, ticket key or permit key after the save
/// and handed out its first fences: those the restored state has never heard of start above the
/// raise too (they used to start at 1, handing the old cluster's fences out again).
#[test]
fn after_a_raise_what_the_saved_state_never_had_mints_above_it() {
    let mut w = World::default();
    w.state.raise_fences(RAISE);
    w.state.raise_fences(RAISE);
    assert_eq!(w.state.fence_floor, 2 * RAISE, "raises add up");
    let at = T0;
    let seed = board::Command::Seed(vec![TaskSpec {
        id: "task".into(),
        deps: Vec::new(),
    }]);
    w.send(at, Command::Board(seed)).unwrap();
    assert_eq!(w.claim(at).fence, 2 * RAISE + 1);
    let offer = offer_ticket();
    match w.send(at, Command::Handoff(offer)) {
        Ok(Reply::Ticket(ticket)) => assert_eq!(ticket.generation, 2 * RAISE + 1),
        other => panic!("offer answered {other:?}"),
    }
    match w.acquire(at, "print-1") {
        Outcome::Granted(EffectLease { fence, .. }) => assert_eq!(fence, 2 * RAISE + 1),
        other => panic!("acquire answered {other:?}"),
    }
    w.queue_and_worker(at);
    w.submit(at, "first");
    let (_, _, token) = w.lease_token(at);
    assert_eq!(token, Some(2 * RAISE + 1));
}
