//! The operator endpoint's listener: a bounded number of connections, each closed once it
//! moves no byte for a while.
//!
//! The HTTP server underneath keeps a connection for as long as its peer likes: one that sends
//! half a request line, or nothing, is held for good, and nothing caps how many are accepted. A
//! peer that can reach the port could then use up the process's file descriptors, which the
//! gRPC and Raft ports and the store need too. Here a connection waits for a place among
//! [`MAX_CONNECTIONS`] before it is accepted (the rest wait in the kernel's backlog, costing the
//! node no descriptor), and one that neither delivers nor takes a byte for [`IDLE_LIMIT`] while
//! the server waits on it is closed. A peer trickling bytes can still hold its place; it holds
//! no more than the cap, and a scraper or probe needs one or two.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::guarded::Guarded;

/// How many connections the endpoint serves at once.
pub const MAX_CONNECTIONS: usize = 128;

/// How long a connection may move no byte while the server waits on it: longer than the usual
/// scrape intervals (15 s to 60 s), so a scraper's kept-alive connection is not closed just as
/// its next scrape goes out.
pub const IDLE_LIMIT: Duration = Duration::from_secs(90);

/// A [`TcpListener`] that accepts at most `max` connections at a time, each closed after `idle`
/// without progress.
pub struct GuardedListener {
    listener: TcpListener,
    places: Arc<Semaphore>,
    idle: Duration,
}

impl GuardedListener {
    /// Guards `listener` with the production limits.
    pub fn new(listener: TcpListener) -> Self {
        Self::with_limits(listener, MAX_CONNECTIONS, IDLE_LIMIT)
    }

    /// Guards `listener` with the given limits.
    pub fn with_limits(listener: TcpListener, max: usize, idle: Duration) -> Self {
        Self {
            listener,
            places: Arc::new(Semaphore::new(max)),
            idle,
        }
    }
}

impl Listener for GuardedListener {
    type Io = Guarded<OwnedSemaphorePermit>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Guarded<OwnedSemaphorePermit>, SocketAddr) {
        // Never closed: the listener owns the semaphore.
        let place = match self.places.clone().acquire_owned().await {
            Ok(place) => place,
            Err(_) => unreachable!("the endpoint's connection places are never closed"),
        };
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    return (Guarded::new(stream, place, self.idle), addr);
                }
                Err(error) => accept_failed(error).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// A failed accept: one peer's connection gone before it was taken is nothing; anything else
/// (out of descriptors, say) is logged and waited out briefly rather than retried hot.
async fn accept_failed(error: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::warn!(%error, "the HTTP endpoint cannot accept a connection; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::time::Instant;

    /// An endpoint answering `/` with "ok", on a guarded listener with the given limits.
    async fn endpoint(max: usize, idle: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let guarded = GuardedListener::with_limits(listener, max, idle);
        tokio::spawn(async move { axum::serve(guarded, app).await });
        addr
    }

    /// Sends one keep-alive request on `stream` and reads its answer's first bytes.
    async fn ask(stream: &mut TcpStream) -> String {
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = vec![0; 512];
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer))
            .await
            .expect("an answer")
            .unwrap();
        String::from_utf8_lossy(&answer[..n]).into_owned()
    }

    /// Reads until the peer closes; how long that took (panics after `limit`).
    async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Duration {
        let started = Instant::now();
        let mut sink = vec![0; 512];
        loop {
            match tokio::time::timeout_at(started + limit, stream.read(&mut sink)).await {
                Err(_) => panic!("the connection was still open after {limit:?}"),
                Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
                Ok(Ok(_)) => {}
            }
        }
    }

    #[tokio::test]
    async fn a_connection_that_sends_half_a_request_is_closed_once_idle() {
        let addr = endpoint(8, Duration::from_millis(300)).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        closed_within(&mut stream, Duration::from_secs(5)).await;
    }

    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_closed_once_idle() {
        let addr = endpoint(8, Duration::from_millis(300)).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        closed_within(&mut stream, Duration::from_secs(5)).await;
    }

    /// A connection whose requests keep coming is never idle for the limit, and stays open
    /// past it: every request is answered on the same connection.
    #[tokio::test]
    async fn a_connection_in_use_stays_open() {
        let limit = Duration::from_millis(1500);
        let addr = endpoint(8, limit).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        // Requests 200 ms apart for 2 s, past the limit; each gap leaves 1.3 s for a busy
        // machine to be late by.
        let started = Instant::now();
        for _ in 0..10 {
            assert!(ask(&mut stream).await.contains("200 OK"));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(ask(&mut stream).await.contains("200 OK"));
        assert!(started.elapsed() > limit, "open for less than the limit");
    }

    #[tokio::test]
    async fn connections_past_the_cap_wait_for_a_place() {
        let addr = endpoint(2, Duration::from_secs(30)).await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut first).await.contains("200 OK"));
        assert!(ask(&mut second).await.contains("200 OK"));
        // The kernel completes the third connection, but nobody takes it while two are held.
        let mut third = TcpStream::connect(addr).await.unwrap();
        third
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = vec![0; 512];
        let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut answer)).await;
        assert!(early.is_err(), "a third connection was served past the cap");
        drop(first);
        let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut answer))
            .await
            .expect("served once a place is free")
            .unwrap();
        assert!(String::from_utf8_lossy(&answer[..n]).contains("200 OK"));
    }
}
