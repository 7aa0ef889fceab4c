//! The fenced-sink service.

use baton_rpc::proto::sink_server;
use baton_rpc::proto::{SinkReadRequest, SinkReadResponse, SinkWriteRequest, SinkWriteResponse};
use baton_statemachine::sink::{Command, Sink};
use baton_statemachine::{Command as Cmd, Refusal, Reply};
use tonic::{Request, Response, Status};

use super::{origin, refused, revision, unexpected};
use crate::node::NodeRef;

/// Serves the fenced sink.
pub struct SinkService {
    node: NodeRef,
}

impl SinkService {
    /// Serves `node`.
    pub fn new(node: NodeRef) -> Self {
        Self { node }
    }
}

#[tonic::async_trait]
impl sink_server::Sink for SinkService {
    #[tracing::instrument(skip_all, fields(command = "sink.write"))]
    async fn write(
        &self,
        request: Request<SinkWriteRequest>,
    ) -> Result<Response<SinkWriteResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Write {
            resource: r.resource,
            fence: r.fence,
            value: r.value,
        };
        match self
            .node
            .propose(Some(origin(r.header)?), Cmd::Sink(command))
            .await?
        {
            Reply::Written { seen_fence, writes } => {
                Ok(Response::new(SinkWriteResponse { seen_fence, writes }))
            }
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(query = "sink.read"))]
    async fn read(
        &self,
        request: Request<SinkReadRequest>,
    ) -> Result<Response<SinkReadResponse>, Status> {
        let resource = request.into_inner().resource;
        Sink::read_name(&resource).map_err(refused)?;
        let reply = self
            .node
            .read(|applied| {
                applied
                    .state
                    .sink
                    .read(&resource)
                    .map(|value| SinkReadResponse {
                        seen_fence: value.seen_fence,
                        value: value.value.clone(),
                        writes: value.writes,
                        revision: revision(applied),
                    })
            })
            .await?;
        reply
            .map(Response::new)
            .ok_or_else(|| refused(Refusal::NotFound))
    }
}
