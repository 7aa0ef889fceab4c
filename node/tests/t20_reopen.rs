//! What the stores promise survives a process exit: vote, log entries, and the state machine as
//! of its latest snapshot (openraft re-applies the committed suffix from the log on start-up).
#![allow(clippy::unwrap_used)]

use baton_node::store;
use baton_node::types::{Batch, TypeConfig};
use baton_statemachine::handoff::{Command as Handoff, OfferArgs, Ticket};
use baton_statemachine::{Command, Envelope, Origin, Stamp};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder, Vote,
};

fn offer(index: u64, key: &str) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Batch(vec![Envelope {
            stamp: Stamp {
                now_ms: 1_000 + index,
                entropy: index as u128,
            },
            origin: Some(Origin {
                client_id: 9,
                seq: index,
                acked_below: 0,
            }),
            command: Command::Handoff(Handoff::Offer(OfferArgs {
                key: key.into(),
                from: "a".into(),
                to: "b".into(),
                payload: vec![],
                reply_to: "a".into(),
                ttl_ms: 60_000,
            })),
        }])),
    }
}

/// Runs `open` until it succeeds, for at most 5 s. sled releases its file lock when the last
/// handle to the database drops, and a flush that just completed may still hold one on sled's
/// thread pool for a moment; a restarted process never sees this, a same-process reopen can.
async fn retry_open<T, E: std::fmt::Display>(what: &str, open: impl Fn() -> Result<T, E>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match open() {
            Ok(opened) => return opened,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("{what}: {e}; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// Opens the stores again in the same process.
async fn reopen(
    path: &std::path::Path,
) -> (
    baton_node::store::LogStore,
    baton_node::store::StateMachineStore,
) {
    retry_open("reopen the stores", || store::open(path)).await
}

#[tokio::test]
async fn vote_log_and_snapshot_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let vote = Vote::new_committed(3, 2);
    let snapshot_state;
    {
        let (mut log, mut sm) = store::open(dir.path()).unwrap();
        log.save_vote(&vote).await.unwrap();
        let entries: Vec<_> = (1..=5).map(|i| offer(i, &format!("k{i}"))).collect();
        log.blocking_append(entries.clone()).await.unwrap();
        sm.apply(entries[..3].to_vec()).await.unwrap();
        let mut builder = sm.get_snapshot_builder().await;
        let snapshot = builder.build_snapshot().await.unwrap();
        assert_eq!(snapshot.meta.last_log_id.map(|id| id.index), Some(3));
        // Applied after the snapshot: lives only in memory and in the log.
        sm.apply(entries[3..].to_vec()).await.unwrap();
        snapshot_state = {
            let applied = sm.read();
            assert_eq!(applied.state.handoff.len(), 5);
            applied
                .state
                .handoff
                .tickets()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
        };
    }

    let (mut log, mut sm) = reopen(dir.path()).await;
    assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id.map(|id| id.index), Some(5));
    let entries = log.try_get_log_entries(1..=5).await.unwrap();
    assert_eq!(entries.len(), 5);
    assert_eq!(entries[4], offer(5, "k5"));

    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(
        applied.map(|id| id.index),
        Some(3),
        "resumes from the snapshot"
    );
    let tickets: Vec<_> = sm.read().state.handoff.tickets().cloned().collect();
    assert_eq!(tickets, snapshot_state);
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta.last_log_id.map(|id| id.index), Some(3));
}

#[tokio::test]
async fn purge_and_truncate_leave_no_hole() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _sm) = store::open(dir.path()).unwrap();
    let entries: Vec<_> = (1..=10).map(|i| offer(i, "k")).collect();
    log.blocking_append(entries).await.unwrap();
    log.purge(LogId::new(CommittedLeaderId::new(1, 1), 4))
        .await
        .unwrap();
    log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 8))
        .await
        .unwrap();
    drop(log);
    drop(_sm);

    let (mut log, _sm) = reopen(dir.path()).await;
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.map(|id| id.index), Some(4));
    assert_eq!(state.last_log_id.map(|id| id.index), Some(7));
    let indexes: Vec<u64> = log
        .try_get_log_entries(0..100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.log_id.index)
        .collect();
    assert_eq!(indexes, vec![5, 6, 7]);
}

