//! Claim: the `baton` command line keeps its contract with scripts against a live cluster —
//! exit codes (0 ok, 2 bad usage, 3 refused with the code on stderr, 4 unreachable naming the
//! endpoint), the JSON shapes of `status --json` and `ticket list --json`, `check` on a clean
//! cluster, and `ticket race` printing the judge's tally.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use baton_cluster_test::binary::baton_bin;
use baton_cluster_test::cli::{self, Run};
use baton_cluster_test::{Cluster, Options};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(30);

async fn baton(bin: &Path, endpoints: &str, args: &[&str]) -> Run {
    let mut all = vec!["--endpoints", endpoints];
    all.extend_from_slice(args);
    cli::run(bin, &all, LIMIT).await.unwrap()
}

/// `baton ticket offer` of `key` from `ci` to `deployer` for `ttl`.
async fn offer(bin: &Path, endpoints: &str, key: &str, ttl: &str) -> Run {
    let args = [
        "ticket",
        "offer",
        "--key",
        key,
        "--from",
        "ci",
        "--to",
        "deployer",
        "--reply-to",
        "ci",
        "--ttl",
        ttl,
    ];
    baton(bin, endpoints, &args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_cli_contract_against_a_live_cluster() {
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    let bin = cluster.bin().to_path_buf();
    let endpoints = cluster.endpoints().join(",");
    let e = endpoints.as_str();

    let offered = offer(&bin, e, "cli-1", "5m").await;
    assert_eq!(offered.code, Some(0), "{offered}");
    assert!(offered.stdout.contains("generation=1"), "{offered}");
    // The same offer again is its retry: the live ticket comes back, exit 0.
    let again = offer(&bin, e, "cli-1", "5m").await;
    assert_eq!(again.code, Some(0), "{again}");
    assert!(again.stdout.contains("generation=1"), "{again}");
    // Another offer on the live key was not made: the ticket it met is named, exit 3.
    let other = offer(&bin, e, "cli-1", "10m").await;
    assert_eq!(other.code, Some(3), "{other}");
    assert!(other.stdout.contains("to=deployer"), "{other}");
    assert!(other.stderr.contains("this offer was not made"), "{other}");

    let take = baton(
        &bin,
        e,
        &["ticket", "take", "--key", "cli-1", "--to", "deployer"],
    )
    .await;
    assert_eq!(take.code, Some(0), "{take}");
    assert!(
        take.stdout.contains("token=") && take.stdout.contains("fence=1"),
        "{take}"
    );

    // A second take: the store refuses, exit 3, the code on stderr.
    let taken = baton(
        &bin,
        e,
        &["ticket", "take", "--key", "cli-1", "--to", "deployer"],
    )
    .await;
    assert_eq!(taken.code, Some(3), "{taken}");
    assert!(taken.stderr.contains("TAKEN"), "{taken}");

    // status --json: one object with the leader and every member's progress.
    let status = baton(&bin, e, &["status", "--json"]).await;
    assert_eq!(status.code, Some(0), "{status}");
    let status_json: Value =
        serde_json::from_str(status.stdout.trim()).unwrap_or_else(|err| panic!("{err}: {status}"));
    let leader = cluster.leader().await.unwrap();
    assert_eq!(status_json["leader"].as_u64(), Some(leader), "{status}");
    let members = status_json["members"]
        .as_array()
        .unwrap_or_else(|| panic!("members: {status}"));
    assert_eq!(members.len(), 3, "{status}");
    for member in members {
        for field in [
            "id",
            "addr",
            "role",
            "term",
            "last_log_index",
            "applied_index",
        ] {
            assert!(
                member.get(field).is_some_and(|v| !v.is_null()),
                "member lacks {field}: {member}"
            );
        }
        assert!(
            member["version"].as_str().is_some_and(|v| !v.is_empty()),
            "member lacks its version: {member}"
        );
        let addr = member["addr"].as_str().unwrap();
        assert_eq!(cluster.id_of(addr), member["id"].as_u64(), "{member}");
    }
    let roles: Vec<&str> = members
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "leader").count(),
        1,
        "{roles:?}"
    );

    // ticket list --json: an array of tickets with their state.
    let list = baton(&bin, e, &["ticket", "list", "--json"]).await;
    assert_eq!(list.code, Some(0), "{list}");
    let list_json: Value =
        serde_json::from_str(list.stdout.trim()).unwrap_or_else(|err| panic!("{err}: {list}"));
    let tickets = list_json
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"));
    assert_eq!(tickets.len(), 1, "{list}");
    let ticket = &tickets[0];
    for field in ["key", "state", "generation", "holder", "deadline"] {
        assert!(
            ticket.get(field).is_some(),
            "ticket lacks {field}: {ticket}"
        );
    }
    assert_eq!(ticket["key"], "cli-1");
    assert_eq!(ticket["state"], "accepted");
    assert_eq!(ticket["generation"], 1);
    assert_eq!(ticket["holder"], "deployer");
    assert!(
        ticket["deadline"]
            .as_str()
            .is_some_and(|d| d.ends_with('Z')),
        "RFC 3339 deadline: {ticket}"
    );

    let check = baton(&bin, e, &["check"]).await;
    assert_eq!(check.code, Some(0), "{check}");

    let race = baton(
        &bin,
        e,
        &["ticket", "race", "--key", "cli-race", "--takers", "8"],
    )
    .await;
    assert_eq!(race.code, Some(0), "{race}");
    assert!(
        race.stdout.contains("winners=1 losers=7 infra_errors=0"),
        "{race}"
    );

    // Its winner keeps the ticket until the deadline: racing the key again then would pit the
    // takers against that winner (every one `TAKEN`), which is refused, not judged a failure.
    let again = baton(
        &bin,
        e,
        &["ticket", "race", "--key", "cli-race", "--takers", "2"],
    )
    .await;
    assert_eq!(again.code, Some(2), "{again}");
    assert!(again.stderr.contains("an earlier race's ticket"), "{again}");

    // A race never takes real work: the key of the ticket taken above, a task seeded for work.
    let refused = baton(
        &bin,
        e,
        &["ticket", "race", "--key", "cli-1", "--takers", "2"],
    )
    .await;
    assert_eq!(refused.code, Some(2), "{refused}");
    assert!(
        refused.stderr.contains("race a key of its own"),
        "{refused}"
    );
    let seeded = baton(&bin, e, &["board", "seed", "--task", "cli-work"]).await;
    assert_eq!(seeded.code, Some(0), "{seeded}");
    let refused = baton(&bin, e, &["board", "race", "--task", "cli-work"]).await;
    assert_eq!(refused.code, Some(2), "{refused}");
    let tasks = baton(&bin, e, &["board", "list", "--json"]).await;
    assert!(!tasks.stdout.contains("claimer-"), "{tasks}");

    // A ticket of years has no deadline in practice, which the contract forbids: refused, naming
    // the ttl, and nothing offered. (One an older version took lists as `never`: `rfc3339`'s
    // unit test.)
    let forever = offer(&bin, e, "cli-forever", "9000y").await;
    assert_eq!(forever.code, Some(3), "{forever}");
    assert!(forever.stderr.contains("ttl"), "{forever}");
    let list = baton(&bin, e, &["ticket", "list"]).await;
    assert!(!list.stdout.contains("cli-forever"), "{list}");

    // `effect acquire` exits 0 only for a grant, so `acquire && perform` never performs an
    // action in someone else's hands or already done.
    let acquire = [
        "effect",
        "acquire",
        "--key",
        "cli-charge",
        "--resource",
        "cli-card",
        "--ttl",
        "1m",
    ];
    let granted = baton(&bin, e, &acquire).await;
    assert_eq!(granted.code, Some(0), "{granted}");
    assert!(granted.stdout.contains("outcome=granted"), "{granted}");
    let field = |name: &str| {
        granted
            .stdout
            .split_whitespace()
            .find_map(|field| field.strip_prefix(name))
            .unwrap()
            .to_string()
    };
    let (fence, holder) = (field("fence="), field("holder="));
    let in_progress = baton(&bin, e, &acquire).await;
    assert_eq!(in_progress.code, Some(3), "{in_progress}");
    assert!(
        in_progress.stdout.contains("outcome=in_progress"),
        "{in_progress}"
    );
    let complete = [
        "effect",
        "complete",
        "--key",
        "cli-charge",
        "--resource",
        "cli-card",
        "--fence",
        &fence,
        "--holder",
        &holder,
        "--result",
        "charged",
    ];
    let completed = baton(&bin, e, &complete).await;
    assert_eq!(completed.code, Some(0), "{completed}");
    let done = baton(&bin, e, &acquire).await;
    assert_eq!(done.code, Some(3), "{done}");
    assert!(
        done.stdout.contains("outcome=completed result=charged"),
        "{done}"
    );

    binary_data_and_closed_pipes(&cluster, &bin, e).await;

    println!("t50: offer/take 0, second take 3 TAKEN, status/list JSON shapes ok, check 0, race winners=1 losers=7, ticket of years 3, effect acquire 0 only when granted, binary data unaltered, a closed pipe ends a listing with 141");
}

