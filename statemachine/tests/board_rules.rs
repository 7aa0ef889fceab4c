//! The task-board contract (contract.md sections 0 and 2, seed 001 `pgstore.BoardStore`), one rule
//! per test, driven through `apply` with hand-built envelopes so the whole envelope path (store
//! clock, entropy, session table) is covered, plus the snapshot judge `board::check`.
#![allow(clippy::unwrap_used)]

use baton_statemachine::board::{
    self, check, BoardProblemCode, Lease, Task, TaskSpec, TaskState, MAX_SEED_TASKS,
};
use baton_statemachine::limits::{MAX_AGENT_BYTES, MAX_DEPENDENCIES, MAX_KEY_BYTES};
use baton_statemachine::{
    apply, Command, Envelope, Origin, Refusal, Reply, Response, Stamp, State,
};

const T0: u64 = 1_000_000;
const CLIENT: u64 = 7;

/// A store plus one client that numbers its requests 1, 2, 3, ...
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

    /// A world seeded with `specs` at T0.
    fn seeded(specs: &[(&str, &[&str])]) -> Self {
        let mut w = World::new();
        let reply = w.send(T0, board::Command::Seed(specs_of(specs))).unwrap();
        assert_eq!(
            reply,
            Reply::Seeded {
                tasks: specs.len() as u64
            }
        );
        w
    }

    /// Sends a board command as the client, stamped `now_ms`, with entropy derived from the
    /// request number.
    fn send(&mut self, now_ms: u64, command: board::Command) -> Result<Reply, Refusal> {
        let entropy = entropy_for(self.seq + 1);
        self.send_with(now_ms, entropy, command)
    }

    /// Sends a board command as the client with an explicit stamp.
    fn send_with(
        &mut self,
        now_ms: u64,
        entropy: u128,
        command: board::Command,
    ) -> Result<Reply, Refusal> {
        self.seq += 1;
        let origin = Origin {
            client_id: CLIENT,
            seq: self.seq,
            acked_below: 0,
        };
        answer(self.send_raw(
            Stamp { now_ms, entropy },
            Some(origin),
            Command::Board(command),
        ))
    }

    fn send_raw(&mut self, stamp: Stamp, origin: Option<Origin>, command: Command) -> Response {
        apply(
            &mut self.state,
            &Envelope {
                stamp,
                origin,
                command,
            },
        )
    }

    fn claim(&mut self, now_ms: u64, id: &str, agent: &str, ttl_ms: i64) -> Result<Task, Refusal> {
        self.send(now_ms, claim(id, agent, ttl_ms))
            .map(|reply| match reply {
                Reply::Task(task) => *task,
                other => panic!("claim answered {other:?}"),
            })
    }

    /// A claim that must succeed; returns its lease.
    fn granted(&mut self, now_ms: u64, id: &str, agent: &str, ttl_ms: i64) -> Lease {
        let task = self
            .claim(now_ms, id, agent, ttl_ms)
            .unwrap_or_else(|refusal| panic!("claim of {id} refused: {refusal:?}"));
        assert_eq!(task.state, TaskState::Claimed);
        task.lease.expect("a granted claim carries its lease")
    }

    fn release(&mut self, now_ms: u64, id: &str, token: &str) -> Result<(), Refusal> {
        self.send(now_ms, release(id, token))
            .map(|reply| assert_eq!(reply, Reply::Done))
    }

    fn complete(&mut self, now_ms: u64, id: &str, token: &str) -> Result<(), Refusal> {
        self.send(now_ms, complete(id, token))
            .map(|reply| assert_eq!(reply, Reply::Done))
    }

    fn renew(&mut self, now_ms: u64, id: &str, token: &str, ttl_ms: i64) -> Result<Task, Refusal> {
        self.send(now_ms, renew(id, token, ttl_ms))
            .map(|reply| match reply {
                Reply::Task(task) => *task,
                other => panic!("renew answered {other:?}"),
            })
    }

    fn reseed(&mut self, now_ms: u64, specs: &[(&str, &[&str])]) {
        self.send(now_ms, board::Command::Seed(specs_of(specs)))
            .unwrap();
    }

    fn sweep(&mut self, now_ms: u64) -> u64 {
        match self.send_raw(Stamp { now_ms, entropy: 0 }, None, Command::Sweep) {
            Response::Answer(Ok(Reply::Swept { expired })) => expired,
            other => panic!("sweep answered {other:?}"),
        }
    }

    fn task(&self, id: &str) -> Task {
        self.state.board.get(id).cloned().expect("task exists")
    }

    fn tasks(&self) -> Vec<Task> {
        self.state.board.tasks().cloned().collect()
    }

    /// Sends `command` without an origin (no session entry), stamped at the current store clock,
    /// expects `expected`, and expects the whole state to be unchanged.
    fn assert_refused_unchanged(&mut self, command: board::Command, expected: &Refusal) {
        let before = self.state.clone();
        let stamp = Stamp {
            now_ms: self.state.clock_ms,
            entropy: 0xdead,
        };
        let response = self.send_raw(stamp, None, Command::Board(command.clone()));
        assert_eq!(
            response,
            Response::Answer(Err(expected.clone())),
            "command {command:?}"
        );
        assert_eq!(
            self.state,
            before,
            "a refused {} must change nothing",
            command.name()
        );
    }
}

