//! Cluster introspection, initialisation, membership changes, leadership handover and backups.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use baton_rpc::error::{infra, infra_status, refusal_status};
use baton_rpc::proto::cluster_server;
use baton_rpc::proto::{
    snapshot_part, AddLearnerRequest, ChangeMembershipRequest, InitializeRequest,
    InitializeResponse, Member, MembershipResponse, NodeInfoRequest, NodeInfoResponse,
    PromoteMemberRequest, RemoveMemberRequest, SaveSnapshotRequest, SnapshotMeta, SnapshotPart,
    StateDigestRequest, StateDigestResponse, TransferLeaderRequest, TransferLeaderResponse,
};
use baton_statemachine::Refusal;
use futures::StreamExt;
use openraft::error::{ChangeMembershipError, ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState, StoredMembership};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tonic::{Code, Request, Response, Status};

use crate::admission::Admission;
use crate::cluster_id::OwnCluster;
use crate::codec;
use crate::config::undialable;
use crate::deposed::unless_deposed;
use crate::handover;
use crate::network::{Network, RulesVerdict};
use crate::node::NodeRef;
use crate::snapshot_file::STATE_FORMAT;
use crate::stamp::wall_clock_ms;
use crate::types::{NodeId, TypeConfig};

/// How long a handover asked for by `TransferLeader` waits for admitted requests to finish.
const TRANSFER_DRAIN: Duration = Duration::from_secs(5);

/// How long initialization waits for each new member to join the cluster.
const JOIN_LIMIT: Duration = Duration::from_secs(3);

/// How long a node being added has to say whether its build applies the cluster's rules.
const RULES_LIMIT: Duration = Duration::from_secs(1);

/// How long a voter change waits for the learners it promotes to store their membership.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(3);

/// How long a membership change waits for an earlier one to commit before it is refused.
const SETTLE_LIMIT: Duration = Duration::from_secs(5);

/// Bytes of encoded state per streamed snapshot chunk.
const SNAPSHOT_CHUNK: usize = 1 << 20;

/// Serves node information, cluster initialisation and administration.
pub struct ClusterService {
    node: NodeRef,
    admission: Admission,
    network: Network,
    /// One snapshot save at a time: each holds an encoded copy of the whole state until its
    /// client has read it, and cluster administration is never refused by the client limits.
    saving: Arc<Semaphore>,
    /// The fingerprint of the restore that seeded this node's data dir (empty: none).
    restored_from: String,
    /// The cluster this node belongs to: minted by `initialize` if it has none.
    cluster: OwnCluster,
}

impl ClusterService {
    /// Refuses to add node `id` at `addr` when its build does not apply the cluster's `rules`:
    /// a learner under older rules stops at its first entries (or, from before versioned rules,
    /// falls behind for good), and the cluster cannot go back to older rules. Every build applies
    /// rules 0. A node that cannot be asked (not started yet, unreachable, or refusing the
    /// question itself: of another cluster, say) is added as before, and the adoption of newer
    /// rules waits for it like for any member: why it could not be asked is returned, for the
    /// operator. `learner`: it is one already (a retry).
    async fn follows_rules(
        &self,
        id: NodeId,
        addr: &str,
        rules: u32,
        learner: bool,
    ) -> Result<Option<String>, Status> {
        if rules == 0 {
            return Ok(None);
        }
        match self
            .network
            .rules_verdict(id, addr, rules, RULES_LIMIT)
            .await
        {
            RulesVerdict::Applies => Ok(None),
            RulesVerdict::AppliesNot(why) => {
                let already = if learner {
                    format!(
                        " (it is a learner already: upgrade it, or take it out with `baton \
                         members remove --id {id}`)"
                    )
                } else {
                    String::new()
                };
                Err(infra_status(
                    Code::FailedPrecondition,
                    infra::MEMBERSHIP,
                    format!(
                        "node {id} at {addr} cannot follow this cluster (apply rules {rules}): \
                         {why}{already}"
                    ),
                ))
            }
            RulesVerdict::Unknown(why) => {
                tracing::info!(
                    id,
                    addr,
                    %why,
                    "adding a learner whose build could not be asked about the apply rules"
                );
                Ok(Some(why))
            }
        }
    }

