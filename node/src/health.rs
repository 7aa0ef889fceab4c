//! gRPC health checking (`grpc.health.v1.Health`) and server reflection, so that standard tools
//! (`grpc_health_probe`, `grpcurl`, load balancers) can probe and explore a node.
//!
//! Every Baton client service, and the whole server (the empty service name), is `SERVING`
//! while the node serves and `NOT_SERVING` from the moment it begins to shut down. A health
//! watch hears `NOT_SERVING` at once, stays open while the node drains and hands over (a watch
//! that ended then would be opened again at once by a gRPC client's health checking, which
//! retries without back-off after a message), and ends (`UNAVAILABLE`, `SHUTTING_DOWN`) when the
//! node stops serving: gRPC clients keep one open for good, and an open stream would hold its
//! connection, and so the node's graceful shutdown, until the close limit cut it.

use baton_rpc::proto::{
    batch_server, board_server, checkpoint_server, cluster_server, effect_server, handoff_server,
    queue_server, sink_server, watch_server,
};
use std::pin::Pin;

use baton_rpc::error::{infra, infra_status};
use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::watch;
use tonic::server::NamedService;
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::health_server::{self, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

/// The gRPC names of the services health checking reports on; "" is the server as a whole.
fn service_names() -> [&'static str; 10] {
    [
        "",
        <handoff_server::HandoffServer<crate::service::HandoffService> as NamedService>::NAME,
        <board_server::BoardServer<crate::service::BoardService> as NamedService>::NAME,
        <effect_server::EffectServer<crate::service::EffectService> as NamedService>::NAME,
        <sink_server::SinkServer<crate::service::SinkService> as NamedService>::NAME,
        <checkpoint_server::CheckpointServer<crate::service::CheckpointService> as NamedService>::NAME,
        <queue_server::QueueServer<crate::service::QueueService> as NamedService>::NAME,
        <cluster_server::ClusterServer<crate::service::ClusterService> as NamedService>::NAME,
        <watch_server::WatchServer<crate::service::WatchService> as NamedService>::NAME,
        <batch_server::BatchServer<crate::service::BatchService> as NamedService>::NAME,
    ]
}

/// Sets what the health service reports.
#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
}

impl Health {
    /// Reports every service as `status`.
    pub async fn set(&self, status: ServingStatus) {
        for name in service_names() {
            self.reporter.set_service_status(name, status).await;
        }
    }
}

/// The health service (Baton's services are unknown to it until [`Health::set`] reports them;
/// its watches end once `closing` turns true: when the node stops serving) and its handle.
pub fn health_service(
    closing: watch::Receiver<bool>,
) -> (Health, HealthServer<impl health_server::Health>) {
    let reporter = HealthReporter::new();
    let inner = HealthService::from_health_reporter(reporter.clone());
    (
        Health { reporter },
        HealthServer::new(ClosingHealth { inner, closing }),
    )
}

/// tonic's health service, whose watches end when the node stops serving.
struct ClosingHealth {
    inner: HealthService,
    closing: watch::Receiver<bool>,
}

/// A health watch as [`ClosingHealth`] serves it.
type HealthWatch = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl health_server::Health for ClosingHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = HealthWatch;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthWatch>, Status> {
        let statuses = self.inner.watch(request).await?.into_inner();
        Ok(Response::new(until_closing(statuses, self.closing.clone())))
    }
}

/// `statuses` until `closing` turns true: then the status changes already made (the shutdown
/// sets `NOT_SERVING` before it stops serving), and an `UNAVAILABLE` end.
fn until_closing<S>(statuses: S, closing: watch::Receiver<bool>) -> HealthWatch
where
    S: Stream<Item = Result<HealthCheckResponse, Status>> + Send + Unpin + 'static,
{
    let shutting_down = || {
        Err(infra_status(
            Code::Unavailable,
            infra::SHUTTING_DOWN,
            "this node is shutting down; watch another node's health",
        ))
    };
    Box::pin(futures::stream::unfold(
        Some((statuses, closing)),
        move |state| async move {
            let (mut statuses, mut closing) = state?;
            if !*closing.borrow() {
                let next = tokio::select! {
                    biased;
                    next = statuses.next() => Some(next),
                    _ = closing.wait_for(|closing| *closing) => None,
                };
                if let Some(next) = next {
                    return next.map(|next| (next, Some((statuses, closing))));
                }
            }
            // Closing: what is ready now (whatever the task's budget), then the end.
            match tokio::task::unconstrained(statuses.next()).now_or_never() {
                Some(Some(next)) => Some((next, Some((statuses, closing)))),
                _ => Some((shutting_down(), None)),
            }
        },
    ))
}

/// The reflection service, describing Baton's services and the health service.
pub fn reflection_service() -> anyhow::Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
> {
    Ok(tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(baton_rpc::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn serving() -> Result<HealthCheckResponse, Status> {
        Ok(HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        })
    }

    /// A watch whose status does not change still ends once the node closes.
    #[tokio::test]
    async fn a_quiet_watch_ends_when_closing() {
        let (tx, rx) = watch::channel(false);
        let mut stream = until_closing(futures::stream::pending(), rx);
        assert!(stream.next().now_or_never().is_none());
        tx.send(true).unwrap();
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), stream.next());
        let end = next.await.unwrap().unwrap().unwrap_err();
        assert_eq!(end.code(), tonic::Code::Unavailable);
        assert!(stream.next().await.is_none());
    }

    /// A status change made before the closing is delivered before the end.
    #[tokio::test]
    async fn a_change_made_before_closing_is_delivered_first() {
        let (tx, rx) = watch::channel(false);
        tx.send(true).unwrap();
        let ready = futures::stream::iter([serving()]).chain(futures::stream::pending());
        let mut stream = until_closing(ready, rx);
        assert!(stream.next().await.unwrap().is_ok());
        assert!(stream.next().await.unwrap().is_err());
        assert!(stream.next().await.is_none());
    }
}
