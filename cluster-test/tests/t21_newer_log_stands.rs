//! Claim: after the leader dies, a survivor that refuses a candidate because its own log is newer
//! stands for election at once instead of waiting out its own election timer
//! (`node/src/pre_vote.rs` for a pre-vote, `node/src/newer_log_stands.rs` for a real vote; the
//! failover target of issue 6, "writes resume within 1 s").
//!
//! Three nodes; node 3 is given a long election timeout (8 s: a leader lease of 16 s and its own
//! timer at 24–32 s after it last heard from a leader), node 2 the default. Node 2 is frozen
//! (SIGSTOP) while more offers are acknowledged by nodes 1 and 3, so node 2's log is older. Then
//! the leader is killed and, once node 3's lease has run out, node 2 is thawed: it asks first,
//! and only node 3 can win (its vote is needed and its log is newer). Without the rule node 3
//! would campaign only when its own timer fires, at least 24 s after the kill; with it, node 3
//! stands as soon as node 2 asks for its (pre-)vote, 17–18 s after the kill, leaving a busy
//! machine some 6 s before that timer. (With a 4 s timeout, run without the rule before pre-votes,
//! node 3 did not lead within 24 s at all: node 2, with its shorter timer, stood again in ever
//! higher terms, and node 3's own candidacies came too late each time, a livelock. With
//! pre-votes and without the rule, node 3 led 14 s after the kill, on its own timer.) The offers
//! acknowledged while node 2 was frozen must all be readable through the new leader.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use baton_cluster_test::{offer_a_to_b, wait, Cluster, Options};

/// Node 3's `--election-timeout` (its maximum and leader lease are twice this). Long, so that
/// standing on a refusal (about `2 * SLOW` + 1.7 s after the kill) and standing on its own timer
/// (`3 * SLOW` at least) are far apart.
const SLOW: Duration = Duration::from_secs(8);

/// A survivor that refuses a candidate for its older log stands at once, and leads before its
/// own election timer could have fired; what the old leader acknowledged is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t21_the_survivor_with_the_newer_log_stands_when_refusing_a_candidate() {
    let options = Options {
        election_timeouts: [(3, SLOW)].into_iter().collect(),
        timeout: Duration::from_secs(30),
        ..Options::proxied()
    };
    let mut cluster = Cluster::start(3, options).await.unwrap();
    let client = cluster.client().await.unwrap();
    if cluster.leader().await.unwrap() != 1 {
        client.transfer_leader(Some(1)).await.unwrap();
    }
    assert_eq!(cluster.leader().await.unwrap(), 1, "node 1 must lead");
    for n in 0..5 {
        client
            .offer(offer_a_to_b(format!("t21-before-{n}")))
            .await
            .unwrap();
    }
    cluster.wait_all_caught_up().await.unwrap();

    // Node 1's link to node 2 is cut before node 2 freezes: otherwise what node 1 sends the
    // frozen node waits in its socket, and once thawed node 2 would take those entries from the
    // dead leader, which restarts its leader lease, and refuse node 3's vote by lease (seen in
    // CI: node 3's first election lost that way, and the next waited for its 4 s timeout).
    cluster.network().unwrap().cut(1, 2);
    cluster.pause(2).unwrap();
    for n in 0..20 {
        client
            .offer(offer_a_to_b(format!("t21-frozen-{n}")))
            .await
            .unwrap();
    }
    let leader_log = cluster.node_info(1).await.unwrap().last_log_index;
    cluster.wait_caught_up(3, leader_log).await.unwrap();

    let logged_before_kill = cluster.log_of_last_run(3).len();
    cluster.kill(1).unwrap();
    let killed_at = Instant::now();
    // Node 3 refuses every vote while its lease (twice SLOW since it last heard from node 1)
    // runs; thaw node 2 once it has run out, so node 2's candidacy is refused for its log only.
    tokio::time::sleep(SLOW * 2 + Duration::from_millis(500)).await;
    cluster.resume(2).unwrap();
    let resumed_at = killed_at.elapsed();

    let own_timer = SLOW * 3;
    let info = wait::until("node 3 to lead", own_timer * 2, || async {
        match cluster.node_info(3).await {
            Ok(info) if info.role == "leader" => Ok(info),
            Ok(info) => Err(format!("node 3 is {} in term {}", info.role, info.term)),
            Err(error) => Err(error.to_string()),
        }
    })
    .await
    .unwrap();
    let led_after = killed_at.elapsed();
    eprintln!(
        "node 2 thawed {resumed_at:?} and node 3 led {led_after:?} after the kill (term {})",
        info.term
    );
    // Node 3 stood because it refused node 2 (either rule logs it), and before its own timer
    // could fire: not before 3 x SLOW after its last word from node 1, which came just before
    // the kill. (Node 2 asks at most its own lease and timeout, 1.2 s, after it thaws, at
    // 2 x SLOW + 0.5 s: 6 s before that timer.)
    let log = cluster.log_of_last_run(3);
    let log = log.get(logged_before_kill..).unwrap_or_default();
    assert!(
        log.contains("pre-vote refused; standing at once")
            || log.contains("refused a candidate with an older log; standing"),
        "node 3 never stood on refusing node 2; it led {led_after:?} after the kill"
    );
    assert!(
        led_after < own_timer,
        "node 3 led {led_after:?} after the kill: it waited for its own timer ({own_timer:?}) \
         instead of standing when it refused node 2"
    );

    for n in 0..20 {
        let key = format!("t21-frozen-{n}");
        let ticket = client.ticket(&key).await.unwrap();
        assert_eq!(ticket.key, key);
    }
    client.offer(offer_a_to_b("t21-after")).await.unwrap();
}