/// Stores four offers in a fresh data dir at `path` and applies the first three, with a snapshot
/// of them; returns the tickets in that snapshot.
async fn four_offers_three_in_a_snapshot(path: &std::path::Path) -> Vec<Ticket> {
    let (mut log, mut sm) = store::open(path).unwrap();
    let entries: Vec<_> = (1..=4).map(|i| offer(i, &format!("k{i}"))).collect();
    log.blocking_append(entries.clone()).await.unwrap();
    sm.apply(entries[..3].to_vec()).await.unwrap();
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let tickets: Vec<_> = sm.read().state.handoff.tickets().cloned().collect();
    assert_eq!(tickets.len(), 3);
    tickets
}

/// Opens a raw sled database, retrying while a just-dropped handle still holds its lock.
async fn raw_sled(path: &std::path::Path) -> sled::Db {
    retry_open(&format!("open {}", path.display()), || sled::open(path)).await
}

/// The image file's encoded meta and data: after an 8-byte magic, the meta's length (8 bytes,
/// little endian), the meta, the data, and a 4-byte checksum.
fn split_image_file(path: &std::path::Path) -> (Vec<u8>, Vec<u8>) {
    let image = std::fs::read(path.join(store::SNAPSHOT_FILE)).expect("a snapshot image file");
    let (len, rest) = image[8..image.len() - 4].split_at(8);
    let len = u64::from_le_bytes(len.try_into().unwrap()) as usize;
    let (meta, data) = rest.split_at(len);
    (meta.to_vec(), data.to_vec())
}

/// Stores a snapshot as the previous version did: in the sled database at `store_dir`, the
/// meta's length, the meta and the data packed under `image`.
async fn pack_into_store(store_dir: &std::path::Path, meta: &[u8], data: &[u8]) {
    let mut packed = (meta.len() as u64).to_le_bytes().to_vec();
    packed.extend_from_slice(meta);
    packed.extend_from_slice(data);
    let db = raw_sled(store_dir).await;
    db.insert(b"image", packed).unwrap();
    db.flush().unwrap();
}

/// How an older version kept the snapshot.
#[derive(Clone, Copy, Debug)]
enum OldLayout {
    /// The oldest: keys `meta` and `data` of the log database's tree `snapshot`.
    LogTree,
    /// A sled database of its own, keys `meta` and `data`.
    StoreKeys,
    /// A sled database of its own, the meta's length, the meta and the data packed under `image`.
    StoreImage,
}

/// Stores a snapshot in the store at `path` as a version keeping it in `layout` did.
async fn keep_as_an_older_version(
    path: &std::path::Path,
    layout: OldLayout,
    meta: &[u8],
    data: &[u8],
) {
    let store_dir = path.join(store::SNAPSHOT_STORE);
    match layout {
        OldLayout::LogTree => {
            let db = raw_sled(path).await;
            let legacy = db.open_tree(b"snapshot").unwrap();
            legacy.insert(b"meta", meta).unwrap();
            legacy.insert(b"data", data).unwrap();
            db.flush().unwrap();
        }
        OldLayout::StoreKeys => {
            let db = raw_sled(&store_dir).await;
            db.insert(b"meta", meta).unwrap();
            db.insert(b"data", data).unwrap();
            db.flush().unwrap();
        }
        OldLayout::StoreImage => pack_into_store(&store_dir, meta, data).await,
    }
}

/// A data dir written by a version that kept its snapshot (of three of four offers) in `layout`
/// resumes from it; the snapshot is moved into the image file and the old copy is gone.
async fn a_snapshot_in_an_older_layout_is_moved_and_used(layout: OldLayout) {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join(store::SNAPSHOT_STORE);
    let tickets_in_snapshot = four_offers_three_in_a_snapshot(dir.path()).await;
    let (meta, data) = split_image_file(dir.path());
    std::fs::remove_file(dir.path().join(store::SNAPSHOT_FILE)).unwrap();
    keep_as_an_older_version(dir.path(), layout, &meta, &data).await;

    {
        let (_log, mut sm) = reopen(dir.path()).await;
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(
            applied.map(|id| id.index),
            Some(3),
            "{layout:?}: resumes from the moved snapshot"
        );
        let tickets: Vec<_> = sm.read().state.handoff.tickets().cloned().collect();
        assert_eq!(tickets, tickets_in_snapshot, "{layout:?}");
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta.last_log_id.map(|id| id.index), Some(3));

        sm.apply(vec![offer(4, "k4")]).await.unwrap();
        let rebuilt = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(rebuilt.meta.last_log_id.map(|id| id.index), Some(4));
    }

    // Moved, not copied.
    assert!(
        !store_dir.exists(),
        "{layout:?}: the snapshot store is gone"
    );
    let db = raw_sled(dir.path()).await;
    assert!(
        !db.tree_names()
            .iter()
            .any(|name| name.as_ref() == b"snapshot"),
        "{layout:?}: the old tree is gone from the log database"
    );
    drop(db);
    let (_log, sm) = reopen(dir.path()).await;
    assert_eq!(sm.read().last_applied.map(|id| id.index), Some(4));
}