#[tokio::test]
async fn t51_bad_usage_exits_2() {
    let bin = baton_bin().unwrap();
    for args in [
        vec!["ticket", "take", "--key", "k"],
        vec!["ticket", "frobnicate"],
        vec!["--timeout", "soon", "status"],
        // No time at all would make every command "cluster unavailable".
        vec![
            "--endpoints",
            "127.0.0.1:1",
            "--timeout",
            "0s",
            "ticket",
            "list",
        ],
        // Without a port it would be dialled at port 80 until the deadline.
        vec!["--endpoints", "127.0.0.1", "ticket", "list"],
        // A member's address without a port: its peers could never dial it (before, every
        // restored data dir was written with it).
        vec![
            "snapshot",
            "restore",
            "--from",
            "/nonexistent-t51.snap",
            "--data-dir",
            "/nonexistent-t51-dir",
            "--id",
            "1",
            "--members",
            "1=10.0.0.1:7001,2=node2",
        ],
        // TTLs the store would refuse (0 ms) are refused here, before any call; the endpoint is
        // unreachable, so a call would exit 4.
        vec![
            "--endpoints",
            "127.0.0.1:1",
            "ticket",
            "offer",
            "--key",
            "k",
            "--from",
            "a",
            "--to",
            "b",
            "--reply-to",
            "a",
            "--ttl",
            "0s",
        ],
        vec![
            "--endpoints",
            "127.0.0.1:1",
            "board",
            "claim",
            "--task",
            "t",
            "--agent",
            "a",
            "--ttl",
            "500us",
        ],
        // A payload that is not JSON, also with no cluster to reach (before: exit 4 after the
        // leader search).
        vec![
            "--endpoints",
            "127.0.0.1:1",
            "task",
            "submit",
            "--queue",
            "q",
            "--idempotency-key",
            "k",
            "--handler",
            "h",
            "--payload",
            "{not json",
        ],
    ] {
        let run = cli::run(&bin, &args, LIMIT).await.unwrap();
        assert_eq!(run.code, Some(2), "baton {}: {run}", args.join(" "));
        assert!(
            !run.stderr.is_empty(),
            "baton {}: usage errors explain themselves",
            args.join(" ")
        );
    }
    println!("t51: nine kinds of bad usage exit 2");
}

