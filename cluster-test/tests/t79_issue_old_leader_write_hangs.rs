//! Regression `t79_issue_old_leader_write_hangs`, found by the robustness suite: in
//! `isolate-leader` (and `mixed`) runs the writes the nemesis sends straight to the isolated old
//! leader were sometimes never answered after the partition healed — each probe ran into its own
//! 10 s timeout (debug `--seed 5 --scenario mixed --fault-time 20s --verbose`: `take probe-1` and
//! `offer probe-1-via-old-leader` => `Cancelled: Timeout expired` 7 s after the heal; release
//! soak seed 4192871935: 2 faults in 18 s because each round waited for its probes). Whether a
//! run hits it depends on the interleaving (an old leader that also appended enough writes of the
//! workload's clients gets them truncated as a conflict, which answers them); this test
//! reproduces it every time.
//!
//! A write sent to a leader that was then cut off was never answered once the partition healed if
//! the old leader had fallen so far behind that it caught up by snapshot: its client waited until
//! its own timeout instead of getting `NOT_LEADER`. Safety holds (the write is not committed), but
//! a client without a timeout hung forever and a server-side request stayed pending.
//!
//! Cause (openraft 0.9.25): a pending client write is answered `ForwardToLeader` only when its
//! entry is truncated as a conflict (`Command::DeleteConflictLog` in `core/raft_core.rs`) or
//! applied. `install_full_snapshot` (`engine/handler/following_handler/mod.rs`) truncates only
//! when the local log has a conflicting entry at the snapshot's last index; an old leader whose
//! log ends below that index has its uncommitted entries purged under the snapshot, and their
//! responders are resolved by neither path.
//!
//! Fixed in `node/src/deposed.rs`: a pending write is answered `NOT_LEADER` as soon as the node
//! learns of another leader; the client's retry with the same `(client_id, seq)` is answered from
//! the session table if the entry did commit after all. The same hang held a fresh leader's first
//! read (it waits for an entry of the leader's term to commit, and that entry was purged the same
//! way) until the client's deadline: `t79_issue_old_leader_read_hangs`.
//!
//! The first test is the control: the same partition and the same 200 majority writes, healed
//! while the old leader can still catch up from the log; its pending write is answered
//! `NOT_LEADER` within a fraction of a second.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use baton_cluster_test::{client_config, wait, Cluster, Options};
use baton_rpc::error::detail_of;
use baton_rpc::proto::handoff_client::HandoffClient;
use baton_rpc::proto::{GetTicketRequest, OfferRequest, RequestHeader};
use baton_rpc::Client;
use baton_statemachine::handoff::OfferArgs;
use tonic::transport::Endpoint;

/// How long the old leader may take to answer its pending write once the partition healed.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);

/// What a node logs once it has stored a snapshot its leader sent it.
const INSTALLED: &str = "installed snapshot";

/// How the old leader is to catch up once healed.
#[derive(Clone, Copy)]
enum CatchUp {
    /// From the log: the majority's leader still holds every entry it lacks.
    FromLog,
    /// By a snapshot: the majority's leader purged the entries it lacks.
    BySnapshot,
}

fn offer(key: &str) -> OfferArgs {
    OfferArgs {
        key: key.into(),
        from: "src".into(),
        to: "dst".into(),
        payload: Vec::new(),
        reply_to: "src".into(),
        ttl_ms: 600_000,
    }
}

/// What the isolated old leader is sent.
#[derive(Clone, Copy)]
enum Pending {
    /// A write: its entry is appended on the old leader and never commits.
    Write,
    /// A linearizable read, the first in the old leader's term: it waits for the entry the
    /// leader commits before its first read (`Node::commit_in_current_term`), which never commits.
    Read,
}