#[tokio::test]
async fn a_snapshot_an_older_version_kept_in_the_log_database_is_moved_and_used() {
    a_snapshot_in_an_older_layout_is_moved_and_used(OldLayout::LogTree).await;
}

#[tokio::test]
async fn a_snapshot_kept_under_separate_meta_and_data_keys_is_moved_and_used() {
    a_snapshot_in_an_older_layout_is_moved_and_used(OldLayout::StoreKeys).await;
}

#[tokio::test]
async fn a_snapshot_kept_packed_in_the_snapshot_store_is_moved_and_used() {
    a_snapshot_in_an_older_layout_is_moved_and_used(OldLayout::StoreImage).await;
}

/// A node upgraded, rolled back to an earlier version (which went on keeping snapshots where it
/// did) and upgraded again finds an older image in the file than in the old place: the newer
/// one is kept, whichever place it is in.
async fn after_a_rollback_the_newer_snapshot_is_kept(layout: OldLayout) {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join(store::SNAPSHOT_STORE);
    four_offers_three_in_a_snapshot(dir.path()).await;
    let file = dir.path().join(store::SNAPSHOT_FILE);
    let older_file = std::fs::read(&file).unwrap();
    {
        let (_log, mut sm) = reopen(dir.path()).await;
        sm.apply(vec![offer(4, "k4")]).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    }
    // The rolled-back version's newer snapshot (of four offers) where it kept it; the file holds
    // the upgrade's older one (of three).
    let (meta, data) = split_image_file(dir.path());
    keep_as_an_older_version(dir.path(), layout, &meta, &data).await;
    std::fs::write(&file, older_file).unwrap();

    let (_log, mut sm) = reopen(dir.path()).await;
    assert_eq!(
        sm.read().last_applied.map(|id| id.index),
        Some(4),
        "{layout:?}: the newer snapshot was kept"
    );
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta.last_log_id.map(|id| id.index), Some(4));
    assert!(!store_dir.exists());
}

#[tokio::test]
async fn after_a_rollback_the_newer_snapshot_of_store_and_file_is_kept() {
    after_a_rollback_the_newer_snapshot_is_kept(OldLayout::StoreImage).await;
}

#[tokio::test]
async fn after_a_rollback_the_newer_snapshot_of_log_tree_and_file_is_kept() {
    after_a_rollback_the_newer_snapshot_is_kept(OldLayout::LogTree).await;
}

/// A snapshot store whose deletion a crash cut short (renamed first, so never opened again) is
/// deleted at the next start.
#[tokio::test]
async fn a_snapshot_store_deletion_cut_short_is_finished() {
    let dir = tempfile::tempdir().unwrap();
    four_offers_three_in_a_snapshot(dir.path()).await;
    let removing = dir.path().join("snapshot-store.removing");
    std::fs::create_dir_all(removing.join("blobs")).unwrap();
    std::fs::write(removing.join("snap.0000000000000000"), b"half deleted").unwrap();
    let (_log, sm) = reopen(dir.path()).await;
    assert!(!removing.exists());
    assert_eq!(sm.read().last_applied.map(|id| id.index), Some(3));
}

/// The bytes of every file under `path`.
fn bytes_under(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                bytes_under(&entry.path())
            } else {
                meta.len()
            }
        })
        .sum()
}

