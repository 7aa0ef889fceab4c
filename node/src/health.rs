//! gRPC health checking (`grpc.health.v1.Health`) and server reflection, so that standard tools
//! (`grpc_health_probe`, `grpcurl`, load balancers) can probe and explore a node.
//!
//! Every Baton client service, and the whole server (the empty service name), is `SERVING`
//! while the node serves and `NOT_SERVING` from the moment it begins to shut down.

use baton_rpc::proto::{
    batch_server, board_server, checkpoint_server, cluster_server, effect_server, handoff_server,
    queue_server, sink_server, watch_server,
};
use tonic::server::NamedService;
use tonic_health::server::{health_reporter, HealthReporter};
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

/// The health service (reporting `NOT_SERVING` until [`Health::set`] says otherwise) and its
/// handle.
pub fn health_service() -> (
    Health,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
) {
    let (reporter, service) = health_reporter();
    (Health { reporter }, service)
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
