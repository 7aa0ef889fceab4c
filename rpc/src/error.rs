//! The one place where error codes map to gRPC statuses and back, so server and client agree.
//!
//! Every non-OK status Baton sends carries an encoded [`ErrorDetail`] in its details. Contract
//! refusals ([`Refusal`]) and infrastructure failures use disjoint codes: a client can never
//! mistake "no leader right now" for "the ticket was taken".

use std::time::Duration;

use baton_statemachine::Refusal;
use prost::Message;
use tonic::{Code, Status};

use crate::proto::ErrorDetail;

/// Codes for failures that are not contract answers.
pub mod infra {
    /// This node is not the leader; `leader_addr` says where it is, if known.
    pub const NOT_LEADER: &str = "NOT_LEADER";
    /// No leader is known right now (election in progress, or no quorum).
    pub const NO_LEADER: &str = "NO_LEADER";
    /// The request's seq is older than the store remembers: its outcome is unknown.
    pub const SESSION_EXPIRED: &str = "SESSION_EXPIRED";
    /// `cluster init` on a node that already belongs to a cluster.
    pub const ALREADY_INITIALIZED: &str = "ALREADY_INITIALIZED";
    /// The node is not part of an initialised cluster yet.
    pub const NOT_INITIALIZED: &str = "NOT_INITIALIZED";
    /// The node failed internally (storage, fatal Raft error).
    pub const INTERNAL: &str = "INTERNAL";
    /// A membership change was refused (another change in progress, an unknown learner, ...).
    pub const MEMBERSHIP: &str = "MEMBERSHIP";
    /// A watch asked for a revision older than the node still retains; `oldest_revision` says
    /// where its history begins. Resync: read a snapshot (e.g. `List`, which returns its
    /// `revision` R), then watch from R + 1.
    pub const COMPACTED: &str = "COMPACTED";
    /// A watch stream fell too far behind the changes it follows and was ended;
    /// `last_revision`/`last_index` name the last event it delivered. Resume right after it.
    pub const SLOW_CONSUMER: &str = "SLOW_CONSUMER";
    /// The node is shutting down; try another one.
    pub const SHUTTING_DOWN: &str = "SHUTTING_DOWN";
    /// The node is serving as many requests as its limits allow (gRPC `RESOURCE_EXHAUSTED`);
    /// nothing was done. Retry after a pause.
    pub const OVERLOADED: &str = "OVERLOADED";
    /// The request is larger than the node accepts (gRPC `RESOURCE_EXHAUSTED`); nothing was
    /// done, and sending it again will not help.
    pub const REQUEST_TOO_LARGE: &str = "REQUEST_TOO_LARGE";
    /// The request carried no token, or one the node does not accept (gRPC `UNAUTHENTICATED`);
    /// nothing was done. Give the client a listed token (`Security::token`).
    pub const UNAUTHENTICATED: &str = "UNAUTHENTICATED";
    /// The store's answer to the request's `client_id` and `seq` is another request's (gRPC
    /// `FAILED_PRECONDITION`): the client used them twice. Nothing was done for this request,
    /// and asking again under the same seq gets the same answer.
    pub const SEQ_REUSED: &str = "SEQ_REUSED";
    /// A leadership handover (`TransferLeader`) did not complete: no other voter, no election
    /// won in time, or (said by the client library) another voter than the one named won; the
    /// message says which. Check `baton status` before asking again.
    pub const HANDOVER_FAILED: &str = "HANDOVER_FAILED";
}

/// The gRPC status code a refusal travels with.
pub fn refusal_grpc_code(refusal: &Refusal) -> Code {
    match refusal {
        Refusal::Invalid { .. } => Code::InvalidArgument,
        Refusal::UnknownKey
        | Refusal::UnknownTask
        | Refusal::UnknownAction
        | Refusal::NotFound
        | Refusal::UnknownQueue
        | Refusal::UnknownWorker => Code::NotFound,
        Refusal::Taken | Refusal::ReconcileTaken | Refusal::IdempotencyConflict => Code::Aborted,
        Refusal::Expired
        | Refusal::NotAddressee
        | Refusal::NotSource
        | Refusal::LeaseLost
        | Refusal::AlreadySettled
        | Refusal::AlreadyDone
        | Refusal::Blocked
        | Refusal::FenceStale
        | Refusal::NotHolder
        | Refusal::ResourceMismatch
        | Refusal::NotInProgress
        | Refusal::NotUncertain
        | Refusal::UnsafeNotRetryable
        | Refusal::StaleSeq
        | Refusal::StateConflict
        | Refusal::AlreadyStarted
        | Refusal::NotStarted => Code::FailedPrecondition,
    }
}

