//! A running node: its Raft instance, its state machine, and the two things every client-facing
//! handler needs — propose a command, or read linearizably.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use baton_rpc::error::{infra, infra_status, not_leader_status, refusal_status};
use baton_statemachine::{Command, Envelope, Origin, Reply, Response};
use openraft::error::{ClientWriteError, ForwardToLeader, RaftError};
use openraft::BasicNode;
use tonic::{Code, Status};

use crate::admission::Admission;
use crate::deposed::unless_deposed;
use crate::proposer::Proposer;
use crate::read_index::{Nudge, ReadIndex};
use crate::stamp;
use crate::store::{Applied, StateMachineStore};
use crate::types::{Batch, NodeId, Raft};

/// Shared handle to this node's consensus and state.
pub struct Node {
    /// This node's id.
    pub id: NodeId,
    /// The address peers and clients reach this node at.
    pub addr: String,
    /// The Raft instance.
    pub raft: Raft,
    /// The applied state.
    pub state_machine: StateMachineStore,
    /// The highest term in which this node, as leader, has committed an entry of its own.
    read_barrier_term: AtomicU64,
    /// Held while that entry is proposed: the reads arriving meanwhile wait for the one entry
    /// instead of proposing one each (a leader without a quorum would pile them up in its log).
    read_barrier: tokio::sync::Mutex<()>,
    /// The queue that packs client commands into log entries.
    proposer: Proposer,
    /// The queue of reads waiting for a leadership confirmation.
    read_index: ReadIndex,
}

/// A shareable [`Node`].
pub type NodeRef = Arc<Node>;

impl Node {
    /// A node over a started Raft instance and its state machine (starts its proposer task, so
    /// call it inside the runtime); it proposes nothing while `gate` is closed.
    pub fn new(
        id: NodeId,
        addr: String,
        raft: Raft,
        state_machine: StateMachineStore,
        gate: Admission,
        nudge: Nudge,
    ) -> Self {
        Self {
            id,
            addr,
            proposer: Proposer::start(raft.clone(), gate),
            read_index: ReadIndex::start(raft.clone(), nudge),
            raft,
            state_machine,
            read_barrier_term: AtomicU64::new(0),
            read_barrier: tokio::sync::Mutex::new(()),
        }
    }

    /// Proposes `command` (batched with whatever else is being proposed, see [`Proposer`]),
    /// waits for it to be committed and applied, and returns the state machine's reply — or the
    /// refusal / infrastructure failure as a gRPC status.
    pub async fn propose(&self, origin: Option<Origin>, command: Command) -> Result<Reply, Status> {
        self.propose_attempt(origin, false, command).await
    }

    /// [`Node::propose`] for a request whose client says whether this is a `retry` (an earlier
    /// attempt may be in the log). A retry is never refused from the state alone; only the
    /// session table's answer spares it the log.
    pub async fn propose_attempt(
        &self,
        origin: Option<Origin>,
        retry: bool,
        command: Command,
    ) -> Result<Reply, Status> {
        let name = command.name();
        let (response, index) = match self.prejudged(origin.as_ref(), retry, &command).await? {
            Some(response) => (response, None),
            None => {
                let timer = crate::metrics::time_proposal(name);
                let proposed = self.proposer.propose(origin, command).await;
                if proposed.as_ref().is_err_and(never_proposed) {
                    timer.never_proposed();
                }
                let (response, index) = proposed?;
                (response, Some(index))
            }
        };
        answer_of(response, name, index)
    }

    /// Confirms leadership with a quorum (read index, shared with concurrent reads), waits until
    /// that index is applied, then runs `read` on the applied state. The result is linearizable.
    pub async fn read<T>(&self, read: impl FnOnce(&Applied) -> T) -> Result<T, Status> {
        let _timer = crate::metrics::time_read();
        self.commit_in_current_term().await?;
        self.read_index.confirm().await?;
        let applied = self.state_machine.read();
        Ok(read(&applied))
    }

