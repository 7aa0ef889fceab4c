//! Claim: a watch delivers exactly the committed history — every change, in commit order, no
//! gap, no duplicate — while the node it reads from is killed and others restart, and a watch
//! that cannot be served from where it asks fails with a typed `COMPACTED` instead of starting
//! later (docs/watch.md; issue 8).
//!
//! The first test makes 10,000 changes with four concurrent writers (board seeds of 1-8 tasks
//! per entry, and ticket offers, every key written once) on a real three-process cluster. Two
//! watchers follow everything from revision 1: one starts on the leader, which is killed
//! mid-stream; later a follower is killed and restarted. The events must equal the final state
//! key for key, include every acknowledged write, be strictly ordered with complete entries, and
//! equal a fresh replay from revision 1 read after the faults.
//!
//! The second test snapshots often and restarts every node, so no node holds the history from
//! revision 1 any more: a watch from there gets `COMPACTED` (library and CLI), and the resync it
//! describes — read a snapshot at revision R, watch from R + 1 — works. It also drives
//! `baton watch --json` and `baton ticket wait`.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_cluster_test::{cli, first, wait, Cluster, Options};
use baton_rpc::{Client, Error, Event, Watch};
use baton_statemachine::board::TaskSpec;
use baton_statemachine::handoff::{OfferArgs, TicketState};
use baton_statemachine::{ChangeFilter, ChangeKind, ChangeValue, Primitive};
use futures::StreamExt;

/// Changes the writers make in total.
const TARGET: u64 = 10_000;
/// Acknowledged changes before the leader is killed, before it is restarted, and before a
/// follower is killed (and restarted a moment later).
const KILL_LEADER_AT: u64 = 2_500;
const RESTART_LEADER_AT: u64 = 4_500;
const KILL_FOLLOWER_AT: u64 = 6_500;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the writers know about their writes.
#[derive(Default)]
struct Writes {
    /// Keys of acknowledged writes.
    acked: BTreeSet<String>,
    /// Keys of writes whose outcome is unknown (they may or may not be in the history).
    ambiguous: BTreeSet<String>,
    /// Contract refusals (there must be none: every key is written once).
    refused: Vec<String>,
}

/// Writer `w`: board seeds (even `w`) or ticket offers (odd `w`) on its own keys until the
/// writers together have `TARGET` acknowledged changes.
async fn writer(client: Client, w: usize, acked: Arc<AtomicU64>, writes: Arc<Mutex<Writes>>) {
    let mut n = 0u64;
    while acked.load(Ordering::Relaxed) < TARGET {
        n += 1;
        let (keys, result) = if w.is_multiple_of(2) {
            let size = 1 + (n % 8);
            let keys: Vec<String> = (0..size).map(|i| format!("s{w}-{n}-{i}")).collect();
            let specs: Vec<TaskSpec> = keys
                .iter()
                .map(|id| TaskSpec {
                    id: id.clone(),
                    deps: vec![],
                })
                .collect();
            let result = client.seed(&specs).await.map(|_| ());
            (keys, result)
        } else {
            let key = format!("t{w}-{n}");
            let result = client
                .offer(OfferArgs {
                    key: key.clone(),
                    from: format!("writer-{w}"),
                    to: "B".into(),
                    payload: key.clone().into_bytes(),
                    reply_to: format!("writer-{w}"),
                    ttl_ms: 600_000,
                })
                .await
                .map(|_| ());
            (vec![key], result)
        };
        let mut writes = lock(&writes);
        match result {
            Ok(()) => {
                acked.fetch_add(keys.len() as u64, Ordering::Relaxed);
                writes.acked.extend(keys);
            }
            Err(Error::Refused(refusal)) => writes.refused.push(format!("{keys:?}: {refusal}")),
            Err(_) => writes.ambiguous.extend(keys),
        }
    }
}

/// What a watch delivered so far, and the error that ended it, if any.
#[derive(Default)]
struct Watched {
    events: Mutex<Vec<Event>>,
    failed: Mutex<Option<Error>>,
}

/// Collects a watch's events in the background until it ends.
fn collect(mut events: Watch) -> Arc<Watched> {
    let watched = Arc::new(Watched::default());
    let into = watched.clone();
    tokio::spawn(async move {
        while let Some(item) = events.next().await {
            match item {
                Ok(event) => lock(&into.events).push(event),
                Err(error) => {
                    *lock(&into.failed) = Some(error);
                    return;
                }
            }
        }
    });
    watched
}

