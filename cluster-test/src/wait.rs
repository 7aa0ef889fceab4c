//! Bounded waiting: every wait in the harness polls a probe until it succeeds or a deadline
//! passes, and a timeout names what was awaited and the last reason it was not yet true.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::bail;

/// How often probes are repeated.
pub const POLL: Duration = Duration::from_millis(25);

/// Runs `probe` every [`POLL`] until it returns `Ok`, for at most `timeout`. `Err(reason)` from
/// the probe means "not yet"; the last reason is part of the timeout error.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        let last = match tokio::time::timeout(timeout, probe()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(reason)) => reason,
            Err(_) => "the probe itself did not finish".to_string(),
        };
        if started.elapsed() >= timeout {
            bail!("timed out after {timeout:?} waiting for {what}: {last}");
        }
        tokio::time::sleep(POLL).await;
    }
}