/// A node keeps one snapshot: building (or installing) a new one frees the space of the one
/// before, also across restarts. (In a sled database of its own every image stayed on disk:
/// sled frees a replaced large value only once its log segment fills up, which a database
/// holding one key never does.)
#[tokio::test]
async fn replacing_the_snapshot_frees_the_space_of_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let big = |index: u64| {
        let mut entry = offer(index, &format!("k{index}"));
        if let EntryPayload::Normal(Batch(envelopes)) = &mut entry.payload {
            if let Command::Handoff(Handoff::Offer(args)) = &mut envelopes[0].command {
                args.payload = vec![index as u8; 256 << 10];
            }
        }
        entry
    };
    let (mut log, mut sm) = store::open(dir.path()).unwrap();
    // Four offers of 256 KiB each: an image of ~1 MiB.
    sm.apply((1..=4).map(big).collect::<Vec<_>>())
        .await
        .unwrap();
    let image = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap()
        .snapshot
        .into_inner()
        .len() as u64;
    let before = bytes_under(dir.path());
    let mut index = 4;
    for round in 0..3 {
        for _ in 0..10 {
            index += 1;
            sm.apply(vec![offer(index, &format!("k{index}"))])
                .await
                .unwrap();
            sm.get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
        }
        drop((log, sm));
        (log, sm) = reopen(dir.path()).await;
        assert_eq!(sm.read().last_applied.map(|id| id.index), Some(index));
        let after = bytes_under(dir.path());
        assert!(
            after < before + 2 * image,
            "after {} more snapshots of ~{image} bytes (round {round}) the store holds {after} \
             bytes, {before} before them",
            (round + 1) * 10
        );
    }
}

/// A snapshot built while entries keep being applied holds exactly the entries up to its own
/// last log id: the state it encodes and the log id it reports are taken at the same moment,
/// however long the build takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_built_during_applies_matches_its_last_log_id() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, mut sm) = store::open(dir.path()).unwrap();
    // Enough state that a build takes a while.
    let seeded = 5_000;
    let entries: Vec<_> = (1..=seeded).map(|i| offer(i, &format!("k{i}"))).collect();
    sm.apply(entries).await.unwrap();

    let applier = {
        let mut sm = sm.clone();
        tokio::spawn(async move {
            for i in seeded + 1..=seeded + 300 {
                sm.apply(vec![offer(i, &format!("k{i}"))]).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        })
    };
    let mut snapshots = Vec::new();
    while !applier.is_finished() {
        let mut builder = sm.get_snapshot_builder().await;
        snapshots.push(builder.build_snapshot().await.unwrap());
        // Builds back to back would keep the applies waiting for the state lock.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    applier.await.unwrap();

    let mut built_mid_stream = 0;
    for snapshot in &snapshots {
        let state: baton_statemachine::State =
            baton_node::codec::decode(snapshot.snapshot.get_ref()).unwrap();
        let last = snapshot.meta.last_log_id.unwrap().index;
        assert_eq!(
            state.handoff.tickets().count() as u64,
            last,
            "snapshot {} holds a state other than its log id's",
            snapshot.meta.snapshot_id
        );
        if last > seeded && last < seeded + 300 {
            built_mid_stream += 1;
        }
    }
    eprintln!(
        "{} snapshots, {built_mid_stream} built while entries were being applied",
        snapshots.len()
    );
    // The applies take at least 0.3 s (1 ms apart); a build takes far less.
    assert!(built_mid_stream > 0, "no snapshot was built mid-stream");
}

/// A build that copied the state before a newer snapshot was installed must not write its older
/// image over the installed one: after a restart the node would resume from the older snapshot
/// with the log already purged up to the newer one, and could not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_finishing_after_a_newer_install_leaves_the_newer_snapshot_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let newer = 1_000_000;
    {
        let (_log, mut sm) = store::open(dir.path()).unwrap();
        // Enough state that encoding it takes far longer than installing a small snapshot.
        let per_entry = 1_000;
        let entries: Vec<_> = (1..=200u64)
            .map(|i| {
                let mut entry = offer(i, "");
                let EntryPayload::Normal(Batch(envelopes)) = &mut entry.payload else {
                    unreachable!()
                };
                let template = envelopes.pop().unwrap();
                for j in 0..per_entry {
                    let mut envelope = template.clone();
                    if let Command::Handoff(Handoff::Offer(args)) = &mut envelope.command {
                        args.key = format!("k{i}-{j}");
                    }
                    envelope.origin = None;
                    envelopes.push(envelope);
                }
                entry
            })
            .collect();
        sm.apply(entries).await.unwrap();

        let build = {
            let mut builder = sm.get_snapshot_builder().await;
            tokio::spawn(async move { builder.build_snapshot().await.unwrap() })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        // An apply waits until the build's copy of the state is done.
        sm.apply(vec![offer(201, "after-the-copy")]).await.unwrap();

        let small = baton_node::codec::encode(&baton_statemachine::State::default()).unwrap();
        let meta = openraft::SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(2, 1), newer)),
            last_membership: openraft::StoredMembership::default(),
            snapshot_id: "from-the-leader".into(),
        };
        sm.install_snapshot(&meta, Box::new(std::io::Cursor::new(small)))
            .await
            .unwrap();
        let built = build.await.unwrap();
        assert!(
            built.meta.last_log_id.unwrap().index <= 201,
            "the build copied the state before the install: {:?}",
            built.meta
        );
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta.snapshot_id, "from-the-leader");
    }
    let (_log, mut sm) = reopen(dir.path()).await;
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.map(|id| id.index), Some(newer));
}

