//! Claim: checkpoint compare-and-set holds under concurrent savers on a real cluster (contract §4:
//! `save_if_newer` stores only a seq above the stored one, `STALE_SEQ` otherwise and nothing
//! written; `load` of a run never saved is `NOT_FOUND`):
//!
//! - 8 clients (8 sessions) save random seqs in 1..=500 for one run at the same time; a save that
//!   fails for infrastructure reasons is retried, and now and then an acknowledged save is sent
//!   again (it must be `STALE_SEQ`: an equal seq is not newer);
//! - every `STALE_SEQ` is explained: some save with a seq >= it (acknowledged or ambiguous) was
//!   invoked before the refusal came back;
//! - no save is acknowledged after another acknowledged save with a seq >= its own had already
//!   come back, and no seq is acknowledged twice;
//! - afterwards `load` returns the highest acknowledged seq with exactly that save's data;
//! - a run never saved reads `NOT_FOUND`, and seq 0 is refused `INVALID_ARGUMENT`.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_cluster_test::{first, Cluster, Options};
use baton_rpc::{Client, Error};
use baton_statemachine::checkpoint::Checkpoint;
use baton_statemachine::Refusal;
use rand::Rng;
use tokio::sync::Barrier;

const CLIENTS: usize = 8;
/// Runs, one after another; in each, every client starts at the same moment.
const RUNS: usize = 10;
const SAVES: usize = 8;
const MAX_SEQ: u64 = 500;

#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Acked,
    Stale,
    /// Infrastructure failure: the save may or may not have been applied.
    Ambiguous(String),
    /// Any other refusal (never legitimate here).
    Refused(String),
}

#[derive(Debug, Clone)]
struct Attempt {
    client: usize,
    seq: u64,
    data: String,
    invoked: Instant,
    answered: Instant,
    answer: Answer,
    /// A deliberate resend of an acknowledged save.
    resend: bool,
}

async fn save(
    client: &Client,
    run: &str,
    id: usize,
    seq: u64,
    data: &str,
    resend: bool,
) -> Attempt {
    let invoked = Instant::now();
    let result = client.save_if_newer(run, seq, data.as_bytes()).await;
    let answer = match result {
        Ok(()) => Answer::Acked,
        Err(Error::Refused(Refusal::StaleSeq)) => Answer::Stale,
        Err(Error::Refused(other)) => Answer::Refused(other.code().to_string()),
        Err(error) => Answer::Ambiguous(error.to_string()),
    };
    Attempt {
        client: id,
        seq,
        data: data.to_string(),
        invoked,
        answered: Instant::now(),
        answer,
        resend,
    }
}

