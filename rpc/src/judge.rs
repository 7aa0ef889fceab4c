//! The contract's judges, driven against a live store.
//!
//! A judge checks a result, not a process: `concurrent_take` lets N takers race for one ticket
//! (and `concurrent_claim` N agents for one task) and requires exactly one winner, with every
//! loser refused `TAKEN`. A loser refused for another reason never reached the race, and an
//! infrastructure failure is reported as such and never counted as a loss, so a dead store cannot
//! pass by having "nobody win".

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use baton_statemachine::board::{self, BoardProblem, Task};
use baton_statemachine::handoff::{self, Handle, Problem};
use baton_statemachine::Refusal;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::{Client, Error};

/// The outcome of one race; `W` is what a winner gets.
#[derive(Debug)]
pub struct Race<W> {
    /// How many contenders were started: every one of them ends up in exactly one of the tallies
    /// below.
    pub contenders: usize,
    /// What the contenders that won got (exactly one when the store is correct).
    pub winners: Vec<W>,
    /// Contenders refused `TAKEN`.
    pub losers: usize,
    /// Contenders refused for another contract reason: they never reached the race.
    pub misses: Vec<Refusal>,
    /// Contenders that failed for infrastructure reasons (including the judgement's own time
    /// limit).
    pub infra_errors: Vec<Error>,
}

impl<W> Default for Race<W> {
    fn default() -> Self {
        Self {
            contenders: 0,
            winners: Vec::new(),
            losers: 0,
            misses: Vec::new(),
            infra_errors: Vec::new(),
        }
    }
}

/// The outcome of a [`concurrent_take`]: winners hold a take's handle.
pub type TakeRace = Race<Handle>;

/// The outcome of a [`concurrent_claim`]: winners hold the claimed task (its lease carries the
/// token and fence).
pub type ClaimRace = Race<Task>;

impl<W> Race<W> {
    /// `Ok` when exactly one contender won and every other one lost with `TAKEN`: the tallies
    /// must also account for every contender started, none lost nor counted twice.
    /// Two winners are the finding that matters most (the store did not make the transfer
    /// atomic): said first, whatever else failed in the same race.
    pub fn verdict(&self) -> Result<(), String> {
        if self.winners.len() > 1 {
            return Err(format!(
                "{} winners, want exactly 1: the store did not make the transfer atomic",
                self.winners.len()
            ));
        }
        if !self.infra_errors.is_empty() {
            return Err(format!(
                "{} infrastructure failures (first: {})",
                self.infra_errors.len(),
                self.infra_errors[0]
            ));
        }
        if !self.misses.is_empty() {
            return Err(format!(
                "{} contenders never reached the race (first refusal: {})",
                self.misses.len(),
                self.misses[0].code()
            ));
        }
        let tallied =
            self.winners.len() + self.losers + self.misses.len() + self.infra_errors.len();
        if tallied != self.contenders {
            return Err(format!(
                "{tallied} outcomes tallied for {} contenders",
                self.contenders
            ));
        }
        if self.winners.len() != 1 {
            return Err(format!("{} winners, want exactly 1", self.winners.len()));
        }
        Ok(())
    }
}

/// Starts one contender per item of `contenders` at the same moment (a barrier, not a loop) and
/// tallies the outcome within `limit`.
async fn race<W, F, Fut>(client: &Client, contenders: &[String], limit: Duration, run: F) -> Race<W>
where
    W: Send + 'static,
    F: Fn(Client, String) -> Fut,
    Fut: Future<Output = Result<W, Error>> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(contenders.len()));
    let mut running = JoinSet::new();
    for name in contenders {
        let barrier = barrier.clone();
        let attempt = run(client.clone(), name.clone());
        running.spawn(async move {
            barrier.wait().await;
            attempt.await
        });
    }
    let mut race = Race {
        contenders: contenders.len(),
        ..Race::default()
    };
    let deadline = crate::client::instant_after(limit);
    loop {
        match tokio::time::timeout_at(deadline, running.join_next()).await {
            Ok(None) => break,
            Ok(Some(Ok(Ok(won)))) => race.winners.push(won),
            Ok(Some(Ok(Err(Error::Refused(Refusal::Taken))))) => race.losers += 1,
            Ok(Some(Ok(Err(Error::Refused(other))))) => race.misses.push(other),
            Ok(Some(Ok(Err(error)))) => race.infra_errors.push(error),
            Ok(Some(Err(join))) => race
                .infra_errors
                .push(Error::Protocol(format!("contender task failed: {join}"))),
            Err(_) => {
                // The judgement is over: the contenders still running are stopped (dropping
                // the set aborts them) and no longer wait for answers; those that finished in
                // time are counted above, a winner among them included. A request already sent
                // may still be applied after this (the verdict is an error then anyway), so a
                // caller that judges again uses a fresh key.
                // Each of them is one infrastructure failure: every contender ends up in
                // exactly one tally.
                for _ in 0..running.len() {
                    race.infra_errors.push(Error::Unavailable {
                        endpoints: client.endpoints().to_vec(),
                        waited: limit,
                        last: "the race did not finish within its time limit".into(),
                    });
                }
                break;
            }
        }
    }
    race
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
    let key = key.to_string();
    race(client, takers, limit, |client, to| {
        let key = key.clone();
        async move { client.take(&key, &to).await }
    })
    .await
}

