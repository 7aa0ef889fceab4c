//! Claims: `baton snapshot save` captures the state at a linearizable point, and
//! `baton snapshot restore` builds a NEW cluster (three members or one) that starts with that
//! state and a fresh membership, elects a leader by itself, serves the saved data, and mints
//! fences above any the old cluster handed out after the save (raised by a billion unless told
//! otherwise). Every member restored together reports one restore fingerprint; members restored
//! with different options show different ones: they are different clusters, which refuse each
//! other's Raft requests, and `baton status` fails on it. A damaged or
//! foreign file is refused with a clear reason and nothing is written.
#![allow(clippy::unwrap_used)]

mod admin_support;

use std::path::Path;
use std::time::Duration;

use admin_support::{show, Procs};
use baton_cluster_test::{Cluster, Options};
use baton_rpc::{Client, Error, Security};
use baton_statemachine::board::TaskSpec;
use baton_statemachine::Refusal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_snapshot_restores_into_a_new_cluster_that_continues_above_it() {
    // The source cluster: a claimed task (fence 2 after two claims), a checkpoint.
    let source = Cluster::start(3, Options::default()).await.unwrap();
    // The file is to show the rules this build's cluster adopts.
    source.wait_rules_adopted().await.unwrap();
    let client = source.client().await.unwrap();
    client
        .seed(&[TaskSpec {
            id: "task".into(),
            deps: vec![],
        }])
        .await
        .unwrap();
    let first = client.claim("task", "a", 60_000).await.unwrap();
    client
        .release_task("task", &first.lease.unwrap().token)
        .await
        .unwrap();
    let second = client.claim("task", "b", 1).await.unwrap();
    let saved_fence = second.lease.unwrap().fence;
    assert_eq!(saved_fence, 2);
    client.save_if_newer("job", 41, b"progress").await.unwrap();

    let procs_dir = tempfile::tempdir().unwrap();
    let file = procs_dir.path().join("backup.snap");
    save(source.bin(), &source.endpoints(), &file);
    // Written after the save: must not be in the restored cluster.
    client.save_if_newer("later", 1, b"x").await.unwrap();
    // Handed out after the save (the 1 ms claim has run out): the restored cluster must never
    // hand this fence out again.
    let after_save = client.claim("task", "late", 60_000).await.unwrap();
    assert_eq!(after_save.lease.unwrap().fence, saved_fence + 1);
    // A task the save never had, seeded and claimed after it: its fence 1 must not come again.
    let fresh = TaskSpec {
        id: "fresh".into(),
        deps: vec![],
    };
    client.seed(std::slice::from_ref(&fresh)).await.unwrap();
    let fresh_claim = client.claim("fresh", "late", 60_000).await.unwrap();
    assert_eq!(fresh_claim.lease.unwrap().fence, 1);

    let inspect = std::process::Command::new(source.bin())
        .args(["snapshot", "inspect"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(inspect.status.success(), "{}", show(&inspect));
    let printed = String::from_utf8_lossy(&inspect.stdout);
    assert!(printed.contains("checksum ok"), "{printed}");
    let rules = format!("\napply rules: {}\n", baton_statemachine::rules::RULES);
    assert!(printed.contains(&rules), "{printed}");
    drop(source);

    // A new three-node cluster on new addresses, seeded from the file.
    let mut procs = Procs::new(Security::default()).unwrap();
    for id in 1..=3 {
        procs.declare(id, &[]).unwrap();
    }
    let members = member_list(&procs);
    let fingerprints: Vec<String> = (1..=3)
        .map(|id| restore(&procs, &file, &procs.data_dir(id), id, &members, None))
        .collect();
    assert!(fingerprints.iter().all(|f| *f == fingerprints[0]));
    for id in 1..=3 {
        procs.start(id).await.unwrap();
    }
    let leader = procs.leader().await.unwrap();
    println!("restored three-node cluster elected node {leader}");
    let client = procs.client(Security::default()).await.unwrap();
    check_restored(&client, saved_fence + 1_000_000_000 + 1).await;
    client.seed(std::slice::from_ref(&fresh)).await.unwrap();
    let claim = client.claim("fresh", "new", 60_000).await.unwrap();
    assert_eq!(claim.lease.unwrap().fence, 1_000_000_000 + 1);
    // A backup of the restored cluster keeps what its counters start at: restored as saved, a
    // task new to it still gets a fence above the first raise.
    let again = procs_dir.path().join("restored.snap");
    save(procs.bin(), &procs.endpoints(), &again);
    let info = procs.info(leader).await.unwrap();
    let ids: Vec<u64> = info.members.iter().map(|m| m.id).collect();
    assert_eq!(ids, vec![1, 2, 3], "the fresh membership");
    assert!(info.members.iter().all(|m| m.addr == procs.addr(m.id)));
    assert_eq!(info.restored_from, fingerprints[0]);
    let status = status_of(&procs);
    assert!(status.status.success(), "{}", show(&status));
    assert!(
        String::from_utf8_lossy(&status.stdout).contains(&format!(
            "restored: fingerprint {} on nodes [1, 2, 3]",
            fingerprints[0]
        )),
        "{}",
        show(&status)
    );
    // The members restored from one file and then written to hold one state.
    let verify = verify_of(&procs);
    assert!(verify.status.success(), "{}", show(&verify));
    assert!(
        String::from_utf8_lossy(&verify.stdout).contains("ok: 3 members agree at applied index"),
        "{}",
        show(&verify)
    );
    procs.kill_all();

    // Node 3 restored with another raise: the same log position, another state. Raft compares
    // positions only; the restores' cluster ids (their fingerprints) differ, so nodes 1 and 2
    // form the cluster and refuse node 3, which falls behind, and `baton status` fails naming
    // both ids.
    let mut mixed = Procs::new(Security::default()).unwrap();
    for id in 1..=3 {
        mixed.declare(id, &[]).unwrap();
    }
    let members = member_list(&mixed);
    let odd = restore(&mixed, &file, &mixed.data_dir(3), 3, &members, Some(7));
    let usual = restore(&mixed, &file, &mixed.data_dir(1), 1, &members, None);
    restore(&mixed, &file, &mixed.data_dir(2), 2, &members, None);
    assert_ne!(odd, usual);
    // Nodes 1 and 3 alone refuse each other (their cluster ids differ): no quorum, no new
    // entry, so both stand at the restore's log position, with different states there.
    mixed.start(1).await.unwrap();
    mixed.start(3).await.unwrap();
    let verify = verify_of(&mixed);
    assert_eq!(verify.status.code(), Some(1), "{}", show(&verify));
    assert!(
        String::from_utf8_lossy(&verify.stderr).contains("STATE MISMATCH"),
        "{}",
        show(&verify)
    );
    // Node 3 joins again once nodes 1 and 2 lead (the leader search wants every running node
    // to name it, which node 3 never will).
    tokio::task::block_in_place(|| mixed.terminate(3, Duration::from_secs(30))).unwrap();
    mixed.start(2).await.unwrap();
    let leader = mixed.leader().await.unwrap();
    mixed.start(3).await.unwrap();
    let client = mixed.client(Security::default()).await.unwrap();
    client.save_if_newer("after", 1, b"restore").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (ahead, apart) = (
        mixed.info(leader).await.unwrap(),
        mixed.info(3).await.unwrap(),
    );
    assert_eq!(
        apart.cluster_id, odd,
        "a restored cluster's id is its fingerprint"
    );
    assert_eq!(ahead.cluster_id, usual);
    assert!(
        apart.applied_index < ahead.applied_index,
        "node 3 is kept out: {apart:?}"
    );
    let status = status_of(&mixed);
    assert_eq!(status.status.code(), Some(1), "{}", show(&status));
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(
        stderr.contains("CLUSTER MISMATCH")
            && stderr.contains(&format!("{usual} on [1, 2]"))
            && stderr.contains(&format!("{odd} on [3]")),
        "{}",
        show(&status)
    );
    mixed.kill_all();

    // The same file restores a single-node cluster too, here told to keep the saved counters:
    // it hands the fence out again (and says so when restoring).
    let (mut single, client) = restored_alone(&file).await;
    check_restored(&client, saved_fence + 1).await;
    single.kill_all();

    let (_twice, client) = restored_alone(&again).await;
    let other = TaskSpec {
        id: "other".into(),
        deps: vec![],
    };
    client.seed(&[other]).await.unwrap();
    let claim = client.claim("other", "c", 60_000).await.unwrap();
    assert_eq!(claim.lease.unwrap().fence, 1_000_000_000 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_or_foreign_snapshot_file_is_refused_and_nothing_is_written() {
    let source = Cluster::start(1, Options::default()).await.unwrap();
    let client = source.client().await.unwrap();
    client.save_if_newer("job", 1, b"x").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("good.snap");
    let output = std::process::Command::new(source.bin())
        .args([
            "--endpoints",
            &source.endpoints().join(","),
            "snapshot",
            "save",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", show(&output));
    let good = std::fs::read(&file).unwrap();

    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    let truncated = good[..good.len() - 10].to_vec();
    let mut future = good.clone();
    future[8] = 2;
    let cases = [
        ("flipped", flipped, "checksum"),
        ("truncated", truncated, "checksum"),
        ("future", future, "format 2"),
        (
            "foreign",
            b"PK\x03\x04 a zip file, not a snapshot".to_vec(),
            "not a Baton snapshot",
        ),
    ];
    for (name, bytes, reason) in cases {
        let path = dir.path().join(format!("{name}.snap"));
        std::fs::write(&path, bytes).unwrap();
        let data_dir = dir.path().join(format!("data-{name}"));
        let output = restore_command(source.bin(), 1, "1=127.0.0.1:1", &path, &data_dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{name}: {}", show(&output));
        assert!(stderr.contains(reason), "{name}: {}", show(&output));
        assert!(!data_dir.exists(), "{name}: nothing is written");
    }
}

/// Members that cannot be what was meant are bad usage (exit 2), refused before the file is read
/// and before anything is written: an id or address named twice would leave one of them out, or
/// `--id` outside the list would restore a node that is no member.
#[test]
fn restore_refuses_members_named_twice_or_without_this_node() {
    let bin = baton_cluster_test::binary::baton_bin().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("1=127.0.0.1:1,2=127.0.0.1:2,1=127.0.0.1:3", "id 1 twice"),
        ("1=127.0.0.1:1,2=127.0.0.1:1", "address 127.0.0.1:1 twice"),
        (
            "2=127.0.0.1:2,3=127.0.0.1:3",
            "--id 1 is not one of --members",
        ),
    ];
    for (members, reason) in cases {
        let data_dir = dir.path().join("data");
        let output = restore_command(
            &bin,
            1,
            members,
            &dir.path().join("no-such-file.snap"),
            &data_dir,
        )
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{members}: {}",
            show(&output)
        );
        assert!(stderr.contains(reason), "{members}: {}", show(&output));
        assert!(!data_dir.exists(), "{members}: nothing is written");
    }
    // A raise past 2^40 could run a fence counter out: refused before anything is read.
    let data_dir = dir.path().join("data");
    let output = restore_command(
        &bin,
        1,
        "1=127.0.0.1:1",
        &dir.path().join("no-such-file.snap"),
        &data_dir,
    )
    .args(["--raise-fences", &((1u64 << 40) + 1).to_string()])
    .output()
    .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", show(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--raise-fences"),
        "{}",
        show(&output)
    );
    assert!(!data_dir.exists(), "nothing is written");
}

fn member_list(procs: &Procs) -> String {
    procs
        .members()
        .iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `baton snapshot restore` of member `id` of `members` from `file` into `data_dir`.
fn restore_command(
    bin: &Path,
    id: u64,
    members: &str,
    file: &Path,
    data_dir: &Path,
) -> std::process::Command {
    let mut command = std::process::Command::new(bin);
    command
        .args(["snapshot", "restore", "--id", &id.to_string()])
        .args(["--members", members])
        .arg("--from")
        .arg(file)
        .arg("--data-dir")
        .arg(data_dir);
    command
}

/// `baton status` of `procs`' nodes.
/// `baton cluster verify` against every node of `procs`, given 5 s.
fn verify_of(procs: &Procs) -> std::process::Output {
    procs
        .cli(&[
            "--endpoints",
            &procs.endpoints().join(","),
            "cluster",
            "verify",
            "--timeout",
            "5s",
        ])
        .unwrap()
}

fn status_of(procs: &Procs) -> std::process::Output {
    procs
        .cli(&["--endpoints", &procs.endpoints().join(","), "status"])
        .unwrap()
}

/// Restores member `id`, with `--raise-fences` when given; returns the restore's fingerprint.
fn restore(
    procs: &Procs,
    file: &Path,
    data_dir: &Path,
    id: u64,
    members: &str,
    raise_fences: Option<u64>,
) -> String {
    let mut command = restore_command(procs.bin(), id, members, file, data_dir);
    if let Some(raise) = raise_fences {
        command.args(["--raise-fences", &raise.to_string()]);
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let raised = raise_fences.unwrap_or(1_000_000_000);
    assert!(
        stdout.contains(&format!("fences raised by {raised}")),
        "{stdout}"
    );
    let warned = String::from_utf8_lossy(&output.stderr).contains("handed out again");
    assert_eq!(warned, raised == 0, "{}", show(&output));
    let fingerprint = stdout
        .split("fingerprint ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    assert_eq!(fingerprint.len(), 32, "{stdout}");
    fingerprint
}

/// `baton snapshot save` of the cluster at `endpoints` into `file`.
fn save(bin: &Path, endpoints: &[String], file: &Path) {
    let output = std::process::Command::new(bin)
        .args(["--endpoints", &endpoints.join(","), "snapshot", "save"])
        .arg(file)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", show(&output));
    println!("{}", String::from_utf8_lossy(&output.stdout).trim());
}

/// A single-node cluster restored from `file` keeping the saved counters, and a client of it.
async fn restored_alone(file: &Path) -> (Procs, Client) {
    let mut single = Procs::new(Security::default()).unwrap();
    single.declare(7, &[]).unwrap();
    let members = member_list(&single);
    restore(&single, file, &single.data_dir(7), 7, &members, Some(0));
    single.start(7).await.unwrap();
    assert_eq!(single.leader().await.unwrap(), 7);
    let client = single.client(Security::default()).await.unwrap();
    (single, client)
}

/// The saved data is there, the later write is not, and a new claim gets `next_fence`.
async fn check_restored(client: &Client, next_fence: u64) {
    let job = client.load("job").await.unwrap();
    assert_eq!((job.seq, job.data.as_slice()), (41, &b"progress"[..]));
    let later = client.load("later").await;
    assert!(
        matches!(later, Err(Error::Refused(Refusal::NotFound))),
        "written after the save, so never saved here: {later:?}"
    );
    // The 1 ms claim from before the save has expired.
    let claim = client.claim("task", "c", 60_000).await.unwrap();
    assert_eq!(claim.lease.unwrap().fence, next_fence);
    client.save_if_newer("job", 42, b"more").await.unwrap();
    assert_eq!(client.load("job").await.unwrap().seq, 42);
}

/// A file that cannot be written is said before anything is asked of the cluster (before: the
/// whole state was downloaded first; here the cluster does not even exist, so exit 4 after the
/// connection's deadline).
#[test]
fn a_snapshot_save_that_cannot_write_its_file_stops_before_the_download() {
    let bin = baton_cluster_test::binary::baton_bin().unwrap();
    let output = std::process::Command::new(bin)
        .args(["--endpoints", "127.0.0.1:9", "snapshot", "save"])
        .arg("/nonexistent-t86-dir/backup.snap")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot write") && stderr.contains("nothing was saved"),
        "{stderr}"
    );
}

/// A directory where the file should be named is said before the download (before: the whole
/// state was downloaded, then the rename onto the directory failed).
#[test]
fn a_snapshot_save_to_a_directory_stops_before_the_download() {
    let bin = baton_cluster_test::binary::baton_bin().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let trailing = format!("{}/", dir.path().join("new").display());
    for target in [dir.path().to_string_lossy().into_owned(), trailing] {
        let output = std::process::Command::new(&bin)
            .args(["--endpoints", "127.0.0.1:9", "snapshot", "save", &target])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{target}: {stderr}");
        assert!(stderr.contains("is a directory"), "{target}: {stderr}");
    }
}