/// A snapshot older than the state is never installed over it (openraft sends none; were one
/// to come, the state would move back and entries after it be applied twice): the install
/// fails, and the state and the stored snapshot stay as they were.
#[tokio::test]
async fn a_snapshot_older_than_the_state_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    four_offers_three_in_a_snapshot(dir.path()).await;
    let (_log, mut sm) = reopen(dir.path()).await;
    let old = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(old.meta.last_log_id.map(|id| id.index), Some(3));
    sm.apply(vec![offer(4, "k4")]).await.unwrap();
    let data = old.snapshot.into_inner();
    assert!(sm
        .install_snapshot(&old.meta, Box::new(std::io::Cursor::new(data)))
        .await
        .is_err());
    assert_eq!(sm.read().last_applied.map(|id| id.index), Some(4));
    assert_eq!(sm.read().state.handoff.tickets().count(), 4);
}

/// openraft purges the log up to a snapshot from the leader as soon as it hands the snapshot to
/// the state machine, without waiting for the install. A node killed while the install still
/// writes must restart from its old snapshot and the entries after it: the purge waits until the
/// new snapshot is on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_for_a_snapshot_streaming_in_waits_until_it_is_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let at = |index| LogId::new(CommittedLeaderId::new(1, 1), index);
    {
        let (mut log, mut sm) = store::open(dir.path()).unwrap();
        let entries: Vec<_> = (1..=10).map(|i| offer(i, &format!("k{i}"))).collect();
        log.blocking_append(entries.clone()).await.unwrap();
        log.save_committed(Some(at(10))).await.unwrap();
        sm.apply(entries[..5].to_vec()).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        // Up to the snapshot on disk: at once.
        log.purge(at(3)).await.unwrap();

        // A snapshot up to 50 streams in; openraft asks for the purge before it is installed.
        let _data = sm.begin_receiving_snapshot().await.unwrap();
        let purge = {
            let mut log = log.clone();
            tokio::spawn(async move { log.purge(at(50)).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !purge.is_finished(),
            "purged past a snapshot not yet on disk"
        );
        // The node dies before the install is stored.
        purge.abort();
    }
    let (mut log, mut sm) = reopen(dir.path()).await;
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.map(|id| id.index), Some(5));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.map(|id| id.index), Some(3));
    let indexes: Vec<u64> = log
        .try_get_log_entries(6..11)
        .await
        .unwrap()
        .iter()
        .map(|e| e.log_id.index)
        .collect();
    assert_eq!(indexes, vec![6, 7, 8, 9, 10], "the entries to re-apply");
}

