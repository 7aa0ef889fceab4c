//! Watches against an in-process single-node cluster over real gRPC: every change in commit
//! order with its value, a typed `COMPACTED` for a start the node no longer retains (and the
//! resync it describes), and a slow consumer cut off with `SLOW_CONSUMER` while the node's memory
//! stays bounded, then resumed by the client library without a gap or a duplicate.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_node::config::WatchTuning;
use baton_node::history::HistoryLimits;
use baton_rpc::error::{detail_of, infra, refusal_of};
use baton_rpc::proto::watch_client::WatchClient;
use baton_rpc::proto::watch_response::Item;
use baton_rpc::proto::{self, WatchRequest};
use baton_rpc::{Error, Event, Watch, WatchPosition};
use baton_statemachine::board::TaskSpec;
use baton_statemachine::handoff::{OfferArgs, Receipt, ReceiptStatus, TicketState};
use baton_statemachine::{ChangeFilter, ChangeKind, ChangeValue, Primitive, Refusal};
use futures::StreamExt;
use tonic::Code;

mod support;
use support::Cluster;

/// The next event of a watch, within a generous bound.
async fn next(events: &mut Watch) -> Event {
    tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event within 10 s")
        .expect("the watch goes on")
        .expect("an event, not an error")
}

fn offer_args(key: &str, to: &str) -> OfferArgs {
    OfferArgs {
        key: key.into(),
        from: "A".into(),
        to: to.into(),
        payload: b"job".to_vec(),
        reply_to: "A".into(),
        ttl_ms: 60_000,
    }
}

async fn node_info(cluster: &Cluster) -> proto::NodeInfoResponse {
    cluster.client.node_info(&cluster.addr).await.unwrap()
}

/// Makes one change and returns the revision a watch from now starts at after it.
async fn next_revision(cluster: &Cluster) -> u64 {
    cluster
        .client
        .write_fenced("warm-up", 1, b"w")
        .await
        .unwrap();
    node_info(cluster).await.applied_index + 1
}

/// Writes `n` sink values of `bytes` bytes each to `resource`, with fences 1 to `n`.
async fn write_values(client: &baton_rpc::Client, resource: &str, n: u64, bytes: usize) {
    let value = vec![b'x'; bytes];
    for fence in 1..=n {
        client.write_fenced(resource, fence, &value).await.unwrap();
    }
}

/// Reads a stream whose reader had stopped until the node ends it (within 20 s): the changes
/// it delivered, as (revision, index), and the status it ended with.
async fn read_until_cut(
    stream: &mut tonic::Streaming<proto::WatchResponse>,
) -> (Vec<(u64, u32)>, tonic::Status) {
    let mut delivered = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(until, stream.message()).await {
            Ok(Ok(Some(response))) => {
                if let Some(Item::Event(event)) = response.item {
                    delivered.push((event.revision, event.index));
                }
            }
            Ok(Ok(None)) => panic!("the stream ended without an error"),
            Ok(Err(status)) => return (delivered, status),
            Err(_) => panic!(
                "no cut-off within 20 s ({} changes delivered)",
                delivered.len()
            ),
        }
    }
}

/// Reads a stream whose reader had stopped until the node cuts it, and checks the cut:
/// `SLOW_CONSUMER`, naming the last change delivered, with the point right after it still held.
async fn cut_where_it_can_resume(
    cluster: &Cluster,
    stuck: &mut tonic::Streaming<proto::WatchResponse>,
) -> (Vec<(u64, u32)>, proto::ErrorDetail) {
    let (delivered, status) = read_until_cut(stuck).await;
    let detail = detail_of(&status).unwrap();
    assert_eq!(
        (status.code(), detail.code.as_str()),
        (Code::ResourceExhausted, infra::SLOW_CONSUMER),
        "{status:?}"
    );
    assert_eq!(delivered.last().map(|d| d.0), Some(detail.last_revision));
    let oldest = node_info(cluster).await.watch_oldest_revision;
    assert!(
        oldest <= detail.last_revision + 1,
        "the resume point {} is gone (oldest {oldest})",
        detail.last_revision + 1
    );
    (delivered, detail)
}

