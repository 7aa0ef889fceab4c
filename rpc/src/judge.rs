//! The contract's judges, driven against a live store.
//!
//! A judge checks a result, not a process: `concurrent_take` lets N takers race for one ticket
//! and requires exactly one winner, with every loser refused `TAKEN`. A loser refused for another
//! reason never reached the race, and an infrastructure failure is reported as such and never
//! counted as a loss, so a dead store cannot pass by having "nobody win".

use std::sync::Arc;
use std::time::Duration;

use baton_statemachine::handoff::{self, Handle, Problem};
use baton_statemachine::Refusal;
use tokio::sync::Barrier;

use crate::{Client, Error};

/// The outcome of one race.
#[derive(Debug, Default)]
pub struct TakeRace {
    /// The handles of the takers that won (exactly one when the store is correct).
    pub winners: Vec<Handle>,
    /// Takers refused `TAKEN`.
    pub losers: usize,
    /// Takers refused for another contract reason: they never reached the race.
    pub misses: Vec<Refusal>,
    /// Takers that failed for infrastructure reasons (including the judgement's own time limit).
    pub infra_errors: Vec<Error>,
}

impl TakeRace {
    /// `Ok` when exactly one taker won and every other one lost with `TAKEN`.
    pub fn verdict(&self) -> Result<(), String> {
        if !self.infra_errors.is_empty() {
            return Err(format!(
                "{} infrastructure failures (first: {})",
                self.infra_errors.len(),
                self.infra_errors[0]
            ));
        }
        if !self.misses.is_empty() {
            return Err(format!(
                "{} takers never reached the race (first refusal: {})",
                self.misses.len(),
                self.misses[0].code()
            ));
        }
        if self.winners.len() != 1 {
            return Err(format!("{} winners, want exactly 1", self.winners.len()));
        }
        Ok(())
    }
}

/// Lets every taker in `takers` take `key` at the same moment (a barrier, not a loop) and
/// tallies the outcome. `limit` bounds the whole judgement so a hung store cannot hang the caller;
/// takers still running at the limit are reported as infrastructure failures.
pub async fn concurrent_take(
    client: &Client,
    key: &str,
    takers: &[String],
    limit: Duration,
) -> TakeRace {
    let barrier = Arc::new(Barrier::new(takers.len()));
    let tasks: Vec<_> = takers
        .iter()
        .map(|to| {
            let (client, barrier, key, to) =
                (client.clone(), barrier.clone(), key.to_string(), to.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                client.take(&key, &to).await
            })
        })
        .collect();
    let mut race = TakeRace::default();
    let all = futures::future::join_all(tasks);
    match tokio::time::timeout(limit, all).await {
        Err(_) => race.infra_errors.push(Error::Unavailable {
            endpoints: client.endpoints().to_vec(),
            waited: limit,
            last: "the race did not finish within its time limit".into(),
        }),
        Ok(results) => {
            for result in results {
                match result {
                    Ok(Ok(handle)) => race.winners.push(handle),
                    Ok(Err(Error::Refused(Refusal::Taken))) => race.losers += 1,
                    Ok(Err(Error::Refused(other))) => race.misses.push(other),
                    Ok(Err(error)) => race.infra_errors.push(error),
                    Err(join) => race
                        .infra_errors
                        .push(Error::Protocol(format!("taker task failed: {join}"))),
                }
            }
        }
    }
    race
}

/// Reads a consistent snapshot and judges its invariants at the store's "now".
pub async fn check(client: &Client) -> Result<Vec<Problem>, Error> {
    let snapshot = client.tickets().await?;
    Ok(handoff::check(&snapshot.tickets, snapshot.now_ms))
}
