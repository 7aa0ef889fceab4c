//! Claim: deadlines run on the store clock the leader stamps (contract §0 "store clock",
//! "expiry is lazy and visible"): an offer's deadline is the leader's wall clock + ttl, a take
//! after the deadline is refused `EXPIRED`, the leader's sweep materialises an expiry nobody
//! touched, and afterwards `check` finds nothing overdue.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_cluster_test::{assert_check_clean, wait, wall_clock_ms, Cluster, Options};
use baton_rpc::Error;
use baton_statemachine::handoff::{OfferArgs, TicketState};
use baton_statemachine::Refusal;

fn offer(key: &str, ttl_ms: i64) -> OfferArgs {
    OfferArgs {
        key: key.into(),
        from: "source".into(),
        to: "worker".into(),
        payload: Vec::new(),
        reply_to: "source".into(),
        ttl_ms,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t15_deadlines_follow_the_leader_stamped_store_clock() {
    let options = Options {
        sweep_interval: Duration::from_millis(200),
        ..Options::default()
    };
    let cluster = Cluster::start(3, options).await.unwrap();
    let client = cluster.client().await.unwrap();

    // The nodes run on this machine, so the leader's clock is this clock (give or take a
    // wall-clock adjustment while the offer was in flight).
    const SLACK_MS: u64 = 1_000;
    let ttl: u64 = 600_000;
    let before = wall_clock_ms();
    let long = client.offer(offer("t15-long", ttl as i64)).await.unwrap();
    let after = wall_clock_ms();
    assert!(
        long.deadline_ms + SLACK_MS >= before + ttl && long.deadline_ms <= after + ttl + SLACK_MS,
        "deadline {} is not the stamped clock + ttl (wall clock {before}..{after} + {ttl})",
        long.deadline_ms
    );

    // A take after the deadline is refused EXPIRED and the ticket becomes expired.
    let short = client.offer(offer("t15-late-take", 300)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    match client.take("t15-late-take", "worker").await {
        Err(Error::Refused(Refusal::Expired)) => {}
        other => panic!(
            "late take of a ticket with deadline {}: {other:?}",
            short.deadline_ms
        ),
    }
    assert_eq!(
        client.ticket("t15-late-take").await.unwrap().state,
        TicketState::Expired
    );

    // Nobody touches this one: the leader's sweep must expire it.
    client.offer(offer("t15-swept", 300)).await.unwrap();
    let swept = wait::until(
        "the sweep to expire t15-swept",
        Duration::from_secs(10),
        || async {
            match client.ticket("t15-swept").await {
                Ok(ticket) if ticket.state == TicketState::Expired => Ok(ticket),
                Ok(ticket) => Err(format!("state {}", ticket.state.as_str())),
                Err(error) => Err(error.to_string()),
            }
        },
    )
    .await
    .unwrap();

    // A listing is judged (`check`) at the store's clock now, not at the last entry's stamp,
    // which an idle store leaves behind: a leftover the sweep has not reached yet must show as
    // overdue.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let before = wall_clock_ms();
    let tickets = client.tickets().await.unwrap();
    let tasks = client.tasks().await.unwrap();
    let after = wall_clock_ms();
    for (listing, now_ms) in [("tickets", tickets.now_ms), ("tasks", tasks.now_ms)] {
        assert!(
            now_ms + SLACK_MS >= before && now_ms <= after + SLACK_MS,
            "the {listing} listing's now {now_ms} is not the store clock (wall clock \
             {before}..{after}) after 2.5 s without a write"
        );
    }

    assert_check_clean(&client).await;
    println!(
        "t15: deadline = stamped clock + ttl; late take EXPIRED; sweep expired an untouched ticket \
         (deadline {}); check clean",
        swept.deadline_ms
    );
}
