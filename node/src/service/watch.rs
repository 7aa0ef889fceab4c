//! The watch service: every committed change matching a filter, pushed in commit order.
//!
//! Any node serves watches from its own [`History`] — followers included, and without going
//! through the log. Each stream has a pump task that reads the history from the stream's
//! position, filters, and hands matching changes to a bounded buffer the connection drains. The
//! pump never skips: it moves its position past a change only after handing it over (or finding
//! that it does not match). It ends the stream with a typed error when it cannot go on:
//!
//! - `COMPACTED` when its position is older than the history holds (at the start, or after a
//!   snapshot install restarted the history, or the history's byte limit evicted what the
//!   stream still owed);
//! - `SLOW_CONSUMER` when the buffer is full and the changes left unread behind the stream exceed
//!   the backlog limit (the node keeps no more per stream than the buffer: the history is shared
//!   and bounded);
//! - `NO_LEADER` when the node has not heard from a leader for a while (it may be partitioned
//!   away and stale; also refused at the start), and `SHUTTING_DOWN` when the node stops.
//!
//! The client library resumes after the last change it received, on another node if needed.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use baton_rpc::error::{compacted_status, infra, infra_status, slow_consumer_status};
use baton_rpc::proto::watch_response::Item;
use baton_rpc::proto::watch_server;
use baton_rpc::proto::{WatchRequest, WatchResponse};
use baton_rpc::{convert, WatchPosition, CLUSTER_ID_HEADER};
use baton_statemachine::{ChangeFilter, Refusal};
use futures::{Future, Stream};
use prost::Message;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tonic::{Code, Request, Response, Status};

use super::refused;
use crate::cluster_id::OwnCluster;
use crate::config::WatchTuning;
use crate::history::{Backlog, History, StreamGuard};
use crate::node::NodeRef;
use crate::pre_vote::Contact;

/// Changes a pump reads from the history at a time.
const READ_BATCH: usize = 256;

/// The most bytes of changes a stream holds ahead of its consumer, besides what HTTP/2 flow
/// control lets into the connection: `stream_buffer` bounds the count, this the size (256
/// changes of 1 MiB values would otherwise be 256 MiB per stream). A larger change goes alone.
const STREAM_BUFFER_BYTES: usize = 4 << 20;

/// A change handed to the connection, with the share of the stream's byte budget it holds until
/// the connection takes it.
type Buffered = (WatchResponse, Option<OwnedSemaphorePermit>);

/// Serves watches.
pub struct WatchService {
    node: NodeRef,
    contact: Contact,
    cluster: OwnCluster,
    tuning: WatchTuning,
    closing: watch::Receiver<bool>,
}

impl WatchService {
    /// Serves `node`'s history while `contact` says it hears from a leader, each stream naming
    /// `cluster` (whose log the revisions count in); streams end when `closing` turns true (the
    /// node shuts down).
    pub fn new(
        node: NodeRef,
        contact: Contact,
        cluster: OwnCluster,
        tuning: WatchTuning,
        closing: watch::Receiver<bool>,
    ) -> Self {
        Self {
            node,
            contact,
            cluster,
            tuning,
            closing,
        }
    }
}

#[tonic::async_trait]
impl watch_server::Watch for WatchService {
    type WatchStream = WatchOutput;