    /// Serves `node`; handovers close `admission` and reach the successor through `network`.
    /// `restored_from` is the data dir's restore fingerprint, reported by `node_info` with
    /// `cluster`.
    pub fn new(
        node: NodeRef,
        admission: Admission,
        network: Network,
        restored_from: String,
        cluster: OwnCluster,
    ) -> Self {
        Self {
            node,
            admission,
            network,
            saving: Arc::new(Semaphore::new(1)),
            restored_from,
            cluster,
        }
    }

    /// Refuses a membership change while the gate is closed (a handover, a shutdown), as a
    /// client request would be: its reads and its entry would undo the handover — read-index
    /// heartbeats renew the followers' leader leases, so the successor's vote is refused, and an
    /// entry appended after the successor caught up leaves it behind. The client retries. Asked
    /// on arrival and again just before the change is proposed (a handover does not wait for
    /// cluster administration, which it does not count among the requests it drains); one
    /// beginning between that and the proposal is not kept out.
    fn not_while_handing_over(&self) -> Result<(), Status> {
        self.admission.refusal_now().map_or(Ok(()), Err)
    }

    /// Refuses to make `voters` the voters while a learner among them has not stored the latest
    /// membership entry ([`unreplicated_newcomers`]), after giving it [`CATCH_UP_LIMIT`] to do
    /// so: a learner just added may not have the entry that added it yet (`add_learner` returns
    /// once the leader no longer counts it far behind, at once on a young cluster).
    async fn newcomers_stored(&self, voters: &BTreeSet<NodeId>) -> Result<(), Status> {
        let raft = &self.node.raft;
        let stored = raft
            .wait(Some(CATCH_UP_LIMIT))
            .metrics(
                |metrics| unreplicated_newcomers(metrics, voters).is_none(),
                "newcomers stored their membership",
            )
            .await;
        if stored.is_err() {
            if let Some(refusal) = unreplicated_newcomers(&raft.metrics().borrow(), voters) {
                return Err(refusal);
            }
        }
        Ok(())
    }