/// A library watch of everything, from right after the last change a cut stream delivered.
async fn resume_after(client: &baton_rpc::Client, cut: &proto::ErrorDetail) -> Watch {
    client
        .watch_from(
            ChangeFilter::all(),
            Some(WatchPosition {
                revision: cut.last_revision,
                index: cut.last_index + 1,
            }),
        )
        .await
}

/// A raw watch stream on the node, for what the client library hides.
async fn raw_watch(
    cluster: &Cluster,
    start_revision: u64,
) -> Result<tonic::Streaming<proto::WatchResponse>, tonic::Status> {
    raw_watch_at(cluster, start_revision, 0).await
}

/// [`raw_watch`] from a position inside an entry.
async fn raw_watch_at(
    cluster: &Cluster,
    start_revision: u64,
    start_index: u32,
) -> Result<tonic::Streaming<proto::WatchResponse>, tonic::Status> {
    let mut client = WatchClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    client
        .watch(WatchRequest {
            filter: None,
            start_revision,
            start_index,
        })
        .await
        .map(tonic::Response::into_inner)
}

/// A stream resumed where a SLOW_CONSUMER cut left it starts as far behind as it was cut. While
/// it catches up (it reads faster than changes come) it is not cut again; it used to be, at the
/// first change made while its buffer was full, every few hundred changes, with a new
/// connection each time, so a consumer that could catch up was held to that pace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumed_after_a_cut_is_not_cut_again_while_it_catches_up() {
    let mut tuning = WatchTuning::with_history(2_000);
    tuning.max_backlog = 60;
    tuning.stream_buffer = 8;
    let cluster = Cluster::start_with(tuning).await;
    let client = &cluster.client;
    let value = vec![b'x'; 32 << 10];
    let start = next_revision(&cluster).await;
    let mut stuck = raw_watch(&cluster, start).await.unwrap();
    write_values(client, "catch-up", 300, 32 << 10).await;
    let (delivered, cut) = cut_where_it_can_resume(&cluster, &mut stuck).await;

    let mut resumed = raw_watch_at(&cluster, cut.last_revision, cut.last_index + 1)
        .await
        .unwrap();
    let mut got = delivered.len();
    let mut fence = 300;
    while got < fence as usize {
        let message = tokio::time::timeout(Duration::from_secs(20), resumed.message())
            .await
            .expect("a message within 20 s");
        let response = match message {
            Ok(Some(response)) => response,
            other => panic!("the resumed stream ended after {got} changes: {other:?}"),
        };
        if let Some(Item::Event(_)) = response.item {
            got += 1;
            // A change now and then while the stream is far behind and its buffer full.
            if got.is_multiple_of(20) && fence < 320 {
                fence += 1;
                client
                    .write_fenced("catch-up", fence, &value)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_delivers_every_matching_change_in_commit_order_with_its_value() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    let mut all = client.watch(ChangeFilter::all(), None).await;
    let mut to_b = client
        .watch(ChangeFilter::all().tickets_to("B"), None)
        .await;
    let mut board = client
        .watch(ChangeFilter::all().primitive(Primitive::Board), None)
        .await;
    // Both watches are open (their first progress fixed "now") before anything is written.
    tokio::time::sleep(Duration::from_millis(300)).await;

    client.offer(offer_args("t1", "B")).await.unwrap();
    client.offer(offer_args("t2", "C")).await.unwrap();
    let handle = client.take("t1", "B").await.unwrap();
    let receipt = Receipt {
        status: ReceiptStatus::Done,
        summary: "done".into(),
        failure: String::new(),
        artifacts: vec![],
    };
    client.reply("t1", &handle.token, &receipt).await.unwrap();
    let seeded = [
        TaskSpec {
            id: "a".into(),
            deps: vec![],
        },
        TaskSpec {
            id: "b".into(),
            deps: vec![],
        },
    ];
    client.seed(&seeded).await.unwrap();
    client.claim("a", "ann", 60_000).await.unwrap();

    let mut seen = Vec::new();
    for _ in 0..7 {
        seen.push(next(&mut all).await);
    }
    let kinds: Vec<(ChangeKind, &str)> = seen
        .iter()
        .map(|e| (e.change.kind, e.change.key.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (ChangeKind::Offered, "t1"),
            (ChangeKind::Offered, "t2"),
            (ChangeKind::Taken, "t1"),
            (ChangeKind::Closed, "t1"),
            (ChangeKind::Seeded, "a"),
            (ChangeKind::Seeded, "b"),
            (ChangeKind::Claimed, "a"),
        ]
    );
    let positions: Vec<WatchPosition> = seen.iter().map(Event::position).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    assert_eq!(
        (seen[4].revision, seen[4].index, seen[5].index),
        (seen[5].revision, 0, 1),
        "one seed entry, two changes"
    );
    match &seen[2].change.value {
        ChangeValue::Ticket(t) => {
            assert_eq!(t.state, TicketState::Accepted);
            assert_eq!(t.holder.as_deref(), Some("B"));
        }
        other => panic!("want a ticket, got {other:?}"),
    }
    assert_eq!(seen[2].change.holder, "B");
    match &seen[6].change.value {
        ChangeValue::Task(t) => assert!(t.lease.as_ref().unwrap().token.is_empty()),
        other => panic!("want a task, got {other:?}"),
    }

    let mut addressed = Vec::new();
    for _ in 0..3 {
        addressed.push(next(&mut to_b).await.change.kind);
    }
    assert_eq!(
        addressed,
        vec![ChangeKind::Offered, ChangeKind::Taken, ChangeKind::Closed]
    );
    assert_eq!(next(&mut board).await.change.kind, ChangeKind::Seeded);

    // The same history again, from its first revision.
    let mut replay = client
        .watch(ChangeFilter::all(), Some(seen[0].revision))
        .await;
    for expected in &seen {
        assert_eq!(&next(&mut replay).await, expected);
    }

    // A bad filter is a typed refusal.
    let mut bad = client
        .watch(ChangeFilter::all().key("a").prefix("a"), None)
        .await;
    match bad.next().await {
        Some(Err(Error::Refused(Refusal::Invalid { field, .. }))) => {
            assert_eq!(field, "filter.key_prefix")
        }
        other => panic!("want an invalid-argument refusal, got {other:?}"),
    }
    assert!(bad.next().await.is_none(), "nothing after the error");

    // A start index without a start revision would be ignored (the watch starts "now"): refused.
    let status = WatchClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap()
        .watch(WatchRequest {
            filter: None,
            start_revision: 0,
            start_index: 3,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    match detail_of(&status).as_ref().and_then(refusal_of) {
        Some(Refusal::Invalid { field, .. }) => assert_eq!(field, "start_index"),
        other => panic!("want an invalid-argument refusal, got {other:?}"),
    }
    drop((all, to_b, board, replay));
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_compacted_revision_gets_compacted_and_a_resync_from_a_snapshot_works() {
    let cluster = Cluster::start_with(WatchTuning::with_history(40)).await;
    let client = &cluster.client;
    for i in 0..100u64 {
        client.write_fenced("r", i + 1, b"v").await.unwrap();
    }
    let info = node_info(&cluster).await;
    assert!(info.watch_events <= 40, "{info:?}");
    assert!(info.watch_oldest_revision > 1, "{info:?}");

    // The raw answer: OUT_OF_RANGE with the oldest available revision in its detail.
    let status = raw_watch(&cluster, 1).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange);
    let detail = detail_of(&status).unwrap();
    assert_eq!(detail.code, infra::COMPACTED);
    assert_eq!(detail.oldest_revision, info.watch_oldest_revision);
    assert!(status.message().contains("resync"), "{}", status.message());

    // The client library surfaces it as a typed error and never starts later silently.
    let mut events = client.watch(ChangeFilter::all(), Some(1)).await;
    match events.next().await {
        Some(Err(Error::Compacted {
            requested,
            oldest_available,
        })) => {
            assert_eq!(requested, 1);
            assert_eq!(oldest_available, info.watch_oldest_revision);
        }
        other => panic!("want COMPACTED, got {other:?}"),
    }
    assert!(events.next().await.is_none());

    // The oldest retained revision itself is still served, from its first change.
    let mut oldest = client
        .watch(ChangeFilter::all(), Some(info.watch_oldest_revision))
        .await;
    assert_eq!(next(&mut oldest).await.revision, info.watch_oldest_revision);

    // Resync: read a snapshot at revision R, then watch from R + 1.
    let snapshot = client.tasks().await.unwrap();
    let mut events = client
        .watch(
            ChangeFilter::all().primitive(Primitive::Sink),
            Some(snapshot.revision + 1),
        )
        .await;
    client.write_fenced("r", 500, b"after").await.unwrap();
    let event = next(&mut events).await;
    assert!(event.revision > snapshot.revision);
    assert_eq!(event.change.fence, 500);
    drop((events, oldest));
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_is_cut_off_with_bounded_memory_and_the_client_resumes_without_a_gap() {
    let mut tuning = WatchTuning::with_history(2_000);
    tuning.max_backlog = 60;
    tuning.stream_buffer = 8;
    tuning.history = HistoryLimits {
        events: 2_000,
        bytes: 64 << 20,
    };
    let cluster = Cluster::start_with(tuning).await;
    let client = &cluster.client;
    // 32 KiB values: the stream's HTTP/2 flow-control window (2 MiB) holds about 60 of them, so
    // a consumer that reads nothing makes the node's pump wait, and the backlog grow.
    let value = vec![b'x'; 32 << 10];
    let start = next_revision(&cluster).await;

    // A raw stream that reads nothing while 300 changes are made.
    let mut stuck = raw_watch(&cluster, start).await.unwrap();
    let mut library = client
        .watch(ChangeFilter::all().primitive(Primitive::Sink), Some(start))
        .await;
    for i in 0..300u64 {
        client
            .write_fenced(&format!("r{}", i % 7), i + 1, &value)
            .await
            .unwrap();
    }
    let info = node_info(&cluster).await;
    assert!(info.watch_events <= 2_000, "{info:?}");
    assert!(info.watch_bytes <= 64 << 20, "{info:?}");

    // The stuck stream delivers what was buffered, then the typed cut-off naming the last change
    // it delivered.
    let (delivered, status) = read_until_cut(&mut stuck).await;
    assert_eq!(status.code(), Code::ResourceExhausted);
    let detail = detail_of(&status).unwrap();
    assert_eq!(detail.code, infra::SLOW_CONSUMER);
    assert!(!delivered.is_empty());
    assert!(
        delivered.len() < 300,
        "a stuck consumer is cut long before it has everything ({} delivered)",
        delivered.len()
    );
    assert_eq!(
        delivered.last().copied(),
        Some((detail.last_revision, detail.last_index))
    );
    assert_eq!(
        delivered.first().map(|d| d.0),
        Some(start),
        "no gap at the start"
    );
    let streams_after_cut = node_info(&cluster).await.watch_streams;

    // Resuming right after the last delivered change gives the rest, exactly.
    let mut resumed = resume_after(client, &detail).await;
    let mut rest = Vec::new();
    while delivered.len() + rest.len() < 300 {
        rest.push(next(&mut resumed).await.revision);
    }
    let all: Vec<u64> = delivered
        .iter()
        .map(|d| d.0)
        .chain(rest.iter().copied())
        .collect();
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "in order, no duplicate"
    );
    assert_eq!(all.len(), 300);

    // The client library's own slow consumer: it reads one change every 10 ms, is cut off on
    // the way, resumes by itself, and sees every change exactly once.
    let mut seen = Vec::new();
    while seen.len() < 300 {
        let event = next(&mut library).await;
        seen.push(event.revision);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen, all, "the library's watch equals the history");
    assert!(
        streams_after_cut <= 2,
        "the cut stream's pump is gone ({streams_after_cut} open)"
    );
    drop((stuck, library, resumed));
    cluster.stop().await;
}

/// A change applied while the stream waited for its reader is sent as soon as the reader drains
/// the stream, not at the next progress tick (the wait for room must not swallow its wake-up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_while_the_stream_waits_for_room_follows_without_delay() {
    let mut tuning = WatchTuning::with_history(2_000);
    tuning.stream_buffer = 1;
    tuning.progress_every = Duration::from_secs(60);
    let cluster = Cluster::start_with(tuning).await;
    let client = &cluster.client;
    let start = next_revision(&cluster).await;
    let mut stream = raw_watch(&cluster, start).await.unwrap();
    // 32 KiB values: about 60 fill the HTTP/2 window, and the pump waits for room.
    write_values(client, "big", 100, 32 << 10).await;
    client.write_fenced("last", 1, b"l").await.unwrap();
    let drained = tokio::time::Instant::now();
    let mut events = 0;
    while events < 101 {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Ok(Ok(Some(response))) => {
                if let Some(Item::Event(_)) = response.item {
                    events += 1;
                }
            }
            other => panic!("after {events} events: {other:?}"),
        }
    }
    assert!(drained.elapsed() < Duration::from_secs(10));
    drop(stream);
    cluster.stop().await;
}

/// Large values fill the history's bytes long before its count: a stream falling behind by size
/// is cut SLOW_CONSUMER while its resume point is still held, and resumes from there; it used to
/// be cut only once that point had been evicted (COMPACTED: resync).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_behind_by_half_the_historys_bytes_is_cut_where_it_can_resume() {
    let mut tuning = WatchTuning::with_history(2_000);
    // The smallest history a node accepts (watch.history_bytes).
    tuning.history.bytes = 32 << 20;
    let cluster = Cluster::start_with(tuning).await;
    let client = &cluster.client;
    let start = next_revision(&cluster).await;
    let mut stuck = raw_watch(&cluster, start).await.unwrap();
    // 800 changes of 32 KiB (25 MiB, all held): the stream takes about 6 MiB of them before
    // its reader stops it, and is 16 MiB behind about 500 changes later.
    write_values(client, "big", 800, 32 << 10).await;
    let (delivered, detail) = cut_where_it_can_resume(&cluster, &mut stuck).await;

    // Resuming right after the last delivered change gives the rest, exactly.
    let mut resumed = resume_after(client, &detail).await;
    let mut all: Vec<u64> = delivered.iter().map(|d| d.0).collect();
    while all.len() < 800 {
        all.push(next(&mut resumed).await.revision);
    }
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "in order, no duplicate"
    );
    drop((stuck, resumed));
    cluster.stop().await;
}