/// Encodes a contract refusal as a gRPC status.
pub fn refusal_status(refusal: &Refusal) -> Status {
    let (field, rule) = match refusal {
        Refusal::Invalid { field, rule } => (field.clone(), rule.clone()),
        _ => (String::new(), String::new()),
    };
    let detail = ErrorDetail {
        code: refusal.code().to_string(),
        field,
        rule,
        ..Default::default()
    };
    with_detail(refusal_grpc_code(refusal), refusal.to_string(), &detail)
}

/// Encodes an infrastructure failure as a gRPC status.
pub fn infra_status(code: Code, baton_code: &str, message: impl Into<String>) -> Status {
    let detail = ErrorDetail {
        code: baton_code.to_string(),
        ..Default::default()
    };
    with_detail(code, message.into(), &detail)
}

/// `NOT_LEADER`, naming the leader when known.
pub fn not_leader_status(leader: Option<(u64, String)>) -> Status {
    let (leader_id, leader_addr) = leader.unwrap_or_default();
    let detail = ErrorDetail {
        code: infra::NOT_LEADER.to_string(),
        leader_id,
        leader_addr: leader_addr.clone(),
        ..Default::default()
    };
    let message = if leader_addr.is_empty() {
        "this node is not the leader and knows no leader".to_string()
    } else {
        format!("this node is not the leader; the leader is node {leader_id} at {leader_addr}")
    };
    with_detail(Code::Unavailable, message, &detail)
}

/// `COMPACTED`: a watch from `requested` cannot be served because this node's history begins at
/// `oldest`.
pub fn compacted_status(requested: u64, oldest: u64) -> Status {
    let detail = ErrorDetail {
        code: infra::COMPACTED.to_string(),
        oldest_revision: oldest,
        ..Default::default()
    };
    let message = format!(
        "revision {requested} is no longer retained here (the oldest available is {oldest}); \
         resync: read a snapshot (a List returns its revision R), then watch from R + 1"
    );
    with_detail(Code::OutOfRange, message, &detail)
}

/// `SLOW_CONSUMER`: the stream fell too far behind; it delivered up to `(revision, index)`.
pub fn slow_consumer_status(revision: u64, index: u32, backlog: usize) -> Status {
    let detail = ErrorDetail {
        code: infra::SLOW_CONSUMER.to_string(),
        last_revision: revision,
        last_index: index,
        ..Default::default()
    };
    let message = format!(
        "the watch fell {backlog} changes behind and was ended after delivering \
         {revision}.{index}; resume right after it"
    );
    with_detail(Code::ResourceExhausted, message, &detail)
}

fn with_detail(code: Code, message: String, detail: &ErrorDetail) -> Status {
    Status::with_details(code, message, detail.encode_to_vec().into())
}

/// Whether `status` is gRPC's report that a protobuf message could not be decoded (`INTERNAL`
/// without a Baton detail, prost's error text): an answer at the client, a request at the node.
/// The same bytes fail the same way every time, so it is never worth sending them again.
pub fn is_undecodable(status: &Status) -> bool {
    status.code() == Code::Internal
        && detail_of(status).is_none()
        && status.message().contains(UNDECODABLE)
}

/// How prost's `DecodeError` begins its text (the client's tests check it against prost).
const UNDECODABLE: &str = "failed to decode Protobuf message";

/// The [`ErrorDetail`] a Baton status carries, if any.
pub fn detail_of(status: &Status) -> Option<ErrorDetail> {
    if status.details().is_empty() {
        return None;
    }
    ErrorDetail::decode(status.details()).ok()
}

/// The contract refusal a detail encodes, if its code is a refusal code.
pub fn refusal_of(detail: &ErrorDetail) -> Option<Refusal> {
    Refusal::from_code(&detail.code, &detail.field, &detail.rule)
}

