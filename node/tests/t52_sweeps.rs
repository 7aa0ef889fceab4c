//! The leader's sweeps against an in-process single-node cluster (docs/design.md "Expiry"): a
//! lease is swept as soon as it falls due — the leader sleeps until the earliest deadline and
//! wakes when a command brings an earlier one — not at the next `sweep_interval` tick; and a
//! leader with nothing due writes nothing to the log.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton_rpc::{Event, Watch};
use baton_statemachine::board::TaskSpec;
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