/// A stream with a selective filter owes its client the changes it skipped on the way to the
/// change it waits to hand over: the client resumes right after the last change it got and reads
/// past them again. The backlog is counted from there, so the stream is cut `SLOW_CONSUMER`
/// while that point is still held. Counted from the waiting change, it was cut only once that
/// point had been evicted (`COMPACTED`: a resync), though nothing it missed matched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selective_stream_is_cut_where_its_client_can_resume() {
    let mut tuning = WatchTuning::with_history(200);
    tuning.stream_buffer = 1;
    // No progress while skipping: the resume point stays right after the last `a` delivered.
    tuning.progress_every = Duration::from_secs(60);
    let cluster = Cluster::start_with(tuning).await;
    let client = &cluster.client;
    let start = next_revision(&cluster).await;
    let mut watch = WatchClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    let filter = proto::WatchFilter {
        key: Some("a".into()),
        ..Default::default()
    };
    let mut stuck = watch
        .watch(WatchRequest {
            filter: Some(filter),
            start_revision: start,
            start_index: 0,
        })
        .await
        .unwrap()
        .into_inner();
    // Each large `a` is followed by 120 changes that do not match: more than the history keeps
    // beyond the backlog limit (200 - 100). The transport takes a few MiB before the unread
    // stream blocks; the writes stop soon after the node cuts it.
    let large = vec![b'x'; 512 << 10];
    let mut cut = false;
    'groups: for fence in 1..=40u64 {
        client.write_fenced("a", fence, &large).await.unwrap();
        for i in 0..120u64 {
            client
                .write_fenced(&format!("b{i}"), fence, b"y")
                .await
                .unwrap();
            if i % 10 == 9 && node_info(&cluster).await.watch_streams == 0 {
                cut = true;
                break 'groups;
            }
        }
    }
    assert!(cut, "the unread stream was never cut");
    cut_where_it_can_resume(&cluster, &mut stuck).await;
    cluster.stop().await;
}