#[tokio::test]
async fn t52_unreachable_cluster_exits_4_and_names_the_endpoint() {
    let bin = baton_bin().unwrap();
    let started = std::time::Instant::now();
    let run = cli::run(
        &bin,
        &[
            "--endpoints",
            "127.0.0.1:1",
            "--timeout",
            "3s",
            "ticket",
            "list",
        ],
        LIMIT,
    )
    .await
    .unwrap();
    assert_eq!(run.code, Some(4), "{run}");
    assert!(run.stderr.contains("127.0.0.1:1"), "{run}");
    // Not silent while it retries: after 2 s it says what it is doing.
    assert!(run.stderr.contains("retrying for up to 3s"), "{run}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "--timeout bounds the wait: {:?}",
        started.elapsed()
    );
    // A write that got no answer says its outcome is unknown, not that nothing happened.
    let take = cli::run(
        &bin,
        &[
            "--endpoints",
            "127.0.0.1:1",
            "--timeout",
            "1s",
            "ticket",
            "take",
            "--key",
            "k",
            "--to",
            "mailer",
        ],
        LIMIT,
    )
    .await
    .unwrap();
    assert_eq!(take.code, Some(4), "{take}");
    assert!(take.stderr.contains("outcome is unknown"), "{take}");
    // status --json still prints JSON on stdout for a script to parse.
    let status = cli::run(
        &bin,
        &[
            "--endpoints",
            "127.0.0.1:1",
            "--timeout",
            "2s",
            "status",
            "--json",
        ],
        LIMIT,
    )
    .await
    .unwrap();
    assert_eq!(status.code, Some(4), "{status}");
    let answer: Value =
        serde_json::from_str(status.stdout.trim()).unwrap_or_else(|err| panic!("{err}: {status}"));
    assert_eq!(answer["error"], "no node answered", "{status}");
    assert_eq!(answer["tried"][0], "127.0.0.1:1", "{status}");
    println!(
        "t52: unreachable endpoint -> exit 4 naming 127.0.0.1:1 after {:?}",
        started.elapsed()
    );
}

