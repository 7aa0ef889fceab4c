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
//! either way for [`IDLE_LIMIT`] is closed ([`Guarded`]): the node pings every connection every
//! [`KEEPALIVE`], idle or not, and a live client answers, so only a dead host, or one that
//! finished its TLS handshake and never sent HTTP/2's preface (before which no ping is sent),
//! goes that long without a byte.

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
                Some(Guarded::new(stream, Place(place), self.idle))
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
pub struct Place(#[allow(dead_code)] OwnedSemaphorePermit);

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

    #[tokio::test]
    async fn a_connection_that_moves_no_byte_fails_once_idle_and_not_before() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let places = ClientConnections::with_idle_limit(1, Duration::from_millis(300));
        let (mut client, accepted) = pair(&listener).await;
        let mut connection = places.admit(accepted).unwrap();
        let mut buf = [0u8; 8];
        // Bytes every 200 ms keep it open past the limit.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            client.write_all(b"x").await.unwrap();
            assert_eq!(connection.read(&mut buf).await.unwrap(), 1);
        }
        let started = tokio::time::Instant::now();
        let idle = connection.read(&mut buf).await.unwrap_err();
        assert_eq!(idle.kind(), std::io::ErrorKind::TimedOut);
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "failed early"
        );
    }
}
