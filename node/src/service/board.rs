//! The task-board service.

use baton_rpc::convert;
use baton_rpc::proto::board_server;
use baton_rpc::proto::{
    ClaimTaskRequest, ClaimTaskResponse, CompleteTaskRequest, CompleteTaskResponse,
    ListTasksRequest, ListTasksResponse, ReleaseTaskRequest, ReleaseTaskResponse, RenewTaskRequest,
    RenewTaskResponse, SeedTasksRequest, SeedTasksResponse,
};
use baton_statemachine::board::Command;
use baton_statemachine::{Command as Cmd, Reply};
use tonic::{Request, Response, Status};

use super::{done, is_retry, now_ms, origin, revision, unexpected, HOLD_TTL};
use crate::node::NodeRef;

/// Serves the task board.
pub struct BoardService {
    node: NodeRef,
}

impl BoardService {
    /// Serves `node`.
    pub fn new(node: NodeRef) -> Self {
        Self { node }
    }
}

#[tonic::async_trait]
impl board_server::Board for BoardService {
    #[tracing::instrument(skip_all, fields(command = "board.seed"))]
    async fn seed(
        &self,
        request: Request<SeedTasksRequest>,
    ) -> Result<Response<SeedTasksResponse>, Status> {
        let r = request.into_inner();
        let specs = r
            .tasks
            .into_iter()
            .map(convert::task_spec_from_proto)
            .collect();
        match self
            .node
            .propose(Some(origin(r.header)?), Cmd::Board(Command::Seed(specs)))
            .await?
        {
            Reply::Seeded { tasks } => Ok(Response::new(SeedTasksResponse { tasks })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(command = "board.claim"))]
    async fn claim(
        &self,
        request: Request<ClaimTaskRequest>,
    ) -> Result<Response<ClaimTaskResponse>, Status> {
        let r = request.into_inner();
        let retry = is_retry(&r.header);
        let origin = origin(r.header)?;
        HOLD_TTL.check(&self.node, &origin, retry, r.ttl_ms).await?;
        let command = Command::Claim {
            id: r.id,
            agent: r.agent,
            ttl_ms: r.ttl_ms,
        };
        match self
            .node
            .propose_attempt(Some(origin), retry, Cmd::Board(command))
            .await?
        {
            // The claimer is the one caller who sees the token.
            Reply::Task(task) => Ok(Response::new(ClaimTaskResponse {
                task: Some(convert::task_to_proto(&task)),
            })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(command = "board.release"))]
    async fn release(
        &self,
        request: Request<ReleaseTaskRequest>,
    ) -> Result<Response<ReleaseTaskResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Release {
            id: r.id,
            token: r.token,
        };
        done(
            self.node
                .propose(Some(origin(r.header)?), Cmd::Board(command))
                .await?,
        )?;
        Ok(Response::new(ReleaseTaskResponse {}))
    }

    #[tracing::instrument(skip_all, fields(command = "board.complete"))]
    async fn complete(
        &self,
        request: Request<CompleteTaskRequest>,
    ) -> Result<Response<CompleteTaskResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Complete {
            id: r.id,
            token: r.token,
        };
        done(
            self.node
                .propose(Some(origin(r.header)?), Cmd::Board(command))
                .await?,
        )?;
        Ok(Response::new(CompleteTaskResponse {}))
    }

    #[tracing::instrument(skip_all, fields(command = "board.renew"))]
    async fn renew(
        &self,
        request: Request<RenewTaskRequest>,
    ) -> Result<Response<RenewTaskResponse>, Status> {
        let r = request.into_inner();
        let retry = is_retry(&r.header);
        let origin = origin(r.header)?;
        HOLD_TTL.check(&self.node, &origin, retry, r.ttl_ms).await?;
        let command = Command::Renew {
            id: r.id,
            token: r.token,
            ttl_ms: r.ttl_ms,
        };
        match self.node.propose(Some(origin), Cmd::Board(command)).await? {
            // The renewer presented the token, so it may see it again.
            Reply::Task(task) => Ok(Response::new(RenewTaskResponse {
                task: Some(convert::task_to_proto(&task)),
            })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(query = "board.list"))]
    async fn list(
        &self,
        _request: Request<ListTasksRequest>,
    ) -> Result<Response<ListTasksResponse>, Status> {
        // Pointers under the state lock, encoding after it: applies wait for the first only.
        let (tasks, now_ms, revision) = self
            .node
            .read(|applied| {
                let tasks: Vec<_> = applied.state.board.shared_tasks().cloned().collect();
                (tasks, now_ms(applied), revision(applied))
            })
            .await?;
        Ok(Response::new(ListTasksResponse {
            tasks: tasks
                .iter()
                .map(|task| convert::task_listing_to_proto(task))
                .collect(),
            now_ms,
            revision,
        }))
    }
}
