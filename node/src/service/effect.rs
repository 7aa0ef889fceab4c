//! The side-effect gate service.

use baton_rpc::convert;
use baton_rpc::proto;
use baton_rpc::proto::effect_server;
use baton_rpc::proto::{
    AbandonRequest, AbandonResponse, AcquireRequest, AcquireResponse, BeginReconcileRequest,
    BeginReconcileResponse, CompleteEffectRequest, CompleteEffectResponse, MarkUncertainRequest,
    MarkUncertainResponse, ReleaseEffectRequest, ReleaseEffectResponse, RenewEffectRequest,
    RenewEffectResponse, ResolveUncertainRequest, ResolveUncertainResponse, ShowActionRequest,
    ShowActionResponse,
};
use baton_statemachine::effect::{Action, Command, EffectLease};
use baton_statemachine::{read_key, Command as Cmd, Refusal, Reply};
use tonic::{Request, Response, Status};

use super::{done, is_retry, now_ms, origin, refused, revision, unexpected, HOLD_TTL};
use crate::node::NodeRef;

/// Serves the side-effect gate.
pub struct EffectService {
    node: NodeRef,
}

impl EffectService {
    /// Serves `node`.
    pub fn new(node: NodeRef) -> Self {
        Self { node }
    }

    async fn propose(
        &self,
        header: Option<proto::RequestHeader>,
        command: Command,
    ) -> Result<Reply, Status> {
        self.node
            .propose(Some(origin(header)?), Cmd::Effect(command))
            .await
    }

    /// [`Self::propose`] for a command asking for a hold of `ttl_ms`, refused over
    /// [`HOLD_TTL`].
    async fn propose_hold(
        &self,
        header: Option<proto::RequestHeader>,
        ttl_ms: i64,
        command: Command,
    ) -> Result<Reply, Status> {
        let retry = is_retry(&header);
        let origin = origin(header)?;
        HOLD_TTL.check(&self.node, &origin, retry, ttl_ms).await?;
        self.node.propose(Some(origin), Cmd::Effect(command)).await
    }
}

fn action(action: Option<proto::Action>) -> Result<Action, Status> {
    convert::action_from_proto(action).map_err(refused)
}

fn lease(lease: Option<proto::EffectLease>) -> Result<EffectLease, Status> {
    convert::effect_lease_from_proto("lease", lease).map_err(refused)
}

#[tonic::async_trait]
impl effect_server::Effect for EffectService {
    #[tracing::instrument(skip_all, fields(command = "effect.acquire"))]
    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Acquire {
            action: action(r.action)?,
            ttl_ms: r.ttl_ms,
        };
        match self.propose_hold(r.header, r.ttl_ms, command).await? {
            Reply::Outcome(outcome) => Ok(Response::new(AcquireResponse {
                outcome: Some(convert::outcome_to_proto(&outcome)),
            })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(command = "effect.complete"))]
    async fn complete(
        &self,
        request: Request<CompleteEffectRequest>,
    ) -> Result<Response<CompleteEffectResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Complete {
            action: action(r.action)?,
            lease: lease(r.lease)?,
            result: r.result,
        };
        match self.propose(r.header, command).await? {
            Reply::EffectResult(result) => Ok(Response::new(CompleteEffectResponse { result })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(command = "effect.release"))]
    async fn release(
        &self,
        request: Request<ReleaseEffectRequest>,
    ) -> Result<Response<ReleaseEffectResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Release {
            action: action(r.action)?,
            lease: lease(r.lease)?,
        };
        done(self.propose(r.header, command).await?)?;
        Ok(Response::new(ReleaseEffectResponse {}))
    }

    #[tracing::instrument(skip_all, fields(command = "effect.abandon"))]
    async fn abandon(
        &self,
        request: Request<AbandonRequest>,
    ) -> Result<Response<AbandonResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Abandon {
            action: action(r.action)?,
            lease: lease(r.lease)?,
            reason: r.reason,
        };
        done(self.propose(r.header, command).await?)?;
        Ok(Response::new(AbandonResponse {}))
    }

    #[tracing::instrument(skip_all, fields(command = "effect.renew"))]
    async fn renew(
        &self,
        request: Request<RenewEffectRequest>,
    ) -> Result<Response<RenewEffectResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Renew {
            action: action(r.action)?,
            lease: lease(r.lease)?,
            ttl_ms: r.ttl_ms,
        };
        match self.propose_hold(r.header, r.ttl_ms, command).await? {
            Reply::EffectLease(lease) => Ok(Response::new(RenewEffectResponse {
                lease: Some(convert::effect_lease_to_proto(&lease)),
            })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(command = "effect.mark_uncertain"))]
    async fn mark_uncertain(
        &self,
        request: Request<MarkUncertainRequest>,
    ) -> Result<Response<MarkUncertainResponse>, Status> {
        let r = request.into_inner();
        let command = Command::MarkUncertain {
            action: action(r.action)?,
            lease: lease(r.lease)?,
            reason: r.reason,
        };
        done(self.propose(r.header, command).await?)?;
        Ok(Response::new(MarkUncertainResponse {}))
    }

    #[tracing::instrument(skip_all, fields(command = "effect.begin_reconcile"))]
    async fn begin_reconcile(
        &self,
        request: Request<BeginReconcileRequest>,
    ) -> Result<Response<BeginReconcileResponse>, Status> {
        let r = request.into_inner();
        let command = Command::BeginReconcile {
            action: action(r.action)?,
            ttl_ms: r.ttl_ms,
        };
        match self.propose_hold(r.header, r.ttl_ms, command).await? {
            Reply::Reconcile(reconcile) => Ok(Response::new(BeginReconcileResponse {
                reconcile: Some(convert::reconcile_to_proto(&reconcile)),
            })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(command = "effect.resolve_uncertain"))]
    async fn resolve_uncertain(
        &self,
        request: Request<ResolveUncertainRequest>,
    ) -> Result<Response<ResolveUncertainResponse>, Status> {
        let r = request.into_inner();
        let command = Command::ResolveUncertain {
            action: action(r.action)?,
            resolution: convert::resolution_from_proto(r.resolution).map_err(refused)?,
        };
        match self.propose(r.header, command).await? {
            Reply::Resolved(resolved) => Ok(Response::new(convert::resolved_to_proto(&resolved))),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(query = "effect.show"))]
    async fn show(
        &self,
        request: Request<ShowActionRequest>,
    ) -> Result<Response<ShowActionResponse>, Status> {
        let key = request.into_inner().key;
        read_key("key", &key).map_err(refused)?;
        let reply = self
            .node
            .read(|applied| {
                applied
                    .state
                    .effects
                    .show(&key)
                    .map(|view| ShowActionResponse {
                        action: Some(convert::action_view_to_proto(&view)),
                        now_ms: now_ms(applied),
                        revision: revision(applied),
                    })
            })
            .await?;
        reply
            .map(Response::new)
            .ok_or_else(|| refused(Refusal::UnknownAction))
    }
}