fn answer(response: Response) -> Result<Reply, Refusal> {
    match response {
        Response::Answer(result) => result,
        other => panic!("unexpected {other:?}"),
    }
}

fn entropy_for(seq: u64) -> u128 {
    (u128::from(seq) << 64) | 0x0123_4567_89ab_cdef
}

fn specs_of(specs: &[(&str, &[&str])]) -> Vec<TaskSpec> {
    specs
        .iter()
        .map(|(id, deps)| TaskSpec {
            id: (*id).into(),
            deps: deps.iter().map(|d| (*d).into()).collect(),
        })
        .collect()
}

fn claim(id: &str, agent: &str, ttl_ms: i64) -> board::Command {
    board::Command::Claim {
        id: id.into(),
        agent: agent.into(),
        ttl_ms,
    }
}

fn release(id: &str, token: &str) -> board::Command {
    board::Command::Release {
        id: id.into(),
        token: token.into(),
    }
}

fn complete(id: &str, token: &str) -> board::Command {
    board::Command::Complete {
        id: id.into(),
        token: token.into(),
    }
}

fn renew(id: &str, token: &str, ttl_ms: i64) -> board::Command {
    board::Command::Renew {
        id: id.into(),
        token: token.into(),
        ttl_ms,
    }
}

fn is_invalid(result: &Result<Reply, Refusal>, field: &str) -> bool {
    matches!(result, Err(Refusal::Invalid { field: f, rule }) if f == field && !rule.is_empty())
}

// ---------------------------------------------------------------------------------------------
// seed

#[test]
fn seed_with_an_invalid_spec_is_refused_naming_the_field_and_writes_nothing() {
    let spec = |id: &str, deps: &[&str]| TaskSpec {
        id: id.into(),
        deps: deps.iter().map(|d| (*d).into()).collect(),
    };
    let long = "x".repeat(MAX_KEY_BYTES + 1);
    let many_deps: Vec<String> = (0..=MAX_DEPENDENCIES).map(|i| format!("d{i}")).collect();
    let too_many_tasks: Vec<TaskSpec> = (0..=MAX_SEED_TASKS)
        .map(|i| spec(&format!("t{i}"), &[]))
        .collect();
    let cases: Vec<(Vec<TaskSpec>, &str)> = vec![
        (Vec::new(), "tasks"),
        (too_many_tasks, "tasks"),
        (vec![spec("ok", &[]), spec("", &[])], "task.id"),
        (vec![spec("ok", &[]), spec(&long, &[])], "task.id"),
        (vec![spec("ok", &[]), spec("b", &[""])], "task.deps"),
        (vec![spec("ok", &[]), spec("b", &[&long])], "task.deps"),
        (vec![spec("ok", &[]), spec("b", &["b"])], "task.deps"),
        (
            vec![
                spec("ok", &[]),
                TaskSpec {
                    id: "b".into(),
                    deps: many_deps,
                },
            ],
            "task.deps",
        ),
    ];
    for (specs, field) in cases {
        let mut w = World::new();
        let before = w.state.board.clone();
        let result = w.send(T0, board::Command::Seed(specs));
        assert!(
            is_invalid(&result, field),
            "expected invalid {field}, got {result:?}"
        );
        // A valid first spec must not have been written before the invalid one was found.
        assert_eq!(w.state.board, before, "a refused seed writes nothing");
        assert!(w.state.board.get("ok").is_none());
    }
}

#[test]
fn seed_at_the_limits_is_accepted() {
    let mut w = World::new();
    let max_id = "k".repeat(MAX_KEY_BYTES);
    let deps: Vec<String> = (0..MAX_DEPENDENCIES).map(|i| format!("d{i}")).collect();
    let reply = w
        .send(
            T0,
            board::Command::Seed(vec![TaskSpec {
                id: max_id.clone(),
                deps: deps.clone(),
            }]),
        )
        .unwrap();
    assert_eq!(reply, Reply::Seeded { tasks: 1 });
    let task = w.task(&max_id);
    assert_eq!(task.deps, deps);
    assert_eq!(task.state, TaskState::Open);
    assert_eq!(task.lease, None);
    assert_eq!(task.max_fence, 0);
}

#[test]
fn reseed_overwrites_deps_clears_the_lease_and_keeps_the_fence_counter() {
    let mut w = World::seeded(&[("a", &[]), ("b", &[])]);
    let first = w.granted(T0, "a", "alice", 1_000);
    assert_eq!(first.fence, 1);
    assert_eq!(w.state.board.leases(), 1);

    // Same id again, now depending on b: deps overwritten, lease cleared, task open.
    w.reseed(T0 + 1, &[("a", &["b"])]);
    let a = w.task("a");
    assert_eq!(a.deps, vec!["b".to_string()]);
    assert_eq!(a.state, TaskState::Open);
    assert_eq!(a.lease, None);
    assert_eq!(a.max_fence, 1, "the fence counter survives a re-seed");
    assert_eq!(
        w.state.board.leases(),
        0,
        "the cleared lease left the sweep index"
    );
    assert_eq!(w.sweep(T0 + 5_000), 0, "nothing left to expire");

    // The cleared lease's token is dead.
    assert_eq!(
        w.release(T0 + 2, "a", &first.token),
        Err(Refusal::LeaseLost)
    );
    // The new deps apply: a is blocked by b now.
    assert_eq!(w.claim(T0 + 3, "a", "bob", 1_000), Err(Refusal::Blocked));

    // Re-seed without deps: claimable again, and the next fence is still above the old one.
    w.reseed(T0 + 4, &[("a", &[])]);
    let second = w.granted(T0 + 5_001, "a", "bob", 1_000);
    assert_eq!(
        second.fence, 2,
        "fence = highest ever issued + 1, not reset by re-seed"
    );
    assert!(check(&w.tasks(), w.state.clock_ms).is_empty());
}

