//! Cluster introspection and initialisation.

use std::collections::BTreeMap;

use baton_rpc::error::{infra, infra_status, refusal_status};
use baton_rpc::proto::cluster_server;
use baton_rpc::proto::{
    InitializeRequest, InitializeResponse, Member, NodeInfoRequest, NodeInfoResponse,
};
use baton_statemachine::Refusal;
use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, ServerState};
use tonic::{Code, Request, Response, Status};

use crate::node::NodeRef;

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
}