    #[tracing::instrument(skip_all, fields(query = "watch"))]
    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let request = request.into_inner();
        let filter = convert::filter_from_proto(request.filter).map_err(refused)?;
        // A stream opened now would only be ended at once, and its client would take the
        // opening for success (and keep coming back) instead of moving to another node.
        if *self.closing.borrow() {
            return Err(shutting_down());
        }
        let freshness = Freshness {
            node: self.node.clone(),
            contact: self.contact.clone(),
            cutoff: self.tuning.leaderless_cutoff,
        };
        if freshness.out_of_touch() {
            return Err(out_of_touch());
        }
        let history = self.node.state_machine.history().clone();
        if request.start_revision == 0 && request.start_index != 0 {
            return Err(refused(Refusal::invalid(
                "start_index",
                "skips changes of the start revision; it needs a start_revision",
            )));
        }
        let start = if request.start_revision == 0 {
            WatchPosition::at(history.head() + 1)
        } else {
            WatchPosition {
                revision: request.start_revision,
                index: request.start_index,
            }
        };
        history
            .check_start(start)
            .map_err(|oldest| compacted_status(start.revision, oldest))?;
        let max_streams = self.tuning.max_streams;
        let open = history
            .open_stream(max_streams)
            .ok_or_else(|| too_many_streams(max_streams))?;
        let (events, buffered) = mpsc::channel(self.tuning.stream_buffer.max(1));
        let budget = Arc::new(Semaphore::new(STREAM_BUFFER_BYTES));
        // A stream resumed after a SLOW_CONSUMER cut starts as far behind as it was cut: it is
        // cut again only if it falls further behind than that, not for catching up.
        let at_open = history.backlog(start).unwrap_or_default();
        let limits = backlog_limits(&self.tuning, &history);
        let tolerated = Backlog {
            changes: at_open.changes.max(limits.changes),
            bytes: at_open.bytes.max(limits.bytes),
        };
        let (end_tx, end) = oneshot::channel();
        let pump = Pump {
            _open: open,
            freshness,
            history,
            filter,
            next: start,
            last_sent: None,
            resume: start,
            tolerated,
            events,
            budget,
            tuning: self.tuning.clone(),
            closing: self.closing.clone(),
        };
        tracing::debug!(start = ?start, "watch started");
        tokio::spawn(async move {
            if let Some(status) = pump.run().await {
                tracing::debug!(code = ?status.code(), message = status.message(), "watch ended");
                let _ = end_tx.send(status);
            }
        });
        let mut response = Response::new(WatchOutput {
            buffered,
            end: Some(end),
        });
        // The cluster whose log the positions count in: a client resuming a position on nodes
        // of another cluster (a restore, or a cluster made anew at the same addresses) would
        // otherwise start in a different history without a word.
        if let Some(id) = self.cluster.settled() {
            if let Ok(value) = id.to_string().parse() {
                response.metadata_mut().insert(CLUSTER_ID_HEADER, value);
            }
        }
        Ok(response)
    }
}

/// A stream's output: the buffered changes, then the error that ended the stream, if any.
pub struct WatchOutput {
    buffered: mpsc::Receiver<Buffered>,
    end: Option<oneshot::Receiver<Status>>,
}

