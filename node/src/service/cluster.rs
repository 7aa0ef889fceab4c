//! Cluster introspection, initialisation and membership changes.

use std::collections::BTreeMap;

use baton_rpc::error::{infra, infra_status, refusal_status};
use baton_rpc::proto::cluster_server;
use baton_rpc::proto::{
    AddLearnerRequest, ChangeMembershipRequest, InitializeRequest, InitializeResponse, Member,
    MembershipResponse, NodeInfoRequest, NodeInfoResponse,
};
use baton_statemachine::Refusal;
use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, ServerState};
use tonic::{Code, Request, Response, Status};

use crate::node::{write_error, NodeRef};
use crate::types::TypeConfig;

/// Serves node information and cluster initialisation.
pub struct ClusterService {
    node: NodeRef,
}

impl ClusterService {
    /// Serves `node`.
    pub fn new(node: NodeRef) -> Self {
        Self { node }
    }
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

#[tonic::async_trait]
impl cluster_server::Cluster for ClusterService {
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
        let nodes: BTreeMap<u64, BasicNode> = members
            .into_iter()
            .map(|member| (member.id, BasicNode { addr: member.addr }))
            .collect();
        match self.node.raft.initialize(nodes).await {
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
        let AddLearnerRequest { id, addr } = request.into_inner();
        if addr.is_empty() {
            return Err(refusal_status(&Refusal::invalid(
                "addr",
                "must not be empty",
            )));
        }
        tracing::info!(id, %addr, "adding learner");
        let written = self
            .node
            .raft
            .add_learner(id, BasicNode { addr }, true)
            .await
            .map_err(write_error)?;
        Ok(Response::new(membership_response(&written)))
    }

    async fn change_membership(
        &self,
        request: Request<ChangeMembershipRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let voters: std::collections::BTreeSet<u64> =
            request.into_inner().voters.into_iter().collect();
        if voters.is_empty() {
            return Err(refusal_status(&Refusal::invalid(
                "voters",
                "must not be empty",
            )));
        }
        tracing::info!(?voters, "changing voters");
        let written = self
            .node
            .raft
            .change_membership(voters, false)
            .await
            .map_err(write_error)?;
        Ok(Response::new(membership_response(&written)))
    }
}

fn membership_response(
    written: &openraft::raft::ClientWriteResponse<TypeConfig>,
) -> MembershipResponse {
    let members = written
        .membership
        .as_ref()
        .map(|membership| {
            membership
                .nodes()
                .map(|(id, node)| Member {
                    id: *id,
                    addr: node.addr.clone(),
                    voter: membership.voter_ids().any(|voter| voter == *id),
                })
                .collect()
        })
        .unwrap_or_default();
    MembershipResponse {
        members,
        log_index: written.log_id.index,
    }
}