/// `baton status --timeout` bounds each probe, and the members are probed at once: the health
/// check in deploy/ (`--timeout 2s`, 5 s for the whole check) used to wait a fixed 3 s for each
/// frozen member in turn, ~6 s with two of them frozen, and so failed on a healthy node. With
/// `--timeout 3s` probes at once take ~3 s and probes in turn at least 6 s: the bound between
/// them leaves 2.5 s for a loaded machine (and probes in turn cannot come in under it). Each
/// probe stops at 3 s, however long `--timeout` is, so a longer one would not widen the gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t56_status_with_frozen_members_answers_within_its_timeout() {
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    let bin = cluster.bin().to_path_buf();
    let endpoint = cluster.endpoints()[0].clone();
    cluster.pause(2).unwrap();
    cluster.pause(3).unwrap();
    let started = std::time::Instant::now();
    let status = baton(&bin, &endpoint, &["--timeout", "3s", "status"]).await;
    let took = started.elapsed();
    cluster.resume(2).unwrap();
    cluster.resume(3).unwrap();
    assert_eq!(status.stdout.matches("unreachable").count(), 2, "{status}");
    assert!(
        took < Duration::from_millis(5_500),
        "status with two frozen members took {took:?} with --timeout 3s: {status}"
    );
    println!("t56: status with two frozen members answered in {took:?} (--timeout 3s)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t53_cluster_init_forms_the_cluster_once() {
    let cluster = Cluster::start_uninitialized(3, Options::default())
        .await
        .unwrap();
    let bin = cluster.bin().to_path_buf();
    let endpoints = cluster.endpoints().join(",");

    // Before: the node answers, alone, and the output says how to form the cluster.
    let status = baton(&bin, &endpoints, &["status"]).await;
    assert_eq!(status.code, Some(0), "{status}");
    assert!(
        status.stdout.contains("not in a cluster yet") && status.stdout.contains("cluster init"),
        "{status}"
    );
    // A script that needs a leader asks for one: exit 1 until the cluster is formed.
    let leaderless = baton(&bin, &endpoints, &["status", "--require-leader"]).await;
    assert_eq!(leaderless.code, Some(1), "{leaderless}");
    assert!(
        leaderless.stderr.contains("no member leads"),
        "{leaderless}"
    );

    let init = baton(&bin, &endpoints, &["cluster", "init"]).await;
    assert_eq!(init.code, Some(0), "{init}");
    assert!(init.stdout.contains("initialized cluster"), "{init}");
    assert!(!init.stderr.contains("warning"), "three voters: {init}");
    let leader = cluster.leader().await.unwrap();
    for id in cluster.live_ids() {
        let members = cluster.node_info(id).await.unwrap().members;
        assert_eq!(
            members.len(),
            3,
            "node {id} knows every member: {members:?}"
        );
        assert!(
            members.iter().all(|m| m.voter),
            "node {id}: every member votes: {members:?}"
        );
    }

    let led = baton(&bin, &endpoints, &["status", "--require-leader"]).await;
    assert_eq!(led.code, Some(0), "{led}");

    let again = baton(&bin, &endpoints, &["cluster", "init"]).await;
    assert_eq!(again.code, Some(3), "{again}");
    assert!(again.stderr.contains("ALREADY_INITIALIZED"), "{again}");
    println!("t53: cluster init exit 0 (leader node {leader}, 3 voters); second init exit 3 ALREADY_INITIALIZED");
}

