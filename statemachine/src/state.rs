//! The whole replicated state and the one function that changes it.

use serde::{Deserialize, Serialize};

use crate::board::{self, Board};
use crate::change::{Change, ChangeKind, ChangeValue, Primitive};
use crate::checkpoint::{self, Checkpoints};
use crate::command::{Command, Envelope, Origin, Reply, Response, Stamp};
use crate::effect::{self, Gate};
use crate::error::Refusal;
use crate::handoff::{self, Desk};
use crate::queue::{self, TaskQueue};
use crate::rules;
use crate::session::{SessionLookup, Sessions};
use crate::sink::{self, Sink};
use crate::sweep::Plan;

/// Everything the store knows. Snapshots are this, serialized.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The store clock in Unix milliseconds: the largest leader stamp of any command executed so
    /// far (a retry answered from the session table executes nothing). It never runs backwards,
    /// even when a new leader's wall clock is behind the old one's.
    pub clock_ms: u64,
    /// Client sessions, for exactly-once answers to retries.
    pub sessions: Sessions,
    /// Handoff tickets.
    pub handoff: Desk,
    /// Task-board tasks.
    pub board: Board,
    /// Side-effect gate keys and resources.
    pub effects: Gate,
    /// Fenced-sink resources.
    pub sink: Sink,
    /// Checkpoints per run.
    pub checkpoints: Checkpoints,
    /// The keyed-concurrency task queue.
    pub queue: TaskQueue,
    /// What every fence counter created from now on starts at: a new resource, task, ticket key
    /// or permit key mints its first fence, generation or token above it. The sum of the raises
    /// a restore made ([`State::raise_fences`]); 0 in a cluster never restored. Outside the
    /// derived encoding, so a snapshot of a state never raised has the layout it always had; a
    /// node's codec writes it after the state when it is not 0.
    #[serde(skip)]
    pub fence_floor: u64,
    /// The apply rules in force ([`crate::rules`]): 0 until the cluster adopts newer ones. Like
    /// [`State::fence_floor`], outside the derived encoding: a node's codec writes it after the
    /// floor when it is not 0, so a build from before versioned rules refuses such a state
    /// instead of applying later entries by its older rules.
    #[serde(skip)]
    pub rules: u32,
}

/// The largest raise [`State::raise_fences`] is meant for: 2^40 (a trillion) leaves room for
/// millions of raises before a counter nears its end.
pub const MAX_FENCE_RAISE: u64 = 1 << 40;

impl State {
    /// Raises every fence the store mints by `by`: board fences, ticket generations, side-effect
    /// resource fences and queue permit tokens (and queue task ids), and the floor counters
    /// created from now on start at ([`State::fence_floor`]): the old cluster may have created a
    /// resource, task or key after the save and handed out its first fences. The next one of each
    /// is then above any the store handed out after this state was saved, as long as no key was
    /// granted `by` times since. A raise is at most [`MAX_FENCE_RAISE`] (a larger `by` raises by
    /// that), so that counters minted by adding one stay far from their end.
    ///
    /// For a restore from a backup: the old cluster went on minting after the save, and the
    /// restored one would otherwise mint those fences again (contract §0: never reset, never
    /// reused), so a fenced resource could not tell a late holder of the old cluster from a new
    /// one. Live side-effect attempts lose their fence (their actions are refused `FENCE_STALE`
    /// and their intents end uncertain, to reconcile): whether they finished after the save is
    /// unknown. Live leases, handles and attempts of the other primitives keep working.
    pub fn raise_fences(&mut self, by: u64) {
        let by = by.min(MAX_FENCE_RAISE);
        self.fence_floor = self.fence_floor.saturating_add(by);
        self.board.raise_fences(by);
        self.handoff.raise_generations(by);
        self.effects.raise_fences(by);
        self.queue.raise_tokens(by);
    }
}

/// Applies one log entry. Deterministic: the result depends only on `state` and `envelope`.
///
/// A repeated `(client_id, seq)` gets the response of its first application and changes nothing,
/// not even the store clock: only a command that is executed advances it.
pub fn apply(state: &mut State, envelope: &Envelope) -> Response {
    apply_with_changes(state, envelope).0
}

