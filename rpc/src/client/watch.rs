//! Watches: every committed change that matches a filter, in commit order, across node failures.
//!
//! A watch is a server stream from any node (followers included). The library tracks the
//! position `(revision, index)` right after the last event it delivered, and the progress the
//! server reports while nothing matches. When the stream breaks — the node died, went silent,
//! lost its leader, shut down, or cut a slow reader — it reconnects (to another node when the
//! failure was the node's) and asks to start exactly at that position, so the caller sees no gap
//! and no duplicate. A start older than a node retains is refused `COMPACTED`; the library then
//! tries the other nodes, and only when none of them has the history does it end the stream with
//! [`Error::Compacted`]: nothing is ever skipped silently.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use baton_statemachine::{Change, ChangeFilter};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tokio::time::Instant;
use tonic::{Status, Streaming};

use super::{classify, Client, Grpc};
use crate::convert;
use crate::error::{detail_of, infra, other_cluster_status, Error};
use crate::proto;
use crate::proto::watch_client::WatchClient;
use crate::proto::watch_response::Item;

/// A node that sends nothing for this long (servers send progress every second) is presumed
/// stuck; the watch moves to another node.
pub const WATCH_SILENCE: Duration = Duration::from_secs(5);

/// A stream that ends (or breaks) younger than this is reopened after a pause, doubling from
/// [`REOPEN_PAUSE`] up to [`REOPEN_PAUSE_MAX`] while streams keep ending young: a node that ends
/// every stream at once (a broken server, a proxy closing streams) must not be dialled in a
/// tight loop. One that lived longer is reopened at once.
const SETTLED_STREAM: Duration = Duration::from_secs(1);
const REOPEN_PAUSE: Duration = Duration::from_millis(20);
const REOPEN_PAUSE_MAX: Duration = Duration::from_secs(2);

/// The largest watch message accepted: a change carries one value (at most a 1 MiB payload, or
/// a board task with many dependencies) plus headroom.
const MAX_EVENT_BYTES: usize = 16 << 20;

/// The response header in which a node names the cluster whose history a watch stream's
/// positions count in (its cluster id, 32 hex digits; absent from nodes that have none).
pub const CLUSTER_ID_HEADER: &str = "baton-cluster-id";

/// A position in the change history: the Raft log index of an entry, and a change's place among
/// the changes that entry made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WatchPosition {
    /// The log index (revision).
    pub revision: u64,
    /// The change's index within its entry.
    pub index: u32,
}

impl WatchPosition {
    /// The first change of `revision`.
    pub fn at(revision: u64) -> Self {
        WatchPosition { revision, index: 0 }
    }
}

/// One change delivered by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The Raft log index of the entry that made the change.
    pub revision: u64,
    /// The change's place among the changes of that entry (0, 1, ...).
    pub index: u32,
    /// What changed.
    pub change: Change,
}

impl Event {
    /// Where this event is.
    pub fn position(&self) -> WatchPosition {
        WatchPosition {
            revision: self.revision,
            index: self.index,
        }
    }

    /// Where a watch that delivered this event resumes.
    pub fn next_position(&self) -> WatchPosition {
        WatchPosition {
            revision: self.revision,
            index: self.index.saturating_add(1),
        }
    }
}

/// A watch's events, in commit order (a [`Stream`]), and where it would resume.
pub struct Watch {
    events: BoxStream<'static, Result<Event, Error>>,
    resume: Arc<Mutex<Option<WatchPosition>>>,
    /// Its filter, for [`Client::resume_watch`].
    filter: ChangeFilter,
    /// The cluster its positions count in, once a stream named it.
    cluster: Arc<Mutex<Option<String>>>,
}

impl Watch {
    /// Where this watch would continue: right after the last event it delivered, or after the
    /// last progress its node reported (changes that did not match), whichever is later. `None`
    /// only for a watch from now that never reached a node (it has no "now" yet).
    ///
    /// After the stream ended with [`Error::Unavailable`], [`Client::resume_watch`] continues
    /// it with neither a gap nor a duplicate, also when it had delivered no event; so does
    /// `Client::watch_from(filter, watch.resume_position())`, except that it cannot tell a
    /// cluster restored or made anew at the same addresses meanwhile (whose history is another).
    pub fn resume_position(&self) -> Option<WatchPosition> {
        *super::lock(&self.resume)
    }
}