/// A voter change that most of the resulting voters cannot answer is refused before it is made
/// (exit 2; `--force` overrides): promoting a learner added at a wrong address to a one-node
/// cluster made a two-voter set with one silent voter, a change that could never commit and
/// that held every write meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t55_members_promote_refuses_a_change_most_voters_cannot_answer() {
    let cluster = Cluster::start(1, Options::default()).await.unwrap();
    let bin = cluster.bin().to_path_buf();
    let endpoints = cluster.endpoints().join(",");
    let e = endpoints.as_str();
    // A learner at an address nobody answers: its catch-up never ends, within 2 s.
    let add_learner = [
        "--timeout",
        "2s",
        "members",
        "add",
        "--id",
        "2",
        "--addr",
        "127.0.0.1:1",
    ];
    let add = baton(&bin, e, &add_learner).await;
    let members = cluster.node_info(1).await.unwrap().members;
    assert!(
        members.iter().any(|m| m.id == 2 && !m.voter),
        "{add}\n{members:?}"
    );
    // The learner again at its own address is a retry (it waits for the catch-up again); the
    // voter's id is refused: a node rebuilt under its old id must not vote again.
    let again = baton(&bin, e, &add_learner).await;
    assert!(!again.stderr.contains("MEMBERSHIP"), "{again}");
    let voter = baton(&bin, e, &["members", "add", "--id", "1", "--addr", e]).await;
    assert_eq!(voter.code, Some(3), "{voter}");
    assert!(voter.stderr.contains("already a voter"), "{voter}");

    let promote = baton(
        &bin,
        e,
        &["--timeout", "5s", "members", "promote", "--id", "2"],
    )
    .await;
    assert_eq!(promote.code, Some(2), "{promote}");
    assert!(promote.stderr.contains("--force"), "{promote}");
    let members = cluster.node_info(1).await.unwrap().members;
    assert!(
        members.iter().any(|m| m.id == 2 && !m.voter),
        "node 2 is still a learner: {members:?}"
    );
    // Writes go on.
    let client = cluster.client().await.unwrap();
    client
        .save_if_newer("t55", 1, b"still writable")
        .await
        .unwrap();
    // The last voter cannot be removed: said plainly, even with --force.
    let last = baton(&bin, e, &["members", "remove", "--id", "1", "--force"]).await;
    assert_eq!(last.code, Some(2), "{last}");
    assert!(last.stderr.contains("node 1 is the last voter"), "{last}");
}

