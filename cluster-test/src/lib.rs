//! Multi-process cluster tests for Baton: a harness that runs real `baton node` processes on
//! 127.0.0.1 and the pieces the tests in `tests/` share.
//!
//! - [`binary`]: finds (and if needed builds) the `baton` binary.
//! - [`cluster`]: starts, kills (SIGKILL), restarts and inspects the nodes of one cluster.
//! - [`history`]: records acknowledged operations and checks that none was lost.
//! - [`workload`]: client tasks that produce such a history.
//! - [`cli`]: runs the `baton` command line with a time limit.
//! - [`holder`]: drives the `holder` binary, a side-effect holder in its own process.
//! - [`queue_worker`]: runs `baton worker run` as its own process and reads what it reports.
//! - [`wait`]: bounded polling.
//! - [`proxy`]: one TCP proxy per peer link, cut and healed to partition the cluster.
//! - [`power_cut`]: a FUSE directory whose unsynced writes a test can throw away, as a power loss does.
//! - [`clock_skew`]: a node whose wall clock runs ahead or behind (libfaketime).
//! - [`linearizability`]: a Wing–Gong/Lowe linearizability checker and a handoff ticket model.
//! - [`robustness`]: fault scenarios under recorded workloads, and the checkers that judge them.
//! - [`docker`]: the compose cluster of `deploy/` in containers, and container faults (skipped
//!   where no Docker engine answers).
#![deny(missing_docs)]

pub mod binary;
pub mod cli;
pub mod clock_skew;
pub mod cluster;
pub mod docker;
pub mod history;
pub mod holder;
pub mod linearizability;
pub mod power_cut;
pub mod proxy;
pub mod queue_worker;
pub mod robustness;
pub mod wait;
pub mod workload;

pub use cluster::{client_config, Cluster, Options};

/// This machine's wall clock in Unix milliseconds: the clock the nodes here stamp commands with.
pub fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// Panics unless every ticket passes the invariants `baton check` judges
/// ([`baton_rpc::judge::check`], at the store's own time).
pub async fn assert_check_clean(client: &baton_rpc::Client) {
    let problems = baton_rpc::judge::check(client)
        .await
        .expect("check could not read the state");
    assert!(
        problems.is_empty(),
        "check found problems: {}",
        first(&problems, 5)
    );
}

/// At most `n` items of a list for an assertion message, with the total count.
pub fn first<T: std::fmt::Debug>(items: &[T], n: usize) -> String {
    let shown: Vec<String> = items
        .iter()
        .take(n)
        .map(|item| format!("{item:?}"))
        .collect();
    if items.len() > n {
        format!(
            "{} in total, first {n}: [{}]",
            items.len(),
            shown.join(", ")
        )
    } else {
        format!("[{}]", shown.join(", "))
    }
}

/// An offer of an empty ticket from "a" to "b" under `key`, alive for ten minutes: what a fault
/// test writes when only whether the write survives matters, not who takes it.
pub fn offer_a_to_b(key: impl Into<String>) -> baton_statemachine::handoff::OfferArgs {
    baton_statemachine::handoff::OfferArgs {
        key: key.into(),
        from: "a".into(),
        to: "b".into(),
        payload: Vec::new(),
        reply_to: "a".into(),
        ttl_ms: 600_000,
    }
}
