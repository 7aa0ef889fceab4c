//! Claim: when the PROCESS that acquired a side effect is SIGKILLed, the key is never silently
//! granted again (contract §3 "an intent that expires unresolved turns the key uncertain — never
//! a fresh grant"; acquire order completed > uncertain > in progress > contended > granted):
//!
//! - while the dead holder's intent is live, the key answers `in_progress` and another key on
//!   the resource `contended`;
//! - once its TTL passed, the key answers `uncertain` — on the lazy path (judged by the acquire
//!   itself) and after the leader's sweep materialised it (seen by a read-only `show`) — even
//!   while another key holds the resource (so not `contended`), and never `granted`;
//! - `begin_reconcile` (one reconciler: a second is `RECONCILE_TAKEN`) + `resolve_uncertain`
//!   "did not happen" makes a safe key acquirable again with a higher fence;
//! - for an unsafe key "did not happen" is refused `UNSAFE_NOT_RETRYABLE` (the key stays
//!   uncertain) unless forced.
//!
//! The holders are separate OS processes (`src/bin/holder.rs`); the test checks through `show`
//! that the grant the store recorded is the one the process printed.
#![allow(clippy::unwrap_used)]

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use baton_cluster_test::holder::Holder;
use baton_cluster_test::{wait, wall_clock_ms, Cluster, Options};
use baton_rpc::{Client, Error};
use baton_statemachine::effect::{
    Action, EffectLease, KeyStatus, Outcome, Resolution, Resolved, RetrySafety,
};

/// Long enough that the checks made while a killed holder's intent lives run on a slow machine
/// too (they come a second or so after the acquire); the test waits the rest of it out.
const TTL_MS: i64 = 10_000;
const LIMIT: Duration = Duration::from_secs(20);

fn action(key: &str, resource: &str, safety: RetrySafety) -> Action {
    Action {
        key: key.into(),
        resource: resource.into(),
        safety,
    }
}

async fn acquire(client: &Client, action: &Action) -> Outcome {
    client.acquire(action, 30_000).await.unwrap()
}

fn granted(outcome: Outcome, what: &str) -> EffectLease {
    match outcome {
        Outcome::Granted(lease) => lease,
        other => panic!("{what}: want granted, got {other:?}"),
    }
}

fn code(result: Result<impl std::fmt::Debug, Error>) -> String {
    match result {
        Err(Error::Refused(refusal)) => refusal.code().to_string(),
        other => panic!("want a contract refusal, got {other:?}"),
    }
}

/// Spawns a holder process for `action`, checks that the store recorded its grant, SIGKILLs it;
/// while its TTL surely runs, checks that the key is in progress and that `probe` (another key
/// on the same resource) is contended. Returns the dead holder's lease and how much of its TTL
/// was left (ms) when those checks began.
async fn holder_killed(
    bin: &Path,
    cluster: &Cluster,
    client: &Client,
    action: &Action,
    probe: &Action,
) -> (EffectLease, u64) {
    let mut holder = Holder::spawn(
        bin,
        &cluster.endpoints(),
        action,
        TTL_MS,
        "t61-sink",
        "never written",
        LIMIT,
    )
    .await
    .unwrap();
    let lease = holder.lease.clone();
    let view = client.show_action(&action.key).await.unwrap();
    assert_eq!(view.status, KeyStatus::InProgress, "{view:?}");
    assert_eq!(
        view.fence,
        lease.fence,
        "the store's attempt is the one holder process {} printed",
        holder.pid()
    );
    let status = holder.kill().await.unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "the holder died of SIGKILL: {status}"
    );
    // The dead process's intent and hold still count until they expire: checked with a second
    // of the TTL to spare at least (the two acquires take milliseconds).
    let left_ms = lease.until_ms.saturating_sub(wall_clock_ms());
    assert!(
        left_ms > 1_000,
        "only {left_ms} ms of the {TTL_MS} ms TTL left to check the live intent"
    );
    assert_eq!(acquire(client, action).await, Outcome::InProgress);
    assert_eq!(acquire(client, probe).await, Outcome::Contended);
    (lease, left_ms)
}