#[test]
fn reseeding_a_done_task_never_makes_it_claimable_again() {
    let mut w = World::seeded(&[("a", &[])]);
    let lease = w.granted(T0, "a", "alice", 1_000);
    w.complete(T0 + 1, "a", &lease.token)
        .expect("the holder completes");
    assert_eq!(w.task("a").state, TaskState::Done);
    w.reseed(T0 + 2, &[("a", &["z"])]);
    let a = w.task("a");
    assert_eq!(
        a.state,
        TaskState::Done,
        "a host re-seeding its topology must not reopen work"
    );
    assert_eq!(
        a.deps,
        vec!["z".to_string()],
        "the content is still overwritten"
    );
    w.assert_refused_unchanged(claim("a", "bob", 1_000), &Refusal::AlreadyDone);
}

#[test]
fn reseeding_a_task_leaves_other_tasks_alone() {
    let mut w = World::seeded(&[("a", &[]), ("b", &[])]);
    let lease_b = w.granted(T0, "b", "bob", 1_000);
    w.reseed(T0 + 1, &[("a", &[])]);
    assert_eq!(w.task("b").lease, Some(lease_b.clone()));
    assert_eq!(w.state.board.len(), 2);
    w.renew(T0 + 2, "b", &lease_b.token, 1_000).unwrap();
}

// ---------------------------------------------------------------------------------------------
// claim: validation and judging order

#[test]
fn claim_with_invalid_input_is_refused_and_changes_nothing() {
    let mut w = World::seeded(&[("a", &[])]);
    let long_id = "x".repeat(MAX_KEY_BYTES + 1);
    let long_agent = "x".repeat(MAX_AGENT_BYTES + 1);
    let cases: Vec<(board::Command, &str)> = vec![
        (claim("", "alice", 100), "id"),
        (claim(&long_id, "alice", 100), "id"),
        (claim("a", "", 100), "agent"),
        (claim("a", &long_agent, 100), "agent"),
        (claim("a", "alice", 0), "ttl"),
        (claim("a", "alice", -1), "ttl"),
        (claim("a", "alice", i64::MIN), "ttl"),
    ];
    for (command, field) in cases {
        let before = w.state.board.clone();
        let result = w.send(T0, command.clone());
        assert!(
            is_invalid(&result, field),
            "{command:?}: expected invalid {field}, got {result:?}"
        );
        assert_eq!(w.state.board, before);
    }
    assert_eq!(
        w.task("a").max_fence,
        0,
        "no refused claim consumed a fence"
    );
}

#[test]
fn claim_of_an_unknown_task_is_unknown_task() {
    let mut w = World::seeded(&[("a", &[])]);
    w.assert_refused_unchanged(claim("nope", "alice", 100), &Refusal::UnknownTask);
}

#[test]
fn claim_judges_done_before_blocked() {
    // b is done and then re-seeded to depend on an open task x: it stays done, and done wins.
    let mut w = World::seeded(&[("b", &[]), ("x", &[])]);
    let lb = w.granted(T0, "b", "bob", 1_000);
    w.complete(T0, "b", &lb.token).unwrap();
    w.reseed(T0, &[("b", &["x"])]);
    assert_eq!(w.task("b").state, TaskState::Done);
    assert_eq!(w.task("x").state, TaskState::Open);
    w.assert_refused_unchanged(claim("b", "carol", 1_000), &Refusal::AlreadyDone);
}

#[test]
fn claim_judges_blocked_before_taken_and_a_claimed_task_cannot_become_blocked() {
    // Blocked is judged before taken, but a claimed task's dependencies are done and stay done
    // (re-seeding never reopens a done task), so a live lease always reads as taken.
    let mut w = World::seeded(&[("a", &[]), ("b", &["a"])]);
    assert_eq!(w.claim(T0, "b", "bob", 1_000), Err(Refusal::Blocked));
    let la = w.granted(T0, "a", "alice", 1_000);
    w.complete(T0, "a", &la.token).unwrap();
    w.granted(T0, "b", "bob", 1_000);
    w.reseed(T0, &[("a", &[])]);
    assert_eq!(w.task("a").state, TaskState::Done);
    assert_eq!(w.task("b").state, TaskState::Claimed);
    w.assert_refused_unchanged(claim("b", "carol", 1_000), &Refusal::Taken);
}

#[test]
fn claim_judges_taken_before_granted() {
    let mut w = World::seeded(&[("a", &[])]);
    let lease = w.granted(T0, "a", "alice", 1_000);
    // The holder itself claiming again is also taken: a claim is not a renewal.
    w.assert_refused_unchanged(claim("a", "alice", 1_000), &Refusal::Taken);
    w.assert_refused_unchanged(claim("a", "bob", 1_000), &Refusal::Taken);
    assert_eq!(w.task("a").lease, Some(lease));
}

