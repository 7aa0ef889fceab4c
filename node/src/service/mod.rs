//! The gRPC services a node serves. Handlers are thin: decode, propose or read, encode.

mod batch;
mod board;
mod checkpoint;
mod cluster;
mod effect;
mod handoff;
mod queue;
mod sink;
mod watch;

pub use batch::BatchService;
pub use board::BoardService;
pub use checkpoint::CheckpointService;
pub use cluster::ClusterService;
pub use effect::EffectService;
pub use handoff::HandoffService;
pub use queue::QueueService;
pub use sink::SinkService;
pub use watch::{WatchOutput, WatchService};

use baton_rpc::error::{infra, infra_status, refusal_status};
use baton_rpc::proto::RequestHeader;
use baton_statemachine::queue::MAX_LEASE_TTL_MS;
use baton_statemachine::{Origin, Refusal, Reply, SessionLookup};
use tonic::Status;

use crate::node::NodeRef;
use crate::stamp::wall_clock_ms;
use crate::store::Applied;

/// A reply of the wrong kind for the command: the session table's answer to another request
/// under the same client id and seq (a client that reuses them); never a contract answer, and
/// not worth retrying (the same seq gets the same answer). Named by its kind only: what it
/// carries (another request's token) is not for this caller.
fn unexpected(reply: Reply) -> Status {
    infra_status(
        tonic::Code::FailedPrecondition,
        infra::SEQ_REUSED,
        format!(
            "the store's answer to this request is a {} reply, not one for this method: \
             header.client_id and header.seq were used for another request",
            reply.kind()
        ),
    )
}

/// Success of a command that returns nothing ([`Reply::Done`]); any other reply is
/// [`unexpected`].
fn done(reply: Reply) -> Result<(), Status> {
    match reply {
        Reply::Done => Ok(()),
        other => Err(unexpected(other)),
    }
}

/// Bad input found while decoding, as the refusal status the state machine would have sent.
fn refused(refusal: Refusal) -> Status {
    refusal_status(&refusal)
}

/// An upper bound on a TTL, judged where a request enters the cluster, not at apply: apply rules
/// carry no version, and a replica of another version must judge an entry already in the log
/// the same way.
struct TtlCap {
    max_ms: i64,
    /// The bound as people say it, and what to do instead.
    says: &'static str,
}

/// A queue lease or renewal ([`MAX_LEASE_TTL_MS`]).
const QUEUE_LEASE_TTL: TtlCap = TtlCap {
    max_ms: MAX_LEASE_TTL_MS,
    says: "24h: renew a long handler's lease instead",
};

/// A hold: a board claim or renewal, a side-effect acquire, renewal or reconcile. Like a queue
/// lease it outlives the holder that crashed with it, keeping its task or action from everyone
/// else until it runs out: a TTL of years was a hold for good, which only a re-seed (board)
/// or nothing (a side effect) undid. Renewals, not long holds, keep long work.
const HOLD_TTL: TtlCap = TtlCap {
    max_ms: MAX_LEASE_TTL_MS,
    says: "24h: renew a long holder's hold instead",
};

/// A handoff ticket's one deadline line (take and reply): a deadline years away is none, which
/// the contract forbids (seed 000: a handoff without one leaves a lock nobody dares touch).
const TICKET_TTL: TtlCap = TtlCap {
    max_ms: 30 * 24 * 3600 * 1000,
    says: "30 days",
};

impl TtlCap {
    /// The refusal of `ttl_ms` when it is over the bound.
    fn refusal(&self, ttl_ms: i64) -> Option<Refusal> {
        (ttl_ms > self.max_ms).then(|| {
            Refusal::invalid(
                "ttl",
                format!("must be at most {} ms ({})", self.max_ms, self.says),
            )
        })
    }

    /// Refuses a request whose `ttl_ms` is over the bound ([`refuse_unless_answered`]).
    async fn check(
        &self,
        node: &NodeRef,
        origin: &Origin,
        retry: bool,
        ttl_ms: i64,
    ) -> Result<(), Status> {
        match self.refusal(ttl_ms) {
            Some(refusal) => refuse_unless_answered(node, origin, retry, refusal).await,
            None => Ok(()),
        }
    }
}

/// Refuses a request the edge judges bad (a limit the state machine does not know), unless it
/// is a retry the store has already answered: a node of an earlier version may have applied
/// it, and its answer, from the session table, is the only true one (a lease whose answer was
/// lost must learn what it leased).
async fn refuse_unless_answered(
    node: &NodeRef,
    origin: &Origin,
    retry: bool,
    refusal: Refusal,
) -> Result<(), Status> {
    let answered = retry
        && node
            .read(|applied| !matches!(applied.state.sessions.lookup(origin), SessionLookup::New))
            .await?;
    if answered {
        return Ok(());
    }
    Err(refused(refusal))
}

/// Whether the request says it was sent before.
fn is_retry(header: &Option<RequestHeader>) -> bool {
    header.as_ref().is_some_and(|header| header.retry)
}

/// The store's "now" for judging a read: the store clock, or this node's clock if it is ahead.
fn now_ms(applied: &Applied) -> u64 {
    applied.state.clock_ms.max(wall_clock_ms())
}

/// The Raft log index a read reflects.
fn revision(applied: &Applied) -> u64 {
    applied.last_applied.map(|id| id.index).unwrap_or(0)
}

/// The request header as the state machine's origin; a missing header is bad input.
fn origin(header: Option<RequestHeader>) -> Result<Origin, Status> {
    let header =
        header.ok_or_else(|| refusal_status(&Refusal::invalid("header", "is required")))?;
    // The last seq has no successor: once forgotten it could not be told from a new request.
    if header.seq == 0 || header.seq == u64::MAX {
        return Err(refusal_status(&Refusal::invalid(
            "header.seq",
            "must be > 0 and < 2^64 - 1",
        )));
    }
    // Zero is what a client that never set the field sends: every such client would share one
    // session, and one's request would be answered with another's remembered reply.
    if header.client_id == 0 {
        return Err(refusal_status(&Refusal::invalid(
            "header.client_id",
            "must be non-zero (a random identity drawn once per client instance)",
        )));
    }
    Ok(Origin {
        client_id: header.client_id,
        seq: header.seq,
        acked_below: header.acked_below.min(header.seq),
    })
}