impl Stream for WatchOutput {
    type Item = Result<WatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.buffered.poll_recv(cx) {
            // The connection has it now: its bytes leave the stream's budget.
            Poll::Ready(Some((response, _bytes))) => Poll::Ready(Some(Ok(response))),
            Poll::Pending => Poll::Pending,
            // The pump is gone: it sent its verdict (if any) before dropping the buffer's sender.
            Poll::Ready(None) => {
                let Some(end) = self.end.as_mut() else {
                    return Poll::Ready(None);
                };
                match Pin::new(end).poll(cx) {
                    Poll::Ready(verdict) => {
                        self.end = None;
                        // None when the pump stopped without one: the client went away (no one
                        // reads this), or it panicked. Never a clean end, which a client takes
                        // for a node that has nothing wrong and reopens on.
                        Poll::Ready(Some(Err(verdict.unwrap_or_else(|_| pump_stopped()))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// Moves changes from the history into one stream's buffer.
struct Pump {
    freshness: Freshness,
    history: History,
    filter: ChangeFilter,
    /// The next position to look at.
    next: WatchPosition,
    /// The last change handed to the buffer.
    last_sent: Option<WatchPosition>,
    /// Where the client resumes if the stream ends now: right after the last change or progress
    /// handed to the buffer (the stream's start before either). A slow consumer's backlog is
    /// counted from here, not from the change the stream waits to hand over: the changes it
    /// skipped on the way there (not matching its filter) are owed too, since the client will
    /// read past them again.
    resume: WatchPosition,
    /// The backlog past which the stream is cut `SLOW_CONSUMER`: [`backlog_limits`], or what it
    /// owed when it opened if that was more, coming down to the limits as it catches up.
    tolerated: Backlog,
    events: mpsc::Sender<Buffered>,
    /// Counts the stream among the node's open ones while it runs.
    _open: StreamGuard,
    /// [`STREAM_BUFFER_BYTES`] of permits.
    budget: Arc<Semaphore>,
    tuning: WatchTuning,
    closing: watch::Receiver<bool>,
}

/// The backlog past which a stream is cut `SLOW_CONSUMER`: `watch.max_backlog` changes, or half
/// the history's bytes.
fn backlog_limits(tuning: &WatchTuning, history: &History) -> Backlog {
    Backlog {
        changes: tuning.max_backlog,
        bytes: history.limits().bytes / 2,
    }
}

impl Pump {
    /// [`backlog_limits`] for this stream.
    fn limits(&self) -> Backlog {
        backlog_limits(&self.tuning, &self.history)
    }

    /// Runs until the client goes away (`None`) or the stream must end with an error.
    async fn run(mut self) -> Option<Status> {
        let mut head = self.history.subscribe();
        // The first message says where the stream starts (what "now" was, for a watch from now).
        if self
            .events
            .send((progress(self.next.revision.saturating_sub(1)), None))
            .await
            .is_err()
        {
            return None;
        }
        let mut last_progress = Instant::now();
        loop {
            // Mark the head seen before reading, so a change recorded after the read wakes us.
            head.borrow_and_update();
            let batch = match self.history.read(self.next, READ_BATCH) {
                Ok(batch) => batch,
                Err(oldest) => return Some(compacted_status(self.next.revision, oldest)),
            };
            // By value: each change is let go once handed over, so a stream blocked on a slow
            // reader does not keep entries alive that the history has evicted (unaccounted).
            for recorded in batch.events {
                let position = recorded.position;
                let after = WatchPosition {
                    revision: position.revision,
                    index: position.index.saturating_add(1),
                };
                if self.filter.matches(recorded.change()) {
                    let event = convert::change_to_proto(
                        position.revision,
                        position.index,
                        recorded.change(),
                    );
                    let response = WatchResponse {
                        item: Some(Item::Event(event)),
                    };
                    if let Err(end) = self.hand_over(response, &mut head).await {
                        return end;
                    }
                    self.last_sent = Some(position);
                    self.resume = after;
                }
                self.next = after;
            }
            if !batch.caught_up {
                if last_progress.elapsed() >= self.tuning.progress_every {
                    // Busy skipping changes that do not match: still tell the client how far
                    // the stream got, so a reconnect need not go back further.
                    self.report_progress(self.next.revision.saturating_sub(1));
                    last_progress = Instant::now();
                }
                tokio::task::yield_now().await;
                continue;
            }
            if self.history.head() != batch.head {
                // Recorded while the batch was handed over (`hand_over` saw that wake-up).
                continue;
            }
            let wait = self
                .tuning
                .progress_every
                .saturating_sub(last_progress.elapsed());
            tokio::select! {
                _ = head.changed() => continue,
                _ = tokio::time::sleep(wait) => {}
                _ = self.events.closed() => return None,
                _ = self.closing.changed() => return Some(shutting_down()),
            }
            // Idle for a while: report progress (also the stream's keep-alive), and make sure
            // this node is still current.
            self.report_progress(batch.head.max(self.next.revision.saturating_sub(1)));
            last_progress = Instant::now();
            if self.freshness.out_of_touch() {
                return Some(out_of_touch());
            }
        }
    }

    /// Tells the client the stream has passed every change up to `revision`, if the buffer has
    /// room (a full buffer has something to say already).
    fn report_progress(&mut self, revision: u64) {
        if self.events.try_send((progress(revision), None)).is_ok() {
            self.resume = self.resume.max(WatchPosition::at(revision + 1));
        }
    }

    /// Waits for room in the buffer (a place, and the change's bytes) and hands `response` over.
    /// Ends the stream when the client is gone (`Err(None)`), falls too far behind, or the node
    /// closes (`Err(Some(status))`).
    async fn hand_over(
        &mut self,
        response: WatchResponse,
        head: &mut watch::Receiver<u64>,
    ) -> Result<(), Option<Status>> {
        let cost = response.encoded_len().clamp(1, STREAM_BUFFER_BYTES);
        let cost = u32::try_from(cost).unwrap_or(u32::MAX);
        loop {
            let room = async {
                let bytes = self.budget.clone().acquire_many_owned(cost).await;
                let place = self.events.reserve().await;
                (bytes, place)
            };
            tokio::select! {
                (bytes, place) = room => {
                    let place = place.map_err(|_| None)?;
                    place.send((response, bytes.ok()));
                    return Ok(());
                }
                changed = head.changed() => {
                    if changed.is_err() {
                        return Err(Some(shutting_down()));
                    }
                    // `None`: a snapshot install restarted the history past what the stream
                    // still owes, or the byte limit evicted it; the client resumes after the
                    // last change it received (elsewhere, or it resyncs).
                    // From the resume point while it is held; once it is not, the client cannot
                    // resume there anyway, and the stream goes on from where it is (the changes
                    // in between did not match) unless that is gone too.
                    let backlog = self
                        .history
                        .backlog(self.resume)
                        .or_else(|| self.history.backlog(self.next));
                    let Some(backlog) = backlog else {
                        return Err(Some(compacted_status(
                            self.resume.revision,
                            self.history.oldest(),
                        )));
                    };
                    // What a stream that opened far behind caught up it may not lose again: its
                    // tolerance comes down with its backlog, to the limits.
                    let limits = self.limits();
                    self.tolerated.changes = self
                        .tolerated
                        .changes
                        .min(backlog.changes.max(limits.changes));
                    self.tolerated.bytes =
                        self.tolerated.bytes.min(backlog.bytes.max(limits.bytes));
                    // Cut while the resume point is still held: by count (max_backlog is below
                    // the history's count), and by size (large values can fill the history's
                    // bytes long before its count).
                    if backlog.changes > self.tolerated.changes
                        || backlog.bytes > self.tolerated.bytes
                    {
                        let (revision, index) = self
                            .last_sent
                            .map_or((0, 0), |p| (p.revision, p.index));
                        return Err(Some(slow_consumer_status(revision, index, backlog.changes)));
                    }
                }
                _ = self.closing.changed() => return Err(Some(shutting_down())),
            }
        }
    }
}

/// Whether this node's history is current: it hears from a leader, or leads with a quorum's
/// acknowledgement. A follower cut off from the others keeps its last leader in Raft's view (it
/// never starts an election it cannot win, see [`crate::pre_vote`]), so the leader's name alone
/// says nothing; the time since the node last heard from it does.
struct Freshness {
    node: NodeRef,
    contact: Contact,
    /// Out of touch for this long, the node is presumed stale.
    cutoff: Duration,
}

impl Freshness {
    fn out_of_touch(&self) -> bool {
        let (leader, quorum_silence) = {
            let metrics = self.node.raft.metrics();
            let metrics = metrics.borrow();
            (metrics.current_leader, metrics.millis_since_quorum_ack)
        };
        match leader {
            // One cut off from the others goes without acknowledgements from then on. A leader
            // just elected has none yet: it counts from its election, so one cut off before
            // the first acknowledgement ages too (openraft reports none until then).
            Some(leader) if leader == self.node.id => {
                let silence = quorum_silence.map_or_else(
                    || {
                        self.contact
                            .leading_since()
                            .map_or(Duration::ZERO, |since| since.elapsed())
                    },
                    Duration::from_millis,
                );
                silence >= self.cutoff
            }
            _ => self.contact.leader_at().elapsed() >= self.cutoff,
        }
    }
}

fn pump_stopped() -> Status {
    infra_status(
        Code::Internal,
        infra::INTERNAL,
        "the watch stream stopped unexpectedly on this node; watch from another node",
    )
}

fn out_of_touch() -> Status {
    infra_status(
        Code::Unavailable,
        infra::NO_LEADER,
        "this node has not heard from a leader for a while and may be stale; watch from another \
         node",
    )
}

fn too_many_streams(max: usize) -> Status {
    infra_status(
        Code::ResourceExhausted,
        infra::OVERLOADED,
        format!(
            "this node serves {max} watch streams already (watch.max_streams); watch from \
             another node"
        ),
    )
}

fn progress(revision: u64) -> WatchResponse {
    WatchResponse {
        item: Some(Item::Progress(revision)),
    }
}

fn shutting_down() -> Status {
    infra_status(
        Code::Unavailable,
        infra::SHUTTING_DOWN,
        "this node is shutting down; watch from another node",
    )
}