impl Stream for Watch {
    type Item = Result<Event, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_next_unpin(cx)
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("resume_position", &self.resume_position())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Follows every committed change matching `filter`, from `from_revision` on: `Some(r)`
    /// delivers every change of revision `r` and later (after reading a snapshot at revision R,
    /// watch from `Some(R + 1)`); `None` delivers every change applied after this call returns
    /// (it returns once a node has opened the stream).
    ///
    /// The stream survives node failures and slow-consumer cut-offs by resuming after the last
    /// event it delivered. It ends with an error only when it cannot go on: [`Error::Compacted`]
    /// (no node retains the history it needs; resync), [`Error::Refused`] (a bad filter),
    /// [`Error::Server`] with [`crate::error::infra::UNAUTHENTICATED`] (no or a wrong token),
    /// [`Error::Protocol`] (an event over the size limit), or [`Error::Unavailable`] (no node
    /// answered within the client's deadline). After such an
    /// error the stream yields nothing more; [`Client::resume_watch`] goes on from where it
    /// stopped.
    pub async fn watch(&self, filter: ChangeFilter, from_revision: Option<u64>) -> Watch {
        self.watch_from(filter, from_revision.map(|r| WatchPosition::at(r.max(1))))
            .await
    }

    /// [`Client::watch`] from an exact position (e.g. [`Event::next_position`] of the last event
    /// a previous watch delivered).
    pub async fn watch_from(&self, filter: ChangeFilter, from: Option<WatchPosition>) -> Watch {
        self.start_watch(filter, from, None).await
    }

    /// Continues `ended` (a watch whose stream ended, e.g. with [`Error::Unavailable`]) where it
    /// stopped, with its filter, held to the cluster it followed: a node of another cluster —
    /// restored from a backup, or made anew at the same addresses — has another history, and
    /// ends the new watch with [`Error::Compacted`] (`oldest_available` 0: resync) instead of
    /// serving that history from the same revision on.
    ///
    /// What it needs of `ended` is taken at the call, so the future does not borrow it and can
    /// run in a spawned task (a [`Watch`] is `Send` but not `Sync`). Call it once `ended` has
    /// ended: events `ended` delivers after the call would come again from the new watch.
    pub fn resume_watch(&self, ended: &Watch) -> impl Future<Output = Watch> + Send + use<'_> {
        let cluster = super::lock(&ended.cluster).clone();
        let (filter, from) = (ended.filter.clone(), ended.resume_position());
        self.start_watch(filter, from, cluster)
    }

    async fn start_watch(
        &self,
        filter: ChangeFilter,
        from: Option<WatchPosition>,
        cluster: Option<String>,
    ) -> Watch {
        let resume = Arc::new(Mutex::new(from));
        let shared_cluster = Arc::new(Mutex::new(cluster.clone()));
        let mut watcher = Watcher {
            client: self.clone(),
            filter: convert::filter_to_proto(&filter),
            next: from,
            cluster,
            shared_cluster: shared_cluster.clone(),
            resume: resume.clone(),
            stream: None,
            avoid: None,
            compacted: None,
            opened: Instant::now(),
            reopen_pause: Duration::ZERO,
            cursor: 0,
            done: false,
        };
        // Open the first stream now, so that "from now" means from this call.
        if let Err(error) = watcher.connect().await.map(|s| {
            watcher.stream = Some(s);
            watcher.opened = Instant::now();
        }) {
            return Watch {
                events: futures::stream::once(async { Err(error) }).boxed(),
                resume,
                filter,
                cluster: shared_cluster,
            };
        }
        let events = futures::stream::unfold(watcher, |mut watcher| async move {
            watcher.next_event().await.map(|item| (item, watcher))
        })
        .boxed();
        Watch {
            events,
            resume,
            filter,
            cluster: shared_cluster,
        }
    }
}

/// How a failed attempt or a broken stream is handled.
enum Verdict {
    /// The node's history starts later than the position needed.
    Compacted(u64),
    /// A final answer (the request was refused, or would fail the same way anywhere).
    Final(Error),
    /// Reconnect, preferably to another node.
    Elsewhere(String),
    /// Reconnect; the node is fine (it cut a slow reader).
    Again,
}

