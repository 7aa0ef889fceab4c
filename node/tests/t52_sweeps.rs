//! The leader's sweeps against an in-process single-node cluster (docs/design.md "Expiry"): a
//! lease is swept as soon as it falls due — the leader sleeps until the earliest deadline and
//! wakes when a command brings an earlier one — not at the next `sweep_interval` tick; a leader
//! with nothing due writes nothing to the log; and a mass expiry is swept in entries small
//! enough for every watch to follow.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::collections::BTreeSet;

use baton_node::config::WatchTuning;
use baton_node::sweeper;
use baton_rpc::{Event, Watch};
use baton_statemachine::board::TaskSpec;
use baton_statemachine::queue;
use baton_statemachine::{ChangeFilter, ChangeKind};
use futures::StreamExt;

mod support;
use support::Cluster;

/// Long enough that a sweep on the interval's tick could not pass for a prompt one.
const TICK: Duration = Duration::from_secs(30);
/// How late a prompt sweep may be heard: generous, so a loaded machine cannot fail the test, and
/// still far from what waiting for the tick would take.
const PROMPT: u64 = 10_000;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn next(events: &mut Watch) -> Event {
    tokio::time::timeout(Duration::from_secs(45), events.next())
        .await
        .expect("an event within 45 s")
        .expect("the watch goes on")
        .expect("an event, not an error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_swept_soon_after_its_deadline_not_at_the_next_tick() {
    let cluster = Cluster::start_custom(|config| config.sweep_interval = TICK).await;
    let client = &cluster.client;
    let tasks: Vec<TaskSpec> = ["early", "late"]
        .iter()
        .map(|id| TaskSpec {
            id: id.to_string(),
            deps: vec![],
        })
        .collect();
    client.seed(&tasks).await.unwrap();
    let mut lost = client
        .watch(ChangeFilter::all().kinds([ChangeKind::Lost]), None)
        .await;
    // The leader is asleep with nothing due; the late lease sets its alarm, the early one (claimed
    // after it, due before it) must move the alarm forward.
    let late = client.claim("late", "bob", 1_500).await.unwrap();
    let early = client.claim("early", "ann", 300).await.unwrap();
    for (id, lease) in [
        ("early", early.lease.unwrap()),
        ("late", late.lease.unwrap()),
    ] {
        let event = next(&mut lost).await;
        let heard = unix_ms();
        assert_eq!(
            (event.change.key.as_str(), event.change.fence),
            (id, lease.fence)
        );
        let after = heard.saturating_sub(lease.until_ms);
        assert!(
            after < PROMPT,
            "{id}: swept {after} ms after its deadline (the sweep interval is {TICK:?})"
        );
    }
    drop(lost);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_with_nothing_due_writes_nothing() {
    let cluster =
        Cluster::start_custom(|config| config.sweep_interval = Duration::from_millis(20)).await;
    let client = &cluster.client;
    client
        .seed(&[TaskSpec {
            id: "far".into(),
            deps: vec![],
        }])
        .await
        .unwrap();
    client.claim("far", "ann", 600_000).await.unwrap();
    let before = client.node_info(&cluster.addr).await.unwrap().applied_index;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let after = client.node_info(&cluster.addr).await.unwrap().applied_index;
    assert_eq!(after, before, "log entries written with nothing due");
    cluster.stop().await;
}

/// A keyed queue lease that runs out makes three changes (lost, key freed, leasable). 800 of them
/// falling due together were swept in one entry of 2,400 changes, more than this node's history
/// of 2,000 keeps: the history skipped the entry, and a watch positioned before it ended
/// `COMPACTED` however fast it read. The leader now sizes its sweeps to its budget (four fifths of
/// the 1,000 changes a stream may owe here), and a watch of the last ten keys hears each freed.
/// (A watch of everything that reads slower than the sweeps come may still be cut and find its
/// place evicted: the history is bounded; see docs/watch.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mass_expiry_of_keyed_leases_is_swept_in_entries_the_history_keeps() {
    const TASKS: usize = 800;
    // The leases' changes (three per task) fit in the history, so the watch's pump, which scans
    // them without a match, cannot fall out of it however late a loaded machine runs it (with
    // 2,000 it once did); the sweeps' budget is still well under the expiries' changes.
    let tuning = WatchTuning::with_history(4_000);
    assert!(sweeper::budget(&tuning).changes < 3 * TASKS);
    let cluster = Cluster::start_custom(|config| config.watch = tuning).await;
    let client = &cluster.client;
    client.create_queue("q", "ns").await.unwrap();
    client.register_worker("w", true).await.unwrap();
    let specs: Vec<queue::TaskSpec> = (0..TASKS)
        .map(|n| queue::TaskSpec {
            queue: "q".into(),
            idempotency_key: format!("task-{n:03}"),
            handler: "h".into(),
            handler_version: String::new(),
            payload_version: String::new(),
            payload: Vec::new(),
            concurrency_key: format!("key-{n:03}"),
            business_key: String::new(),
            max_attempts: 3,
            ttl_ms: 600_000,
        })
        .collect();
    futures::stream::iter(&specs)
        .for_each_concurrent(32, |spec| async move {
            client.submit(spec).await.unwrap();
        })
        .await;

    let mut last_keys = client
        .watch(
            ChangeFilter::all()
                .prefix("key-79")
                .kinds([ChangeKind::KeyFreed]),
            None,
        )
        .await;
    // Leased 100 at a time (a lease entry makes changes per task too, and this history is
    // small), each lease shorter by the time since the first, so that all fall due together.
    // Ten seconds for eight lease calls: a loaded machine does not run out of it.
    let mut leased = 0;
    let first_lease = std::time::Instant::now();
    while leased < TASKS {
        let ttl_ms = 10_000 - first_lease.elapsed().as_millis() as i64;
        assert!(ttl_ms > 500, "leasing took too long to end together");
        let got = client
            .lease("w", &[], 100, ttl_ms, Duration::ZERO)
            .await
            .unwrap();
        assert!(!got.is_empty(), "only {leased} of {TASKS} tasks leased");
        leased += got.len();
    }

    let mut freed = BTreeSet::new();
    while freed.len() < 10 {
        let event = next(&mut last_keys).await;
        assert_eq!(event.change.kind, ChangeKind::KeyFreed);
        freed.insert(event.change.key);
    }
    let expected: BTreeSet<String> = (790..800).map(|n| format!("key-{n}")).collect();
    assert_eq!(freed, expected);
    println!(
        "leased {TASKS} tasks, and heard the last ten keys freed, {:?} after the first lease",
        first_lease.elapsed()
    );
    drop(last_keys);
    cluster.stop().await;
}
