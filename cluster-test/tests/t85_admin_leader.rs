//! Claims: leadership can be handed over on purpose, and a leader that gets SIGTERM hands it
//! over before it exits.
//!
//! - `baton leader transfer --to N` makes voter N the leader and prints it; without `--to` the
//!   leadership moves to another voter; the data is intact either way.
//! - SIGTERM on the leader of a three-node cluster under light write load: the process exits 0,
//!   a new leader is elected (the gap without a leader is printed, never asserted), and every
//!   write acknowledged before, during and after the shutdown can be read back.
#![allow(clippy::unwrap_used)]

mod admin_support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admin_support::{show, Procs, TIMEOUT};
use baton_cluster_test::{Cluster, Options};
use baton_rpc::Security;

/// What a leader logs when its handover's drain ran out with client requests still admitted.
const DRAIN_TIMED_OUT: &str = "handing over with client requests still in flight";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_transfer_moves_leadership_to_the_chosen_voter() {
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    client.save_if_newer("before", 7, b"kept").await.unwrap();
    let first = cluster.leader().await.unwrap();
    let target = cluster.ids().into_iter().find(|id| *id != first).unwrap();
    let endpoints = cluster.endpoints().join(",");

    let output = std::process::Command::new(cluster.bin())
        .args(["--endpoints", &endpoints, "leader", "transfer", "--to"])
        .arg(target.to_string())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!("leader: node {target} at")),
        "{stdout}"
    );
    assert_eq!(cluster.leader().await.unwrap(), target);

    let output = std::process::Command::new(cluster.bin())
        .args(["--endpoints", &endpoints, "leader", "transfer"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", show(&output));
    let next = cluster.leader().await.unwrap();
    assert_ne!(next, target, "leadership moved on again");
    println!("handovers: {first} -> {target} -> {next}");

    let output = std::process::Command::new(cluster.bin())
        .args([
            "--endpoints",
            &endpoints,
            "leader",
            "transfer",
            "--to",
            "99",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "{}", show(&output));

    let read = client.load("before").await.unwrap();
    assert_eq!((read.seq, read.data.as_slice()), (7, &b"kept"[..]));
    client.save_if_newer("after", 1, b"new").await.unwrap();
}

/// A worker's long poll waiting on the leader does not hold a handover up: the poll is answered
/// retryably when the gate closes (the handover's drain does not wait out its 5 s limit), and it
/// goes on waiting on the new leader, where a task submitted afterwards reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_does_not_hold_a_handover_up() {
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    client.create_queue("t85", "ns").await.unwrap();
    client.register_worker("t85-w", false).await.unwrap();
    let first = cluster.leader().await.unwrap();
    let polling = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lease(
                    "t85-w",
                    &["t85".to_string()],
                    1,
                    30_000,
                    Duration::from_secs(25),
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !polling.is_finished(),
        "the poll should wait: nothing is leasable"
    );

    let handed = client.transfer_leader(None).await.unwrap();
    println!(
        "handover {first} -> {} with a long poll waiting took {} ms",
        handed.leader_id, handed.took_ms
    );
    // A drain that ran out its limit with a request still admitted says so in the old leader's
    // log (node/src/handover.rs); the poll was the only client request in flight.
    let log = cluster.log_of_last_run(first);
    assert!(
        !log.contains(DRAIN_TIMED_OUT),
        "the handover took {} ms: its drain (5 s at most) waited for the long poll:\n{}",
        handed.took_ms,
        cluster.log_tail(first, 20)
    );

    let spec = baton_statemachine::queue::TaskSpec {
        queue: "t85".into(),
        idempotency_key: "after-handover".into(),
        handler: "h".into(),
        handler_version: "v1".into(),
        payload_version: "v1".into(),
        payload: Vec::new(),
        concurrency_key: String::new(),
        business_key: String::new(),
        max_attempts: 1,
        ttl_ms: 600_000,
    };
    let id = client.submit(&spec).await.unwrap().task.id;
    let leased = tokio::time::timeout(Duration::from_secs(20), polling)
        .await
        .expect("the poll did not come back")
        .unwrap()
        .unwrap();
    assert_eq!(
        leased.iter().map(|a| a.task_id).collect::<Vec<_>>(),
        vec![id],
        "the poll, moved to the new leader, should lease the task submitted after the handover"
    );
}

/// A handover whose caller goes away mid-way (its call dropped after 300 ms, while the leader has
/// heartbeats off and its gate closed) leaves the old leader serving: it answers client requests
/// again, and no election storm follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_whose_caller_goes_away_leaves_the_old_leader_serving() {
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    client.save_if_newer("before", 1, b"kept").await.unwrap();
    let old = cluster.leader().await.unwrap();
    let target = cluster.ids().into_iter().find(|id| *id != old).unwrap();

    let asked = tokio::time::timeout(
        Duration::from_millis(300),
        client.transfer_leader(Some(target)),
    )
    .await;
    assert!(
        asked.is_err(),
        "the handover answered within 300 ms: {asked:?}"
    );

    // Whoever leads once things settle, the old leader must take client requests again: a client
    // that knows only that node reads through it (served there, or redirected to the leader).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let only_old = baton_rpc::Client::new(
        &[cluster.addr(old).to_string()],
        baton_rpc::ClientConfig {
            deadline: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .unwrap();
    let read = only_old.load("before").await;
    assert!(
        matches!(&read, Ok(saved) if saved.data == b"kept"),
        "node {old} still refuses client requests after the abandoned handover: {read:?}"
    );

    // And the leadership is stable: the term does not keep climbing (a leader with heartbeats
    // off is unseated every lease).
    cluster.leader().await.unwrap();
    let first = highest_term(&cluster).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let second = highest_term(&cluster).await;
    assert_eq!(
        first, second,
        "elections went on after the abandoned handover"
    );
    only_old.save_if_newer("after", 1, b"new").await.unwrap();
}

/// A handover to a voter that is down fails at once (the `TimeoutNow` never left), rather than
/// waiting out an election per attempt with the gate closed; writes go on through the old
/// leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_a_stopped_voter_fails_at_once() {
    let mut cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    client.save_if_newer("before", 1, b"kept").await.unwrap();
    let leader = cluster.leader().await.unwrap();
    let down = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    // The voter stopped holds the whole log, as in a handover to a caught-up voter: what is
    // measured is the TimeoutNow that cannot leave, not a wait for the voter to catch up.
    cluster.wait_all_caught_up().await.unwrap();
    cluster.kill(down).unwrap();

    let asked = Instant::now();
    let answer = client.transfer_leader(Some(down)).await;
    let took = asked.elapsed();
    match &answer {
        Err(baton_rpc::Error::Server { code, .. }) => assert_eq!(code, "HANDOVER_FAILED"),
        other => panic!("expected HANDOVER_FAILED, got {other:?}"),
    }
    println!("handover to a stopped voter answered in {took:?}");
    assert!(
        took < Duration::from_secs(2),
        "the handover to a stopped voter took {took:?}"
    );
    assert_eq!(cluster.leader().await.unwrap(), leader);
    client.save_if_newer("after", 1, b"new").await.unwrap();
}