/// A power loss can leave sled with an entry's record but not the file that holds its value
/// (values over ~128 KiB live in files of their own under `blobs/`); sled then skips that entry
/// and keeps the later ones. Reopened, the log drops everything from the hole on (none of it was
/// reported stored) instead of presenting a log with a hole, which openraft cannot read across.
#[tokio::test]
async fn an_entry_lost_with_its_blob_file_takes_the_later_entries_along() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let (mut log, _sm) = store::open(&path).unwrap();
        let mut big = offer(2, "big");
        if let EntryPayload::Normal(Batch(envelopes)) = &mut big.payload {
            if let Command::Handoff(Handoff::Offer(args)) = &mut envelopes[0].command {
                args.payload = vec![7; 300 << 10];
            }
        }
        log.blocking_append(vec![offer(1, "a")]).await.unwrap();
        log.save_committed(Some(LogId::new(CommittedLeaderId::new(1, 1), 1)))
            .await
            .unwrap();
        log.blocking_append(vec![big, offer(3, "c")]).await.unwrap();
    }
    // The power loss: the large entry's file never reached the disk.
    let blobs = path.join("blobs");
    let mut lost = 0;
    for file in std::fs::read_dir(&blobs).unwrap() {
        std::fs::remove_file(file.unwrap().path()).unwrap();
        lost += 1;
    }
    assert!(
        lost > 0,
        "the large entry was not kept in a file of its own"
    );

    let (mut log, _sm) = reopen(&path).await;
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id.map(|id| id.index), Some(1), "{state:?}");
    let entries = log.try_get_log_entries(0..10).await.unwrap();
    assert_eq!(
        entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
        vec![1]
    );
    assert_eq!(
        log.read_committed().await.unwrap().map(|id| id.index),
        Some(1)
    );
    // The log goes on from the hole.
    log.blocking_append(vec![offer(2, "b2")]).await.unwrap();
    let entries = log.try_get_log_entries(0..10).await.unwrap();
    assert_eq!(entries.len(), 2);
}

/// A snapshot write that a crash interrupted leaves its temporary file (as large as the image)
/// in the store's directory; the next open removes it and keeps the image.
#[tokio::test]
async fn a_snapshot_write_cut_short_leaves_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    four_offers_three_in_a_snapshot(dir.path()).await;
    let leftover = dir.path().join(".baton-interrupted");
    std::fs::write(&leftover, vec![0; 1 << 20]).unwrap();
    let (_log, sm) = reopen(dir.path()).await;
    assert!(
        !leftover.exists(),
        "the interrupted write's file is still there"
    );
    assert_eq!(sm.read().last_applied.map(|id| id.index), Some(3));
}

/// A committed entry is saved only after it was synced, so an entry missing at or below the
/// committed index was reported stored and is gone (a damaged disk, a data dir copied while
/// its node ran): the store refuses to open, naming the entry, instead of cutting its log back
/// and voting with it as if nothing had been acknowledged.
#[tokio::test]
async fn a_committed_entry_gone_from_the_log_stops_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let (mut log, _sm) = store::open(&path).unwrap();
        log.blocking_append(
            (1..=5)
                .map(|i| offer(i, &format!("k{i}")))
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
        log.save_committed(Some(LogId::new(CommittedLeaderId::new(1, 1), 4)))
            .await
            .unwrap();
    }
    {
        let db = raw_sled(&path).await;
        db.open_tree(b"log")
            .unwrap()
            .remove(3u64.to_be_bytes())
            .unwrap()
            .expect("entry 3 was stored");
        db.flush().unwrap();
    }
    // sled may hold the raw handle's lock for a moment after it is dropped.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let error = loop {
        match store::open(&path) {
            Ok(_) => panic!("a log that lost committed entry 3 was opened"),
            Err(error) if error.to_string().contains("lost entry") => break error.to_string(),
            Err(error) if std::time::Instant::now() < deadline => {
                eprintln!("open: {error}; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(error) => panic!("open: {error}"),
        }
    };
    assert!(
        error.contains("lost entry 3") && error.contains("entries up to 4 were committed"),
        "{error}"
    );
}

/// The committed pointer is saved lazily (and not when a snapshot is installed), so it may lag
/// far behind; the durable snapshot covers committed entries only. A hole at or below the
/// snapshot's end is refused the same way, with no committed pointer saved at all.
#[tokio::test]
async fn an_entry_the_snapshot_covers_gone_from_the_log_stops_the_node() {
    let dir = tempfile::tempdir().unwrap();
    four_offers_three_in_a_snapshot(dir.path()).await;
    {
        let db = raw_sled(dir.path()).await;
        db.open_tree(b"log")
            .unwrap()
            .remove(2u64.to_be_bytes())
            .unwrap()
            .expect("entry 2 was stored");
        db.flush().unwrap();
    }
    let error = retry_open("reopen the stores", || match store::open(dir.path()) {
        Ok(_) => Err("a log that lost entry 2 of the snapshot's 3 was opened".to_string()),
        Err(error) if error.to_string().contains("lost entry") => Ok(error.to_string()),
        Err(error) => Err(error.to_string()),
    })
    .await;
    assert!(
        error.contains("lost entry 2") && error.contains("entries up to 3 were committed"),
        "{error}"
    );
}