/// [`apply`], also reporting every state change the entry made, in the order it made them (see
/// [`Change`]). A retry answered from the session table, and a refusal that changed nothing,
/// report none; a refusal judged after a lazy expiry reports that expiry.
pub fn apply_with_changes(state: &mut State, envelope: &Envelope) -> (Response, Vec<Change>) {
    let mut changes = Vec::new();
    let Some(origin) = &envelope.origin else {
        let answer = execute(state, &envelope.stamp, &envelope.command, &mut changes);
        return (Response::Answer(answer), changes);
    };
    let response = match state.sessions.lookup(origin) {
        SessionLookup::Seen(first) => first,
        SessionLookup::Forgotten => Response::SessionExpired,
        SessionLookup::New
            if !state
                .sessions
                .admits(origin, state.clock_ms.max(envelope.stamp.now_ms)) =>
        {
            Response::SessionsFull
        }
        SessionLookup::New => {
            let answer = execute(state, &envelope.stamp, &envelope.command, &mut changes);
            let response = Response::Answer(answer);
            state
                .sessions
                .record(origin, response.clone(), state.clock_ms);
            response
        }
    };
    (response, changes)
}

impl State {
    /// What applying `command` from `origin` with a stamp of `now_ms` would answer, when that
    /// answer is known to change nothing the command is about: a retry already answered (the
    /// session table's response), or a refusal judged on this state (a claim of a held task, a
    /// take of a taken ticket). `None` when the command must go through the log.
    ///
    /// Applied through the log, such a command would also move the store clock and record its
    /// answer in the session table; neither is needed for a refusal, which a retry may safely
    /// judge again. The leader uses this, on a state confirmed current by a read index, to answer
    /// contended requests without a log entry and a quorum fsync, for a request's first attempt
    /// only: a retry gets just [`State::answered`], and the service of every command refused
    /// here passes the client's retry mark on (`Node::propose_attempt`).
    pub fn prejudge(
        &self,
        origin: Option<&Origin>,
        command: &Command,
        now_ms: u64,
    ) -> Option<Response> {
        if let Some(answer) = origin.and_then(|origin| self.answered(origin)) {
            return Some(answer);
        }
        let clock = self.clock_ms.max(now_ms);
        let refusal = match command {
            Command::Board(board::Command::Claim { id, agent, ttl_ms }) => {
                self.board.claim_refused(clock, id, agent, *ttl_ms)
            }
            Command::Handoff(handoff::Command::Take { key, to }) => {
                self.handoff.take_refused(clock, key, to)
            }
            _ => None,
        }?;
        Some(Response::Answer(Err(refusal)))
    }
}

impl State {
    /// The answer the session table holds for `origin`'s request: its first answer, or
    /// `SessionExpired` when the request is older than the table remembers; `None` when it was
    /// never applied.
    ///
    /// All a retry may be answered with outside the log: an earlier attempt of it may sit in the
    /// log unapplied, and a refusal judged on the state (see [`State::prejudge`]) could contradict
    /// what that attempt does once applied.
    pub fn answered(&self, origin: &Origin) -> Option<Response> {
        match self.sessions.lookup(origin) {
            SessionLookup::Seen(first) => Some(first),
            SessionLookup::Forgotten => Some(Response::SessionExpired),
            SessionLookup::New => None,
        }
    }
}

/// Runs one command and appends the changes it made to `changes`.
fn execute(
    state: &mut State,
    stamp: &Stamp,
    command: &Command,
    changes: &mut Vec<Change>,
) -> Result<Reply, Refusal> {
    let answer = run(state, stamp, command);
    // Only the sweep touches more than one primitive, and it runs them in this order.
    append(changes, state.handoff.take_changes());
    append(changes, state.board.take_changes());
    append(changes, state.effects.take_changes());
    append(changes, state.queue.take_changes());
    if answer.is_ok() {
        changes.extend(written(state, command));
    }
    answer
}

/// Appends `more` to `changes`, taking the vector as it is when `changes` is empty (a sweep's
/// tens of thousands of changes are not copied once more).
fn append(changes: &mut Vec<Change>, more: Vec<Change>) {
    if changes.is_empty() {
        *changes = more;
    } else {
        changes.extend(more);
    }
}

/// The change an accepted sink write or checkpoint save made (the other primitives record their
/// own, including expiries judged along the way).
fn written(state: &State, command: &Command) -> Option<Change> {
    match command {
        Command::Sink(sink::Command::Write {
            resource, fence, ..
        }) => state.sink.read(resource).map(|value| Change {
            primitive: Primitive::Sink,
            key: resource.clone(),
            kind: ChangeKind::Written,
            holder: String::new(),
            fence: *fence,
            value: ChangeValue::Sink(value.clone()),
        }),
        Command::Checkpoint(checkpoint::Command::SaveIfNewer { run, seq, .. }) => {
            state.checkpoints.load(run).map(|saved| Change {
                primitive: Primitive::Checkpoint,
                key: run.clone(),
                kind: ChangeKind::Saved,
                holder: String::new(),
                fence: *seq,
                value: ChangeValue::Checkpoint(saved.clone()),
            })
        }
        _ => None,
    }
}