async fn until_acked(acked: &AtomicU64, at: u64) {
    wait::until(
        &format!("{at} acknowledged changes"),
        Duration::from_secs(60),
        || async {
            let now = acked.load(Ordering::Relaxed);
            if now >= at {
                Ok(())
            } else {
                Err(format!("{now} so far"))
            }
        },
    )
    .await
    .unwrap();
}

/// Which running nodes serve at least one watch stream right now.
async fn watch_hosts(cluster: &Cluster) -> Vec<u64> {
    let mut hosts = Vec::new();
    for id in cluster.live_ids() {
        if let Ok(info) = cluster.node_info(id).await {
            if info.watch_streams > 0 {
                hosts.push(id);
            }
        }
    }
    hosts
}

/// Every node's id (running or not).
fn ids(cluster: &Cluster) -> Vec<u64> {
    cluster
        .endpoints()
        .iter()
        .filter_map(|addr| cluster.id_of(addr))
        .collect()
}

/// A client whose endpoints list `first` first (a new watch starts there).
fn client_starting_at(cluster: &Cluster, first: u64) -> Client {
    let mut endpoints = vec![cluster.addr(first).to_string()];
    endpoints.extend(
        cluster
            .ids()
            .into_iter()
            .filter(|id| *id != first)
            .map(|id| cluster.addr(id).to_string()),
    );
    Client::new(&endpoints, baton_cluster_test::client_config()).unwrap()
}