fn judge(status: &Status) -> Verdict {
    if let Some(detail) = detail_of(status) {
        match detail.code.as_str() {
            infra::COMPACTED => return Verdict::Compacted(detail.oldest_revision),
            infra::SLOW_CONSUMER => return Verdict::Again,
            _ => {}
        }
    }
    // What fails the same way on every node (a refusal, a missing or wrong token, a message
    // over the size limit) ends the watch at once rather than after the whole deadline spent
    // reconnecting. Anything else, codes this client does not know included, is worth another
    // node: a watch is long-lived, and a newer node may say something passing.
    match classify(status) {
        super::Verdict::Fail(error @ (Error::Refused(_) | Error::Protocol(_))) => {
            Verdict::Final(error)
        }
        super::Verdict::Fail(error @ Error::Server { .. })
            if detail_of(status).is_some_and(|d| d.code == infra::UNAUTHENTICATED) =>
        {
            Verdict::Final(error)
        }
        _ => Verdict::Elsewhere(match detail_of(status) {
            Some(detail) => format!("{}: {}", detail.code, status.message()),
            None => format!("{:?}: {}", status.code(), status.message()),
        }),
    }
}

struct Watcher {
    client: Client,
    filter: proto::WatchFilter,
    /// The next position to deliver; `None` until the first stream says where "now" is.
    next: Option<WatchPosition>,
    /// `next`, for [`Watch::resume_position`].
    resume: Arc<Mutex<Option<WatchPosition>>>,
    /// The cluster whose history `next` counts in, once known: a node of another answers as if
    /// the position were compacted.
    cluster: Option<String>,
    /// `cluster`, for [`Client::resume_watch`].
    shared_cluster: Arc<Mutex<Option<String>>>,
    stream: Option<(String, Streaming<proto::WatchResponse>)>,
    /// The node that just failed, tried last on the next connect.
    avoid: Option<String>,
    /// A node that said COMPACTED mid-stream, carried into the next connect.
    compacted: Option<(String, u64)>,
    /// When the current (or last) stream opened.
    opened: Instant,
    /// The pause before the next connect ([`SETTLED_STREAM`]); zero when the last stream lived.
    reopen_pause: Duration,
    cursor: usize,
    done: bool,
}

impl Watcher {
    async fn next_event(&mut self) -> Option<Result<Event, Error>> {
        loop {
            if self.done {
                return None;
            }
            let Some((addr, stream)) = self.stream.as_mut() else {
                if !self.reopen_pause.is_zero() {
                    tokio::time::sleep(self.reopen_pause).await;
                }
                match self.connect().await {
                    Ok(connected) => {
                        self.stream = Some(connected);
                        self.opened = Instant::now();
                    }
                    Err(error) => {
                        self.done = true;
                        return Some(Err(error));
                    }
                }
                continue;
            };
            let addr = addr.clone();
            let message = match tokio::time::timeout(WATCH_SILENCE, stream.message()).await {
                Ok(message) => message,
                Err(_) => {
                    tracing::debug!(%addr, "watch stream went silent; reconnecting");
                    self.reconnect(Some(addr));
                    continue;
                }
            };
            let item = match message {
                Ok(Some(response)) => response.item,
                Ok(None) => {
                    self.reconnect(Some(addr));
                    continue;
                }
                Err(status) => {
                    match judge(&status) {
                        Verdict::Final(error) => {
                            self.done = true;
                            return Some(Err(error));
                        }
                        Verdict::Compacted(oldest) => {
                            self.compacted = Some((addr.clone(), oldest));
                            self.reconnect(Some(addr));
                        }
                        Verdict::Again => self.reconnect(None),
                        Verdict::Elsewhere(reason) => {
                            tracing::debug!(%addr, %reason, "watch stream broke; reconnecting");
                            self.reconnect(Some(addr));
                        }
                    }
                    continue;
                }
            };
            match item {
                // (Saturating: a revision past any log's, from a broken server, must not wrap
                // to 0, which asks for "from now" on the next reconnect.)
                Some(Item::Progress(revision)) => {
                    self.advance(WatchPosition::at(revision.saturating_add(1)))
                }
                Some(Item::Event(event)) => match convert::change_from_proto(event) {
                    Ok((revision, index, change)) => {
                        let event = Event {
                            revision,
                            index,
                            change,
                        };
                        if self.next.is_some_and(|next| event.position() < next) {
                            // Already delivered (a server never sends this; kept as a guard).
                            continue;
                        }
                        self.set_next(event.next_position());
                        return Some(Ok(event));
                    }
                    Err(refusal) => {
                        self.done = true;
                        return Some(Err(Error::Protocol(format!(
                            "watch sent an event this client cannot read: {refusal}"
                        ))));
                    }
                },
                None => {}
            }
        }
    }

