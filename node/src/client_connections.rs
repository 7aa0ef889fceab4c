//! The client connections a node serves at once.
//!
//! Every connection costs a file descriptor, and so do what the node cannot do without: the
//! store's files, its peers' Raft links, snapshot files, the operator endpoint. The gRPC server
//! caps nothing, so a client fleet that leaks channels, or anyone who opens connections and
//! answers the keepalive pings, could use up the process's descriptors, and a node that cannot
//! open a peer link or a snapshot file stops taking part in the cluster. So a node holds at most
//! `limits.max_connections` client connections. One more is closed as soon as its first byte says
//! it is not a peer's, before its TLS handshake or HTTP/2 preface, and its client moves on to
//! another node (the client library's usual answer to a connection it cannot use). Peers' Raft
//! connections are never counted: a node at its cap still replicates, votes and hands over.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::metrics::metrics;
use crate::throttle::Throttle;

/// The places for client connections; clones share them.
#[derive(Clone)]
pub struct ClientConnections {
    places: Arc<Semaphore>,
    max: usize,
    warned: Throttle,
}

impl ClientConnections {
    /// Room for `max` connections at once.
    pub fn new(max: usize) -> Self {
        Self {
            places: Arc::new(Semaphore::new(max)),
            max,
            warned: Throttle::default(),
        }
    }

    /// `stream` holding a place until it is dropped, or `None` when every place is taken (the
    /// caller then drops `stream`, which closes it).
    pub fn admit(&self, stream: TcpStream) -> Option<ClientConnection> {
        match self.places.clone().try_acquire_owned() {
            Ok(place) => {
                metrics().client_connection_opened();
                Some(ClientConnection {
                    stream,
                    _place: Place(place),
                })
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
                         file-descriptor limit with it)"
                    );
                }
                None
            }
        }
    }
}

/// A place taken, given back when the connection is dropped.
struct Place(#[allow(dead_code)] OwnedSemaphorePermit);

impl Drop for Place {
    fn drop(&mut self) {
        metrics().client_connection_closed();
    }
}

/// A client's connection, holding its place for as long as the gRPC server keeps it.
pub struct ClientConnection {
    stream: TcpStream,
    _place: Place,
}

impl ClientConnection {
    /// The socket, to peek at and tune before the gRPC server takes the connection.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }
}

impl Connected for ClientConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for ClientConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClientConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
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
}