/// What a client call can fail with.
///
/// [`Error::Refused`] is the contract's answer; every other variant is an infrastructure failure
/// and says nothing about the contract.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The store refused the command; nothing changed.
    #[error("refused {code}: {0}", code = .0.code())]
    Refused(#[from] Refusal),
    /// No node gave a usable answer before the deadline. For a write, the outcome is unknown.
    #[error("{}", unavailable(endpoints, waited, last))]
    Unavailable {
        /// Every endpoint tried.
        endpoints: Vec<String>,
        /// How long the client kept trying.
        waited: Duration,
        /// The last failure seen.
        last: String,
    },
    /// The write's outcome cannot be told: the store no longer remembers the request, or an
    /// earlier attempt went unanswered and the last one was turned away by a node before the
    /// store judged it (a token or a size limit that node does not accept).
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The server rejected an administrative request or failed; `code` is its stable code.
    #[error("server error {code}: {message}")]
    Server {
        /// The Baton code (e.g. `ALREADY_INITIALIZED`).
        code: String,
        /// The server's explanation.
        message: String,
    },
    /// The server answered something this client cannot understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A watch cannot start where asked: no node retains the history from `requested` any more,
    /// or (`oldest_available` 0) the nodes now belong to another cluster than the one the
    /// position was read from (restored from a backup, or made anew at the same addresses), whose
    /// history is another. Nothing was skipped; resync by reading a snapshot (a `List` returns
    /// its revision R) and watching from R + 1.
    #[error("{}", compacted(*requested, *oldest_available))]
    Compacted {
        /// The revision the watch needed next.
        requested: u64,
        /// The oldest revision the nodes that answered can still deliver from (0: they belong to
        /// another cluster).
        oldest_available: u64,
    },
    /// The client was configured wrongly (e.g. no endpoints).
    #[error("configuration error: {0}")]
    Config(String),
}

impl Error {
    /// The contract refusal, when this is one.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Error::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }

    /// Whether this is an infrastructure failure rather than a contract answer.
    pub fn is_infrastructure(&self) -> bool {
        !matches!(self, Error::Refused(_))
    }

    /// Whether a write failed for want of an answer, so that it may still have been applied: no
    /// usable answer came before the deadline ([`Error::Unavailable`]), or the store no longer
    /// remembers the request ([`Error::OutcomeUnknown`]). Calling again sends a new command,
    /// which the store judges afresh (a second `take` of a ticket the first one won is refused
    /// `TAKEN`): read the state to learn the outcome. (A [`Error::Protocol`] error, an answer
    /// this client cannot read, may follow an applied write too: client and server do not
    /// match, and asking again gets the same answer.)
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::OutcomeUnknown(_))
    }
}

/// How [`Error::Compacted`] reads.
fn compacted(requested: u64, oldest_available: u64) -> String {
    let why = if oldest_available == 0 {
        "is not in these nodes' history: they belong to another cluster than the one the \
         position was read from (restored from a backup, or made anew)"
            .to_string()
    } else {
        format!("is compacted (the oldest available is {oldest_available})")
    };
    format!(
        "revision {requested} {why}; resync: read a snapshot at a revision R, then watch from R \
         + 1"
    )
}

/// `COMPACTED` from a node of another cluster than the one a watch's position counts in
/// (`oldest_revision` 0 says so): its history is not the one the position belongs to.
pub fn other_cluster_status(requested: u64, expected: &str, found: &str) -> Status {
    let detail = ErrorDetail {
        code: infra::COMPACTED.to_string(),
        oldest_revision: 0,
        ..Default::default()
    };
    let message = format!(
        "revision {requested} counts in cluster {expected}'s history, and this node belongs to \
         cluster {found}; resync: read a snapshot (a List returns its revision R), then watch \
         from R + 1"
    );
    with_detail(Code::OutOfRange, message, &detail)
}