    /// [`Node::read`] for a read that copies much of the state (a backup): applies wait for it
    /// without blocking a runtime worker (see [`crate::store::StateMachineStore::copy`]).
    pub async fn read_copy<T>(&self, read: impl FnOnce(&Applied) -> T) -> Result<T, Status> {
        let _timer = crate::metrics::time_read();
        self.commit_in_current_term().await?;
        self.read_index.confirm().await?;
        Ok(self.state_machine.copy(read))
    }

    /// The answer to `command` when it needs no log entry: a retry already answered, or a
    /// refusal that changes nothing (see `State::prejudge`), judged on state confirmed current
    /// by a read index, so the answer is linearizable. Only a command the local state already
    /// prejudges pays for the read index; every other command goes straight to the log, and so
    /// does a repeat of a request this node is still proposing (with or without the retry flag):
    /// the state does not include that request yet, and the log entry gets the first attempt's
    /// answer from the session table. That check is made while the applied state is held (see
    /// [`Proposer::is_proposing`]).
    async fn prejudged(
        &self,
        origin: Option<&Origin>,
        retry: bool,
        command: &Command,
    ) -> Result<Option<Response>, Status> {
        let leading = self.raft.metrics().borrow().current_leader == Some(self.id);
        let judge = |applied: &Applied| match (retry, origin) {
            (true, Some(origin)) => applied.state.answered(origin),
            // Checked while `applied` is held: an attempt no longer proposing was applied
            // before it (see `Proposer::is_proposing`).
            (false, Some(origin)) if self.proposer.is_proposing(origin) => None,
            _ => applied
                .state
                .prejudge(origin, command, stamp::wall_clock_ms()),
        };
        if !leading || judge(&self.state_machine.read()).is_none() {
            return Ok(None);
        }
        self.read(judge).await
    }

    /// Makes sure this leader has committed an entry of its current term before it serves reads.
    ///
    /// After a restart a leader can resume its term with the commit index it last saved, which
    /// may lag behind entries that were committed (and acknowledged to clients) before the
    /// crash; openraft 0.9 appends no new entry in that case, so its read index would be that
    /// stale commit index and a read could miss an acknowledged write. Committing one entry of
    /// its own (a sweep, harmless at any time) advances the commit index past everything before
    /// it, as the Raft paper requires of a leader before it answers read-only queries (§8).
    async fn commit_in_current_term(&self) -> Result<(), Status> {
        let (term, leading) = self.term_and_leading();
        if self.read_barrier_term.load(Ordering::Acquire) >= term {
            return Ok(());
        }
        // A follower's write is refused at once (with the leader's address): no need to queue.
        let _proposing = if leading {
            Some(self.read_barrier.lock().await)
        } else {
            None
        };
        if self.read_barrier_term.load(Ordering::Acquire) >= self.term_and_leading().0 {
            return Ok(());
        }
        let sweep = Envelope {
            stamp: stamp::stamp(),
            origin: None,
            command: crate::sweeper::barrier_command(),
        };
        let written =
            unless_deposed(&self.raft, self.raft.client_write(Batch(vec![sweep]))).await?;
        self.read_barrier_term
            .fetch_max(written.log_id.leader_id.term, Ordering::AcqRel);
        Ok(())
    }

    /// This node's current term, and whether it leads in it.
    fn term_and_leading(&self) -> (u64, bool) {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        (
            metrics.current_term,
            metrics.current_leader == Some(self.id),
        )
    }

    /// The address of a member, from the current membership.
    pub fn member_addr(&self, id: NodeId) -> Option<String> {
        member_addr(&self.raft, id)
    }
}

/// Whether the node these metrics describe is a voter of its current membership.
pub(crate) fn is_voter(metrics: &openraft::RaftMetrics<NodeId, openraft::BasicNode>) -> bool {
    is_voter_id(metrics, metrics.id)
}

/// Whether node `id` votes in the membership `metrics` show.
pub(crate) fn is_voter_id(
    metrics: &openraft::RaftMetrics<NodeId, openraft::BasicNode>,
    id: NodeId,
) -> bool {
    metrics
        .membership_config
        .membership()
        .voter_ids()
        .any(|voter| voter == id)
}

/// The address of member `id` in `raft`'s current membership.
pub(crate) fn member_addr(raft: &Raft, id: NodeId) -> Option<String> {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    metrics
        .membership_config
        .membership()
        .get_node(&id)
        .map(|node| node.addr.clone())
}