fn run(state: &mut State, stamp: &Stamp, command: &Command) -> Result<Reply, Refusal> {
    state.clock_ms = state.clock_ms.max(stamp.now_ms);
    let clock = state.clock_ms;
    let floor = state.fence_floor;
    match command {
        Command::Handoff(command) => {
            handoff_command(&mut state.handoff, stamp, clock, floor, command.clone())
        }
        Command::Board(command) => {
            board_command(&mut state.board, stamp, clock, floor, command.clone())
        }
        Command::Effect(command) => {
            effect_command(&mut state.effects, stamp, clock, floor, command)
        }
        Command::Sink(sink::Command::Write {
            resource,
            fence,
            value,
        }) => state
            .sink
            .write(state.rules, resource, *fence, value.clone())
            .map(|written| Reply::Written {
                seen_fence: written.seen_fence,
                writes: written.writes,
            }),
        Command::Checkpoint(checkpoint::Command::SaveIfNewer { run, seq, data }) => state
            .checkpoints
            .save_if_newer(clock, run, *seq, data.clone())
            .map(|()| Reply::Done),
        Command::Queue(command) => queue_command(&mut state.queue, clock, floor, command.clone()),
        Command::Sweep => {
            forget_idle_sessions(state, clock);
            let expired = state.handoff.sweep(clock)
                + state.board.sweep(clock)
                + state.effects.sweep(clock)
                + state.queue.sweep(clock);
            Ok(Reply::Swept { expired })
        }
        Command::SweepAtMost { expiries } => {
            forget_idle_sessions(state, clock);
            let max = usize::try_from(*expiries).unwrap_or(usize::MAX);
            let plan = Plan::first_due(state, clock, max);
            let expired = state.handoff.sweep_first(clock, plan.tickets)
                + state.board.sweep_first(clock, plan.claims)
                + state.effects.sweep_first(clock, plan.intents, plan.holds)
                + state
                    .queue
                    .sweep_first(clock, plan.leases, plan.retries, plan.deadlines);
            Ok(Reply::Swept { expired })
        }
        Command::AdoptRules { rules } => {
            // Never back: entries applied by newer rules stay so (an older build cannot run
            // them, and a node stops before an entry adopting rules `rules::known` refuses).
            state.rules = state.rules.max(*rules);
            Ok(Reply::Done)
        }
    }
}

/// Forgets idle client sessions, all of them under rules 0, a bounded number from rules 1 on.
fn forget_idle_sessions(state: &mut State, clock: u64) {
    let most = if state.rules >= 1 {
        rules::IDLE_SESSIONS_PER_SWEEP
    } else {
        usize::MAX
    };
    state.sessions.expire_idle(clock, most);
}

fn handoff_command(
    desk: &mut Desk,
    stamp: &Stamp,
    clock: u64,
    floor: u64,
    command: handoff::Command,
) -> Result<Reply, Refusal> {
    match command {
        handoff::Command::Offer(args) => desk
            .offer(clock, floor, args)
            .map(|ticket| Reply::Ticket(Box::new(ticket))),
        handoff::Command::Take { key, to } => desk.take(stamp, clock, &key, &to).map(Reply::Handle),
        handoff::Command::Reply {
            key,
            token,
            receipt,
        } => desk
            .reply(clock, &key, &token, receipt)
            .map(|()| Reply::Done),
        handoff::Command::Cancel { key, by } => desk.cancel(clock, &key, &by).map(|()| Reply::Done),
    }
}

fn board_command(
    board: &mut Board,
    stamp: &Stamp,
    clock: u64,
    floor: u64,
    command: board::Command,
) -> Result<Reply, Refusal> {
    match command {
        board::Command::Seed(specs) => board
            .seed(floor, specs)
            .map(|tasks| Reply::Seeded { tasks }),
        board::Command::Claim { id, agent, ttl_ms } => board
            .claim(stamp, clock, &id, &agent, ttl_ms)
            .map(|task| Reply::Task(Box::new(task))),
        board::Command::Release { id, token } => {
            board.release(clock, &id, &token).map(|()| Reply::Done)
        }
        board::Command::Complete { id, token } => {
            board.complete(clock, &id, &token).map(|()| Reply::Done)
        }
        board::Command::Renew { id, token, ttl_ms } => board
            .renew(clock, &id, &token, ttl_ms)
            .map(|task| Reply::Task(Box::new(task))),
    }
}