#[test]
fn claim_is_blocked_until_every_dependency_is_done() {
    let mut w = World::seeded(&[("a", &[]), ("b", &[]), ("c", &["a", "b", "ghost"])]);
    w.assert_refused_unchanged(claim("c", "carol", 100), &Refusal::Blocked);
    let la = w.granted(T0, "a", "alice", 1_000);
    // A claimed (not done) dependency still blocks.
    w.assert_refused_unchanged(claim("c", "carol", 100), &Refusal::Blocked);
    w.complete(T0, "a", &la.token).unwrap();
    let lb = w.granted(T0, "b", "bob", 1_000);
    w.complete(T0, "b", &lb.token).unwrap();
    // A dependency naming no task is never done.
    w.assert_refused_unchanged(claim("c", "carol", 100), &Refusal::Blocked);
    w.reseed(T0, &[("c", &["a", "b"])]);
    let lc = w.granted(T0, "c", "carol", 100);
    assert_eq!(lc.fence, 1);
}

#[test]
fn claim_of_a_done_task_is_already_done() {
    let mut w = World::seeded(&[("a", &[])]);
    let lease = w.granted(T0, "a", "alice", 1_000);
    w.complete(T0 + 1, "a", &lease.token).unwrap();
    assert_eq!(w.task("a").state, TaskState::Done);
    assert_eq!(w.task("a").lease, None);
    w.assert_refused_unchanged(claim("a", "bob", 1_000), &Refusal::AlreadyDone);
}

// ---------------------------------------------------------------------------------------------
// claim: what a grant mints