/// This process's resident memory in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Streams whose readers stop hold a few MiB each, not `stream_buffer` whole changes: 256
/// changes of 256 KiB would be 64 MiB per stream (docs/watch.md, "Slow consumers").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_read_nothing_hold_a_bounded_number_of_bytes() {
    let mut tuning = WatchTuning::with_history(2_000);
    // Room for every change written below, twice: no stream is cut for falling behind.
    tuning.history.bytes = 256 << 20;
    let cluster = Cluster::start_with(tuning).await;
    let client = &cluster.client;
    let start = next_revision(&cluster).await;
    let mut streams = Vec::new();
    for _ in 0..16 {
        streams.push(raw_watch(&cluster, start).await.unwrap());
    }
    let before = rss_kib();
    write_values(client, "big", 300, 256 << 10).await;
    // Let the pumps fill what they may: until memory stops growing (less than 2 MiB in a
    // second), for 30 s at most, so that a slow machine's pumps are not measured half-way (which
    // would understate what they hold). Past 30 s it is measured anyway: later only holds more.
    let settling = tokio::time::Instant::now();
    let mut last = rss_kib();
    let settled = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = rss_kib();
        let grew = now.saturating_sub(last);
        last = now;
        if grew < 2 << 10 {
            break true;
        }
        if settling.elapsed() > Duration::from_secs(30) {
            break false;
        }
    };
    let grown_mib = last.saturating_sub(before) >> 10;
    println!(
        "memory grew by {grown_mib} MiB (settled: {settled}, after {:?})",
        settling.elapsed()
    );
    // The history (75 MiB here), storage and 16 streams of a few MiB each fit under this (about
    // 300 MiB measured); buffers of whole changes need over 1 GiB (1,235 MiB measured).
    assert!(grown_mib < 700, "memory grew by {grown_mib} MiB");
    assert_eq!(node_info(&cluster).await.watch_streams, 16);
    drop(streams);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_loss_reaches_the_holders_watch() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    client
        .seed(&[TaskSpec {
            id: "job".into(),
            deps: vec![],
        }])
        .await
        .unwrap();
    let mut mine = client.watch(ChangeFilter::all().holder("ann"), None).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let claimed = client.claim("job", "ann", 300).await.unwrap();
    let fence = claimed.lease.unwrap().fence;
    let event = next(&mut mine).await;
    assert_eq!(
        (event.change.kind, event.change.fence),
        (ChangeKind::Claimed, fence)
    );
    // Nobody renews: the leader's sweep materialises the expiry and ann hears of it.
    let event = next(&mut mine).await;
    assert_eq!(event.change.kind, ChangeKind::Lost);
    assert_eq!(
        (event.change.key.as_str(), event.change.fence),
        ("job", fence)
    );
    assert_eq!(event.change.holder, "ann");
    drop(mine);
    cluster.stop().await;
}