/// Two learners promoted at once by two operators both become voters, and a promotion asked
/// again changes nothing. Before, each `members promote` sent the whole voter list it had read:
/// the later change dropped the voter the earlier one added (or was refused while the earlier
/// one was still committing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t58_promotions_made_at_once_both_land() {
    let mut cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    let mut learners = Vec::new();
    for _ in 0..2 {
        let id = cluster.add_node().await.unwrap();
        client.add_learner(id, cluster.addr(id)).await.unwrap();
        learners.push(id);
    }
    let bin = cluster.bin().to_path_buf();
    let endpoints = cluster.endpoints().join(",");
    let e = endpoints.as_str();
    let [a, b] = [learners[0].to_string(), learners[1].to_string()];
    let promote_a = ["members", "promote", "--id", &a];
    let promote_b = ["members", "promote", "--id", &b];
    let (first, second) = tokio::join!(baton(&bin, e, &promote_a), baton(&bin, e, &promote_b));
    assert_eq!(first.code, Some(0), "{first}");
    assert_eq!(second.code, Some(0), "{second}");
    let leader = cluster.leader().await.unwrap();
    let members = cluster.node_info(leader).await.unwrap().members;
    let voters: Vec<u64> = members.iter().filter(|m| m.voter).map(|m| m.id).collect();
    assert_eq!(voters, [1, 2, 3, learners[0], learners[1]], "{members:?}");

    // Asked again (a client's retry of a promotion that went through): answered, no new entry.
    let before = cluster.node_info(leader).await.unwrap().applied_index;
    let again = client.promote_member(learners[0]).await.unwrap();
    assert_eq!(again.members.len(), 5, "{again:?}");
    assert!(
        again.log_index <= before,
        "{again:?} after applied index {before}"
    );
    // A stranger is refused, naming the way in.
    let stranger = client.promote_member(99).await.unwrap_err();
    assert!(
        stranger.to_string().contains("add it as a learner first"),
        "{stranger}"
    );
    println!("t58: learners {learners:?} promoted at once; voters {voters:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t54_members_remove_takes_out_learners_and_voters_and_refuses_strangers() {
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    let bin = cluster.bin().to_path_buf();
    let endpoints = cluster.endpoints().join(",");
    let e = endpoints.as_str();
    let leader = cluster.leader().await.unwrap();
    let voters = |members: &[baton_rpc::proto::Member]| -> Vec<u64> {
        members.iter().filter(|m| m.voter).map(|m| m.id).collect()
    };

    // A learner at an address nobody answers (a typo): it is recorded though it never catches
    // up.
    let add = baton(
        &bin,
        e,
        &[
            "--timeout",
            "2s",
            "members",
            "add",
            "--id",
            "4",
            "--addr",
            "127.0.0.1:1",
        ],
    )
    .await;
    let members = cluster.node_info(leader).await.unwrap().members;
    assert!(
        members.iter().any(|m| m.id == 4 && !m.voter),
        "{add}\n{members:?}"
    );

    // Promoting it: three of four voters would answer, a majority, but the cluster would be
    // one failure from stopping: refused unless --force.
    let promote = baton(&bin, e, &["members", "promote", "--id", "4"]).await;
    assert_eq!(promote.code, Some(2), "{promote}");
    assert!(
        promote.stderr.contains("node 4 does not answer"),
        "{promote}"
    );
    // Forced, the node itself refuses: the learner has stored nothing (before, the cluster
    // took a fourth voter that never votes, and was one failure from stopping).
    let forced = baton(&bin, e, &["members", "promote", "--id", "4", "--force"]).await;
    assert_eq!(forced.code, Some(3), "{forced}");
    assert!(
        forced.stderr.contains("MEMBERSHIP") && forced.stderr.contains("have not stored"),
        "{forced}"
    );
    let members = cluster.node_info(leader).await.unwrap().members;
    assert!(
        members.iter().any(|m| m.id == 4 && !m.voter),
        "still a learner: {members:?}"
    );

    let remove = baton(&bin, e, &["members", "remove", "--id", "4"]).await;
    assert_eq!(remove.code, Some(0), "{remove}");
    let members = cluster.node_info(leader).await.unwrap().members;
    assert!(
        members.iter().all(|m| m.id != 4),
        "learner 4 gone: {members:?}"
    );
    assert_eq!(members.len(), 3, "{members:?}");

    // Not a member (any more): a usage error, nothing changes.
    let stranger = baton(&bin, e, &["members", "remove", "--id", "4"]).await;
    assert_eq!(stranger.code, Some(2), "{stranger}");
    assert!(stranger.stderr.contains("not a member"), "{stranger}");
    assert_eq!(
        cluster.node_info(leader).await.unwrap().members.len(),
        3,
        "a refused removal changes nothing"
    );

    // A voter leaves the voter set and the membership.
    let follower = cluster
        .live_ids()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap();
    let follower_arg = follower.to_string();
    let out = baton(&bin, e, &["members", "remove", "--id", &follower_arg]).await;
    assert_eq!(out.code, Some(0), "{out}");
    // Two voters survive no failure: said, not refused.
    assert!(out.stderr.contains("warning: 2 voter(s)"), "{out}");
    assert!(
        !remove.stderr.contains("warning"),
        "three voters are not fragile: {remove}"
    );
    let members = cluster.node_info(leader).await.unwrap().members;
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(!voters(&members).contains(&follower), "{members:?}");
    // The store itself answers a repeated removal (a client's retry) with the membership.
    let client =
        baton_rpc::Client::new(&cluster.endpoints(), baton_rpc::ClientConfig::default()).unwrap();
    let again = client.remove_member(follower).await.unwrap();
    assert_eq!(again.members.len(), 2, "{again:?}");
    println!("t54: learner 4 removed, stranger refused exit 2, voter {follower} removed, repeat answered");
}

