//! The client connections a node serves at once, and how long one may stall.
//!
//! Every connection costs a file descriptor, and so do what the node cannot do without: the
//! store's files, its peers' Raft links, snapshot files, the operator endpoint. The gRPC server
//! caps nothing, so a client fleet that leaks channels, or anyone who opens connections and
//! keeps them open, could use up the process's descriptors, and a node that cannot open a peer
//! link or a snapshot file stops taking part in the cluster. So a node holds at most
//! `limits.max_connections` client connections. One more is closed as soon as its first byte says
//! it is not a peer's, before its TLS handshake or HTTP/2 preface, and its client moves on to
//! another node (the client library's usual answer to a connection it cannot use). Peers' Raft
//! connections are not counted: a node at its cap still replicates, votes and hands over.
//!
//! A held place is given back when the connection closes, and a connection that moves no byte
//! either way for [`IDLE_LIMIT`] is closed ([`Guarded`]). Once HTTP/2 runs, the node pings a
//! connection it has heard nothing from for [`KEEPALIVE`], streams open or not, and closes it
//! when no answer comes within as long again, so a live client never goes that long without a
//! byte and a dead one is let go at 40 s: the idle limit is what bounds a connection before
//! HTTP/2 runs, such as one that finished its TLS handshake and never sent HTTP/2's preface.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::guarded::Guarded;
use crate::metrics::metrics;
use crate::throttle::Throttle;

/// How often the node pings a client connection (HTTP/2 keepalive), and how long the answer may
/// take before the connection is closed.
pub const KEEPALIVE: Duration = Duration::from_secs(20);

/// How long a client connection may move no byte either way: three keepalive intervals.
pub const IDLE_LIMIT: Duration = Duration::from_secs(60);

/// A client's connection, holding its place for as long as the gRPC server keeps it.
pub type ClientConnection = Guarded<Place>;

/// The places for client connections; clones share them.
#[derive(Clone)]
pub struct ClientConnections {
    places: Arc<Semaphore>,
    max: usize,
    idle: Duration,
    warned: Throttle,
}

impl ClientConnections {
    /// Room for `max` connections at once, each closed after [`IDLE_LIMIT`] without a byte.
    pub fn new(max: usize) -> Self {
        Self::with_idle_limit(max, IDLE_LIMIT)
    }

    /// Room for `max` connections at once, each closed after `idle` without a byte.
    pub fn with_idle_limit(max: usize, idle: Duration) -> Self {
        Self {
            places: Arc::new(Semaphore::new(max)),
            max,
            idle,
            warned: Throttle::default(),
        }
    }

    /// `stream` holding a place until it is dropped, or `None` when every place is taken (the
    /// caller then drops `stream`, which closes it).
    pub fn admit(&self, stream: TcpStream) -> Option<ClientConnection> {
        match self.places.clone().try_acquire_owned() {
            Ok(place) => {
                metrics().client_connection_opened();
                Some(Guarded::new(stream, Place { _permit: place }, self.idle))
            }
            Err(_) => {
                metrics().client_connection_refused();
                if self.warned.due() {
                    tracing::warn!(
                        max = self.max,
                        peer = ?stream.peer_addr().ok(),
                        "closed a client connection: this node already holds \
                         limits.max_connections of them; look for a client that opens \
                         connections without closing them, or raise the limit (and the \
                         open-file limit with it)"
                    );
                }
                None
            }
        }
    }
}

/// A place taken, given back when the connection is dropped.
pub struct Place {
    _permit: OwnedSemaphorePermit,
}

impl Drop for Place {
    fn drop(&mut self) {
        metrics().client_connection_closed();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn a_place_is_held_while_the_connection_lives() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let places = ClientConnections::new(2);
        let (_c1, s1) = pair(&listener).await;
        let (_c2, s2) = pair(&listener).await;
        let (_c3, s3) = pair(&listener).await;
        let first = places.admit(s1).unwrap();
        let _second = places.admit(s2).unwrap();
        let (_c4, s4) = pair(&listener).await;
        assert!(places.admit(s3).is_none(), "both places are taken");
        drop(first);
        assert!(
            places.admit(s4).is_some(),
            "a closed connection gives its place back"
        );
    }

    /// Serves gRPC health on `listener`, each connection admitted with a 300 ms idle limit, the
    /// server pinging every `keepalive` (never with `None`); counts the connections accepted.
    fn health_server(
        listener: TcpListener,
        keepalive: Option<Duration>,
    ) -> Arc<std::sync::atomic::AtomicUsize> {
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let places = ClientConnections::with_idle_limit(8, Duration::from_millis(300));
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = tx
                    .send(Ok::<_, std::io::Error>(places.admit(stream).unwrap()))
                    .await;
            }
        });
        let (_, health) = tonic_health::server::health_reporter();
        let server = tonic::transport::Server::builder()
            .http2_keepalive_interval(keepalive)
            .http2_keepalive_timeout(keepalive)
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::ReceiverStream::new(rx));
        tokio::spawn(server);
        accepted
    }

    /// A health call on a fresh connection to a [`health_server`] pinging every `keepalive`,
    /// then another on the same channel 1 s later: whether the second was served, and how many
    /// connections the server accepted.
    async fn asked_twice(keepalive: Option<Duration>) -> (bool, usize) {
        use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = health_server(listener, keepalive);
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        client.check(HealthCheckRequest::default()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let second = client.check(HealthCheckRequest::default()).await;
        (
            second.is_ok(),
            accepted.load(std::sync::atomic::Ordering::SeqCst),
        )
    }

    /// The server's pings keep a quiet, live connection moving bytes, so the idle limit never
    /// closes it: the claim the 60 s limit rests on. Without pings the same connection is
    /// closed once idle, and the client has to connect again (or fails).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pings_keep_a_quiet_live_connection_open_past_the_idle_limit() {
        let (served, accepted) = asked_twice(Some(Duration::from_millis(100))).await;
        assert!(served, "the second call failed");
        assert_eq!(
            accepted, 1,
            "the quiet connection was closed and opened again"
        );
        let (served, accepted) = asked_twice(None).await;
        assert!(
            !served || accepted == 2,
            "without pings, the quiet connection outlived the idle limit"
        );
    }

    /// A connection that keeps moving bytes stays open past the idle limit; once it moves none,
    /// it fails with `TimedOut` after the limit, not sooner.
    #[tokio::test]
    async fn a_connection_that_moves_no_byte_fails_once_idle_and_not_before() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let limit = Duration::from_secs(1);
        let places = ClientConnections::with_idle_limit(1, limit);
        let (mut client, accepted) = pair(&listener).await;
        let mut connection = places.admit(accepted).unwrap();
        let mut buf = [0u8; 8];
        // Bytes every 200 ms keep it open for 1.6 s, past the limit; each gap leaves 800 ms for
        // a busy machine to be late by.
        let started = tokio::time::Instant::now();
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            client.write_all(b"x").await.unwrap();
            assert_eq!(connection.read(&mut buf).await.unwrap(), 1);
        }
        assert!(started.elapsed() > limit, "open for less than the limit");
        let started = tokio::time::Instant::now();
        let idle = connection.read(&mut buf).await.unwrap_err();
        assert_eq!(idle.kind(), std::io::ErrorKind::TimedOut);
        // The limit counts from the last byte read, just before `started`: a machine slower
        // than that can only make it later.
        assert!(started.elapsed() >= limit - limit / 10, "failed early");
    }
}
