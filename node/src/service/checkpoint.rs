//! The checkpoint service.

use baton_rpc::proto::checkpoint_server;
use baton_rpc::proto::{
    LoadCheckpointRequest, LoadCheckpointResponse, SaveIfNewerRequest, SaveIfNewerResponse,
};
use baton_statemachine::checkpoint::Command;
use baton_statemachine::{read_key, Command as Cmd, Refusal};
use tonic::{Request, Response, Status};

use super::{done, origin, refused, revision};
use crate::node::NodeRef;

/// Serves checkpoint compare-and-set.
pub struct CheckpointService {
    node: NodeRef,
}

impl CheckpointService {
    /// Serves `node`.
    pub fn new(node: NodeRef) -> Self {
        Self { node }
    }
}

#[tonic::async_trait]
impl checkpoint_server::Checkpoint for CheckpointService {
    #[tracing::instrument(skip_all, fields(command = "checkpoint.save"))]
    async fn save_if_newer(
        &self,
        request: Request<SaveIfNewerRequest>,
    ) -> Result<Response<SaveIfNewerResponse>, Status> {
        let r = request.into_inner();
        let command = Command::SaveIfNewer {
            run: r.run,
            seq: r.seq,
            data: r.data,
        };
        done(
            self.node
                .propose(Some(origin(r.header)?), Cmd::Checkpoint(command))
                .await?,
        )?;
        Ok(Response::new(SaveIfNewerResponse {}))
    }

    #[tracing::instrument(skip_all, fields(query = "checkpoint.load"))]
    async fn load(
        &self,
        request: Request<LoadCheckpointRequest>,
    ) -> Result<Response<LoadCheckpointResponse>, Status> {
        let run = request.into_inner().run;
        read_key("run", &run).map_err(refused)?;
        let reply = self
            .node
            .read(|applied| {
                applied
                    .state
                    .checkpoints
                    .load(&run)
                    .map(|saved| LoadCheckpointResponse {
                        seq: saved.seq,
                        data: saved.data.clone(),
                        saved_at_ms: saved.saved_at_ms,
                        revision: revision(applied),
                    })
            })
            .await?;
        reply
            .map(Response::new)
            .ok_or_else(|| refused(Refusal::NotFound))
    }
}