/// The history's invariants: strictly increasing positions, and the changes of every entry
/// complete (indices 0, 1, 2, ... with no hole).
fn check_order(events: &[Event]) {
    for pair in events.windows(2) {
        assert!(
            pair[0].position() < pair[1].position(),
            "out of order or duplicated: {:?} then {:?}",
            pair[0].position(),
            pair[1].position()
        );
        if pair[1].revision == pair[0].revision {
            assert_eq!(pair[1].index, pair[0].index + 1, "a hole inside an entry");
        } else {
            assert_eq!(pair[1].index, 0, "an entry's first change is missing");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t80_a_watch_equals_the_committed_history_across_a_leader_kill_and_a_follower_restart() {
    let options = Options {
        snapshot_every: 1_000,
        keep_logs: 500,
        ..Options::default()
    };
    let mut cluster = Cluster::start(3, options).await.unwrap();
    let started = Instant::now();
    let leader = cluster.leader().await.unwrap();
    let follower = ids(&cluster).into_iter().find(|id| *id != leader).unwrap();

    // Two watchers of everything from revision 1: one starts on the leader, one on a follower.
    let on_leader = client_starting_at(&cluster, leader)
        .watch(ChangeFilter::all(), Some(1))
        .await;
    let on_follower = client_starting_at(&cluster, follower)
        .watch(ChangeFilter::all(), Some(1))
        .await;
    let watcher_a = collect(on_leader);
    let watcher_b = collect(on_follower);

    let acked = Arc::new(AtomicU64::new(0));
    let writes = Arc::new(Mutex::new(Writes::default()));
    let mut writers = Vec::new();
    for w in 0..4 {
        let client = cluster.client().await.unwrap();
        writers.push(tokio::spawn(writer(
            client,
            w,
            acked.clone(),
            writes.clone(),
        )));
    }

    until_acked(&acked, KILL_LEADER_AT).await;
    let hosts = watch_hosts(&cluster).await;
    println!("t80: watch streams on nodes {hosts:?}");
    assert!(
        hosts.contains(&leader),
        "watcher A reads from the leader it started on"
    );
    cluster.kill(leader).unwrap();
    let new_leader = cluster.leader().await.unwrap();
    println!("t80: killed leader {leader}; node {new_leader} leads");

    until_acked(&acked, RESTART_LEADER_AT).await;
    cluster.restart(leader).await.unwrap();
    println!("t80: restarted node {leader}");

    until_acked(&acked, KILL_FOLLOWER_AT).await;
    let current = cluster.leader().await.unwrap();
    let hosts = watch_hosts(&cluster).await;
    let victim = cluster
        .live_ids()
        .into_iter()
        .filter(|id| *id != current)
        .max_by_key(|id| (hosts.contains(id), *id != leader))
        .unwrap();
    println!("t80: watch streams on nodes {hosts:?}; killing follower {victim}");
    cluster.kill(victim).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.restart(victim).await.unwrap();
    println!("t80: restarted follower {victim}");

    for writer in writers {
        tokio::time::timeout(Duration::from_secs(60), writer)
            .await
            .unwrap()
            .unwrap();
    }
    let written_in = started.elapsed();
    let applied = cluster.wait_all_caught_up().await.unwrap();

    // The final state: every key written exactly once.
    let client = cluster.client().await.unwrap();
    let tickets = client.tickets().await.unwrap();
    let tasks = client.tasks().await.unwrap();
    let mut final_keys: BTreeSet<String> = tickets.tickets.iter().map(|t| t.key.clone()).collect();
    final_keys.extend(tasks.tasks.iter().map(|t| t.id.clone()));
    let expected = final_keys.len();
    assert!(expected as u64 >= TARGET, "{expected} keys");

    for (name, watched) in [("A", &watcher_a), ("B", &watcher_b)] {
        wait::until(
            &format!("watcher {name} to deliver {expected} changes"),
            Duration::from_secs(30),
            || async {
                if let Some(error) = lock(&watched.failed).as_ref() {
                    return Err(format!("the watch failed: {error}"));
                }
                let n = lock(&watched.events).len();
                if n >= expected {
                    Ok(())
                } else {
                    Err(format!("{n} so far"))
                }
            },
        )
        .await
        .unwrap();
    }
    // Nothing more may come: every key was written once.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let writes = std::mem::take(&mut *lock(&writes));
    assert!(
        writes.refused.is_empty(),
        "refusals: {}",
        first(&writes.refused, 5)
    );
    let events = lock(&watcher_a.events).clone();
    assert_eq!(events.len(), expected, "watcher A delivered extra changes");
    check_order(&events);
    let mut keys = BTreeMap::new();
    for event in &events {
        *keys.entry(event.change.key.clone()).or_insert(0u32) += 1;
        match (&event.change.kind, &event.change.value) {
            (ChangeKind::Seeded, ChangeValue::Task(task)) => assert_eq!(task.id, event.change.key),
            (ChangeKind::Offered, ChangeValue::Ticket(ticket)) => {
                assert_eq!(ticket.state, TicketState::Offered);
                assert_eq!(ticket.payload, event.change.key.as_bytes());
            }
            other => panic!("unexpected change {other:?}"),
        }
    }
    let duplicated: Vec<&String> = keys
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, _)| k)
        .collect();
    assert!(
        duplicated.is_empty(),
        "duplicates: {}",
        first(&duplicated, 5)
    );
    let watched: BTreeSet<String> = keys.into_keys().collect();
    assert_eq!(watched, final_keys, "the watch equals the final state");
    let lost: Vec<&String> = writes.acked.difference(&watched).collect();
    assert!(
        lost.is_empty(),
        "acknowledged but never delivered: {}",
        first(&lost, 5)
    );
    let ambiguous_applied = writes.ambiguous.intersection(&watched).count();

    let other = lock(&watcher_b.events).clone();
    assert_eq!(other, events, "both watchers saw the same history");

    // A fresh replay from revision 1 (some node never restarted still holds it all).
    let replay = client.watch(ChangeFilter::all(), Some(1)).await;
    let replayed: Vec<Event> = tokio::time::timeout(
        Duration::from_secs(30),
        replay.take(expected).map(|item| item.unwrap()).collect(),
    )
    .await
    .unwrap();
    assert_eq!(
        replayed, events,
        "a replay from revision 1 equals the live watch"
    );

    // Filters see exactly their part of the same history.
    let offers = client
        .watch(
            ChangeFilter::all()
                .primitive(Primitive::Handoff)
                .tickets_to("B"),
            Some(1),
        )
        .await;
    let want: Vec<&Event> = events
        .iter()
        .filter(|e| e.change.primitive == Primitive::Handoff)
        .collect();
    let got: Vec<Event> = tokio::time::timeout(
        Duration::from_secs(30),
        offers.take(want.len()).map(|item| item.unwrap()).collect(),
    )
    .await
    .unwrap();
    assert_eq!(got.iter().collect::<Vec<_>>(), want);

    println!(
        "t80: {} changes ({} acknowledged keys, {} ambiguous of which {} applied) in {:?}, \
         applied index {applied}; both watchers and a replay from revision 1 equal the final \
         state, in order, no gap, no duplicate (total {:?})",
        events.len(),
        writes.acked.len(),
        writes.ambiguous.len(),
        ambiguous_applied,
        written_in,
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t80_a_watch_from_a_compacted_revision_gets_compacted_and_the_resync_works() {
    let options = Options {
        snapshot_every: 100,
        keep_logs: 20,
        ..Options::default()
    };
    let mut cluster = Cluster::start(3, options).await.unwrap();
    let client = cluster.client().await.unwrap();
    for i in 0..350u64 {
        client.write_fenced("r", i + 1, b"v").await.unwrap();
    }
    cluster.wait_all_caught_up().await.unwrap();
    // A restart keeps only what follows each node's snapshot.
    for id in ids(&cluster) {
        cluster.kill(id).unwrap();
    }
    for id in ids(&cluster) {
        cluster.restart(id).await.unwrap();
    }
    cluster.leader().await.unwrap();
    let mut oldest = Vec::new();
    for id in ids(&cluster) {
        let info = cluster.node_info(id).await.unwrap();
        assert!(info.watch_oldest_revision > 1, "node {id}: {info:?}");
        oldest.push(info.watch_oldest_revision);
    }

    let client = cluster.client().await.unwrap();
    client.write_fenced("barrier", 1, b"b").await.unwrap();
    let mut events = client.watch(ChangeFilter::all(), Some(1)).await;
    match events.next().await {
        Some(Err(Error::Compacted {
            requested,
            oldest_available,
        })) => {
            assert_eq!(requested, 1);
            assert_eq!(Some(oldest_available), oldest.iter().min().copied());
        }
        other => panic!("want COMPACTED, got {other:?}"),
    }
    assert!(events.next().await.is_none(), "nothing after COMPACTED");

    let endpoints = cluster.endpoints().join(",");
    let bin = cluster.bin().to_path_buf();
    let baton = |args: Vec<String>, limit: u64| {
        let bin = bin.clone();
        let mut all = vec!["--endpoints".to_string(), endpoints.clone()];
        all.extend(args);
        async move {
            cli::run(&bin, &all, Duration::from_secs(limit))
                .await
                .unwrap()
        }
    };
    let run = baton(vec!["watch".into(), "--from".into(), "1".into()], 30).await;
    assert_eq!(run.code, Some(5), "{run}");
    assert!(run.stderr.contains("COMPACTED"), "{run}");

    // Resync: a snapshot at revision R, then a watch from R + 1 sees the next change. (The write
    // above came first: a leader that resumed its term after the restart may not know that its
    // last entries are committed until it commits a new one, and a read before that can miss
    // them.)
    let snapshot = client.tasks().await.unwrap();
    let from = snapshot.revision + 1;
    let mut events = client.watch(ChangeFilter::all(), Some(from)).await;
    let watching = tokio::spawn(baton(
        vec![
            "watch".into(),
            "--from".into(),
            from.to_string(),
            "--count".into(),
            "2".into(),
            "--json".into(),
        ],
        60,
    ));
    let waiting = tokio::spawn(baton(
        vec![
            "ticket".into(),
            "wait".into(),
            "--to".into(),
            "wally".into(),
            "--timeout".into(),
            "40s".into(),
        ],
        60,
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    client.write_fenced("r", 1_000, b"after").await.unwrap();
    client
        .offer(OfferArgs {
            key: "for-wally".into(),
            from: "A".into(),
            to: "wally".into(),
            payload: b"hello".to_vec(),
            reply_to: "A".into(),
            ttl_ms: 60_000,
        })
        .await
        .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(20), events.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(event.revision >= from);
    assert_eq!(
        (event.change.kind, event.change.fence),
        (ChangeKind::Written, 1_000)
    );

    let run = watching.await.unwrap();
    assert_eq!(run.code, Some(0), "{run}");
    let lines: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{run}");
    assert_eq!(lines[0]["kind"], "written");
    assert_eq!(lines[0]["key"], "r");
    assert_eq!(lines[0]["revision"], event.revision);
    assert_eq!(lines[1]["kind"], "offered");
    assert_eq!(lines[1]["value"]["to"], "wally");

    let run = waiting.await.unwrap();
    assert_eq!(run.code, Some(0), "{run}");
    assert!(run.stdout.contains("key=for-wally"), "{run}");
    assert!(run.stdout.contains("payload=hello"), "{run}");

    // A ticket already waiting is printed at once; with none, the wait times out with exit 1.
    let run = baton(
        vec![
            "ticket".into(),
            "wait".into(),
            "--to".into(),
            "wally".into(),
            "--json".into(),
        ],
        30,
    )
    .await;
    assert_eq!(run.code, Some(0), "{run}");
    let ticket: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(ticket["key"], "for-wally");
    let run = baton(
        vec![
            "ticket".into(),
            "wait".into(),
            "--to".into(),
            "nobody".into(),
            "--timeout".into(),
            "2s".into(),
        ],
        30,
    )
    .await;
    assert_eq!(run.code, Some(1), "{run}");
    println!("t80: every node's history starts after its snapshot (oldest {oldest:?}); a watch from 1 is COMPACTED; the resync works");
}

/// A client of the cluster's nodes but `skip`.
fn client_without(cluster: &Cluster, skip: u64) -> Client {
    let endpoints: Vec<String> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != skip)
        .map(|id| cluster.addr(id).to_string())
        .collect();
    Client::new(&endpoints, baton_cluster_test::client_config()).unwrap()
}

/// A follower of the current leader.
async fn a_follower(cluster: &Cluster) -> u64 {
    let leader = cluster.leader().await.unwrap();
    cluster.ids().into_iter().find(|id| *id != leader).unwrap()
}

/// A follower cut off from the others still names its old leader (it never stands in an election
/// it cannot win), so "has a leader" says nothing about whether its history is current. Its
/// watch streams must end `NO_LEADER` once it has heard nothing from a leader for the cutoff, so
/// the library moves to a current node instead of waiting for the partition to heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t80_a_watch_on_a_follower_cut_off_from_the_others_moves_to_a_current_node() {
    let cluster = Cluster::start(3, Options::proxied()).await.unwrap();
    let cut = a_follower(&cluster).await;
    let writer = client_without(&cluster, cut);
    let watched = collect(
        client_starting_at(&cluster, cut)
            .watch(ChangeFilter::all().primitive(Primitive::Sink), None)
            .await,
    );
    writer.write_fenced("before", 1, b"b").await.unwrap();
    wait::until("the first change", Duration::from_secs(20), || async {
        match lock(&watched.events).len() {
            0 => Err("nothing yet".to_string()),
            _ => Ok(()),
        }
    })
    .await
    .unwrap();
    assert_eq!(
        watch_hosts(&cluster).await,
        vec![cut],
        "the watch starts on {cut}"
    );

    cluster.network().unwrap().isolate(cut);
    writer.write_fenced("after", 1, b"a").await.unwrap();
    // The cutoff is 3 s, checked once a second while the stream idles; then a reconnect.
    let delivered = wait::until(
        "the change made after the cut",
        Duration::from_secs(20),
        || {
            let watched = watched.clone();
            async move {
                if let Some(error) = lock(&watched.failed).as_ref() {
                    panic!("the watch failed: {error}");
                }
                let keys: Vec<String> = lock(&watched.events)
                    .iter()
                    .map(|event| event.change.key.clone())
                    .collect();
                if keys.iter().any(|key| key == "after") {
                    Ok(keys)
                } else {
                    Err(format!("seen {keys:?}"))
                }
            }
        },
    )
    .await;
    cluster.network().unwrap().heal_all();
    assert_eq!(delivered.unwrap(), vec!["before", "after"]);
    assert!(!watch_hosts(&cluster).await.contains(&cut));
}

/// A stream whose follower installs a snapshot while the stream waits for its reader has lost
/// the history it still owes: it must end `COMPACTED` (the library then looks elsewhere or
/// reports a resync), not `SLOW_CONSUMER`, whose resume point no node holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t80_a_stream_whose_node_installs_a_snapshot_under_it_ends_compacted() {
    let options = Options {
        snapshot_every: 50,
        keep_logs: 10,
        ..Options::proxied()
    };
    let cluster = Cluster::start(3, options).await.unwrap();
    let follower = a_follower(&cluster).await;
    let writer = client_without(&cluster, follower);
    writer.write_fenced("warm-up", 1, b"w").await.unwrap();
    cluster.wait_all_caught_up().await.unwrap();
    let start = cluster.node_info(follower).await.unwrap().applied_index + 1;
    let mut raw = baton_rpc::proto::watch_client::WatchClient::connect(format!(
        "http://{}",
        cluster.addr(follower)
    ))
    .await
    .unwrap()
    .watch(baton_rpc::proto::WatchRequest {
        filter: None,
        start_revision: start,
        start_index: 0,
    })
    .await
    .unwrap()
    .into_inner();
    // Read nothing: 256 changes fill the node's buffer, about 60 of 32 KiB the HTTP/2 window,
    // and the stream's pump then waits with the rest unsent.
    let value = vec![b'x'; 32 << 10];
    for i in 0..400u64 {
        writer.write_fenced("big", i + 1, &value).await.unwrap();
    }
    cluster.wait_all_caught_up().await.unwrap();
    // Entries the follower misses while cut off are purged from the leader's log, so the
    // follower catches up by installing a snapshot.
    cluster.network().unwrap().isolate(follower);
    for i in 0..200u64 {
        writer.write_fenced("small", i + 1, b"s").await.unwrap();
    }
    cluster.network().unwrap().heal_all();
    cluster.wait_all_caught_up().await.unwrap();
    let oldest = cluster
        .node_info(follower)
        .await
        .unwrap()
        .watch_oldest_revision;
    assert!(oldest > start + 400, "the follower installed a snapshot");

    let mut last = None;
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(30), raw.message()).await {
            Ok(Ok(Some(response))) => {
                if let Some(baton_rpc::proto::watch_response::Item::Event(event)) = response.item {
                    last = Some(event.revision);
                }
            }
            Ok(Ok(None)) => panic!("the stream ended without an error"),
            Ok(Err(status)) => break status,
            Err(_) => panic!("the stream neither moved nor ended in 30 s"),
        }
    };
    let detail = baton_rpc::error::detail_of(&status).unwrap();
    assert_eq!(
        (status.code(), detail.code.as_str()),
        (tonic::Code::OutOfRange, baton_rpc::error::infra::COMPACTED),
        "{status:?}"
    );
    let last = last.expect("the stream delivered what it had buffered");
    assert!(last < start + 400, "it was cut before the end ({last})");
    // The history restarted after the installed snapshot (a later install may move it on).
    assert!(
        detail.oldest_revision > last && detail.oldest_revision <= oldest,
        "oldest {} at the cut, {oldest} now, last delivered {last}",
        detail.oldest_revision
    );
}