/// The highest term any node reports.
async fn highest_term(cluster: &Cluster) -> u64 {
    let mut highest = 0;
    for id in cluster.ids() {
        highest = highest.max(cluster.node_info(id).await.unwrap().term);
    }
    highest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_the_leader_hands_over_and_loses_no_acknowledged_write() {
    let mut procs = Procs::new(Security::default()).unwrap();
    let leader = procs.form_cluster(3, &[]).await.unwrap();
    let client = procs.client(Security::default()).await.unwrap();

    // Light load: one writer, one write at a time, each acknowledged write remembered.
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (client, acked, stop) = (client.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut slowest = Duration::ZERO;
            for i in 0..100_000u64 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let run = format!("run-{i}");
                let sent = Instant::now();
                let answer = client.save_if_newer(&run, 1, run.as_bytes()).await;
                slowest = slowest.max(sent.elapsed());
                match answer {
                    Ok(()) => acked.lock().unwrap().push(run),
                    Err(error) => failures.push(format!("{run}: {error}")),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (failures, slowest)
        })
    };
    wait_acked(&acked, 20).await;

    let before = acked.lock().unwrap().len();
    let sent = Instant::now();
    let status = tokio::task::block_in_place(|| procs.terminate(leader, TIMEOUT)).unwrap();
    let exited = sent.elapsed();
    assert!(
        status.success(),
        "exit status {status}\n{}",
        procs.log_tail(leader)
    );

    // The survivors name a new leader.
    let survivors: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let new_leader = procs.leader().await.unwrap();
    assert!(survivors.contains(&new_leader));
    let log = std::fs::read_to_string(procs.dir().join(format!("node-{leader}.log"))).unwrap();
    assert!(
        log.contains("leadership handed over before shutdown"),
        "the leader handed over rather than leaving an election to the timeout\n{}",
        procs.log_tail(leader)
    );
    let gap = log
        .lines()
        .find(|line| line.contains("handed leadership over"))
        .unwrap_or("")
        .to_string();
    println!("SIGTERM -> exit: {exited:?}; handover: {gap}");

    // Writes go on against the new leader, then stop.
    let target = acked.lock().unwrap().len() + 20;
    wait_acked(&acked, target).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (failures, slowest) = writer.await.unwrap();
    let acked = acked.lock().unwrap().clone();
    println!(
        "{} writes acknowledged ({before} before SIGTERM), slowest write {slowest:?} \
         (the client-visible gap), {} failed: {:?}",
        acked.len(),
        failures.len(),
        failures.iter().take(3).collect::<Vec<_>>()
    );

    let mut missing = BTreeSet::new();
    for run in &acked {
        match client.load(run).await {
            Ok(saved) if saved.data == run.as_bytes() => {}
            other => {
                missing.insert(format!("{run}: {other:?}"));
            }
        }
    }
    assert!(missing.is_empty(), "acknowledged writes lost: {missing:?}");
}