/// Whether a proposal's failure says it was turned away before the log: this node does not lead
/// (it knows so before writing) or is stopping. (A leader deposed while writing answers
/// `NOT_LEADER` too, rarely; that proposal goes uncounted.)
fn never_proposed(status: &Status) -> bool {
    let code = baton_rpc::error::detail_of(status).map(|detail| detail.code);
    matches!(
        code.as_deref(),
        Some(infra::NOT_LEADER | infra::NO_LEADER | infra::SHUTTING_DOWN)
    )
}

pub(crate) fn not_leader(forward: ForwardToLeader<NodeId, BasicNode>) -> Status {
    match (forward.leader_id, forward.leader_node) {
        (Some(id), Some(node)) => not_leader_status(Some((id, node.addr))),
        _ => infra_status(
            Code::Unavailable,
            infra::NO_LEADER,
            "no leader is known right now",
        ),
    }
}

/// A failed Raft write (a client command or a membership change) as a gRPC status.
pub(crate) fn write_error(error: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> Status {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => not_leader(forward),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            infra_status(Code::FailedPrecondition, infra::MEMBERSHIP, e.to_string())
        }
        RaftError::Fatal(fatal) => {
            infra_status(Code::Unavailable, infra::INTERNAL, fatal.to_string())
        }
    }
}

