//! The operator's HTTP endpoint, separate from gRPC so that scrapers and probes need no gRPC:
//! `/metrics` (Prometheus text format), `/livez` (the process answers) and `/readyz` (the node
//! should receive traffic; 503 with the reason when not).

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::http_listener::GuardedListener;
use crate::metrics::{self, StoreStats};
use crate::node::NodeRef;
use crate::readiness::Readiness;

/// What the endpoint reports on.
pub struct Endpoint {
    /// The node.
    pub node: NodeRef,
    /// What its stores observed.
    pub stats: Arc<StoreStats>,
    /// Its readiness judge.
    pub readiness: Readiness,
}

/// Serves the endpoint on `listener` until `shutdown` resolves, within the connection limits
/// of [`crate::http_listener`].
pub async fn serve(
    listener: TcpListener,
    endpoint: Arc<Endpoint>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/livez", get(live))
        .route("/readyz", get(ready))
        .with_state(endpoint);
    axum::serve(GuardedListener::new(listener), app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn render_metrics(State(endpoint): State<Arc<Endpoint>>) -> impl IntoResponse {
    let text = metrics::metrics().render(&endpoint.node, &endpoint.stats);
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text)
}

async fn live() -> &'static str {
    "ok\n"
}

async fn ready(State(endpoint): State<Arc<Endpoint>>) -> (StatusCode, String) {
    match endpoint.readiness.check().await {
        Ok(summary) => (StatusCode::OK, format!("ready: {summary}\n")),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        ),
    }
}
