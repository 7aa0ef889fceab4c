//! Claim: on a real three-node cluster, 32 takers racing for one ticket produce exactly one
//! winner and 31 `TAKEN` losers, round after round, with no infrastructure failure
//! (contract §0 "one command = one atomic step", §1 `take` and the `concurrent_take` judge).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use baton_cluster_test::{Cluster, Options};
use baton_rpc::judge::concurrent_take;
use baton_statemachine::handoff::{OfferArgs, TicketState};

const ROUNDS: usize = 50;
const TAKERS: usize = 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_32_takers_one_winner_31_taken_for_50_rounds() {
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    let started = Instant::now();
    for round in 0..ROUNDS {
        let key = format!("race-{round}");
        let offered = client
            .offer(OfferArgs {
                key: key.clone(),
                from: "source".into(),
                to: "racer".into(),
                payload: Vec::new(),
                reply_to: "source".into(),
                ttl_ms: 600_000,
            })
            .await
            .unwrap();
        assert_eq!(
            offered.generation, 1,
            "{key}: a fresh key starts at generation 1"
        );

        let takers = vec!["racer".to_string(); TAKERS];
        let race = concurrent_take(&client, &key, &takers, Duration::from_secs(20)).await;
        assert!(
            race.infra_errors.is_empty(),
            "round {round}: infrastructure errors {:?}",
            race.infra_errors
        );
        assert!(
            race.misses.is_empty(),
            "round {round}: takers refused for other reasons {:?}",
            race.misses
        );
        assert_eq!(
            race.winners.len(),
            1,
            "round {round}: winners {:?}",
            race.winners
        );
        assert_eq!(race.losers, TAKERS - 1, "round {round}: losers");
        race.verdict().unwrap();

        let ticket = client.ticket(&key).await.unwrap();
        assert_eq!(ticket.state, TicketState::Accepted, "{key}");
        assert_eq!(ticket.holder.as_deref(), Some("racer"), "{key}");
        assert_eq!(
            race.winners[0].fence, ticket.generation,
            "{key}: the fence is the generation"
        );
    }
    println!(
        "t10: {ROUNDS} rounds x {TAKERS} takers: 1 winner + {} TAKEN each, 0 infra errors, {:.1}s",
        TAKERS - 1,
        started.elapsed().as_secs_f64()
    );
}
