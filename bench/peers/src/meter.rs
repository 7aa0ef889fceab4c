//! What one client counts: ops, contended claims, requests (round trips to the server), errors
//! and the latency of every request — the same figures as `baton bench`, so the JSON lines line up.

use std::future::Future;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// How one op ended (the same outcomes as `baton bench`'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every step succeeded.
    Done,
    /// The claim found the permit held.
    Contended,
    /// The lease found no task.
    Empty,
    /// A conditional step found the state not as the op left it (a lost lease, a ticket not
    /// offered): the op did not complete.
    Failed,
}

impl From<bool> for Outcome {
    fn from(done: bool) -> Self {
        if done {
            Outcome::Done
        } else {
            Outcome::Failed
        }
    }
}

/// Counters of one client (merged into one for the report).
pub struct Meter {
    /// Whether the warm-up is over: nothing is counted before.
    pub measuring: bool,
    ops: u64,
    contended: u64,
    empty: u64,
    failed: u64,
    /// Clients that stopped early, their op unanswered past the deadline.
    stalled_clients: u64,
    requests: u64,
    errors: u64,
    latency_us: Histogram<u64>,
}

impl Meter {
    /// An empty meter, not yet measuring.
    pub fn new() -> Self {
        Self {
            measuring: false,
            ops: 0,
            contended: 0,
            empty: 0,
            failed: 0,
            stalled_clients: 0,
            requests: 0,
            errors: 0,
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3)
                .expect("1 µs .. 60 s with 3 significant digits are valid histogram bounds"),
        }
    }

    /// Runs one request (one round trip) and records its latency, and an error if it failed.
    pub async fn time<T, E>(
        &mut self,
        request: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let result = request.await;
        if self.measuring {
            self.requests += 1;
            let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            // A latency beyond the histogram's 60 s bound is clamped rather than lost.
            self.latency_us.saturating_record(micros.max(1));
            if result.is_err() {
                self.errors += 1;
            }
        }
        result
    }

    /// Counts how an op ended.
    pub fn outcome(&mut self, outcome: Outcome) {
        if !self.measuring {
            return;
        }
        match outcome {
            Outcome::Done => self.ops += 1,
            Outcome::Contended => self.contended += 1,
            Outcome::Empty => self.empty += 1,
            Outcome::Failed => self.failed += 1,
        }
    }

    /// Records that this client stopped early (its op got no answer in time).
    pub fn stalled(&mut self) {
        self.stalled_clients += 1;
    }

    /// Adds another client's counts to these.
    pub fn merge(&mut self, other: &Meter) {
        self.ops += other.ops;
        self.contended += other.contended;
        self.empty += other.empty;
        self.failed += other.failed;
        self.stalled_clients += other.stalled_clients;
        self.requests += other.requests;
        self.errors += other.errors;
        // Both histograms share the same bounds, so adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
    }

    /// The JSON object of one run: `baton bench --json`'s keys, plus `system`.
    pub fn report(&self, system: &str, workload: &str, clients: usize, elapsed_s: f64) -> Value {
        let per_s = |n: u64| n as f64 / elapsed_s;
        let ms = |q: f64| self.latency_us.value_at_quantile(q) as f64 / 1000.0;
        json!({
            "system": system,
            "workload": workload,
            "clients": clients,
            "duration_s": elapsed_s,
            "ops": self.ops,
            "ops_per_s": per_s(self.ops),
            "contended_per_s": per_s(self.contended),
            "requests_per_s": per_s(self.requests),
            "errors": self.errors,
            "failed_ops": self.failed,
            "empty_leases": self.empty,
            "stalled_clients": self.stalled_clients,
            "p50_ms": ms(0.50),
            "p99_ms": ms(0.99),
            "p999_ms": ms(0.999),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_only_while_measuring() {
        let mut meter = Meter::new();
        let _ = meter.time(async { Ok::<_, ()>(()) }).await;
        meter.outcome(Outcome::Done);
        meter.measuring = true;
        let _ = meter.time(async { Ok::<_, ()>(()) }).await;
        let _ = meter.time(async { Err::<(), _>(()) }).await;
        meter.outcome(Outcome::Done);
        meter.outcome(Outcome::Contended);
        meter.outcome(Outcome::Empty);
        meter.outcome(Outcome::Failed);
        let report = meter.report("x", "permit-hot", 1, 2.0);
        assert_eq!(report["ops"], 1);
        assert_eq!(report["errors"], 1);
        assert_eq!(report["failed_ops"], 1);
        assert_eq!(report["empty_leases"], 1);
        assert_eq!(report["requests_per_s"], 1.0);
        assert_eq!(report["contended_per_s"], 0.5);
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = Meter::new();
        let mut b = Meter::new();
        a.measuring = true;
        b.measuring = true;
        a.outcome(Outcome::Done);
        b.outcome(Outcome::Done);
        b.outcome(Outcome::Done);
        a.merge(&b);
        assert_eq!(a.report("x", "handoff", 2, 1.0)["ops"], 3);
    }
}