#[test]
fn granted_claim_mints_token_from_the_stamp_entropy_fence_and_deadline() {
    let mut w = World::seeded(&[("a", &[])]);
    let entropy: u128 = 0x0fed_cba9_8765_4321_0011_2233_4455_6677;
    let task = match w.send_with(T0 + 10, entropy, claim("a", "alice", 250)) {
        Ok(Reply::Task(task)) => *task,
        other => panic!("claim answered {other:?}"),
    };
    let lease = task.lease.clone().unwrap();
    assert_eq!(lease.token, "0fedcba9876543210011223344556677");
    assert_eq!(lease.token.len(), 32);
    assert!(lease
        .token
        .chars()
        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    assert_eq!(lease.agent, "alice");
    assert_eq!(lease.fence, 1);
    assert_eq!(lease.until_ms, T0 + 10 + 250, "until = store clock + ttl");
    assert_eq!(task.max_fence, 1);
    assert_eq!(task.state, TaskState::Claimed);
    assert_eq!(w.task("a"), task, "the reply is the stored task");

    // Small entropy is zero-padded to 32 characters.
    let mut w = World::seeded(&[("b", &[])]);
    let lease = match w.send_with(T0, 0xab, claim("b", "bob", 10)) {
        Ok(Reply::Task(task)) => task.lease.unwrap(),
        other => panic!("claim answered {other:?}"),
    };
    assert_eq!(lease.token, format!("{:032x}", 0xab));
}

#[test]
fn deadline_uses_the_store_clock_not_a_lagging_leader_stamp() {
    let mut w = World::seeded(&[("a", &[])]);
    w.sweep(T0 + 5_000);
    // A new leader whose wall clock is behind the store clock.
    let lease = w.granted(T0 + 1_000, "a", "alice", 100);
    assert_eq!(lease.until_ms, T0 + 5_000 + 100);
}

#[test]
fn fences_strictly_increase_across_claim_release_and_expiry() {
    let mut w = World::seeded(&[("a", &[])]);
    let mut fences = Vec::new();
    // claim, release
    let l = w.granted(T0, "a", "alice", 1_000);
    fences.push(l.fence);
    w.release(T0 + 1, "a", &l.token).unwrap();
    // claim, release again
    let l = w.granted(T0 + 2, "a", "bob", 1_000);
    fences.push(l.fence);
    w.release(T0 + 3, "a", &l.token).unwrap();
    // claim, lazy expiry, claim by someone else
    let l = w.granted(T0 + 4, "a", "alice", 100);
    fences.push(l.fence);
    let l = w.granted(T0 + 104, "a", "bob", 100);
    fences.push(l.fence);
    // expiry materialised by a sweep, then claim
    assert_eq!(w.sweep(T0 + 204), 1);
    let l = w.granted(T0 + 205, "a", "carol", 100);
    fences.push(l.fence);
    assert_eq!(fences, vec![1, 2, 3, 4, 5]);
    assert_eq!(w.task("a").max_fence, 5);
}

#[test]
fn fences_are_per_task() {
    let mut w = World::seeded(&[("a", &[]), ("b", &[])]);
    let la = w.granted(T0, "a", "alice", 100);
    w.release(T0, "a", &la.token).unwrap();
    let la = w.granted(T0, "a", "alice", 100);
    let lb = w.granted(T0, "b", "bob", 100);
    assert_eq!(la.fence, 2);
    assert_eq!(lb.fence, 1);
}

#[test]
fn a_retried_claim_returns_the_first_answer_not_taken() {
    let mut w = World::seeded(&[("a", &[])]);
    let origin = Origin {
        client_id: 99,
        seq: 1,
        acked_below: 0,
    };
    let first = w.send_raw(
        Stamp {
            now_ms: T0,
            entropy: 1,
        },
        Some(origin),
        Command::Board(claim("a", "alice", 1_000)),
    );
    let after_first = w.state.clone();
    let retry = w.send_raw(
        Stamp {
            now_ms: T0 + 10,
            entropy: 2,
        },
        Some(origin),
        Command::Board(claim("a", "alice", 1_000)),
    );
    assert!(matches!(&first, Response::Answer(Ok(Reply::Task(_)))));
    assert_eq!(retry, first, "the retry gets the winning answer again");
    assert_eq!(w.state, after_first, "and executes nothing");
    assert_eq!(w.task("a").max_fence, 1);
}

// ---------------------------------------------------------------------------------------------
// release / complete / renew: only the current, unexpired token

#[test]
fn release_frees_the_task_for_the_next_claim() {
    let mut w = World::seeded(&[("a", &[])]);
    let l = w.granted(T0, "a", "alice", 1_000);
    w.release(T0 + 1, "a", &l.token).unwrap();
    let a = w.task("a");
    assert_eq!(a.state, TaskState::Open);
    assert_eq!(a.lease, None);
    assert_eq!(w.state.board.leases(), 0);
    // The released token is dead for every holder action.
    w.assert_refused_unchanged(release("a", &l.token), &Refusal::LeaseLost);
    w.assert_refused_unchanged(complete("a", &l.token), &Refusal::LeaseLost);
    w.assert_refused_unchanged(renew("a", &l.token, 100), &Refusal::LeaseLost);
    w.granted(T0 + 2, "a", "bob", 1_000);
}

#[test]
fn complete_makes_the_task_done_and_unblocks_dependents() {
    let mut w = World::seeded(&[("a", &[]), ("b", &["a"])]);
    let l = w.granted(T0, "a", "alice", 1_000);
    w.complete(T0 + 1, "a", &l.token).unwrap();
    assert_eq!(w.task("a").state, TaskState::Done);
    assert_eq!(w.state.board.leases(), 0);
    w.assert_refused_unchanged(complete("a", &l.token), &Refusal::LeaseLost);
    w.assert_refused_unchanged(release("a", &l.token), &Refusal::LeaseLost);
    w.granted(T0 + 2, "b", "bob", 1_000);
}

#[test]
fn holder_actions_with_a_wrong_token_are_lease_lost_and_change_nothing() {
    let mut w = World::seeded(&[("a", &[]), ("b", &[])]);
    let la = w.granted(T0, "a", "alice", 1_000);
    let lb = w.granted(T0, "b", "bob", 1_000);
    for token in ["0".repeat(32), lb.token.clone(), la.token.to_uppercase()] {
        w.assert_refused_unchanged(release("a", &token), &Refusal::LeaseLost);
        w.assert_refused_unchanged(complete("a", &token), &Refusal::LeaseLost);
        w.assert_refused_unchanged(renew("a", &token, 100), &Refusal::LeaseLost);
    }
    // On a task that was never claimed there is no current token at all.
    w.reseed(T0, &[("c", &[])]);
    w.assert_refused_unchanged(release("c", &la.token), &Refusal::LeaseLost);
    w.assert_refused_unchanged(complete("c", &la.token), &Refusal::LeaseLost);
    w.assert_refused_unchanged(renew("c", &la.token, 100), &Refusal::LeaseLost);
}

#[test]
fn holder_actions_on_an_unknown_task_or_with_an_empty_token_are_refused() {
    let mut w = World::seeded(&[("a", &[])]);
    let l = w.granted(T0, "a", "alice", 1_000);
    w.assert_refused_unchanged(release("zz", &l.token), &Refusal::UnknownTask);
    w.assert_refused_unchanged(complete("zz", &l.token), &Refusal::UnknownTask);
    w.assert_refused_unchanged(renew("zz", &l.token, 10), &Refusal::UnknownTask);
    for command in [release("a", ""), complete("a", ""), renew("a", "", 10)] {
        let before = w.state.board.clone();
        let result = w.send(T0, command);
        assert!(is_invalid(&result, "token"), "got {result:?}");
        assert_eq!(w.state.board, before);
    }
}

#[test]
fn holder_actions_after_expiry_are_lease_lost_even_with_the_right_token() {
    for (name, command) in [
        ("release", release as fn(&str, &str) -> board::Command),
        ("complete", complete),
        ("renew", |id, token| renew(id, token, 1_000)),
    ] {
        let mut w = World::seeded(&[("a", &[])]);
        let l = w.granted(T0, "a", "alice", 100);
        // Exactly at `until` the lease no longer holds.
        let result = w.send(l.until_ms, command("a", &l.token));
        assert_eq!(result, Err(Refusal::LeaseLost), "{name} at until");
        let a = w.task("a");
        assert_eq!(
            a.state,
            TaskState::Open,
            "{name}: the expiry was materialised"
        );
        assert_eq!(a.lease, None);
        assert_eq!(w.state.board.leases(), 0);
    }
}

#[test]
fn holder_actions_just_before_expiry_succeed() {
    let mut w = World::seeded(&[("a", &[])]);
    let l = w.granted(T0, "a", "alice", 100);
    w.renew(l.until_ms - 1, "a", &l.token, 100).unwrap();
    let mut w = World::seeded(&[("a", &[])]);
    let l = w.granted(T0, "a", "alice", 100);
    w.complete(l.until_ms - 1, "a", &l.token).unwrap();
    assert_eq!(w.task("a").state, TaskState::Done);
}

#[test]
fn a_late_holder_cannot_touch_a_newer_holders_lease() {
    let mut w = World::seeded(&[("a", &[])]);
    let old = w.granted(T0, "a", "alice", 100);
    let new = w.granted(T0 + 100, "a", "bob", 1_000);
    assert!(new.fence > old.fence);
    assert_ne!(new.token, old.token);
    w.assert_refused_unchanged(release("a", &old.token), &Refusal::LeaseLost);
    w.assert_refused_unchanged(complete("a", &old.token), &Refusal::LeaseLost);
    w.assert_refused_unchanged(renew("a", &old.token, 5_000), &Refusal::LeaseLost);
    assert_eq!(w.task("a").lease, Some(new.clone()));
    assert_eq!(w.task("a").state, TaskState::Claimed);
    // The new holder is unaffected.
    w.complete(T0 + 200, "a", &new.token).unwrap();
}

#[test]
fn renew_keeps_token_and_fence_and_extends_until() {
    let mut w = World::seeded(&[("a", &[])]);
    let l = w.granted(T0, "a", "alice", 100);
    let task = w.renew(T0 + 50, "a", &l.token, 300).unwrap();
    let renewed = task.lease.clone().unwrap();
    assert_eq!(renewed.token, l.token, "renewal is not a takeover");
    assert_eq!(renewed.fence, l.fence);
    assert_eq!(renewed.agent, l.agent);
    assert_eq!(renewed.until_ms, T0 + 50 + 300);
    assert_eq!(task.max_fence, l.fence, "renewal mints no fence");
    assert_eq!(w.task("a"), task);

    // The old deadline no longer applies: still held after it, for claims and for the sweep.
    assert_eq!(w.claim(T0 + 200, "a", "bob", 100), Err(Refusal::Taken));
    assert_eq!(w.sweep(T0 + 200), 0);
    w.renew(T0 + 250, "a", &l.token, 100).unwrap();
    // The new deadline does: the sweep frees it exactly once at T0 + 350.
    assert_eq!(w.sweep(T0 + 349), 0);
    assert_eq!(w.sweep(T0 + 350), 1);
    assert_eq!(w.state.board.leases(), 0);
}

#[test]
fn renew_with_a_non_positive_ttl_is_refused_and_keeps_the_lease() {
    let mut w = World::seeded(&[("a", &[])]);
    let l = w.granted(T0, "a", "alice", 100);
    for ttl in [0, -1, i64::MIN] {
        let before = w.state.board.clone();
        let result = w.send(T0 + 1, renew("a", &l.token, ttl));
        assert!(is_invalid(&result, "ttl"), "got {result:?}");
        assert_eq!(w.state.board, before);
    }
}

#[test]
fn expired_lease_can_be_claimed_by_someone_else_with_a_higher_fence() {
    let mut w = World::seeded(&[("a", &[])]);
    let old = w.granted(T0, "a", "alice", 100);
    assert_eq!(w.claim(T0 + 99, "a", "bob", 100), Err(Refusal::Taken));
    // No sweep ran: the claim judges the expiry itself.
    let new = w.granted(T0 + 100, "a", "bob", 100);
    assert_eq!(new.agent, "bob");
    assert_eq!(new.fence, old.fence + 1);
    assert_eq!(
        w.state.board.leases(),
        1,
        "the expired lease left the sweep index"
    );
    assert_eq!(
        w.sweep(T0 + 150),
        0,
        "the old lease is not swept on top of the new one"
    );
    assert_eq!(w.task("a").lease, Some(new));
}

#[test]
fn sweep_frees_overdue_leases_and_only_those() {
    let mut w = World::seeded(&[("a", &[]), ("b", &[]), ("c", &[])]);
    w.granted(T0, "a", "alice", 100);
    w.granted(T0, "b", "bob", 200);
    let lc = w.granted(T0, "c", "carol", 300);
    assert!(!w.state.sweep_due(T0 + 99));
    assert_eq!(w.sweep(T0 + 99), 0);
    assert!(w.state.sweep_due(T0 + 200));
    assert_eq!(
        w.sweep(T0 + 200),
        2,
        "a and b are due (b exactly at its until)"
    );
    for id in ["a", "b"] {
        assert_eq!(w.task(id).state, TaskState::Open);
        assert_eq!(w.task(id).lease, None);
    }
    assert_eq!(w.task("c").lease, Some(lc));
    assert_eq!(w.state.board.leases(), 1);
    assert!(check(&w.tasks(), w.state.clock_ms).is_empty());
    assert_eq!(w.sweep(T0 + 300), 1);
    assert_eq!(w.state.board.leases(), 0);
    assert!(!w.state.sweep_due(T0 + 10_000));
}

// ---------------------------------------------------------------------------------------------
// check: one test per problem code

fn open(id: &str, deps: &[&str]) -> Task {
    Task {
        id: id.into(),
        deps: deps.iter().map(|d| (*d).into()).collect(),
        state: TaskState::Open,
        lease: None,
        max_fence: 0,
    }
}

fn claimed(id: &str, fence: u64, until_ms: u64) -> Task {
    Task {
        id: id.into(),
        deps: Vec::new(),
        state: TaskState::Claimed,
        lease: Some(Lease {
            agent: "alice".into(),
            token: String::new(),
            fence,
            until_ms,
        }),
        max_fence: fence,
    }
}

fn codes(tasks: &[Task], now_ms: u64) -> Vec<(String, BoardProblemCode)> {
    check(tasks, now_ms)
        .into_iter()
        .map(|p| {
            assert!(!p.text.is_empty(), "every problem explains itself");
            (p.id, p.code)
        })
        .collect()
}

fn one(id: &str, code: BoardProblemCode) -> Vec<(String, BoardProblemCode)> {
    vec![(id.to_string(), code)]
}

#[test]
fn check_accepts_a_consistent_snapshot() {
    let done = Task {
        state: TaskState::Done,
        max_fence: 3,
        ..open("a", &[])
    };
    let tasks = vec![done, claimed("b", 2, T0 + 1), open("c", &["a", "b"])];
    assert_eq!(codes(&tasks, T0), Vec::new());
    // claimed b depending on done a is fine too
    let mut b = claimed("b", 2, T0 + 1);
    b.deps = vec!["a".into()];
    let tasks = vec![
        Task {
            state: TaskState::Done,
            ..open("a", &[])
        },
        b,
    ];
    assert_eq!(codes(&tasks, T0), Vec::new());
}

#[test]
fn check_reports_empty_id() {
    assert_eq!(
        codes(&[open("", &[])], T0),
        one("", BoardProblemCode::EmptyId)
    );
}

#[test]
fn check_reports_duplicate_id() {
    let tasks = vec![open("a", &[]), open("a", &[])];
    assert_eq!(codes(&tasks, T0), one("a", BoardProblemCode::DuplicateId));
}

#[test]
fn check_reports_unknown_state() {
    let task = Task {
        state: TaskState::parse("paused"),
        ..open("a", &[])
    };
    assert_eq!(task.state, TaskState::Unrecognized("paused".into()));
    assert_eq!(codes(&[task], T0), one("a", BoardProblemCode::UnknownState));
}

#[test]
fn check_reports_holder_mismatch_both_ways() {
    // claimed without a lease
    let no_lease = Task {
        state: TaskState::Claimed,
        ..open("a", &[])
    };
    assert_eq!(
        codes(&[no_lease], T0),
        one("a", BoardProblemCode::HolderMismatch)
    );
    // a lease on an open task, and on a done task
    for state in [TaskState::Open, TaskState::Done] {
        let stray = Task {
            state,
            ..claimed("a", 1, T0 + 100)
        };
        assert_eq!(
            codes(&[stray], T0),
            one("a", BoardProblemCode::HolderMismatch)
        );
    }
}

#[test]
fn check_reports_missing_fence() {
    assert_eq!(
        codes(&[claimed("a", 0, T0 + 100)], T0),
        one("a", BoardProblemCode::MissingFence)
    );
}

#[test]
fn check_reports_fence_regression() {
    let task = Task {
        max_fence: 2,
        ..claimed("a", 3, T0 + 100)
    };
    assert_eq!(
        codes(&[task], T0),
        one("a", BoardProblemCode::FenceRegression)
    );
    // a lease below the recorded maximum is an older claim being listed, not a regression
    let task = Task {
        max_fence: 4,
        ..claimed("a", 3, T0 + 100)
    };
    assert_eq!(codes(&[task], T0), Vec::new());
}

#[test]
fn check_reports_overdue_lease_from_its_until_on() {
    let tasks = [claimed("a", 1, T0 + 100)];
    assert_eq!(codes(&tasks, T0 + 99), Vec::new());
    assert_eq!(
        codes(&tasks, T0 + 100),
        one("a", BoardProblemCode::OverdueLease)
    );
}

#[test]
fn check_reports_dependency_not_done_for_claimed_and_done_tasks() {
    for state in [TaskState::Claimed, TaskState::Done] {
        let dependent = if state == TaskState::Claimed {
            Task {
                deps: vec!["a".into()],
                ..claimed("b", 1, T0 + 100)
            }
        } else {
            Task {
                state,
                ..open("b", &["a"])
            }
        };
        let tasks = vec![open("a", &[]), dependent];
        assert_eq!(
            codes(&tasks, T0),
            one("b", BoardProblemCode::DependencyNotDone)
        );
    }
    // an open task waiting on an open dependency is normal
    assert_eq!(codes(&[open("a", &[]), open("b", &["a"])], T0), Vec::new());
}

#[test]
fn check_reports_unknown_dependency() {
    assert_eq!(
        codes(&[open("b", &["ghost"])], T0),
        one("b", BoardProblemCode::UnknownDependency)
    );
}

/// Seeding refuses a task depending on itself, not a longer cycle: its tasks (and those waiting
/// on them) can never be claimed, which the judge says. A done task breaks a cycle.
#[test]
fn check_reports_tasks_blocked_by_a_dependency_cycle() {
    let tasks = vec![
        open("a", &["b"]),
        open("b", &["c"]),
        open("c", &["a"]),
        open("d", &["a"]),
        open("e", &[]),
        open("f", &["e", "ghost"]),
    ];
    let cycle = |tasks: &[Task]| -> Vec<(String, BoardProblemCode)> {
        codes(tasks, T0)
            .into_iter()
            .filter(|(_, code)| *code == BoardProblemCode::DependencyCycle)
            .collect()
    };
    assert_eq!(
        cycle(&tasks),
        ["a", "b", "c", "d"]
            .map(|id| (id.to_string(), BoardProblemCode::DependencyCycle))
            .to_vec()
    );
    let broken = vec![
        open("a", &["b"]),
        Task {
            state: TaskState::Done,
            ..open("b", &["a"])
        },
    ];
    assert_eq!(cycle(&broken), Vec::new());
    // Seeded through the store: the board accepts the cycle, the judge reports it.
    let w = World::seeded(&[("x", &["y"]), ("y", &["x"])]);
    assert_eq!(
        codes(&w.tasks(), T0),
        vec![
            ("x".to_string(), BoardProblemCode::DependencyCycle),
            ("y".to_string(), BoardProblemCode::DependencyCycle),
        ]
    );
}

#[test]
fn check_output_is_sorted_by_id_then_code() {
    let tasks = vec![
        // z: overdue, and its lease fence exceeds the recorded max (two codes)
        Task {
            max_fence: 0,
            ..claimed("z", 1, T0)
        },
        open("m", &["ghost"]),
        open("a", &[]),
        Task {
            state: TaskState::Unrecognized("weird".into()),
            ..open("a", &[])
        },
    ];
    let got = codes(&tasks, T0);
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(got, sorted);
    assert_eq!(
        got,
        vec![
            ("a".to_string(), BoardProblemCode::DuplicateId),
            ("a".to_string(), BoardProblemCode::UnknownState),
            ("m".to_string(), BoardProblemCode::UnknownDependency),
            ("z".to_string(), BoardProblemCode::FenceRegression),
            ("z".to_string(), BoardProblemCode::OverdueLease),
        ]
    );
}

/// Codes of one task sort by their stable strings, as handoff's do: `dependency_not_done`
/// before `holder_mismatch`, although the enum declares them the other way round.
#[test]
fn problems_of_one_task_sort_by_their_code_strings() {
    let tasks = vec![
        // Done while still leased, and while its dependency is open: two codes.
        Task {
            state: TaskState::Done,
            deps: vec!["d".into()],
            max_fence: 1,
            ..claimed("t", 1, T0 + 60_000)
        },
        open("d", &[]),
    ];
    let got: Vec<&str> = codes(&tasks, T0)
        .iter()
        .map(|(_, code)| code.as_str())
        .collect();
    assert_eq!(got, vec!["dependency_not_done", "holder_mismatch"]);
}

#[test]
fn check_codes_have_stable_names() {
    let names: Vec<&str> = [
        BoardProblemCode::EmptyId,
        BoardProblemCode::DuplicateId,
        BoardProblemCode::UnknownState,
        BoardProblemCode::HolderMismatch,
        BoardProblemCode::MissingFence,
        BoardProblemCode::FenceRegression,
        BoardProblemCode::OverdueLease,
        BoardProblemCode::DependencyNotDone,
        BoardProblemCode::DependencyCycle,
        BoardProblemCode::UnknownDependency,
    ]
    .iter()
    .map(BoardProblemCode::as_str)
    .collect();
    assert_eq!(
        names,
        vec![
            "empty_id",
            "duplicate_id",
            "unknown_state",
            "holder_mismatch",
            "missing_fence",
            "fence_regression",
            "overdue_lease",
            "dependency_not_done",
            "dependency_cycle",
            "unknown_dependency",
        ]
    );
}

#[test]
fn check_is_clean_after_operations_and_shows_expiry_until_swept() {
    let mut w = World::seeded(&[("a", &[]), ("b", &["a"]), ("c", &[]), ("d", &["c"])]);
    let la = w.granted(T0, "a", "alice", 1_000);
    assert!(check(&w.tasks(), w.state.clock_ms).is_empty());
    w.renew(T0 + 10, "a", &la.token, 1_000).unwrap();
    w.complete(T0 + 20, "a", &la.token).unwrap();
    let lb = w.granted(T0 + 30, "b", "bob", 1_000);
    w.release(T0 + 40, "b", &lb.token).unwrap();
    let lb = w.granted(T0 + 50, "b", "bob", 1_000);
    w.complete(T0 + 60, "b", &lb.token).unwrap();
    w.granted(T0 + 70, "c", "carol", 100);
    assert!(check(&w.tasks(), w.state.clock_ms).is_empty());

    // c's lease runs out with nobody touching it: the judge makes the leftover visible...
    let later = T0 + 170;
    assert_eq!(
        codes(&w.tasks(), later),
        one("c", BoardProblemCode::OverdueLease)
    );
    // ...and the sweep removes it.
    assert_eq!(w.sweep(later), 1);
    assert!(check(&w.tasks(), w.state.clock_ms).is_empty());
    let lc = w.granted(later + 1, "c", "dave", 100);
    assert_eq!(lc.fence, 2);
    w.complete(later + 2, "c", &lc.token).unwrap();
    let ld = w.granted(later + 3, "d", "erin", 100);
    w.complete(later + 4, "d", &ld.token).unwrap();
    assert!(check(&w.tasks(), w.state.clock_ms).is_empty());
    assert!(w.tasks().iter().all(|t| t.state == TaskState::Done));
}