async fn saver(client: Client, run: String, id: usize, barrier: Arc<Barrier>) -> Vec<Attempt> {
    let mut attempts = Vec::new();
    barrier.wait().await;
    for n in 0..SAVES {
        let (seq, resend) = {
            let mut rng = rand::rng();
            (rng.random_range(1..=MAX_SEQ), rng.random_ratio(1, 4))
        };
        let data = format!("{run}-client-{id}-save-{n}-seq-{seq}");
        // Retry an ambiguous save (a retry's STALE_SEQ may be its own first attempt's doing).
        for _ in 0..3 {
            let attempt = save(&client, &run, id, seq, &data, false).await;
            let answer = attempt.answer.clone();
            attempts.push(attempt);
            match answer {
                Answer::Ambiguous(_) => continue,
                Answer::Acked if resend => {
                    attempts.push(save(&client, &run, id, seq, &data, true).await);
                    break;
                }
                _ => break,
            }
        }
    }
    attempts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t64_concurrent_savers_keep_the_highest_acknowledged_seq() {
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    let started = Instant::now();

    let never = client.load("t64-never-saved").await.unwrap_err();
    assert_eq!(never.refusal(), Some(&Refusal::NotFound), "{never}");
    let zero = client
        .save_if_newer("t64-run-0", 0, b"zero")
        .await
        .unwrap_err();
    assert_eq!(
        zero.refusal().map(|r| r.code()),
        Some("INVALID_ARGUMENT"),
        "{zero}"
    );
    let still_never = client.load("t64-run-0").await.unwrap_err();
    assert_eq!(
        still_never.refusal(),
        Some(&Refusal::NotFound),
        "a refused seq 0 wrote nothing: {still_never}"
    );

    let mut savers = Vec::new();
    for _ in 0..CLIENTS {
        savers.push(cluster.client().await.unwrap());
    }
    let mut totals = Totals::default();
    let mut finals = Vec::new();
    for r in 0..RUNS {
        let run = format!("t64-run-{r}");
        let barrier = Arc::new(Barrier::new(CLIENTS));
        let tasks: Vec<_> = savers
            .iter()
            .enumerate()
            .map(|(id, saver_client)| {
                tokio::spawn(saver(
                    saver_client.clone(),
                    run.clone(),
                    id,
                    barrier.clone(),
                ))
            })
            .collect();
        let mut attempts = Vec::new();
        for task in tasks {
            attempts.extend(
                tokio::time::timeout(Duration::from_secs(60), task)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        let loaded = client.load(&run).await.unwrap();
        finals.push(verify_run(&run, &attempts, &loaded, &mut totals));
    }
    println!(
        "t64: {RUNS} runs x {CLIENTS} concurrent clients x {SAVES} saves of random seqs 1..={MAX_SEQ}: {} attempts, \
         {} acknowledged, {} STALE_SEQ (incl. {} resends of acknowledged saves), {} ambiguous; every STALE_SEQ \
         explained; each load returned the highest acknowledged seq with its data (final seqs {finals:?}); \
         never-saved run NOT_FOUND, seq 0 INVALID_ARGUMENT; {:.1}s",
        totals.attempts,
        totals.acked,
        totals.stale,
        totals.resends,
        totals.ambiguous,
        started.elapsed().as_secs_f64()
    );
}

#[derive(Debug, Default)]
struct Totals {
    attempts: usize,
    acked: usize,
    stale: usize,
    resends: usize,
    ambiguous: usize,
}

/// Checks one run's attempts against its final load; returns the loaded seq.
fn verify_run(run: &str, attempts: &[Attempt], loaded: &Checkpoint, totals: &mut Totals) -> u64 {
    let refused: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| matches!(a.answer, Answer::Refused(_)))
        .collect();
    assert!(
        refused.is_empty(),
        "{run}: other refusals: {}",
        first(&refused, 5)
    );
    let acked: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| a.answer == Answer::Acked)
        .collect();
    let stale: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| a.answer == Answer::Stale)
        .collect();
    let ambiguous = attempts
        .iter()
        .filter(|a| matches!(a.answer, Answer::Ambiguous(_)))
        .count();

    // A resend of an acknowledged save is never newer (it may only fail for infrastructure
    // reasons, which says nothing).
    for a in attempts.iter().filter(|a| a.resend) {
        assert!(
            matches!(a.answer, Answer::Stale | Answer::Ambiguous(_)),
            "{run}: a resent acknowledged save was not refused STALE_SEQ: {a:?}"
        );
    }
    // Every STALE_SEQ is explained by a save with a seq >= it that started before it ended.
    for (i, refusal) in attempts.iter().enumerate() {
        if refusal.answer != Answer::Stale {
            continue;
        }
        let explained = attempts.iter().enumerate().any(|(j, other)| {
            j != i
                && other.seq >= refusal.seq
                && other.invoked < refusal.answered
                && matches!(other.answer, Answer::Acked | Answer::Ambiguous(_))
        });
        assert!(
            explained,
            "{run}: STALE_SEQ for seq {} (client {}) with no save of a seq >= it before: {refusal:?}",
            refusal.seq, refusal.client
        );
    }
    // No acknowledged save after an acknowledged save with a seq >= its own had come back.
    for a in &acked {
        if let Some(b) = acked
            .iter()
            .find(|b| b.seq >= a.seq && b.answered < a.invoked)
        {
            panic!(
                "{run}: seq {} acknowledged although seq {} was stored before it started: \
                 {a:?} after {b:?}",
                a.seq, b.seq
            );
        }
    }
    let mut by_seq: BTreeMap<u64, &Attempt> = BTreeMap::new();
    for a in &acked {
        if let Some(previous) = by_seq.insert(a.seq, a) {
            panic!(
                "{run}: seq {} acknowledged twice: {previous:?} and {a:?}",
                a.seq
            );
        }
    }

    // The final load: the highest acknowledged seq with its data (or, only if it was higher, an
    // ambiguous save's).
    let (&max_acked, winner) = by_seq
        .last_key_value()
        .unwrap_or_else(|| panic!("{run}: no save was acknowledged"));
    if loaded.seq == max_acked {
        assert_eq!(
            String::from_utf8_lossy(&loaded.data),
            winner.data,
            "{run}: load returned seq {max_acked} with another save's data"
        );
    } else {
        let source = attempts.iter().find(|a| {
            a.seq == loaded.seq
                && matches!(a.answer, Answer::Ambiguous(_))
                && a.data.as_bytes() == loaded.data.as_slice()
        });
        assert!(
            loaded.seq > max_acked && source.is_some(),
            "{run}: load returned seq {} ({:?}); the highest acknowledged is {max_acked}",
            loaded.seq,
            String::from_utf8_lossy(&loaded.data)
        );
    }
    assert!(loaded.saved_at_ms > 0);
    totals.attempts += attempts.len();
    totals.acked += acked.len();
    totals.stale += stale.len();
    totals.resends += attempts.iter().filter(|a| a.resend).count();
    totals.ambiguous += ambiguous;
    loaded.seq
}