/// `baton watch | head -1`: once the reader is gone, the next change ends the watch with exit 0,
/// as any filter ends, not with a panic on the closed pipe (exit 101).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_command_ends_quietly_when_its_reader_goes_away() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    let cluster = Cluster::start().await;
    let mut watch = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["--endpoints", &cluster.addr, "watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        line
    });
    // The watch starts at "now": keep writing until it has printed a line.
    let mut n = 0;
    while !first.is_finished() {
        n += 1;
        cluster.client.write_fenced("piped", n, b"v").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(n < 200, "the watch printed nothing");
    }
    let line = first.await.unwrap();
    assert!(line.contains("sink"), "{line}");
    // The reader (and with it the pipe) is gone; the next changes make the watch write.
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = watch.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the watch went on after its reader left"
        );
        n += 1;
        cluster.client.write_fenced("piped", n, b"v").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut watch.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// A watch request the node cannot decode is refused `INVALID_ARGUMENT` on `request`, as every
/// other call's is (gRPC's own answer is `INTERNAL` with no detail, which says the node failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_watch_request_is_refused_as_invalid() {
    let cluster = Cluster::start().await;
    let mut grpc = support::raw_grpc(&cluster.addr).await;
    let status = grpc
        .server_streaming::<_, proto::WatchResponse, _>(
            tonic::Request::new(support::not_a_request()),
            tonic::codegen::http::uri::PathAndQuery::from_static("/baton.v1.Watch/Watch"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let detail = detail_of(&status).unwrap();
    assert_eq!(
        (detail.code.as_str(), detail.field.as_str()),
        ("INVALID_ARGUMENT", "request")
    );
    cluster.stop().await;
}

/// A node serves at most `watch.max_streams` watches at once: one more is refused `OVERLOADED`
/// (the Rust client then tries another node), and a place comes back when a stream ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_the_limit_are_refused_overloaded() {
    let tuning = WatchTuning {
        max_streams: 2,
        ..WatchTuning::default()
    };
    let cluster = Cluster::start_with(tuning).await;
    let mut watch = WatchClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    let from_now = WatchRequest {
        filter: None,
        start_revision: 0,
        start_index: 0,
    };
    let first = watch.watch(from_now.clone()).await.unwrap();
    let second = watch.watch(from_now.clone()).await.unwrap();
    let status = watch.watch(from_now.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(detail_of(&status).unwrap().code, infra::OVERLOADED);
    assert!(status.message().contains("watch.max_streams"), "{status:?}");
    assert_eq!(node_info(&cluster).await.watch_streams, 2);
    // The streams that were admitted work.
    let mut second = second.into_inner();
    assert!(matches!(
        second.message().await.unwrap().and_then(|r| r.item),
        Some(Item::Progress(_))
    ));
    // A stream that ends gives its place back (once the node notices the reader is gone).
    drop(first);
    let admitted = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(stream) = watch.watch(from_now.clone()).await {
                return stream;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a place came back");
    drop((admitted, second));
    cluster.stop().await;
}

/// A watch resumed (`resume_watch`) on nodes of another cluster — one made anew at the same
/// address (or restored from a backup) — is told its position is not in their history
/// (`COMPACTED`, oldest 0), not served that cluster's changes from the same revision on as if
/// they followed (before, the stream carried on there, skipping or mixing histories without a
/// word). The resync that follows works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumed_on_another_cluster_at_the_same_address_is_told_to_resync() {
    let first = Cluster::start().await;
    let addr = first.addr.clone();
    let client = baton_rpc::Client::new(
        &[addr.as_str()],
        baton_rpc::ClientConfig {
            deadline: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .unwrap();
    let everything = ChangeFilter::default();
    let mut watch = client.watch(everything.clone(), None).await;
    client.write_fenced("before", 1, b"a").await.unwrap();
    let seen = next(&mut watch).await;
    assert_eq!(seen.change.key, "before");
    let resume = watch.resume_position().unwrap();
    first.stop().await;

    // A new cluster at the same address, its history past the position already.
    let second = Cluster::start_at(&addr).await;
    write_values(&second.client, "after", 5, 8).await;
    let head = second.client.node_info(&addr).await.unwrap().applied_index;
    assert!(head > resume.revision, "{head} <= {resume:?}");

    let mut resumed = client.resume_watch(&watch).await;
    let answer = tokio::time::timeout(Duration::from_secs(20), resumed.next())
        .await
        .expect("an answer within 20 s");
    match answer {
        Some(Err(Error::Compacted {
            requested,
            oldest_available: 0,
        })) => assert_eq!(requested, resume.revision),
        other => panic!("resumed in another cluster's history: {other:?}"),
    }

    // The resync: a position read from the new cluster is followed there.
    let mut resynced = client
        .watch_from(everything, Some(WatchPosition::at(head + 1)))
        .await;
    second.client.write_fenced("later", 1, b"b").await.unwrap();
    assert_eq!(next(&mut resynced).await.change.key, "later");
    second.stop().await;
}