/// The answer to a client for the state machine's `response` to its command `name`, applied at
/// log `index` (`None`: answered without the log). Only the state machine's own refusals are
/// contract refusals; a request it did not run (a session table full or expired) is an
/// infrastructure failure, never a refusal such as `TAKEN` for a command that never ran.
fn answer_of(response: Response, name: &str, index: Option<u64>) -> Result<Reply, Status> {
    match response {
        Response::Answer(Ok(reply)) => {
            tracing::debug!(command = name, ?index, "applied");
            Ok(reply)
        }
        Response::Answer(Err(refusal)) => {
            tracing::debug!(command = name, ?index, code = refusal.code(), "refused");
            Err(refusal_status(&refusal))
        }
        Response::SessionExpired => Err(infra_status(
            Code::Aborted,
            infra::SESSION_EXPIRED,
            "this request is older than the store's session window; its outcome is unknown",
        )),
        Response::SessionsFull => Err(infra_status(
            Code::ResourceExhausted,
            infra::OVERLOADED,
            format!(
                "the store is keeping answers for {} clients, each seen within the last {} \
                 s, and takes no new client until one of them has been idle that long; \
                 nothing was done",
                baton_statemachine::MAX_CLIENTS,
                baton_statemachine::SESSION_RETRY_WINDOW_MS / 1000
            ),
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;
    use std::time::Duration;

    use baton_statemachine::board;

    use super::*;
    use crate::admission::Admission;
    use crate::network::Network;

    /// Only the state machine's own refusals reach a client as contract refusals: a command the
    /// session table kept from running (full, or the request older than its window) is an
    /// infrastructure failure, so no caller reads "TAKEN" for a take that never ran.
    #[test]
    fn a_command_that_never_ran_is_not_answered_with_a_refusal() {
        use baton_rpc::error::{detail_of, refusal_of};
        use baton_statemachine::Refusal;
        let code = |response| {
            let status = answer_of(response, "take", None).unwrap_err();
            let detail = detail_of(&status).unwrap();
            (status.code(), detail.code.clone(), refusal_of(&detail))
        };
        assert_eq!(
            code(Response::SessionsFull),
            (Code::ResourceExhausted, infra::OVERLOADED.to_string(), None)
        );
        assert_eq!(
            code(Response::SessionExpired),
            (Code::Aborted, infra::SESSION_EXPIRED.to_string(), None)
        );
        let (_, detail, refusal) = code(Response::Answer(Err(Refusal::Taken)));
        assert_eq!((detail.as_str(), refusal), ("TAKEN", Some(Refusal::Taken)));
    }

    /// A one-member cluster in this process, leading, over storage in `dir`.
    async fn lone_leader(dir: &std::path::Path) -> Node {
        lone_leader_behind(dir, Admission::new(None)).await
    }

    /// [`lone_leader`] behind the admission gate `gate`.
    pub(crate) async fn lone_leader_behind(dir: &std::path::Path, gate: Admission) -> Node {
        let (log, state_machine) =
            crate::store::open_with(&dir.join("db"), Default::default()).unwrap();
        let config = openraft::Config {
            cluster_name: "test".into(),
            ..Default::default()
        };
        let raft = Raft::new(
            1,
            Arc::new(config.validate().unwrap()),
            Network::default(),
            log,
            state_machine.clone(),
        )
        .await
        .unwrap();
        let members = BTreeMap::from([(1, BasicNode::new("127.0.0.1:1"))]);
        raft.initialize(members).await.unwrap();
        raft.wait(Some(Duration::from_secs(10)))
            .current_leader(1, "leading")
            .await
            .unwrap();
        let nudge = Nudge::new(gate.clone(), Duration::from_millis(400));
        Node::new(1, "127.0.0.1:1".into(), raft, state_machine, gate, nudge)
    }

    /// A command still queued when the gate closes (its caller may have given up, so the
    /// handover's drain does not wait for it) is answered with the gate's refusal, not written:
    /// a leader handing over appends nothing after its drain.
    #[tokio::test]
    async fn nothing_is_proposed_while_the_gate_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let gate = Admission::new(None);
        let node = lone_leader_behind(dir.path(), gate.clone()).await;
        let seed = |id: &str| {
            Command::Board(board::Command::Seed(vec![board::TaskSpec {
                id: id.into(),
                deps: vec![],
            }]))
        };
        node.propose(None, seed("before")).await.unwrap();
        let last_log = node.raft.metrics().borrow().last_log_index;

        gate.close(crate::admission::Closed::HandingOver);
        let status = node.propose(None, seed("during")).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert_eq!(node.raft.metrics().borrow().last_log_index, last_log);
        assert!(node
            .state_machine
            .read()
            .state
            .board
            .get("during")
            .is_none());

        gate.reopen();
        node.propose(None, seed("after")).await.unwrap();
        assert!(node.state_machine.read().state.board.get("after").is_some());
        node.raft.shutdown().await.unwrap();
    }

    fn origin(client_id: u64, seq: u64) -> Origin {
        Origin {
            client_id,
            seq,
            acked_below: seq,
        }
    }

    fn claim(agent: &str) -> Command {
        Command::Board(board::Command::Claim {
            id: "t".into(),
            agent: agent.into(),
            ttl_ms: 60_000,
        })
    }

    /// A repeat (without the retry flag) of a request this node is still proposing is not
    /// judged on the state, which does not include the first attempt yet: it goes to the log,
    /// whose session table gives it the first attempt's answer. Judged on the state, a claim of
    /// a task held by someone else was refused TAKEN without a log entry, while the first
    /// attempt, behind a release in the queue, could go on to win.
    #[tokio::test]
    async fn a_repeat_of_a_request_still_being_proposed_goes_to_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let node = lone_leader(dir.path()).await;
        let seed = board::Command::Seed(vec![board::TaskSpec {
            id: "t".into(),
            deps: vec![],
        }]);
        node.propose(None, Command::Board(seed)).await.unwrap();
        node.propose(Some(origin(1, 1)), claim("holder"))
            .await
            .unwrap();

        // Judged on the state, a claim of the held task is refused without a log entry.
        let stranger = origin(2, 1);
        assert!(node.propose(Some(stranger), claim("a")).await.is_err());
        assert_eq!(node.state_machine.read().state.answered(&stranger), None);

        // The first attempt of this request is in the proposer (held as it would be).
        let repeat = origin(3, 1);
        let _first = node.proposer.hold(&repeat);
        let status = node.propose(Some(repeat), claim("a")).await.unwrap_err();
        let code = baton_rpc::error::detail_of(&status).unwrap().code;
        assert_eq!(code, "TAKEN", "{status:?}");
        assert!(
            node.state_machine.read().state.answered(&repeat).is_some(),
            "the repeat went through the log"
        );
        node.raft.shutdown().await.unwrap();
    }
}