/// Waits until at least `n` writes have been acknowledged.
async fn wait_acked(acked: &Arc<Mutex<Vec<String>>>, n: usize) {
    let started = Instant::now();
    while acked.lock().unwrap().len() < n {
        assert!(
            started.elapsed() < TIMEOUT,
            "only {} writes acknowledged in {TIMEOUT:?}",
            acked.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SIGTERM ends a leader that lost both followers, though it can commit nothing: its sweeper,
/// proposing a deadline that fell due, waited for an entry no quorum would ever commit, and the
/// shutdown waited for the sweeper, so the process never exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_leader_that_lost_its_quorum() {
    let mut procs = Procs::new(Security::default()).unwrap();
    let leader = procs.form_cluster(3, &[]).await.unwrap();
    let client = procs.client(Security::default()).await.unwrap();
    // A deadline that falls due once the followers are gone: the leader's sweeper proposes it.
    client
        .offer(baton_statemachine::handoff::OfferArgs {
            key: "due".into(),
            from: "a".into(),
            to: "b".into(),
            payload: Vec::new(),
            reply_to: "a".into(),
            ttl_ms: 3_000,
        })
        .await
        .unwrap();
    for id in [1, 2, 3].into_iter().filter(|id| *id != leader) {
        tokio::task::block_in_place(|| procs.terminate(id, TIMEOUT)).unwrap();
    }
    tokio::time::sleep(Duration::from_secs(5)).await;

    let asked = Instant::now();
    let status = tokio::task::block_in_place(|| procs.terminate(leader, Duration::from_secs(90)))
        .unwrap_or_else(|e| panic!("{e}: {}", procs.log_tail(leader)));
    println!(
        "the leader without a quorum exited {status} {:?} after SIGTERM",
        asked.elapsed()
    );
    // A clean stop, not one that gave up (or panicked) on the proposal no quorum commits.
    assert!(
        status.success(),
        "exit status {status}\n{}",
        procs.log_tail(leader)
    );
}