fn queue_command(
    q: &mut TaskQueue,
    clock: u64,
    floor: u64,
    command: queue::Command,
) -> Result<Reply, Refusal> {
    use queue::Command as C;
    let task = |task: queue::Task| Reply::QueueTask(Box::new(task));
    match command {
        C::CreateQueue(spec) => q.create_queue(spec).map(Reply::Queue),
        C::RegisterWorker(worker) => q.register_worker(worker).map(Reply::Worker),
        C::Submit(spec) => q.submit(clock, spec).map(|r| Reply::Submitted(Box::new(r))),
        C::Lease {
            worker,
            queues,
            limit,
            lease_ttl_ms,
        } => q
            .lease(clock, floor, &worker, &queues, limit, lease_ttl_ms)
            .map(Reply::Assignments),
        C::Start {
            task_id,
            attempt,
            worker,
        } => q.start(clock, task_id, attempt, &worker).map(task),
        C::Renew {
            task_id,
            attempt,
            worker,
            lease_ttl_ms,
        } => q
            .renew(clock, task_id, attempt, &worker, lease_ttl_ms)
            .map(task),
        C::Complete {
            task_id,
            attempt,
            worker,
            result,
        } => q
            .complete(clock, task_id, attempt, &worker, result)
            .map(task),
        C::Fail {
            task_id,
            attempt,
            worker,
            error,
            retryable,
        } => q
            .fail(clock, task_id, attempt, &worker, &error, retryable)
            .map(task),
        C::ReportUnknown {
            task_id,
            attempt,
            worker,
            note,
        } => q
            .report_unknown(clock, task_id, attempt, &worker, &note)
            .map(task),
        C::Cancel { task_id } => q.cancel(clock, task_id).map(task),
    }
}

fn effect_command(
    gate: &mut Gate,
    stamp: &Stamp,
    clock: u64,
    floor: u64,
    command: &effect::Command,
) -> Result<Reply, Refusal> {
    use effect::Command as C;
    match command {
        C::Acquire { action, ttl_ms } => gate
            .acquire(stamp, clock, floor, action, *ttl_ms)
            .map(|outcome| Reply::Outcome(Box::new(outcome))),
        C::Complete {
            action,
            lease,
            result,
        } => gate
            .complete(clock, action, lease, result.clone())
            .map(Reply::EffectResult),
        C::Release { action, lease } => gate.release(clock, action, lease).map(|()| Reply::Done),
        C::Abandon {
            action,
            lease,
            reason,
        } => gate
            .abandon(clock, action, lease, reason)
            .map(|()| Reply::Done),
        C::Renew {
            action,
            lease,
            ttl_ms,
        } => gate
            .renew(clock, action, lease, *ttl_ms)
            .map(|lease| Reply::EffectLease(Box::new(lease))),
        C::MarkUncertain {
            action,
            lease,
            reason,
        } => gate
            .mark_uncertain(clock, action, lease, reason)
            .map(|()| Reply::Done),
        C::BeginReconcile { action, ttl_ms } => gate
            .begin_reconcile(stamp, clock, action, *ttl_ms)
            .map(Reply::Reconcile),
        C::ResolveUncertain { action, resolution } => gate
            .resolve_uncertain(clock, action, resolution)
            .map(Reply::Resolved),
    }
}

impl State {
    /// Whether a sweep at `now_ms` has anything to do (used by the leader to skip idle sweeps).
    pub fn sweep_due(&self, now_ms: u64) -> bool {
        let now = now_ms.max(self.clock_ms);
        self.handoff.has_overdue(now)
            || self.board.has_overdue(now)
            || self.effects.has_overdue(now)
            || self.queue.has_overdue(now)
    }

    /// The earliest time (Unix ms) at which [`State::sweep_due`] turns true if no command comes
    /// in between — the earliest deadline, back-off end or total deadline the sweep watches;
    /// `None` when nothing has one. The leader sleeps until then. It may be in the past: then a
    /// sweep is due now.
    pub fn next_due_ms(&self) -> Option<u64> {
        // Everything is due at the end of time, so each source's first due time is its earliest.
        let end = u64::MAX;
        [
            self.handoff.due(end).next().map(|(at, _)| at),
            self.board.due(end).next().map(|(at, _)| at),
            self.effects.due_intents(end).next().map(|(at, _)| at),
            self.effects.due_holds(end).next().map(|(at, _)| at),
            self.queue.due_leases(end).next().map(|(at, _)| at),
            self.queue.due_retries(end).next().map(|(at, _)| at),
            self.queue.due_deadlines(end).next().map(|(at, _)| at),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}