    /// Proposes `change` and waits for it to commit. openraft takes one membership change at a
    /// time and refuses another while the last is uncommitted (a joint configuration between
    /// its two steps, say): such a change is proposed again until [`SETTLE_LIMIT`], so that two
    /// operators' changes at once both land rather than one failing. A change given as a
    /// difference (voters added or removed) is applied to the membership it finds then, so
    /// neither undoes the other. Each proposal asks again whether a handover has begun (during
    /// the caller's reads and waits, or since the last proposal).
    async fn change_members(
        &self,
        change: ChangeMembers<NodeId, BasicNode>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let raft = &self.node.raft;
        let deadline = tokio::time::Instant::now() + SETTLE_LIMIT;
        let settled = async {
            loop {
                if let Err(refused) = self.not_while_handing_over() {
                    return Ok(Err(refused));
                }
                match raft.change_membership(change.clone(), false).await {
                    Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                        ChangeMembershipError::InProgress(_),
                    ))) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    written => return written.map(Ok),
                }
            }
        };
        let written = unless_deposed(raft, settled).await??;
        Ok(Response::new(membership_response(&written)))
    }

    /// Asks every other member of the cluster being initialized to join it; fails, naming the
    /// ones that did not, unless all did. A member that has not joined refuses the votes of
    /// the cluster's candidates (it cannot tell them from a stale node's) until a leader's
    /// entries reach it: with it, a majority that lost the first leader could not elect
    /// another.
    async fn join_members(&self, members: &BTreeMap<NodeId, BasicNode>) -> Result<(), Status> {
        let others = members.iter().filter(|(id, _)| **id != self.node.id);
        let answers = futures::future::join_all(others.map(|(id, node)| async move {
            let joined = self.network.join(*id, &node.addr, JOIN_LIMIT).await;
            (*id, joined)
        }))
        .await;
        let missing: Vec<String> = answers
            .into_iter()
            .filter_map(|(id, joined)| {
                // Some refusals name the node already.
                joined.err().map(|why| match why.to_string() {
                    named if named.starts_with(&format!("node {id}:")) => named,
                    why => format!("node {id}: {why}"),
                })
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(infra_status(
            Code::FailedPrecondition,
            infra::MEMBERSHIP,
            format!(
                "{} of the {} members did not join the new cluster (start them all, then run \
                 this again; nothing was initialized): {}",
                missing.len(),
                members.len(),
                missing.join("; ")
            ),
        ))
    }
}

/// The members of a membership, as the wire lists them.
fn members_of(membership: &openraft::Membership<NodeId, BasicNode>) -> Vec<Member> {
    membership
        .nodes()
        .map(|(id, node)| Member {
            id: *id,
            addr: node.addr.clone(),
            voter: membership.voter_ids().any(|voter| voter == *id),
        })
        .collect()
}

/// A server state's wire name.
pub fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

impl ClusterService {
    /// The one slot for encoding the whole state on this node's request (a snapshot save, a
    /// digest): it costs as much memory as the state again, so a second waits its turn.
    fn one_encode_at_a_time(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Status> {
        self.saving.clone().try_acquire_owned().map_err(|_| {
            infra_status(
                Code::ResourceExhausted,
                infra::OVERLOADED,
                "a snapshot save or state digest is already running on this node; retry when it \
                 ends",
            )
        })
    }
}

/// Runs an encoding of the whole state on a blocking thread (it can take seconds).
async fn off_runtime<T: Send + 'static>(
    encode: impl FnOnce() -> Result<T, bincode::error::EncodeError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(encode)
        .await
        .map_err(|e| {
            infra_status(
                Code::Internal,
                infra::INTERNAL,
                format!("the state encoder stopped: {e}"),
            )
        })?
        .map_err(|e| {
            infra_status(
                Code::Internal,
                infra::INTERNAL,
                format!("cannot encode the state: {e}"),
            )
        })
}

type SnapshotStream =
    Pin<Box<dyn futures::Stream<Item = Result<SnapshotPart, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl cluster_server::Cluster for ClusterService {
    type SaveSnapshotStream = SnapshotStream;

    async fn node_info(
        &self,
        _request: Request<NodeInfoRequest>,
    ) -> Result<Response<NodeInfoResponse>, Status> {
        let metrics = self.node.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let members: Vec<Member> = membership
            .nodes()
            .map(|(id, node)| Member {
                id: *id,
                addr: node.addr.clone(),
                voter: membership.voter_ids().any(|voter| voter == *id),
            })
            .collect();
        let leader_addr = metrics
            .current_leader
            .and_then(|leader| self.node.member_addr(leader))
            .unwrap_or_default();
        let history = self.node.state_machine.history().stats();
        Ok(Response::new(NodeInfoResponse {
            id: self.node.id,
            addr: self.node.addr.clone(),
            role: role_name(metrics.state).to_string(),
            term: metrics.current_term,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            applied_index: metrics.last_applied.map(|id| id.index).unwrap_or(0),
            leader_id: metrics.current_leader,
            leader_addr,
            initialized: !members.is_empty(),
            members,
            snapshot_index: metrics.snapshot.map(|id| id.index).unwrap_or(0),
            watch_oldest_revision: history.oldest,
            watch_events: history.events as u64,
            watch_bytes: history.bytes as u64,
            watch_streams: history.streams as u64,
            quorum_ack_age_ms: metrics.millis_since_quorum_ack,
            version: env!("CARGO_PKG_VERSION").to_string(),
            restored_from: self.restored_from.clone(),
            cluster_id: self
                .cluster
                .get()
                .map(|id| id.to_string())
                .unwrap_or_default(),
            apply_rules: self.node.state_machine.read().state.rules,
            apply_rules_supported: baton_statemachine::rules::RULES,
        }))
    }

    async fn initialize(
        &self,
        request: Request<InitializeRequest>,
    ) -> Result<Response<InitializeResponse>, Status> {
        let members = request.into_inner().members;
        if members.is_empty() {
            return Err(refusal_status(&Refusal::invalid(
                "members",
                "must not be empty",
            )));
        }
        if !members.iter().any(|member| member.id == self.node.id) {
            return Err(refusal_status(&Refusal::invalid(
                "members",
                format!("must include this node (id {})", self.node.id),
            )));
        }
        let mut nodes = BTreeMap::new();
        for member in members {
            let (id, addr) = (member.id, member.addr.trim().to_string());
            if addr.is_empty() {
                return Err(refusal_status(&Refusal::invalid(
                    "members",
                    format!("node {id} has no address"),
                )));
            }
            if let Some(why) = undialable(&addr) {
                return Err(refusal_status(&Refusal::invalid(
                    "members",
                    format!("node {id}'s address: {why}"),
                )));
            }
            if nodes.insert(id, BasicNode { addr }).is_some() {
                return Err(refusal_status(&Refusal::invalid(
                    "members",
                    format!("node {id} is listed twice"),
                )));
            }
        }
        // The new cluster gets an id and a majority of its members join it before the first
        // election: a new node refuses votes that carry an id it has not joined. A node that
        // Raft would not initialize (it voted, or holds a log) mints nothing: refused below.
        let pristine = self
            .node
            .raft
            .is_initialized()
            .await
            .map(|initialized| !initialized)
            .map_err(|e| infra_status(Code::Internal, infra::INTERNAL, e.to_string()))?;
        let mut founding = if pristine {
            self.cluster.mint().map_err(|e| {
                infra_status(
                    Code::FailedPrecondition,
                    infra::MEMBERSHIP,
                    format!("{e:#}"),
                )
            })?
        } else {
            None
        };
        if founding.is_some() {
            // A failure here drops `founding`, which lets the node join others again.
            self.join_members(&nodes).await?;
        }
        if let Some(founding) = founding.as_mut() {
            founding.raft_asked();
        }
        let initialized = self.node.raft.initialize(nodes).await;
        match founding {
            Some(founding) if initialized.is_ok() => founding.found(),
            Some(founding) => founding.abandon(),
            None => {}
        }
        match initialized {
            Ok(()) => Ok(Response::new(InitializeResponse {})),
            Err(RaftError::APIError(InitializeError::NotAllowed(e))) => Err(infra_status(
                Code::FailedPrecondition,
                infra::ALREADY_INITIALIZED,
                format!("node {} already belongs to a cluster: {e}", self.node.id),
            )),
            Err(e) => Err(infra_status(Code::Internal, infra::INTERNAL, e.to_string())),
        }
    }

    async fn add_learner(
        &self,
        request: Request<AddLearnerRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        self.not_while_handing_over()?;
        let AddLearnerRequest { id, addr } = request.into_inner();
        let addr = addr.trim().to_string();
        if addr.is_empty() {
            return Err(refusal_status(&Refusal::invalid(
                "addr",
                "must not be empty",
            )));
        }
        if let Some(why) = undialable(&addr) {
            return Err(refusal_status(&Refusal::invalid("addr", why)));
        }
        // openraft adds a node only if its id is new: a member's id given again with another
        // address would be answered with the unchanged membership, as if the node were added.
        // Judged on the committed membership, read linearizably (redirecting a follower); a
        // learner again at its own address goes on, so that a retry waits for it to catch up.
        let (stored, rules) = self
            .node
            .read(|applied| (applied.membership.clone(), applied.state.rules))
            .await?;
        if let Some(conflict) = address_conflict(stored.membership(), id, &addr)
            .or_else(|| already_voter(stored.membership(), id))
        {
            return Err(conflict);
        }
        let learner = stored.membership().get_node(&id).is_some();
        let mut unasked = self.follows_rules(id, &addr, rules, learner).await?;
        tracing::info!(id, %addr, "adding learner");
        // Again: a handover may have begun during the read.
        self.not_while_handing_over()?;
        let raft = &self.node.raft;
        let written = unless_deposed(
            raft,
            raft.add_learner(id, BasicNode { addr: addr.clone() }, true),
        )
        .await?;
        // A concurrent addition of the same id (or address) may have committed between the look
        // and this one, which openraft then left as it was: judged again on what was written.
        if let Some(conflict) = written
            .membership
            .as_ref()
            .and_then(|membership| address_conflict(membership, id, &addr))
        {
            return Err(conflict);
        }
        // The leader may have adopted newer rules while the node was asked and added (it asked
        // the members it had then): the node is asked about those too.
        let adopted = self.node.state_machine.read().state.rules;
        if adopted > rules {
            unasked = self.follows_rules(id, &addr, adopted, true).await?;
        }
        Ok(Response::new(MembershipResponse {
            unasked: unasked.unwrap_or_default(),
            ..membership_response(&written)
        }))
    }

    async fn change_membership(
        &self,
        request: Request<ChangeMembershipRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        self.not_while_handing_over()?;
        let voters: std::collections::BTreeSet<u64> =
            request.into_inner().voters.into_iter().collect();
        if voters.is_empty() {
            return Err(refusal_status(&Refusal::invalid(
                "voters",
                "must not be empty",
            )));
        }
        self.newcomers_stored(&voters).await?;
        tracing::info!(?voters, "changing voters");
        // Again: a handover may have begun during the wait.
        self.not_while_handing_over()?;
        let raft = &self.node.raft;
        let written = unless_deposed(raft, raft.change_membership(voters, false)).await?;
        Ok(Response::new(membership_response(&written)))
    }

    async fn promote_member(
        &self,
        request: Request<PromoteMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        self.not_while_handing_over()?;
        let id = request.into_inner().id;
        // Judged on the committed and applied membership, read linearizably (which also
        // redirects a follower to the leader), as a removal is.
        let stored = self.node.read(|applied| applied.membership.clone()).await?;
        let membership = stored.membership();
        if membership.get_node(&id).is_none() {
            return Err(refusal_status(&Refusal::invalid(
                "id",
                format!("node {id} is not a member; add it as a learner first"),
            )));
        }
        // Already a voter, in a configuration that is not a joint one a deposed leader left half
        // done (a retry of a promotion that went through): nothing to change. In a joint one the
        // change below finishes it.
        let configs = membership.get_joint_config();
        if configs.len() == 1 && configs[0].contains(&id) {
            return Ok(Response::new(unchanged(&stored)));
        }
        let voters: BTreeSet<NodeId> = membership.voter_ids().chain([id]).collect();
        self.newcomers_stored(&voters).await?;
        tracing::info!(id, "promoting learner");
        self.change_members(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
            .await
    }

    async fn remove_member(
        &self,
        request: Request<RemoveMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        self.not_while_handing_over()?;
        let id = request.into_inner().id;
        // Judged on the committed and applied membership, read linearizably (which also
        // redirects a follower to the leader): an answer of "already gone" must not rest on a
        // change the log may still lose.
        let stored = self.node.read(|applied| applied.membership.clone()).await?;
        let membership = stored.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        if membership.get_node(&id).is_none() {
            // Already gone (a retry of a removal that went through): nothing to change.
            return Ok(Response::new(unchanged(&stored)));
        }
        // Voters and learners leave by different changes: openraft's voter replacement keeps
        // learners, and its node removal refuses voters.
        let change = if voters.contains(&id) {
            if voters.len() == 1 {
                return Err(refusal_status(&Refusal::invalid(
                    "id",
                    format!("node {id} is the last voter and cannot be removed"),
                )));
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        tracing::info!(id, ?change, "removing member");
        self.change_members(change).await
    }

    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        let to = request.into_inner().to;
        tracing::info!(?to, "leadership handover asked for");
        let done = handover::hand_over(
            &self.node,
            &self.admission,
            &self.network,
            to,
            TRANSFER_DRAIN,
        )
        .await
        .map_err(|e| e.to_status())?;
        Ok(Response::new(TransferLeaderResponse {
            leader_id: done.leader,
            leader_addr: self.node.member_addr(done.leader).unwrap_or_default(),
            term: done.term,
            took_ms: u64::try_from(done.took.as_millis()).unwrap_or(u64::MAX),
        }))
    }

    async fn state_digest(
        &self,
        _request: Request<StateDigestRequest>,
    ) -> Result<Response<StateDigestResponse>, Status> {
        let saving = self.one_encode_at_a_time()?;
        // This node's own state, not a linearizable read: what is compared is what each replica
        // applied, at the index it says.
        let (state, last_applied) = self
            .node
            .state_machine
            .copy(|applied| (applied.state.clone(), applied.last_applied));
        // Encoded straight into the hash (no image in memory), off the runtime; the slot is
        // held until that ends, also when the caller gives up first.
        let digest = off_runtime(move || {
            let _saving = saving;
            let mut hash = Sha256::new();
            codec::encode_state_into(&state, &mut hash).map(|()| hash.finalize())
        })
        .await?;
        Ok(Response::new(StateDigestResponse {
            applied_index: last_applied.map(|id| id.index).unwrap_or(0),
            digest: hex::encode(&digest[..16]),
        }))
    }

    async fn save_snapshot(
        &self,
        _request: Request<SaveSnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        let saving = self.one_encode_at_a_time()?;
        // A linearizable read: the state includes every write acknowledged before this call.
        // Only a copy is taken under the lock (its tasks, tickets and keys are shared, not
        // copied); the encode runs after the lock is released, off the runtime.
        // The time is read under the same lock (which excludes the apply): every write
        // acknowledged before it is in the copy, which is what the backup's `saved:` time tells
        // an operator deciding whose writes a restore lost. (Taken after the encode, as it was,
        // a write acknowledged during the encode looked saved.)
        let (state, last_applied, membership, served_at_ms) = self
            .node
            .read_copy(|applied| {
                (
                    applied.state.clone(),
                    applied.last_applied,
                    applied.membership.clone(),
                    wall_clock_ms(),
                )
            })
            .await?;
        let state = off_runtime(move || codec::encode_state(&state)).await?;
        let last = last_applied.ok_or_else(|| {
            infra_status(
                Code::FailedPrecondition,
                infra::NOT_INITIALIZED,
                "nothing has been applied yet",
            )
        })?;
        tracing::info!(
            index = last.index,
            bytes = state.len(),
            "serving a snapshot for a backup"
        );
        let meta = SnapshotMeta {
            last_log_index: last.index,
            last_log_term: last.leader_id.term,
            last_log_leader: last.leader_id.node_id,
            members: members_of(membership.membership()),
            state_bytes: state.len() as u64,
            state_format: STATE_FORMAT,
            served_by: self.node.id,
            served_at_ms,
        };
        let head = futures::stream::once(std::future::ready(Ok(SnapshotPart {
            part: Some(snapshot_part::Part::Meta(meta)),
        })));
        // Chunks are copied out one at a time as the client reads them, and the save holds its
        // place until the stream ends (read to the end, or dropped with the client).
        let chunks = (0..state.len()).step_by(SNAPSHOT_CHUNK).map(move |start| {
            let _saving = &saving;
            let chunk = state[start..(start + SNAPSHOT_CHUNK).min(state.len())].to_vec();
            Ok(SnapshotPart {
                part: Some(snapshot_part::Part::Chunk(chunk)),
            })
        });
        Ok(Response::new(Box::pin(
            head.chain(futures::stream::iter(chunks)),
        )))
    }
}

/// Why node `id` cannot be (or was not) added at `addr` to `membership`: the id is a member at
/// another address, or another member has the address.
fn address_conflict(
    membership: &openraft::Membership<NodeId, BasicNode>,
    id: NodeId,
    addr: &str,
) -> Option<Status> {
    let conflict = |message: String| {
        Some(infra_status(
            Code::FailedPrecondition,
            infra::MEMBERSHIP,
            message,
        ))
    };
    if let Some(member) = membership
        .get_node(&id)
        .filter(|member| member.addr != addr)
    {
        return conflict(format!(
            "node {id} is already a member, at {}; remove it first (`baton members remove --id \
             {id}`), and give a node with an empty data dir a new id",
            member.addr
        ));
    }
    if let Some((other, _)) = membership
        .nodes()
        .find(|(other, node)| **other != id && node.addr == addr)
    {
        return conflict(format!("{addr} is already the address of node {other}"));
    }
    None
}

/// Why node `id` must not be added as a learner to `membership` because it is a voter, if it is
/// one: it would be answered as if it had joined. The usual reason to ask is a voter rebuilt
/// with an empty data dir under its old id, which must not vote again: it may have acknowledged
/// entries it no longer has, and could elect a leader that lacks them. (Judged before the
/// addition only: a promotion committed meanwhile does not make a granted addition fail.)
fn already_voter(
    membership: &openraft::Membership<NodeId, BasicNode>,
    id: NodeId,
) -> Option<Status> {
    membership.voter_ids().any(|voter| voter == id).then(|| {
        infra_status(
            Code::FailedPrecondition,
            infra::MEMBERSHIP,
            format!(
                "node {id} is already a voter; if it lost its data dir, remove it (`baton \
                 members remove --id {id}`) and add the replacement under a new id"
            ),
        )
    })
}

/// Why `voters` must not become the voters yet, judged on the leader's replication `metrics`:
/// a learner they would make a voter has not stored the latest membership entry (which lists
/// it). Most often it has accepted nothing the leader sent — it is down, at a wrong address, or a node of another
/// cluster refusing every entry — and as a voter it would count against every quorum: with one
/// or two voters the change itself could never commit, and it holds every write and every later
/// membership change (a removal too) until it does; with more, the cluster would be a failure
/// closer to stopping without knowing it. Not judged on a follower, whose change openraft
/// refuses anyway (it names the leader).
fn unreplicated_newcomers(
    metrics: &openraft::RaftMetrics<NodeId, BasicNode>,
    voters: &BTreeSet<NodeId>,
) -> Option<Status> {
    let replication = metrics.replication.as_ref()?;
    let config = &metrics.membership_config;
    let listed = config.log_id().map_or(0, |id| id.index);
    let current: BTreeSet<NodeId> = config.membership().voter_ids().collect();
    let behind: Vec<NodeId> = voters
        .iter()
        .filter(|id| !current.contains(id))
        .filter(|id| {
            replication
                .get(id)
                .is_some_and(|matched| matched.map_or(0, |m| m.index) < listed)
        })
        .copied()
        .collect();
    if behind.is_empty() {
        return None;
    }
    Some(infra_status(
        Code::FailedPrecondition,
        infra::MEMBERSHIP,
        format!(
            "learner(s) {behind:?} have not stored the latest membership entry, which lists \
             them (log index {listed}): if down, at a wrong address, or of another cluster, they \
             would be voters that never vote; start them (or remove them and add them at the \
             right address), wait until `baton status` shows them caught up, then promote"
        ),
    ))
}

/// The answer to a change already made: the membership as `stored`.
fn unchanged(stored: &StoredMembership<NodeId, BasicNode>) -> MembershipResponse {
    MembershipResponse {
        members: members_of(stored.membership()),
        log_index: stored.log_id().map_or(0, |id| id.index),
        unasked: String::new(),
    }
}

fn membership_response(
    written: &openraft::raft::ClientWriteResponse<TypeConfig>,
) -> MembershipResponse {
    MembershipResponse {
        members: written
            .membership
            .as_ref()
            .map(members_of)
            .unwrap_or_default(),
        log_index: written.log_id.index,
        unasked: String::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use openraft::{CommittedLeaderId, LogId, Membership};

    use super::*;

    /// A leader's metrics: voters 1-3, learner 4, the membership listing them at index 10,
    /// and what each follower has stored.
    fn leader_metrics(
        stored: &[(NodeId, Option<u64>)],
    ) -> openraft::RaftMetrics<NodeId, BasicNode> {
        let at = |index| LogId::new(CommittedLeaderId::new(1, 1), index);
        let nodes: BTreeMap<NodeId, BasicNode> =
            (1..=4).map(|id| (id, BasicNode::default())).collect();
        let membership = Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes);
        let mut metrics = openraft::RaftMetrics::new_initial(1);
        metrics.membership_config = Arc::new(StoredMembership::new(Some(at(10)), membership));
        metrics.replication = Some(
            stored
                .iter()
                .map(|(id, index)| (*id, index.map(at)))
                .collect(),
        );
        metrics
    }

    /// While the gate is closed for a handover no membership change is made (or read for).
    #[tokio::test]
    async fn membership_changes_wait_out_a_handover() {
        use crate::admission::{Admission, Closed};
        use baton_rpc::proto::cluster_server::Cluster;
        let dir = tempfile::tempdir().unwrap();
        let gate = Admission::new(None);
        let node = Arc::new(crate::node::tests::lone_leader_behind(dir.path(), gate.clone()).await);
        let service = ClusterService::new(
            node.clone(),
            gate.clone(),
            Network::default(),
            String::new(),
            OwnCluster::default(),
        );
        gate.close(Closed::HandingOver);
        let add = AddLearnerRequest {
            id: 2,
            addr: "127.0.0.1:9".into(),
        };
        let refused = [
            service.add_learner(Request::new(add.clone())).await.err(),
            service
                .change_membership(Request::new(ChangeMembershipRequest { voters: vec![1, 2] }))
                .await
                .err(),
            service
                .promote_member(Request::new(PromoteMemberRequest { id: 2 }))
                .await
                .err(),
            service
                .remove_member(Request::new(RemoveMemberRequest { id: 2 }))
                .await
                .err(),
        ];
        for status in refused {
            let status = status.expect("refused while handing over");
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        }
        let members = node.raft.metrics().borrow().membership_config.clone();
        assert_eq!(members.membership().nodes().count(), 1, "{members:?}");
        // Once the gate reopens, the same change goes through.
        gate.reopen();
        service.add_learner(Request::new(add)).await.unwrap();
    }

    #[test]
    fn a_learner_is_promoted_only_once_it_stored_its_membership() {
        let promote = BTreeSet::from([1, 2, 3, 4]);
        for (learner, refused) in [(None, true), (Some(9), true), (Some(10), false)] {
            let metrics = leader_metrics(&[(2, Some(12)), (3, Some(12)), (4, learner)]);
            let answer = unreplicated_newcomers(&metrics, &promote);
            assert_eq!(
                answer.is_some(),
                refused,
                "learner at {learner:?}: {answer:?}"
            );
            if let Some(status) = answer {
                assert!(status.message().contains("[4]"), "{status:?}");
            }
        }
    }

    #[test]
    fn voters_already_in_and_followers_are_not_judged() {
        // A voter behind (node 3) stays a voter: only newcomers must have stored the entry.
        let metrics = leader_metrics(&[(2, Some(12)), (3, None), (4, None)]);
        assert!(unreplicated_newcomers(&metrics, &BTreeSet::from([1, 2, 3])).is_none());
        assert!(unreplicated_newcomers(&metrics, &BTreeSet::from([1, 2])).is_none());
        // A follower has no replication to judge by; openraft names the leader instead.
        let mut follower = metrics;
        follower.replication = None;
        assert!(unreplicated_newcomers(&follower, &BTreeSet::from([1, 2, 3, 4])).is_none());
    }
}
