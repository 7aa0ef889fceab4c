//! The server side of the Raft transport.

use baton_rpc::proto::raft::raft_server;
use baton_rpc::proto::raft::{raft_reply, RaftReply, RaftRequest};
use openraft::raft::VoteRequest;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::codec;
use crate::newer_log_stands;
use crate::types::{NodeId, Raft};

/// Hands peer messages to the local Raft instance.
pub struct RaftService {
    raft: Raft,
}

impl RaftService {
    /// Serves `raft`.
    pub fn new(raft: Raft) -> Self {
        Self { raft }
    }
}

fn decode<T: DeserializeOwned>(request: Request<RaftRequest>) -> Result<T, Status> {
    codec::decode(&request.into_inner().body)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft message: {e}")))
}

fn reply<T: Serialize, E: Serialize>(result: Result<T, E>) -> Result<Response<RaftReply>, Status> {
    let encoded = match &result {
        Ok(value) => codec::encode(value).map(raft_reply::Result::Ok),
        Err(error) => codec::encode(error).map(raft_reply::Result::Err),
    }
    .map_err(|e| Status::internal(format!("cannot encode raft reply: {e}")))?;
    Ok(Response::new(RaftReply {
        result: Some(encoded),
    }))
}

#[tonic::async_trait]
impl raft_server::Raft for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        reply(self.raft.append_entries(decode(request)?).await)
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let request: VoteRequest<NodeId> = decode(request)?;
        let result = self.raft.vote(request.clone()).await;
        if let Ok(response) = &result {
            // Votes are rare (elections only); the rule decides inside whether to act.
            let (raft, response) = (self.raft.clone(), response.clone());
            tokio::spawn(async move {
                newer_log_stands::after_vote(&raft, &request, &response).await;
            });
        }
        reply(result)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        reply(self.raft.install_snapshot(decode(request)?).await)
    }

    async fn timeout_now(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        reply(crate::handover::on_timeout_now(&self.raft, decode(request)?).await)
    }
}
