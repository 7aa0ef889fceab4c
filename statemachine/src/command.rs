//! The log entry's payload: the leader's stamp, the client's identity and the command itself.

use serde::{Deserialize, Serialize};

use crate::error::Refusal;
use crate::{board, checkpoint, effect, handoff, queue, sink};

/// What the leader decided, once, before proposing the entry.
///
/// Everything nondeterministic an apply needs comes from here, so every replica computes the same
/// tokens and deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// The proposing leader's wall clock, in milliseconds since the Unix epoch. The store clock
    /// only moves forward: `clock = max(clock, now_ms)`.
    pub now_ms: u64,
    /// 128 random bits drawn by the leader; tokens minted by this command derive from them.
    pub entropy: u128,
}

impl Command {
    /// The command's name, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Handoff(command) => command.name(),
            Command::Board(command) => command.name(),
            Command::Effect(command) => command.name(),
            Command::Sink(command) => command.name(),
            Command::Checkpoint(command) => command.name(),
            Command::Queue(command) => command.name(),
            Command::Sweep | Command::SweepAtMost { .. } => "sweep",
            Command::AdoptRules { .. } => "adopt_rules",
        }
    }
}

impl Stamp {
    /// The token minted by this command: 128 random bits as 32 lowercase hex characters.
    pub fn token(&self) -> String {
        hex::encode(self.entropy.to_be_bytes())
    }
}

/// Which client sent the command and which of its requests this is.
///
/// Retrying with the same `(client_id, seq)` is always safe: the session table answers a repeat
/// with the response the first attempt produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// A random identity the client library draws once per client instance.
    pub client_id: u64,
    /// The client's request number, starting at 1 and never reused by that client.
    pub seq: u64,
    /// Every request of this client below this number has been answered and will never be retried,
    /// so the store may forget their responses.
    pub acked_below: u64,
}

/// One entry of the replicated log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The leader's clock and randomness for this command.
    pub stamp: Stamp,
    /// The client request this is, or `None` for commands the leader proposes itself (the sweep).
    pub origin: Option<Origin>,
    /// What to do.
    pub command: Command,
}

/// Every state change the store knows, grouped by primitive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A handoff ticket command.
    Handoff(handoff::Command),
    /// A task-board command.
    Board(board::Command),
    /// A side-effect gate command.
    Effect(effect::Command),
    /// A fenced-sink write.
    Sink(sink::Command),
    /// A checkpoint save.
    Checkpoint(checkpoint::Command),
    /// A task-queue command.
    Queue(queue::Command),
    /// Materialise every expiry that is due at the store clock and forget idle client sessions.
    /// Leaders no longer propose it (a mass expiry made it one huge apply); it stays so that logs
    /// and snapshots written before [`Command::SweepAtMost`] existed still apply the same.
    Sweep,
    /// Materialise the `expiries` expiries due at the store clock that fell due first (fewer when
    /// fewer are due; see the `sweep` module for the order) and forget idle client sessions.
    /// Proposed by the leader when something is due, back to back while more is, so snapshots
    /// carry no overdue leftovers and no single apply grows with the number of expiries.
    ///
    /// Appended last: bincode encodes the variant's index, so the variants before it keep theirs.
    SweepAtMost {
        /// The most expiries this sweep materialises.
        expiries: u32,
    },
    /// Apply every later entry by `rules` (crate::rules), when they are newer than the rules in
    /// force. Proposed by the leader once every member runs a build that applies them.
    ///
    /// Appended last, like [`Command::SweepAtMost`].
    AdoptRules {
        /// The rules version to adopt.
        rules: u32,
    },
}

/// A successful command's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The ticket as it stands after the command (offer). Boxed: tickets are large and most
    /// replies are not.
    Ticket(Box<handoff::Ticket>),
    /// The proof of a successful take.
    Handle(handoff::Handle),
    /// The command succeeded and has nothing to return (reply, cancel, release, ...).
    Done,
    /// Tasks seeded.
    Seeded {
        /// How many tasks were written.
        tasks: u64,
    },
    /// A task after a claim or renew (the lease carries the token).
    Task(Box<board::Task>),
    /// What `acquire` decided.
    Outcome(Box<effect::Outcome>),
    /// The result recorded for a completed action (the first completion's).
    EffectResult(String),
    /// An extended side-effect lease.
    EffectLease(Box<effect::EffectLease>),
    /// A reconcile slot.
    Reconcile(effect::Reconcile),
    /// What a resolution left behind.
    Resolved(effect::Resolved),
    /// A fenced write was accepted.
    Written {
        /// The resource's highest seen fence after the write.
        seen_fence: u64,
        /// Accepted writes on the resource so far.
        writes: u64,
    },
    /// A queue (created or existing).
    Queue(queue::Queue),
    /// A registered worker.
    Worker(queue::Worker),
    /// A submission's receipt.
    Submitted(Box<queue::SubmitReceipt>),
    /// Tasks leased to a worker.
    Assignments(Vec<queue::Assignment>),
    /// A queue task after the command.
    QueueTask(Box<queue::Task>),
    /// A sweep ran: how many expiries it materialised.
    Swept {
        /// Tickets, leases, intents and holds expired.
        expired: u64,
    },
}

impl Reply {
    /// The reply's kind, without what it carries (tokens, payloads).
    pub fn kind(&self) -> &'static str {
        match self {
            Reply::Ticket(_) => "Ticket",
            Reply::Handle(_) => "Handle",
            Reply::Done => "Done",
            Reply::Seeded { .. } => "Seeded",
            Reply::Task(_) => "Task",
            Reply::Outcome(_) => "Outcome",
            Reply::EffectResult(_) => "EffectResult",
            Reply::EffectLease(_) => "EffectLease",
            Reply::Reconcile(_) => "Reconcile",
            Reply::Resolved(_) => "Resolved",
            Reply::Written { .. } => "Written",
            Reply::Queue(_) => "Queue",
            Reply::Worker(_) => "Worker",
            Reply::Submitted(_) => "Submitted",
            Reply::Assignments(_) => "Assignments",
            Reply::QueueTask(_) => "QueueTask",
            Reply::Swept { .. } => "Swept",
        }
    }
}

/// What `apply` returns for one envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The contract's answer: a reply, or a refusal that changed nothing.
    Answer(Result<Reply, Refusal>),
    /// The request's `seq` is older than what the session table still remembers for its client,
    /// so the store cannot tell what it answered the first time. The outcome is unknown; this is
    /// never a contract refusal.
    SessionExpired,
    /// The request is from a client the session table does not know, and the table is full of
    /// clients seen too recently to forget (see [`crate::session::SESSION_RETRY_WINDOW_MS`]).
    /// Nothing was done and nothing recorded: the client may send it again later.
    SessionsFull,
}