/// Data that is not UTF-8 comes out unaltered (before: printed lossily, exit 0); a listing whose
/// reader went away ends quietly with exit 141 (before: a panic, exit 101); a board race whose TTL
/// no claim may have is refused before it seeds its task (before: the task was seeded, every
/// claim refused, and a second run refused for the task it left).
async fn binary_data_and_closed_pipes(cluster: &Cluster, bin: &Path, e: &str) {
    let client = cluster.client().await.unwrap();
    let bytes = [0xff, 0x00, 0x80, b'\n', 0xfe];
    client.save_if_newer("cli-binary", 1, &bytes).await.unwrap();
    let loaded = std::process::Command::new(bin)
        .args([
            "--endpoints",
            e,
            "checkpoint",
            "load",
            "--run",
            "cli-binary",
        ])
        .env_remove("BATON_ENDPOINTS")
        .output()
        .unwrap();
    assert_eq!(loaded.status.code(), Some(0), "{loaded:?}");
    assert_eq!(loaded.stdout, bytes, "{loaded:?}");
    let as_json = baton(
        bin,
        e,
        &["checkpoint", "load", "--run", "cli-binary", "--json"],
    )
    .await;
    assert_eq!(as_json.code, Some(0), "{as_json}");
    let value: serde_json::Value = serde_json::from_str(as_json.stdout.trim()).unwrap();
    assert_eq!(value["seq"], 1, "{value}");
    assert!(value["data"].is_null(), "{value}");
    assert_eq!(value["data_base64"], "/wCACv4=", "{value}");

    client
        .write_fenced("cli-binary-sink", 1, &bytes)
        .await
        .unwrap();
    let read = baton(bin, e, &["sink", "read", "--resource", "cli-binary-sink"]).await;
    assert_eq!(read.code, Some(0), "{read}");
    assert_eq!(
        read.stdout.trim(),
        "fence=1 value_base64=/wCACv4=",
        "{read}"
    );

    // More than a pipe holds (64 KiB), so the listing is still writing when its reader goes.
    let tasks: Vec<baton_statemachine::board::TaskSpec> = (0..3_000)
        .map(|i| baton_statemachine::board::TaskSpec {
            id: format!("cli-pipe-task-with-a-longish-name-{i:05}"),
            deps: vec![],
        })
        .collect();
    client.seed(&tasks).await.unwrap();
    let mut listing = std::process::Command::new(bin)
        .args(["--endpoints", e, "board", "list"])
        .env_remove("BATON_ENDPOINTS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(listing.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut first).unwrap();
    assert!(!first.is_empty());
    drop(stdout);
    let ended = listing.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&ended.stderr);
    // 141, as a filter killed by SIGPIPE: never a success that could hide a verdict.
    assert_eq!(ended.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let race = baton(
        bin,
        e,
        &["board", "race", "--task", "cli-long-race", "--ttl", "48h"],
    )
    .await;
    assert_eq!(race.code, Some(2), "{race}");
    let snapshot = client.tasks().await.unwrap();
    assert!(
        !snapshot.tasks.iter().any(|task| task.id == "cli-long-race"),
        "the race seeded its task before being refused"
    );
}
