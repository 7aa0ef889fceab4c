//! A connection that holds a place among a bounded number, and is closed once it moves no byte
//! for a while.
//!
//! A server keeps a connection for as long as its peer likes, and a peer that neither sends nor
//! reads holds it, and its file descriptor, for good: both the operator endpoint
//! ([`crate::http_listener`]) and the client port ([`crate::client_connections`]) bound how
//! many they hold and close the ones that stall. A read or write still pending when no byte has
//! moved either way for the idle limit fails with `TimedOut`, and the server closes the
//! connection; a peer trickling bytes keeps it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// An accepted connection: holds its `place` until dropped, and fails a read or write that
/// makes no progress for the idle limit.
pub struct Guarded<P> {
    stream: TcpStream,
    _place: P,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<P> Guarded<P> {
    /// `stream` holding `place`, closed once idle for `idle`.
    pub fn new(stream: TcpStream, place: P, idle: Duration) -> Self {
        Self {
            stream,
            _place: place,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }

    /// The socket, to peek at and tune before the server takes the connection.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    fn progressed(&mut self) {
        let next = Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    /// A write's outcome: bytes taken are progress; `Pending` is judged by [`Self::unless_idle`].
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Ready(result) => {
                if matches!(result, Ok(written) if written > 0) {
                    self.progressed();
                }
                Poll::Ready(result)
            }
            Poll::Pending => self.unless_idle(cx),
        }
    }

    /// `Pending` turned into an error once the connection has been idle too long.
    fn unless_idle<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no byte moved for {:?}", self.idle),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<P: Unpin> AsyncRead for Guarded<P> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.progressed();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.unless_idle(cx),
        }
    }
}

impl<P: Unpin> AsyncWrite for Guarded<P> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.wrote(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_flush(cx) {
            Poll::Pending => this.unless_idle(cx),
            ready => ready,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.wrote(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl<P> Connected for Guarded<P> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}
