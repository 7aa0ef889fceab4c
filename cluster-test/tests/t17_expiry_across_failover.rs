//! Claim: deadlines outlive the leader that set them (contract §0, "expiry is lazy and visible";
//! §1 `reply`: "past deadline -> `EXPIRED` (late receipts are refused, fail-closed)"; §3: "an
//! intent that expires unresolved turns the key uncertain — never a fresh grant"). A ticket is
//! taken and a side effect acquired under one leader; the leader is SIGKILLed, another is
//! elected, and both deadlines pass under it:
//!
//! - the holder's late reply is refused `EXPIRED`, the ticket reads expired in generation 1, and
//!   a new offer starts generation 2 (the late receipt never closed the old one);
//! - a fresh acquire of the effect's key answers `uncertain`, never `granted`, and `show` says
//!   uncertain; the resource itself is free again and its next grant (another key) gets the next
//!   fence;
//! - the old leader, restarted, catches up and agrees.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_cluster_test::{assert_check_clean, wall_clock_ms, Cluster, Options};
use baton_rpc::Error;
use baton_statemachine::effect::{Action, KeyStatus, Outcome, RetrySafety};
use baton_statemachine::handoff::{OfferArgs, Receipt, ReceiptStatus, TicketState};
use baton_statemachine::Refusal;

/// Long enough for the take, the acquire and the kill to happen under the first leader.
const TTL_MS: i64 = 3_000;

fn offer() -> OfferArgs {
    OfferArgs {
        key: "t17".into(),
        from: "source".into(),
        to: "worker".into(),
        payload: b"job".to_vec(),
        reply_to: "source".into(),
        ttl_ms: TTL_MS,
    }
}

fn action(key: &str) -> Action {
    Action {
        key: key.into(),
        resource: "t17-resource".into(),
        safety: RetrySafety::Safe,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t17_deadlines_set_under_a_dead_leader_are_judged_by_the_next() {
    let mut cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();

    let ticket = client.offer(offer()).await.unwrap();
    let handle = client.take("t17", "worker").await.unwrap();
    let lease = match client.acquire(&action("t17-effect"), TTL_MS).await.unwrap() {
        Outcome::Granted(lease) => lease,
        other => panic!("the first acquire answered {other:?}"),
    };

    let old = cluster.leader().await.unwrap();
    let term = cluster.node_info(old).await.unwrap().term;
    cluster.kill(old).unwrap();
    let others: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != old).collect();
    let new = cluster
        .new_leader(&others, term, Duration::from_secs(20))
        .await
        .unwrap();
    let past = ticket.deadline_ms.max(lease.until_ms) + 300;
    let now = wall_clock_ms();
    if now < past {
        tokio::time::sleep(Duration::from_millis(past - now)).await;
    }

    // The late receipt is refused, fail-closed, and the ticket reads expired.
    let receipt = Receipt {
        status: ReceiptStatus::Done,
        summary: "done, but late".into(),
        failure: String::new(),
        artifacts: Vec::new(),
    };
    match client.reply("t17", &handle.token, &receipt).await {
        Err(Error::Refused(Refusal::Expired)) => {}
        other => panic!("a reply past the deadline, under node {new}, answered {other:?}"),
    }
    let read = client.ticket("t17").await.unwrap();
    assert_eq!((read.generation, read.state), (1, TicketState::Expired));
    assert!(read.receipt.is_none(), "the late receipt was stored");
    let again = client.offer(offer()).await.unwrap();
    assert_eq!((again.generation, again.state), (2, TicketState::Offered));

    // The effect's key is uncertain, never granted again; its resource is free.
    let retried = client.acquire(&action("t17-effect"), TTL_MS).await.unwrap();
    assert!(
        matches!(retried, Outcome::Uncertain),
        "an acquire after the intent ran out under node {new} answered {retried:?}"
    );
    let shown = client.show_action("t17-effect").await.unwrap();
    assert_eq!(shown.status, KeyStatus::Uncertain);
    match client.acquire(&action("t17-other"), TTL_MS).await.unwrap() {
        Outcome::Granted(next) => assert_eq!(next.fence, lease.fence + 1),
        other => panic!("the free resource answered {other:?}"),
    }

    // The old leader comes back, catches up and agrees.
    cluster.restart(old).await.unwrap();
    cluster.wait_all_caught_up().await.unwrap();
    let info = cluster.node_info(old).await.unwrap();
    assert_ne!(info.role, "leader");
    // Its state is the leader's, not only its applied index: digests of both at one index.
    baton_cluster_test::wait::until(
        "the old leader's state to match the new leader's",
        Duration::from_secs(10),
        || async {
            let (theirs, ours) = (
                cluster.state_digest(new).await.map_err(|e| e.to_string())?,
                cluster.state_digest(old).await.map_err(|e| e.to_string())?,
            );
            if (theirs.applied_index, &theirs.digest) == (ours.applied_index, &ours.digest) {
                Ok(())
            } else {
                Err(format!("leader {theirs:?}, old leader {ours:?}"))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        client.ticket("t17").await.unwrap().generation,
        2,
        "after the old leader's return"
    );
    assert_check_clean(&client).await;
    println!(
        "t17: node {old} killed, node {new} judged the deadlines: late reply EXPIRED, effect key \
         uncertain, resource's next fence {}",
        lease.fence + 1
    );
}
