//! Claim: store time never runs backwards across leaders (contract §0, "store clock": the state
//! machine keeps `clock = max(clock, stamp)`), on real processes whose wall clocks disagree —
//! node 3 runs two minutes behind the others (libfaketime, [`clock_skew`]):
//!
//! - while node 3 leads, store time stands still at the newest time node 1 stamped (node 3's
//!   stamps are all older): checkpoints saved under it a second and a half apart carry the same
//!   store time, never an older one (this also shows the skew took effect);
//! - a ticket offered under node 3 gets its deadline from that store time, not from node 3's
//!   clock: back under node 1 the ticket can still be taken (with node 3's stamp as the clock,
//!   its deadline would have passed 90 s before it was offered, and the take would be
//!   `EXPIRED`);
//! - store times of saves never go back across the handovers, and `check` finds nothing wrong.
//!
//! Skipped with a message where libfaketime is missing (`BATON_REQUIRE_FAKETIME=1` makes that a
//! failure; CI installs it).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use baton_cluster_test::{assert_check_clean, clock_skew, wall_clock_ms, Cluster, Options};
use baton_rpc::Client;
use baton_statemachine::handoff::{OfferArgs, TicketState};

/// Node 3's wall clock against everyone else's, in seconds.
const NODE_3_OFFSET_S: i64 = -120;
/// The ticket's TTL: far shorter than the skew, far longer than the handovers take.
const TTL_MS: u64 = 30_000;

/// Makes `id` the leader (a handover can end with another node winning: asked again).
async fn lead(cluster: &Cluster, client: &Client, id: u64) -> u64 {
    for _ in 0..10 {
        let _ = client.transfer_leader(Some(id)).await;
        if cluster.leader().await.unwrap() == id {
            return cluster.node_info(id).await.unwrap().term;
        }
    }
    panic!("node {id} did not become the leader in 10 handovers");
}

/// Saves `seq` for the test's run and returns the store time the save got.
async fn save(client: &Client, seq: u64) -> u64 {
    client
        .save_if_newer("t16", seq, format!("save {seq}").as_bytes())
        .await
        .unwrap();
    let saved = client.load("t16").await.unwrap();
    assert_eq!(saved.seq, seq);
    saved.saved_at_ms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t16_a_leader_whose_clock_is_behind_never_turns_store_time_back() {
    let Some(skewed) = clock_skew::offset_env_or_skip("t16", NODE_3_OFFSET_S).unwrap() else {
        return;
    };
    let options = Options {
        env: BTreeMap::from([(3, skewed)]),
        ..Options::default()
    };
    let cluster = Cluster::start(3, options).await.unwrap();
    let client = cluster.client().await.unwrap();

    // Under node 1, store time is this machine's clock.
    lead(&cluster, &client, 1).await;
    let before = wall_clock_ms();
    let under_1 = save(&client, 1).await;
    assert!(
        under_1 + 1_000 >= before && under_1 <= wall_clock_ms() + 1_000,
        "node 1 stamped {under_1}, the wall clock read {before}"
    );

    // Under node 3 it stands still: node 3's stamps are two minutes older. An election in the
    // middle (node 1 stamping again) would move it: then the phase is run again.
    let mut seq = 1;
    let (standing, ticket) = 'phase: {
        for _ in 0..3 {
            let term = lead(&cluster, &client, 3).await;
            let first = save(&client, seq + 1).await;
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            let second = save(&client, seq + 2).await;
            let offered = client
                .offer(OfferArgs {
                    key: "t16".into(),
                    from: "source".into(),
                    to: "worker".into(),
                    payload: Vec::new(),
                    reply_to: "source".into(),
                    ttl_ms: TTL_MS as i64,
                })
                .await
                .unwrap();
            seq += 2;
            assert!(
                first >= under_1 && second >= first,
                "store time went back: {under_1} under node 1, then {first} and {second} under \
                 node 3"
            );
            let info = cluster.node_info(3).await.unwrap();
            if info.role == "leader" && info.term == term {
                assert_eq!(
                    second, first,
                    "store time moved on while node 3 (clock {NODE_3_OFFSET_S} s) led: is the \
                     clock skewed?"
                );
                break 'phase (second, offered);
            }
            client.cancel("t16", "source").await.unwrap();
        }
        panic!("node 3 never kept the lead through the phase");
    };
    assert_eq!(
        ticket.deadline_ms,
        standing + TTL_MS,
        "the deadline of a ticket offered under node 3 is not store time + TTL"
    );

    // Back under node 1 the ticket is still live and can be taken.
    lead(&cluster, &client, 1).await;
    let handle = client.take("t16", "worker").await.unwrap_or_else(|error| {
        panic!(
            "take under node 1 of the ticket offered under node 3 (deadline {}): {error}",
            ticket.deadline_ms
        )
    });
    assert_eq!(handle.fence, ticket.generation);
    assert_eq!(
        client.ticket("t16").await.unwrap().state,
        TicketState::Accepted
    );
    let after = save(&client, seq + 1).await;
    assert!(
        after >= standing,
        "store time went back from {standing} to {after} when node 1 led again"
    );

    assert_check_clean(&client).await;
    println!(
        "t16: store time stood at {standing} while node 3 ({NODE_3_OFFSET_S} s) led; its ticket \
         (deadline {}) was taken under node 1; store time {after} afterwards",
        ticket.deadline_ms
    );
}