/// A watch that ended `Unavailable` (its only endpoint cut off for longer than the client's
/// deadline) says where it would resume, also when it had delivered nothing (progress on the
/// changes it skipped moved that point): a watch from there delivers what was committed
/// meanwhile, with no gap. Before, such a watch had no position to give, and a caller watching
/// from now again missed everything committed while it was cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t80_a_watch_that_ended_unavailable_resumes_where_it_stopped() {
    use baton_cluster_test::proxy::Proxy;
    use baton_rpc::ClientConfig;

    let cluster = Cluster::start(1, Options::default()).await.unwrap();
    let direct = cluster.client().await.unwrap();
    let proxy = Proxy::start(cluster.addr(1)).await.unwrap();
    let config = ClientConfig {
        deadline: Duration::from_secs(2),
        attempt_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
    };
    let proxied = Client::new(&[proxy.addr().to_string()], config).unwrap();
    let mut watch = proxied.watch(ChangeFilter::all().key("k"), None).await;
    let started = watch.resume_position().unwrap();
    // Changes the filter skips; the node's progress (every second) moves the resume point past
    // them, though no event was delivered.
    for fence in 1..=5 {
        direct.write_fenced("other", fence, b"o").await.unwrap();
    }
    // Progress is taken in while the caller waits for the next event.
    let mut waited = Duration::ZERO;
    while watch.resume_position() <= Some(started) {
        assert!(
            waited < Duration::from_secs(10),
            "no progress past the skipped changes"
        );
        let nothing = tokio::time::timeout(Duration::from_millis(500), watch.next()).await;
        assert!(nothing.is_err(), "no change matches yet: {nothing:?}");
        waited += Duration::from_millis(500);
    }

    proxy.cut();
    let ended = tokio::time::timeout(Duration::from_secs(30), watch.next())
        .await
        .expect("the watch ends within 30 s");
    assert!(
        matches!(ended, Some(Err(Error::Unavailable { .. }))),
        "{ended:?}"
    );
    let resume = watch.resume_position().unwrap();
    assert!(resume > started, "{resume:?}");
    // Committed after the watch ended, before it is resumed: a watch from now would miss it.
    direct.write_fenced("k", 1, b"while cut off").await.unwrap();

    proxy.heal();
    let mut resumed = proxied
        .watch_from(ChangeFilter::all().key("k"), Some(resume))
        .await;
    let event = tokio::time::timeout(Duration::from_secs(10), resumed.next())
        .await
        .expect("the change made while cut off")
        .unwrap()
        .unwrap();
    assert_eq!(
        (event.change.key.as_str(), event.change.fence),
        ("k", 1),
        "{event:?}"
    );
    assert!(event.position() >= resume);
}