/// A SIGKILLed holder's key is in progress while its intent lives, uncertain (never granted)
/// once it expired, and acquirable again only through reconciliation (an unsafe key only when
/// forced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t61_sigkilled_holder_leaves_the_key_uncertain_until_reconciled() {
    let bin = Path::new(env!("CARGO_BIN_EXE_holder"));
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    let started = Instant::now();

    let safe = action("t61-safe", "t61-res-safe", RetrySafety::Safe);
    let unsafe_ = action("t61-unsafe", "t61-res-unsafe", RetrySafety::Unsafe);
    let probe = action("t61-probe", "t61-res-safe", RetrySafety::Safe);

    let unsafe_probe = action("t61-unsafe-probe", "t61-res-unsafe", RetrySafety::Safe);
    let (dead_safe, left_safe) = holder_killed(bin, &cluster, &client, &safe, &probe).await;
    let (dead_unsafe, left_unsafe) =
        holder_killed(bin, &cluster, &client, &unsafe_, &unsafe_probe).await;
    assert_eq!((dead_safe.fence, dead_unsafe.fence), (1, 1));

    // Past the TTL: the safe key is uncertain, normally on the lazy path (this acquire judges the
    // expiry before the sweep got to it).
    let until = dead_safe.until_ms.max(dead_unsafe.until_ms);
    let wait_ms = (until + 50).saturating_sub(wall_clock_ms());
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    // `show` is a read: it still says in progress unless the sweep already ran.
    let lazy = client.show_action(&safe.key).await.unwrap().status == KeyStatus::InProgress;
    assert_eq!(
        acquire(&client, &safe).await,
        Outcome::Uncertain,
        "an expired, unresolved intent must turn the key uncertain, never a fresh grant"
    );

    // The unsafe key is touched by nobody: the leader's sweep materialises its expiry.
    let swept = wait::until(
        "the sweep to turn the unsafe key uncertain",
        LIMIT,
        || async {
            match client.show_action(&unsafe_.key).await {
                Ok(view) if view.status == KeyStatus::Uncertain => Ok(view),
                Ok(view) => Err(format!("{view:?}")),
                Err(error) => Err(error.to_string()),
            }
        },
    )
    .await
    .unwrap();
    assert!(swept.intent_until_ms.is_none(), "{swept:?}");
    assert!(swept.reason.contains("expired"), "{swept:?}");
    // After the sweep: both keys still uncertain.
    assert_eq!(acquire(&client, &unsafe_).await, Outcome::Uncertain);
    assert_eq!(acquire(&client, &safe).await, Outcome::Uncertain);

    // The hold expired too: another key takes the resource, and while it holds it the dead
    // holder's key is still judged uncertain first (not contended).
    let probe_lease = granted(
        acquire(&client, &probe).await,
        "probe on the freed resource",
    );
    assert!(probe_lease.fence > dead_safe.fence);
    assert_eq!(acquire(&client, &safe).await, Outcome::Uncertain);
    client
        .complete_effect(&probe, &probe_lease, "probed")
        .await
        .unwrap();
    client.release_effect(&probe, &probe_lease).await.unwrap();

    // Reconcile the safe key: one reconciler at a time; "did not happen" makes it retryable.
    client.begin_reconcile(&safe, 10_000).await.unwrap();
    assert_eq!(
        code(client.begin_reconcile(&safe, 10_000).await),
        "RECONCILE_TAKEN"
    );
    let resolved = client
        .resolve_uncertain(
            &safe,
            &Resolution {
                happened: false,
                result: String::new(),
                force_retryable: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Retryable);
    assert_eq!(
        client.show_action(&safe.key).await.unwrap().status,
        KeyStatus::Idle
    );
    let retry = granted(acquire(&client, &safe).await, "the reconciled safe key");
    assert!(
        retry.fence > probe_lease.fence && retry.fence > dead_safe.fence,
        "retry fence {} after {} and {}",
        retry.fence,
        dead_safe.fence,
        probe_lease.fence
    );
    client
        .complete_effect(&safe, &retry, "charged-once")
        .await
        .unwrap();
    client.release_effect(&safe, &retry).await.unwrap();
    assert_eq!(
        acquire(&client, &safe).await,
        Outcome::Completed("charged-once".into())
    );

    // The unsafe key: "did not happen" is refused unless forced, and changes nothing.
    client.begin_reconcile(&unsafe_, 10_000).await.unwrap();
    let not_forced = Resolution {
        happened: false,
        result: String::new(),
        force_retryable: false,
    };
    assert_eq!(
        code(client.resolve_uncertain(&unsafe_, &not_forced).await),
        "UNSAFE_NOT_RETRYABLE"
    );
    assert_eq!(
        client.show_action(&unsafe_.key).await.unwrap().status,
        KeyStatus::Uncertain
    );
    assert_eq!(acquire(&client, &unsafe_).await, Outcome::Uncertain);
    let forced = Resolution {
        force_retryable: true,
        ..not_forced
    };
    assert_eq!(
        client.resolve_uncertain(&unsafe_, &forced).await.unwrap(),
        Resolved::Retryable
    );
    let unsafe_retry = granted(acquire(&client, &unsafe_).await, "the forced unsafe key");
    assert!(unsafe_retry.fence > dead_unsafe.fence);
    client
        .release_effect(&unsafe_, &unsafe_retry)
        .await
        .unwrap();

    println!(
        "t61: 2 holder processes SIGKILLed after acquiring (fence 1 each); in-progress/contended checks while the dead intent lived, with {left_safe}/{left_unsafe} ms of it left; \
         after TTL {TTL_MS}ms both keys uncertain (first answer on the lazy path: {lazy}; after the sweep too, also with the resource held by \
         fence {}); safe key reconciled -> granted fence {}; unsafe did-not-happen refused UNSAFE_NOT_RETRYABLE, \
         forced -> granted fence {}; {:.1}s",
        probe_lease.fence,
        retry.fence,
        unsafe_retry.fence,
        started.elapsed().as_secs_f64()
    );
}