/// Lets every agent in `agents` claim task `id` at the same moment (a barrier, not a loop) and
/// tallies the outcome: exactly one must win and every other one must be refused `TAKEN`.
///
/// `limit` bounds the whole judgement (agents still running at the limit are reported as
/// infrastructure failures) and is also the lease's TTL, so the winner's lease outlives the race
/// and no loser can slip in after it expires.
pub async fn concurrent_claim(
    client: &Client,
    id: &str,
    agents: &[String],
    limit: Duration,
) -> ClaimRace {
    let id = id.to_string();
    let ttl_ms = i64::try_from(limit.as_millis()).unwrap_or(i64::MAX).max(1);
    race(client, agents, limit, |client, agent| {
        let id = id.clone();
        async move { client.claim(&id, &agent, ttl_ms).await }
    })
    .await
}

/// Reads a consistent ticket snapshot and judges its invariants at the store's "now".
pub async fn check(client: &Client) -> Result<Vec<Problem>, Error> {
    let snapshot = client.tickets().await?;
    Ok(handoff::check(&snapshot.tickets, snapshot.now_ms))
}

/// Reads a consistent board snapshot and judges its invariants at the store's "now".
pub async fn check_board(client: &Client) -> Result<Vec<BoardProblem>, Error> {
    let snapshot = client.tasks().await?;
    Ok(board::check(&snapshot.tasks, snapshot.now_ms))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::ClientConfig;

    /// A race of as many contenders as it tallies.
    fn race(winners: usize, losers: usize, misses: Vec<Refusal>, infra: usize) -> Race<()> {
        let contenders = winners + losers + misses.len() + infra;
        race_of(contenders, winners, losers, misses, infra)
    }

    fn race_of(
        contenders: usize,
        winners: usize,
        losers: usize,
        misses: Vec<Refusal>,
        infra: usize,
    ) -> Race<()> {
        Race {
            contenders,
            winners: vec![(); winners],
            losers,
            misses,
            infra_errors: (0..infra)
                .map(|_| Error::Protocol("broken".into()))
                .collect(),
        }
    }

    #[test]
    fn only_one_winner_and_nothing_but_taken_passes() {
        assert_eq!(race(1, 4, vec![], 0).verdict(), Ok(()));
        assert_eq!(race(1, 0, vec![], 0).verdict(), Ok(()));
        for failing in [
            race(0, 5, vec![], 0),
            race(2, 3, vec![], 0),
            race(1, 3, vec![Refusal::NotAddressee], 0),
            race(1, 3, vec![], 1),
            race(0, 0, vec![], 5),
        ] {
            assert!(failing.verdict().is_err(), "{failing:?} passed");
        }
    }

    /// A second winner is named as such even when other contenders failed or missed: it is a
    /// broken store, not an outage to run the race again after.
    #[test]
    fn two_winners_are_named_before_any_other_failure() {
        for failing in [
            race(2, 0, vec![], 3),
            race(2, 1, vec![Refusal::NotAddressee], 0),
        ] {
            let verdict = failing.verdict();
            assert!(
                verdict.as_ref().is_err_and(|why| why.contains("2 winners")),
                "{failing:?}: {verdict:?}"
            );
        }
    }

    /// The tallies must account for every contender started: a race that lost a contender's
    /// outcome (or counted one twice) cannot pass, even with one winner and only `TAKEN` losers.
    #[test]
    fn a_tally_that_does_not_add_up_to_the_contenders_fails() {
        assert_eq!(race_of(5, 1, 4, vec![], 0).verdict(), Ok(()));
        assert_eq!(race_of(1, 1, 0, vec![], 0).verdict(), Ok(()));
        for (contenders, losers) in [(5, 0), (5, 3), (5, 5), (0, 0), (2, 0)] {
            let failing = race_of(contenders, 1, losers, vec![], 0);
            let verdict = failing.verdict();
            assert!(
                verdict.as_ref().is_err_and(|why| why.contains("tallied")),
                "{failing:?}: {verdict:?}"
            );
        }
    }

    /// The contenders run at the same time (a barrier, not a loop): none starts before every
    /// one has been made, and all of them are in flight together.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_contenders_of_a_race_run_at_the_same_time() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

        const CONTENDERS: usize = 8;
        let client = Client::new(&["127.0.0.1:1"], ClientConfig::default()).unwrap();
        let names: Vec<String> = (0..CONTENDERS).map(|i| format!("c-{i}")).collect();
        let made = Arc::new(AtomicUsize::new(0));
        let fewest_made_at_start = Arc::new(AtomicUsize::new(usize::MAX));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most_in_flight = Arc::new(AtomicUsize::new(0));
        let outcome: Race<()> = super::race(&client, &names, Duration::from_secs(10), |_, _| {
            let made = made.clone();
            let fewest_made_at_start = fewest_made_at_start.clone();
            let in_flight = in_flight.clone();
            let most_in_flight = most_in_flight.clone();
            made.fetch_add(1, SeqCst);
            // A contender that takes a moment to make: one let go at once would be running
            // (on another worker) before the next ones exist.
            std::thread::sleep(Duration::from_millis(5));
            async move {
                fewest_made_at_start.fetch_min(made.load(SeqCst), SeqCst);
                let now = in_flight.fetch_add(1, SeqCst) + 1;
                most_in_flight.fetch_max(now, SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                in_flight.fetch_sub(1, SeqCst);
                Ok(())
            }
        })
        .await;
        assert_eq!(outcome.contenders, CONTENDERS, "{outcome:?}");
        assert_eq!(outcome.winners.len(), CONTENDERS, "{outcome:?}");
        assert_eq!(
            most_in_flight.load(SeqCst),
            CONTENDERS,
            "not all in flight at once"
        );
        assert_eq!(
            fewest_made_at_start.load(SeqCst),
            CONTENDERS,
            "a contender started before all were made"
        );
    }

    fn impatient(addr: &str) -> Client {
        let config = ClientConfig {
            deadline: Duration::from_millis(400),
            attempt_timeout: Duration::from_millis(200),
            connect_timeout: Duration::from_millis(100),
        };
        Client::new(&[addr.to_string()], config).unwrap()
    }

    fn takers() -> Vec<String> {
        (0..4).map(|i| format!("taker-{i}")).collect()
    }

    /// A store nobody answers for cannot pass by having "nobody win": every taker is an
    /// infrastructure failure, none a loser.
    #[tokio::test]
    async fn an_unreachable_store_fails_the_judgement_as_infrastructure() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap().to_string();
        drop(free);
        let race = concurrent_take(&impatient(&addr), "k", &takers(), Duration::from_secs(5)).await;
        assert_eq!(race.losers, 0, "{race:?}");
        assert!(race.winners.is_empty(), "{race:?}");
        assert_eq!(race.infra_errors.len(), 4, "{race:?}");
        assert!(race.verdict().is_err());
    }

    /// The judgement's own limit bounds it against a store that accepts and never answers, and
    /// every contender still waiting then counts as one infrastructure failure.
    #[tokio::test]
    async fn a_silent_store_fails_the_judgement_within_its_limit() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let config = ClientConfig {
            deadline: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(30),
        };
        let client = Client::new(&[addr], config).unwrap();
        let started = std::time::Instant::now();
        let race = concurrent_claim(&client, "t", &takers(), Duration::from_millis(200)).await;
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "the judgement took {took:?}");
        assert_eq!(race.losers, 0, "{race:?}");
        assert_eq!(race.infra_errors.len(), takers().len(), "{race:?}");
        assert!(race.verdict().is_err());
    }
}
