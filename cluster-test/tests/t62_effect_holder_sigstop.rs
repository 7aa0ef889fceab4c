//! Claim: a holder PROCESS frozen with SIGSTOP past its lease cannot do damage when it wakes up
//! (contract §3: holder operations pass the three-way check, `FENCE_STALE` when the resource
//! moved on; the fenced sink refuses a fence below the highest it has seen and writes nothing):
//!
//! - while it is frozen its hold expires and another key on the same resource is granted a
//!   higher fence (before that, the resource answers `contended`), and writes the sink with it;
//! - after SIGCONT the old holder's fenced write is refused `FENCE_STALE` and the sink value
//!   stays the new holder's; its complete and its release are refused `FENCE_STALE`;
//! - the new holder's write, complete and release succeed.
//!
//! The old holder is a separate OS process (`src/bin/holder.rs`) that acquires, prints its lease
//! and performs each step when told on stdin, so the test freezes it between steps.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use baton_cluster_test::holder::Holder;
use baton_cluster_test::{wait, Cluster, Options};
use baton_statemachine::effect::{Action, KeyStatus, Outcome, RetrySafety};

const OLD_TTL_MS: i64 = 2_000;
const NEW_TTL_MS: i64 = 30_000;
const SINK: &str = "t62-ledger";
const LIMIT: Duration = Duration::from_secs(20);

/// The process state letter from `/proc/<pid>/stat` (`T` = stopped).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t62_sigstopped_holder_is_fenced_out_after_sigcont() {
    let bin = Path::new(env!("CARGO_BIN_EXE_holder"));
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    let started = Instant::now();

    let old = Action {
        key: "t62-old".into(),
        resource: "t62-res".into(),
        safety: RetrySafety::Safe,
    };
    let new = Action {
        key: "t62-new".into(),
        ..old.clone()
    };

    let mut holder = Holder::spawn(
        bin,
        &cluster.endpoints(),
        &old,
        OLD_TTL_MS,
        SINK,
        "old-holder",
        LIMIT,
    )
    .await
    .unwrap();
    let old_lease = holder.lease.clone();
    let view = client.show_action(&old.key).await.unwrap();
    assert_eq!(
        view.fence, old_lease.fence,
        "the store's attempt is the holder process's"
    );
    // While its lease lives, the old holder's fenced write goes through.
    let first_write = holder.command("write", LIMIT).await.unwrap();
    assert_eq!(first_write.status, "ok", "{}", first_write.raw);
    assert_eq!(
        first_write.field("seen").unwrap(),
        old_lease.fence.to_string()
    );

    holder.stop().unwrap();
    let pid = holder.pid();
    wait::until("the holder to be stopped", LIMIT, || async move {
        match process_state(pid) {
            Some('T') | Some('t') => Ok(()),
            other => Err(format!("state {other:?}")),
        }
    })
    .await
    .unwrap();

    // While it is frozen: contended until its hold expires, then granted with a higher fence.
    let contended = AtomicUsize::new(0);
    let new_lease = wait::until("the frozen holder's hold to expire", LIMIT, || {
        let (client, new, contended) = (&client, &new, &contended);
        async move {
            match client.acquire(new, NEW_TTL_MS).await {
                Ok(Outcome::Granted(lease)) => Ok(Ok(lease)),
                Ok(Outcome::Contended) => {
                    contended.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Err("contended".to_string())
                }
                Ok(other) => Ok(Err(format!("unexpected outcome {other:?}"))),
                Err(error) => Err(error.to_string()),
            }
        }
    })
    .await
    .unwrap()
    .unwrap();
    let contended = contended.into_inner();
    assert_eq!(
        process_state(pid),
        Some('T'),
        "the old holder stayed frozen"
    );
    assert!(
        new_lease.fence > old_lease.fence,
        "new fence {} after {}",
        new_lease.fence,
        old_lease.fence
    );
    let granted_at = new_lease.until_ms - NEW_TTL_MS as u64;
    assert!(
        granted_at >= old_lease.until_ms,
        "granted at store time {granted_at}, before the old hold ended at {}",
        old_lease.until_ms
    );
    let written = client
        .write_fenced(SINK, new_lease.fence, b"new-holder")
        .await
        .unwrap();
    assert_eq!((written.seen_fence, written.writes), (new_lease.fence, 2));

    // Wake the old holder up and let it go on as if nothing happened.
    holder.resume().unwrap();
    let late_write = holder.command("write", LIMIT).await.unwrap();
    assert_eq!(
        late_write.refusal(),
        Some("FENCE_STALE"),
        "{}",
        late_write.raw
    );
    let sink = client.read_sink(SINK).await.unwrap();
    assert_eq!(
        (sink.value.as_slice(), sink.seen_fence, sink.writes),
        (&b"new-holder"[..], new_lease.fence, 2),
        "the refused write changed nothing"
    );
    let late_complete = holder.command("complete", LIMIT).await.unwrap();
    assert_eq!(
        late_complete.refusal(),
        Some("FENCE_STALE"),
        "{}",
        late_complete.raw
    );
    let late_release = holder.command("release", LIMIT).await.unwrap();
    assert_eq!(
        late_release.refusal(),
        Some("FENCE_STALE"),
        "{}",
        late_release.raw
    );
    let status = holder.finish(LIMIT).await.unwrap();
    assert!(status.success(), "holder exit {status}");
    let old_view = client.show_action(&old.key).await.unwrap();
    assert_eq!(
        old_view.status,
        KeyStatus::Uncertain,
        "the old attempt's intent expired unresolved; its refused complete recorded nothing: {old_view:?}"
    );
    assert_eq!(old_view.result, None);

    // The new holder is untouched: its own write, complete and release succeed.
    let again = client
        .write_fenced(SINK, new_lease.fence, b"new-holder-2")
        .await
        .unwrap();
    assert_eq!((again.seen_fence, again.writes), (new_lease.fence, 3));
    assert_eq!(
        client
            .complete_effect(&new, &new_lease, "new-result")
            .await
            .unwrap(),
        "new-result"
    );
    client.release_effect(&new, &new_lease).await.unwrap();
    let new_view = client.show_action(&new.key).await.unwrap();
    assert_eq!(new_view.status, KeyStatus::Completed);
    assert_eq!(new_view.result.as_deref(), Some("new-result"));
    let sink = client.read_sink(SINK).await.unwrap();
    assert_eq!(sink.value, b"new-holder-2");

    println!(
        "t62: holder pid {pid} acquired fence {} (ttl {OLD_TTL_MS}ms), wrote, was SIGSTOPped; {contended} \
         contended answers, then fence {} granted to another key and written; after SIGCONT the old \
         holder's write, complete and release were refused FENCE_STALE, sink kept fence {} value \
         new-holder; the new holder's write/complete/release succeeded; {:.1}s",
        old_lease.fence,
        new_lease.fence,
        new_lease.fence,
        started.elapsed().as_secs_f64()
    );
}