    fn advance(&mut self, to: WatchPosition) {
        if self.next.is_none_or(|next| next < to) {
            self.set_next(to);
        }
    }

    fn set_next(&mut self, to: WatchPosition) {
        self.next = Some(to);
        *super::lock(&self.resume) = Some(to);
    }

    fn reconnect(&mut self, avoid: Option<String>) {
        if self.stream.take().is_some() {
            self.reopen_pause = if self.opened.elapsed() < SETTLED_STREAM {
                (self.reopen_pause * 2).clamp(REOPEN_PAUSE, REOPEN_PAUSE_MAX)
            } else {
                Duration::ZERO
            };
        }
        self.avoid = avoid;
    }

    /// The next node to try ([`next_endpoint`]).
    fn pick(&mut self, compacted: &BTreeMap<String, u64>) -> Option<String> {
        next_endpoint(
            self.client.endpoints(),
            &mut self.cursor,
            self.avoid.as_ref(),
            compacted,
        )
    }

    /// Opens a stream at the current position on some node, retrying until the client's
    /// deadline.
    async fn connect(&mut self) -> Result<(String, Streaming<proto::WatchResponse>), Error> {
        let config = self.client.inner.config.clone();
        let started = Instant::now();
        let mut compacted: BTreeMap<String, u64> = self.compacted.take().into_iter().collect();
        let mut pause = Duration::from_millis(20);
        let mut last;
        let mut tried = Vec::new();
        loop {
            let Some(addr) = self.pick(&compacted) else {
                return Err(self.compacted_error(&compacted));
            };
            if !tried.contains(&addr) {
                tried.push(addr.clone());
            }
            // The same for every node (TLS settings): a configuration error, not a retry.
            let channel = self.client.grpc(&addr)?;
            // No attempt outlives the deadline.
            let budget = config
                .attempt_timeout
                .min(config.deadline.saturating_sub(started.elapsed()));
            match tokio::time::timeout(budget, self.open(channel)).await {
                Ok(Ok(stream)) => {
                    self.avoid = None;
                    return Ok((addr, stream));
                }
                Ok(Err(status)) => match judge(&status) {
                    Verdict::Final(error) => return Err(error),
                    Verdict::Compacted(oldest) => {
                        compacted.insert(addr.clone(), oldest);
                        if compacted.len() >= self.client.endpoints().len() {
                            return Err(self.compacted_error(&compacted));
                        }
                        continue;
                    }
                    Verdict::Again => last = format!("{addr}: {}", status.message()),
                    Verdict::Elsewhere(reason) => {
                        self.avoid = Some(addr.clone());
                        last = format!("{addr}: {reason}");
                    }
                },
                Err(_) => {
                    self.avoid = Some(addr.clone());
                    last = format!("{addr}: no answer within {budget:?}");
                }
            }
            let waited = started.elapsed();
            if waited + pause >= config.deadline {
                // Some nodes said COMPACTED and the others did not answer in time: resync. (One
                // of those may hold the position, but a node down for good would make a caller
                // that waits for it retry forever; a resync always moves on.)
                if !compacted.is_empty() {
                    return Err(self.compacted_error(&compacted));
                }
                return Err(Error::Unavailable {
                    endpoints: tried,
                    waited,
                    last,
                });
            }
            tracing::debug!(%last, ?pause, "watch reconnecting");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// One attempt to open a stream on `channel`'s node. A watch from "now" waits for the first progress
    /// message, which fixes the position later reconnects resume from.
    ///
    /// Every stream gets a connection of its own: changes a slow caller has not read yet occupy
    /// its connection's flow-control window, which must not stall the client's other calls.
    async fn open(&mut self, channel: Grpc) -> Result<Streaming<proto::WatchResponse>, Status> {
        let request = proto::WatchRequest {
            filter: Some(self.filter.clone()),
            start_revision: self.next.map_or(0, |p| p.revision),
            start_index: self.next.map_or(0, |p| p.index),
        };
        let response = WatchClient::new(channel)
            .max_decoding_message_size(MAX_EVENT_BYTES)
            .watch(request)
            .await?;
        self.same_cluster(response.metadata())?;
        let mut stream = response.into_inner();
        if self.next.is_none() {
            match stream.message().await? {
                Some(proto::WatchResponse {
                    item: Some(Item::Progress(revision)),
                }) => self.set_next(WatchPosition::at(revision.saturating_add(1))),
                other => {
                    return Err(Status::internal(format!(
                        "a watch from now must start with its progress, got {other:?}"
                    )))
                }
            }
        }
        Ok(stream)
    }

    /// Holds a stream to the cluster the watch's position counts in. A node of another cluster
    /// (the cluster was restored from a backup, or made anew at the same addresses) has another
    /// history, where the position means other changes or none yet: it answers as if compacted,
    /// so the caller resyncs instead of silently missing what lies between.
    fn same_cluster(&mut self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        let Some(theirs) = metadata
            .get(CLUSTER_ID_HEADER)
            .and_then(|value| value.to_str().ok())
        else {
            return Ok(());
        };
        match &self.cluster {
            Some(ours) if ours != theirs => Err(other_cluster_status(
                self.next.map_or(0, |p| p.revision),
                ours,
                theirs,
            )),
            Some(_) => Ok(()),
            None => {
                self.cluster = Some(theirs.to_string());
                *super::lock(&self.shared_cluster) = self.cluster.clone();
                Ok(())
            }
        }
    }

    fn compacted_error(&self, compacted: &BTreeMap<String, u64>) -> Error {
        Error::Compacted {
            requested: self.next.map_or(0, |p| p.revision),
            // A node of another cluster says 0; a real compaction elsewhere is the likelier
            // cause to name when there is one.
            oldest_available: compacted
                .values()
                .copied()
                .filter(|oldest| *oldest > 0)
                .min()
                .unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod judge_tests {
    use super::*;
    use crate::error::{infra_status, refusal_status};
    use baton_statemachine::Refusal;
    use tonic::Code;

    fn kind(status: Status) -> &'static str {
        match judge(&status) {
            Verdict::Compacted(_) => "compacted",
            Verdict::Final(_) => "final",
            Verdict::Elsewhere(_) => "elsewhere",
            Verdict::Again => "again",
        }
    }

    /// What fails alike everywhere ends a watch at once; anything else, codes this client does
    /// not know included, is tried on another node.
    #[test]
    fn a_watch_ends_only_on_what_fails_everywhere() {
        let refusal = Refusal::invalid("filter", "bad");
        assert_eq!(kind(refusal_status(&refusal)), "final");
        let token = infra_status(Code::Unauthenticated, infra::UNAUTHENTICATED, "no token");
        assert_eq!(kind(token), "final");
        assert_eq!(kind(Status::out_of_range("message too large")), "final");
        for code in [
            infra::NOT_LEADER,
            infra::NO_LEADER,
            infra::SHUTTING_DOWN,
            infra::INTERNAL,
            infra::OVERLOADED,
            infra::MEMBERSHIP,
            "SOMETHING_NEW",
        ] {
            assert_eq!(
                kind(infra_status(Code::Unavailable, code, "x")),
                "elsewhere",
                "{code}"
            );
        }
        assert_eq!(kind(Status::unavailable("connection reset")), "elsewhere");
        assert_eq!(
            kind(infra_status(
                Code::ResourceExhausted,
                infra::SLOW_CONSUMER,
                "x"
            )),
            "again"
        );
    }
}

/// The next node to try: the endpoints in turn from `cursor` (the first to begin with), skipping
/// nodes that said COMPACTED and the node that just failed (`avoid`), which is tried only when
/// no other is left. The turn goes round the whole list, so a node between two that keep
/// failing is reached too.
fn next_endpoint(
    endpoints: &[String],
    cursor: &mut usize,
    avoid: Option<&String>,
    compacted: &BTreeMap<String, u64>,
) -> Option<String> {
    let n = endpoints.len();
    for step in 0..n {
        let at = (*cursor + step) % n;
        let endpoint = &endpoints[at];
        if !compacted.contains_key(endpoint) && avoid != Some(endpoint) {
            *cursor = at + 1;
            return Some(endpoint.clone());
        }
    }
    avoid
        .filter(|e| endpoints.contains(e) && !compacted.contains_key(*e))
        .cloned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Two failing nodes around a healthy one: the turn reaches the healthy one (it used to
    /// alternate between the failing two, the list shrinking by the one just avoided).
    #[test]
    fn a_node_between_two_failing_ones_is_tried() {
        let endpoints: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let failing = ["a", "c"];
        let none = BTreeMap::new();
        let (mut cursor, mut avoid) = (0, None);
        let mut tried = Vec::new();
        for _ in 0..3 {
            let e = next_endpoint(&endpoints, &mut cursor, avoid.as_ref(), &none).unwrap();
            tried.push(e.clone());
            if !failing.contains(&e.as_str()) {
                break;
            }
            avoid = Some(e);
        }
        assert_eq!(tried, ["a", "b"]);
        // Compacted nodes are skipped; the one just avoided is taken when it alone is left.
        let compacted = BTreeMap::from([("b".to_string(), 7), ("c".to_string(), 7)]);
        let a = Some("a".to_string());
        assert_eq!(
            next_endpoint(&endpoints, &mut cursor, a.as_ref(), &compacted).as_deref(),
            Some("a")
        );
        let all: BTreeMap<String, u64> = endpoints.iter().map(|e| (e.clone(), 7)).collect();
        assert_eq!(
            next_endpoint(&endpoints, &mut cursor, a.as_ref(), &all),
            None
        );
    }

    /// A node that ends every watch stream cleanly right after its first progress message.
    struct EndsAtOnce {
        opened: Arc<std::sync::atomic::AtomicUsize>,
    }

    #[tonic::async_trait]
    impl proto::watch_server::Watch for EndsAtOnce {
        type WatchStream = BoxStream<'static, Result<proto::WatchResponse, Status>>;

        async fn watch(
            &self,
            _: tonic::Request<proto::WatchRequest>,
        ) -> Result<tonic::Response<Self::WatchStream>, Status> {
            self.opened
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let progress = proto::WatchResponse {
                item: Some(Item::Progress(5)),
            };
            Ok(tonic::Response::new(
                futures::stream::iter([Ok(progress)]).boxed(),
            ))
        }
    }

    /// Streams that end as soon as they open are reopened with a growing pause, not in a tight
    /// loop (before: thousands of connections a second against the one node, for ever).
    #[tokio::test]
    async fn a_node_that_ends_every_stream_is_not_redialled_in_a_tight_loop() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let node = EndsAtOnce {
            opened: opened.clone(),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(proto::watch_server::WatchServer::new(node))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        let client = Client::new(&[addr], crate::client::ClientConfig::default()).unwrap();
        let mut watch = client.watch(ChangeFilter::default(), None).await;
        let watched = Duration::from_secs(2);
        let nothing = tokio::time::timeout(watched, watch.next()).await;
        assert!(nothing.is_err(), "no event, no error: {nothing:?}");
        let opened = opened.load(std::sync::atomic::Ordering::SeqCst);
        // Pauses of 20, 40, 80, ... ms: 7 or 8 streams within 2 s.
        assert!(
            (2..=10).contains(&opened),
            "{opened} streams opened within {watched:?}"
        );
        // Where it resumes did not move back: the node's progress stands.
        assert_eq!(watch.resume_position(), Some(WatchPosition::at(6)));
    }

    /// Opening a stream on a node that never answers stops at the client's deadline: each try
    /// got the whole attempt timeout, so the first alone ran on past a shorter deadline.
    #[tokio::test]
    async fn opening_a_watch_ends_at_the_deadline() {
        let (silent, _) = crate::client::connection_tests::silent_node().await;
        let deadline = Duration::from_secs(1);
        let config = crate::client::ClientConfig {
            deadline,
            attempt_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_millis(200),
        };
        let client = Client::new(&[silent], config).unwrap();
        let started = Instant::now();
        let mut watch = client.watch(ChangeFilter::default(), None).await;
        let first = watch.next().await;
        let took = started.elapsed();
        assert!(
            matches!(first, Some(Err(Error::Unavailable { .. }))),
            "{first:?}"
        );
        // Seconds from both the deadline and where the first try alone used to end (its 10 s
        // attempt timeout).
        assert!(
            took < deadline * 5,
            "took {took:?} for a {deadline:?} deadline"
        );
        println!("opening the watch ended after {took:?} for a {deadline:?} deadline");
        // Resuming it runs in a spawned task: the future does not borrow the watch, which is
        // not `Sync` (before, this did not compile).
        let resumed = tokio::spawn(async move {
            let mut resumed = client.resume_watch(&watch).await;
            resumed.next().await
        })
        .await
        .unwrap();
        assert!(
            matches!(resumed, Some(Err(Error::Unavailable { .. }))),
            "{resumed:?}"
        );
    }
}