/// Isolates the leader, sends it one `pending` request, lets the majority commit `writes`
/// entries, heals, checks that the old leader caught up as `catch_up` says (by its log), and
/// returns how long after healing it answered the pending request, the answer, and its snapshot
/// index once it caught up.
async fn pending_after_heal(
    options: Options,
    pending: Pending,
    writes: usize,
    catch_up: CatchUp,
) -> (Option<Duration>, String, u64) {
    let cluster = Cluster::start(3, options).await.unwrap();
    let old = cluster.leader().await.unwrap();
    let term = cluster.node_info(old).await.unwrap().term;
    let channel = Endpoint::from_shared(format!("http://{}", cluster.addr(old)))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .connect_lazy();
    cluster.network().unwrap().isolate(old);

    let pending = tokio::spawn(async move {
        if let Pending::Read = pending {
            let request = GetTicketRequest {
                key: "t79-pending".into(),
            };
            let answer = HandoffClient::new(channel).get(request).await.map(|_| ());
            return (Instant::now(), answer);
        }
        let request = OfferRequest {
            header: Some(RequestHeader {
                client_id: rand::random(),
                seq: 1,
                acked_below: 1,
                ..Default::default()
            }),
            key: "t79-pending".into(),
            from: "src".into(),
            to: "dst".into(),
            payload: Vec::new(),
            reply_to: "src".into(),
            ttl_ms: 600_000,
        };
        let answer = HandoffClient::new(channel).offer(request).await.map(|_| ());
        (Instant::now(), answer)
    });

    let others: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != old).collect();
    cluster
        .new_leader(&others, term, Duration::from_secs(20))
        .await
        .unwrap();
    let majority: Vec<&str> = others.iter().map(|id| cluster.addr(*id)).collect();
    let majority = Client::connect_with(&majority, client_config())
        .await
        .unwrap();
    for i in 0..writes {
        majority.offer(offer(&format!("t79-{i}"))).await.unwrap();
    }

    cluster.network().unwrap().heal_all();
    let healed = Instant::now();
    cluster.leader().await.unwrap();
    let answered = tokio::time::timeout(ANSWER_LIMIT * 3, pending).await;
    cluster.wait_all_caught_up().await.unwrap();
    let snapshot = cluster.node_info(old).await.unwrap().snapshot_index;
    match catch_up {
        // The install is logged once the snapshot is stored, a moment after the node counts its
        // state as applied: waited for.
        CatchUp::BySnapshot => {
            wait::until(
                "the old leader to log a snapshot install",
                Duration::from_secs(30),
                || {
                    let logged = cluster.log_of_last_run(old).contains(INSTALLED);
                    async move { logged.then_some(()).ok_or_else(|| "not logged".to_string()) }
                },
            )
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "node {old} did not catch up by snapshot: {e:#}\n{}",
                    cluster.log_tail(old, 20)
                )
            });
        }
        // Too few entries for a snapshot to purge any the old leader lacked.
        CatchUp::FromLog => assert!(
            !cluster.log_of_last_run(old).contains(INSTALLED),
            "node {old} caught up by snapshot:\n{}",
            cluster.log_tail(old, 20)
        ),
    }
    let (after, answer) = match answered {
        Ok(Ok((at, answer))) => {
            let answer = match answer {
                Ok(()) => "answered".to_string(),
                Err(status) => detail_of(&status)
                    .map(|d| d.code)
                    .unwrap_or_else(|| format!("{:?}", status.code())),
            };
            (Some(at.saturating_duration_since(healed)), answer)
        }
        _ => (None, "no answer".to_string()),
    };
    (after, answer, snapshot)
}

/// Control: an old leader that catches up from the log answers its pending write `NOT_LEADER`
/// soon after the partition heals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t79_control_old_leader_catching_up_from_the_log_answers_its_pending_write() {
    let (after, answer, snapshot) =
        pending_after_heal(Options::proxied(), Pending::Write, 200, CatchUp::FromLog).await;
    println!(
        "t79 control: the old leader (snapshot at {snapshot}) answered {answer} {after:?} after healing"
    );
    assert!(
        after.is_some_and(|after| after <= ANSWER_LIMIT),
        "answered {answer} {after:?} after healing"
    );
    assert_eq!(answer, "NOT_LEADER");
}

/// An old leader that catches up by snapshot (its pending write's entry purged under it)
/// answers that write too, telling the client to go to the leader, soon after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t79_issue_old_leader_write_hangs() {
    let options = Options {
        snapshot_every: 50,
        keep_logs: 10,
        ..Options::proxied()
    };
    let (after, answer, snapshot) =
        pending_after_heal(options, Pending::Write, 200, CatchUp::BySnapshot).await;
    println!(
        "t79: the old leader (caught up by snapshot, now at {snapshot}) answered {answer} {after:?} after healing"
    );
    assert!(
        after.is_some_and(|after| after <= ANSWER_LIMIT),
        "the old leader's pending write was answered {answer} {after:?} after healing (limit {ANSWER_LIMIT:?})"
    );
    // Told to go to the leader (named, or not yet known): never a success, a refusal, an internal
    // error or a dropped call.
    assert!(
        matches!(answer.as_str(), "NOT_LEADER" | "NO_LEADER"),
        "the old leader's pending write was answered {answer}"
    );
}

/// The same for a read: the old leader's first read in its term waits for an entry of that term
/// to commit, and that entry, purged under the snapshot it catches up by, was never answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t79_issue_old_leader_read_hangs() {
    let options = Options {
        snapshot_every: 50,
        keep_logs: 10,
        ..Options::proxied()
    };
    let (after, answer, snapshot) =
        pending_after_heal(options, Pending::Read, 200, CatchUp::BySnapshot).await;
    println!(
        "t79 read: the old leader (caught up by snapshot, now at {snapshot}) answered {answer} {after:?} after healing"
    );
    assert!(
        after.is_some_and(|after| after <= ANSWER_LIMIT),
        "the old leader's pending read was answered {answer} {after:?} after healing (limit {ANSWER_LIMIT:?})"
    );
    assert_eq!(answer, "NOT_LEADER");
}
