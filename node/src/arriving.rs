//! A client call's request body, which must keep arriving.
//!
//! A client call takes its in-flight place ([`crate::limits`]) as its headers arrive, and the
//! gRPC server reads its body inside the handler: a call whose body stalls would hold that place
//! for as long as its connection lives (the connection answers the node's pings), and a few
//! stalled calls could hold every place of the node. So a client call's body that delivers
//! nothing for [`BODY_IDLE_LIMIT`] before it ends fails the call, which gives the place back. A
//! slow link that keeps delivering is never cut.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tonic::Status;

/// An error of any kind, as tonic's server takes a body's errors.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a client call's body may deliver nothing before it ends. The clock starts with the
/// headers, and HTTP/2 shares a connection's window among its streams: a client sending many
/// large requests at once over a slow link has the later ones wait their turn for a while,
/// delivering nothing. The Rust client gives up on an attempt after 3 s anyway.
pub const BODY_IDLE_LIMIT: Duration = Duration::from_secs(30);

/// A body that fails once it delivers nothing for its idle limit before its end.
pub struct Arriving<B> {
    body: B,
    /// None for a body that may take its time, or one that has ended or failed.
    limit: Option<Limit>,
}

/// How long a body may deliver nothing, and since when it has not.
struct Limit {
    idle: Duration,
    since: Instant,
    /// The timer, made the first time the body has nothing to deliver: most bodies have all of
    /// theirs at once, and a client call should not pay for a timer it never waits on.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<B> Arriving<B> {
    /// `body`, failed once it delivers nothing for `idle` before its end.
    pub fn within(body: B, idle: Duration) -> Self {
        Self {
            body,
            limit: Some(Limit {
                idle,
                since: Instant::now(),
                deadline: None,
            }),
        }
    }

    /// `body` as it is.
    pub fn unbounded(body: B) -> Self {
        Self { body, limit: None }
    }
}

impl<B> Body for Arriving<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(limit) = &mut this.limit {
                    limit.since = Instant::now();
                    if let Some(deadline) = &mut limit.deadline {
                        deadline.as_mut().reset(limit.since + limit.idle);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => {
                this.limit = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                let Some(limit) = &mut this.limit else {
                    return Poll::Pending;
                };
                let until = limit.since + limit.idle;
                let deadline = limit
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                if deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let idle = limit.idle;
                this.limit = None;
                // Nothing was done (the message never arrived), so the call may be sent again:
                // UNAVAILABLE says so to any gRPC client. (tonic would take a CANCELLED from a
                // body for the body's end.)
                Poll::Ready(Some(Err(Box::new(Status::unavailable(format!(
                    "the request's body stopped arriving: nothing for {idle:?} before its end"
                ))))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use bytes::Bytes;
    use std::convert::Infallible;

    /// A body that delivers `chunks` frames `every` apart, then ends.
    struct Trickle {
        chunks: usize,
        every: Duration,
        next: Pin<Box<Sleep>>,
    }

    impl Body for Trickle {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            if self.chunks == 0 {
                return Poll::Ready(None);
            }
            if self.next.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.chunks -= 1;
            let every = self.every;
            self.next.as_mut().reset(Instant::now() + every);
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
        }
    }

    fn trickle(chunks: usize, every: Duration) -> Trickle {
        Trickle {
            chunks,
            every,
            next: Box::pin(tokio::time::sleep(every)),
        }
    }

    async fn read_all(mut body: Arriving<Trickle>) -> Result<usize, String> {
        let mut frames = 0;
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            frame.map_err(|e| e.to_string())?;
            frames += 1;
        }
        Ok(frames)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_arriving_is_never_cut() {
        let idle = Duration::from_secs(10);
        // 30 s in all, never 10 s without a frame.
        let body = Arriving::within(trickle(5, Duration::from_secs(6)), idle);
        assert_eq!(read_all(body).await, Ok(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_fails_after_the_idle_limit() {
        let idle = Duration::from_secs(10);
        let started = Instant::now();
        let body = Arriving::within(trickle(5, Duration::from_secs(11)), idle);
        let failed = read_all(body).await.unwrap_err();
        assert!(failed.contains("stopped arriving"), "{failed}");
        assert_eq!(started.elapsed(), idle);
        let unbounded = Arriving::unbounded(trickle(2, Duration::from_secs(60)));
        assert_eq!(read_all(unbounded).await, Ok(2));
    }
}