/// How [`Error::Unavailable`] reads: how long and where the client tried, when it did.
fn unavailable(endpoints: &[String], waited: &Duration, last: &str) -> String {
    let mut text = String::from("cluster unavailable");
    if !waited.is_zero() {
        text.push_str(&format!(" after {waited:.1?}"));
    }
    if !endpoints.is_empty() {
        text.push_str(&format!(" (tried {})", endpoints.join(", ")));
    }
    format!("{text}: {last}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_cluster_says_only_what_the_client_knows() {
        let error = |endpoints: &[&str], waited| Error::Unavailable {
            endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
            waited,
            last: "tcp connect error".into(),
        };
        assert_eq!(
            error(&["a:1", "b:2"], Duration::from_millis(15_040)).to_string(),
            "cluster unavailable after 15.0s (tried a:1, b:2): tcp connect error"
        );
        assert_eq!(
            error(&["a:1"], Duration::ZERO).to_string(),
            "cluster unavailable (tried a:1): tcp connect error"
        );
        assert_eq!(
            error(&[], Duration::ZERO).to_string(),
            "cluster unavailable: tcp connect error"
        );
    }

    /// The gRPC status each refusal travels with, written out as docs/api.md's refusal table
    /// lists it (not derived from the code under test).
    const DOCUMENTED_GRPC_CODES: &[(&str, Code)] = &[
        ("INVALID_ARGUMENT", Code::InvalidArgument),
        ("UNKNOWN_KEY", Code::NotFound),
        ("TAKEN", Code::Aborted),
        ("EXPIRED", Code::FailedPrecondition),
        ("NOT_ADDRESSEE", Code::FailedPrecondition),
        ("NOT_SOURCE", Code::FailedPrecondition),
        ("LEASE_LOST", Code::FailedPrecondition),
        ("ALREADY_SETTLED", Code::FailedPrecondition),
        ("UNKNOWN_TASK", Code::NotFound),
        ("ALREADY_DONE", Code::FailedPrecondition),
        ("BLOCKED", Code::FailedPrecondition),
        ("UNKNOWN_ACTION", Code::NotFound),
        ("FENCE_STALE", Code::FailedPrecondition),
        ("NOT_HOLDER", Code::FailedPrecondition),
        ("RESOURCE_MISMATCH", Code::FailedPrecondition),
        ("NOT_IN_PROGRESS", Code::FailedPrecondition),
        ("NOT_UNCERTAIN", Code::FailedPrecondition),
        ("RECONCILE_TAKEN", Code::Aborted),
        ("UNSAFE_NOT_RETRYABLE", Code::FailedPrecondition),
        ("STALE_SEQ", Code::FailedPrecondition),
        ("NOT_FOUND", Code::NotFound),
        ("IDEMPOTENCY_CONFLICT", Code::Aborted),
        ("UNKNOWN_QUEUE", Code::NotFound),
        ("UNKNOWN_WORKER", Code::NotFound),
        ("STATE_CONFLICT", Code::FailedPrecondition),
        ("ALREADY_STARTED", Code::FailedPrecondition),
        ("NOT_STARTED", Code::FailedPrecondition),
    ];

    /// Every refusal travels with the gRPC status the documented table gives it, and the table
    /// lists every refusal (a new one must be documented here too).
    #[test]
    fn every_refusal_travels_with_its_documented_grpc_code() {
        let refusals: Vec<Refusal> = Refusal::all()
            .chain([Refusal::invalid("ttl", "must be > 0")])
            .collect();
        let mut codes: Vec<&str> = refusals.iter().map(Refusal::code).collect();
        codes.sort_unstable();
        codes.dedup();
        let mut documented: Vec<&str> = DOCUMENTED_GRPC_CODES.iter().map(|(c, _)| *c).collect();
        documented.sort_unstable();
        assert_eq!(codes, documented, "the table and the refusals disagree");
        for refusal in &refusals {
            let (_, want) = DOCUMENTED_GRPC_CODES
                .iter()
                .find(|(code, _)| *code == refusal.code())
                .expect("every refusal is in the table");
            assert_eq!(refusal_status(refusal).code(), *want, "{}", refusal.code());
        }
    }

    #[test]
    fn every_refusal_survives_the_wire() {
        for refusal in Refusal::all().chain([Refusal::invalid("ttl", "must be > 0")]) {
            let status = refusal_status(&refusal);
            let detail = detail_of(&status).expect("a refusal status carries a detail");
            assert_eq!(refusal_of(&detail), Some(refusal.clone()));
        }
    }

    #[test]
    fn infrastructure_codes_never_decode_as_refusals() {
        for code in [
            infra::NOT_LEADER,
            infra::NO_LEADER,
            infra::SESSION_EXPIRED,
            infra::INTERNAL,
            infra::ALREADY_INITIALIZED,
            infra::NOT_INITIALIZED,
            infra::MEMBERSHIP,
            infra::COMPACTED,
            infra::SLOW_CONSUMER,
            infra::SHUTTING_DOWN,
            infra::OVERLOADED,
            infra::REQUEST_TOO_LARGE,
            infra::UNAUTHENTICATED,
            infra::HANDOVER_FAILED,
            infra::SEQ_REUSED,
        ] {
            let status = infra_status(Code::Unavailable, code, "x");
            let detail = detail_of(&status).expect("detail");
            assert_eq!(refusal_of(&detail), None, "{code} must not be a refusal");
        }
    }

    #[test]
    fn watch_errors_carry_their_positions() {
        let status = compacted_status(5, 120);
        assert_eq!(status.code(), Code::OutOfRange);
        let detail = detail_of(&status).expect("detail");
        assert_eq!(detail.code, infra::COMPACTED);
        assert_eq!(detail.oldest_revision, 120);

        let status = slow_consumer_status(77, 3, 5000);
        assert_eq!(status.code(), Code::ResourceExhausted);
        let detail = detail_of(&status).expect("detail");
        assert_eq!(detail.code, infra::SLOW_CONSUMER);
        assert_eq!((detail.last_revision, detail.last_index), (77, 3));
    }
}
