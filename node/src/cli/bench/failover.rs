//! `baton bench --workload failover`: how long writes stop when the leader dies under load.
//!
//! Closed-loop clients run permit-uniform pairs on the bench's own three-node cluster; halfway
//! through the measured time the leader is SIGKILLed (a crash: no shutdown, no flush). Every
//! successful write (claim or release) is time-stamped as its answer arrives. The figure that
//! matters is the longest stretch without any acknowledged write that ends after the kill: it
//! opens at the last write the old leader acknowledged and closes when the new leader has been
//! elected *and* a client has found it. A poller beside the clients records when a survivor first
//! calls itself leader, which splits that gap into election time and client-side discovery
//! (retry pauses and redirects in the client library).

use std::time::{Duration, Instant};

use baton_rpc::Security;
use serde_json::json;

use super::{connect_and_set_up, exit, start_own_cluster, BenchArgs, Drivers, Tally};

/// How often the election poller asks each survivor for its role.
const POLL_EVERY: Duration = Duration::from_millis(5);

/// What the kill did to the stream of acknowledged writes.
struct Outage {
    /// The longest stretch without an acknowledged write, among those ending after the kill.
    gap: Duration,
    /// When it began and ended, in ms relative to the kill (the start is usually just before).
    from_ms: f64,
    to_ms: f64,
}

/// Runs the workload and prints its figures.
pub(super) async fn run(args: &BenchArgs) -> u8 {
    let mut cluster = match start_own_cluster(args).await {
        Ok(cluster) => cluster,
        Err(code) => return code,
    };
    let (client, run_id) =
        match connect_and_set_up(args, &cluster.endpoints, Security::default()).await {
            Ok(connected) => connected,
            Err(code) => return code,
        };
    let drivers = Drivers::start(&client, args.workload, run_id, args.clients);
    tokio::time::sleep(args.warmup).await;
    drivers.measure();
    let started = Instant::now();
    let end = started + args.duration;
    tokio::time::sleep(args.duration / 2).await;

    let (old_leader, old_term) = match client.discover_leader().await {
        Ok(addr) => (
            cluster.id_at(&addr),
            client.node_info(&addr).await.ok().map(|info| info.term),
        ),
        Err(error) => return exit::report(&error),
    };
    let Some(old_leader) = old_leader else {
        eprintln!("baton bench: the leader is not one of the bench's nodes");
        return exit::FAILURE;
    };
    let killed_at = Instant::now();
    if let Err(why) = cluster.kill(old_leader) {
        eprintln!("baton bench: cannot kill node {old_leader}: {why}");
        return exit::FAILURE;
    }
    let survivors: Vec<String> = cluster
        .running_ids()
        .into_iter()
        .filter_map(|id| cluster.addr_of(id).map(str::to_string))
        .collect();
    let elected = first_new_leader(&client, &survivors, end).await;

    tokio::time::sleep_until(end.into()).await;
    drivers.stop();
    let elapsed = started.elapsed();
    let total = drivers.collect().await;
    let figures = Figures {
        total: &total,
        elapsed,
        started,
        killed_at,
        old_leader,
        old_term,
        elected: elected.map(|(at, term)| (at.saturating_duration_since(killed_at), term)),
        rss_kib: cluster.peak_rss_kib(),
    };
    figures.print(args);
    let resumed = total
        .acks
        .as_ref()
        .is_some_and(|acks| acks.iter().any(|at| *at > killed_at));
    if !resumed {
        eprintln!("baton bench: no write was acknowledged after the leader was killed");
        return exit::FAILURE;
    }
    exit::OK
}

/// When a survivor first reports itself leader (polled until `end`), and its term; `None` if
/// none did.
async fn first_new_leader(
    client: &baton_rpc::Client,
    survivors: &[String],
    end: Instant,
) -> Option<(Instant, u64)> {
    while Instant::now() < end {
        for addr in survivors {
            if let Ok(info) = client.node_info(addr).await {
                if info.role == "leader" {
                    return Some((Instant::now(), info.term));
                }
            }
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    None
}

/// The longest gap between consecutive acknowledged writes among the gaps that end after the
/// kill; `None` when no write was acknowledged after it.
fn outage(acks: &mut [Instant], killed_at: Instant) -> Option<Outage> {
    acks.sort_unstable();
    let relative_ms = |at: Instant| {
        if at >= killed_at {
            at.duration_since(killed_at).as_secs_f64() * 1000.0
        } else {
            -(killed_at.duration_since(at).as_secs_f64() * 1000.0)
        }
    };
    acks.windows(2)
        .filter(|pair| pair[1] > killed_at)
        .max_by_key(|pair| pair[1].duration_since(pair[0]))
        .map(|pair| Outage {
            gap: pair[1].duration_since(pair[0]),
            from_ms: relative_ms(pair[0]),
            to_ms: relative_ms(pair[1]),
        })
}

/// Everything one failover run measured.
struct Figures<'a> {
    total: &'a Tally,
    elapsed: Duration,
    started: Instant,
    killed_at: Instant,
    old_leader: u64,
    /// The old leader's term, if it answered before the kill.
    old_term: Option<u64>,
    /// How long after the kill a survivor first called itself leader, and in which term (more
    /// than one term past the old leader's means an election round failed).
    elected: Option<(Duration, u64)>,
    /// The survivors' peak RSS.
    rss_kib: Vec<u64>,
}

impl Figures<'_> {
    fn print(&self, args: &BenchArgs) {
        let total = self.total;
        let mut acks = total.acks.clone().unwrap_or_default();
        let outage = outage(&mut acks, self.killed_at);
        let before = acks.iter().filter(|at| **at < self.killed_at).count();
        let after = acks.len() - before;
        let before_s = self
            .killed_at
            .duration_since(self.started)
            .as_secs_f64()
            .max(1e-9);
        let end = self.started + self.elapsed;
        // The rate after the kill is taken from the moment writes resumed.
        let resumed_at = outage
            .as_ref()
            .map(|o| self.killed_at + Duration::from_secs_f64(o.to_ms.max(0.0) / 1000.0));
        let after_s = resumed_at
            .map(|at| end.saturating_duration_since(at).as_secs_f64())
            .unwrap_or(0.0)
            .max(1e-9);
        let elapsed = self.elapsed.as_secs_f64();
        let ms = |q: f64| total.latency_us.value_at_quantile(q) as f64 / 1000.0;
        let elected_ms = self.elected.map(|(d, _)| d.as_secs_f64() * 1000.0);
        let new_term = self.elected.map(|(_, term)| term);
        let rss_mib: Vec<f64> = self.rss_kib.iter().map(|k| *k as f64 / 1024.0).collect();
        if args.json {
            println!(
                "{}",
                json!({
                    "workload": args.workload.name(),
                    "clients": args.clients,
                    "duration_s": elapsed,
                    "ops": total.ops,
                    "ops_per_s": total.ops as f64 / elapsed,
                    "requests_per_s": total.requests as f64 / elapsed,
                    "errors": total.errors,
                    "p50_ms": ms(0.50),
                    "p99_ms": ms(0.99),
                    "p999_ms": ms(0.999),
                    "node_args": args.node_args,
                    "killed_node": self.old_leader,
                    "new_leader_after_ms": elected_ms,
                    "old_term": self.old_term,
                    "new_term": new_term,
                    "longest_gap_ms": outage.as_ref().map(|o| o.gap.as_secs_f64() * 1000.0),
                    "gap_from_ms": outage.as_ref().map(|o| o.from_ms),
                    "first_write_after_kill_ms": outage.as_ref().map(|o| o.to_ms),
                    "writes_before": before,
                    "writes_after": after,
                    "writes_per_s_before": before as f64 / before_s,
                    "writes_per_s_after": after as f64 / after_s,
                    "survivor_peak_rss_mib": rss_mib,
                })
            );
            return;
        }
        let show = |value: Option<f64>| value.map_or("none".to_string(), |v| format!("{v:.0} ms"));
        println!(
            "workload=failover clients={} node_args={:?} ops/s={:.0} requests/s={:.0} p50={:.2}ms p99={:.2}ms p999={:.2}ms errors={}",
            args.clients,
            args.node_args,
            total.ops as f64 / elapsed,
            total.requests as f64 / elapsed,
            ms(0.50),
            ms(0.99),
            ms(0.999),
            total.errors,
        );
        let terms = match (self.old_term, new_term) {
            (Some(old), Some(new)) => format!(" (term {old} -> {new})"),
            _ => String::new(),
        };
        println!(
            "  killed leader node {} (SIGKILL) {:.1} s into the run; a survivor called itself leader after {}{terms}",
            self.old_leader,
            before_s,
            show(elected_ms),
        );
        match &outage {
            Some(o) => println!(
                "  longest write gap {:.0} ms (from {:+.0} ms to {:+.0} ms around the kill): first write acknowledged {:.0} ms after the kill",
                o.gap.as_secs_f64() * 1000.0,
                o.from_ms,
                o.to_ms,
                o.to_ms,
            ),
            None => println!("  no write was acknowledged after the kill"),
        }
        println!(
            "  writes before the kill: {before} ({:.0}/s); after: {after} ({:.0}/s once resumed)",
            before as f64 / before_s,
            after as f64 / after_s,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outage_is_the_longest_gap_that_ends_after_the_kill() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // A 900 ms gap before the kill does not count; the one across the kill (at 1,000 ms) does.
        let mut acks = vec![at(0), at(900), at(990), at(1_600), at(1_610), at(1_700)];
        let outage = outage(&mut acks, at(1_000)).expect("writes resumed");
        assert_eq!(outage.gap, Duration::from_millis(610));
        assert!((outage.from_ms + 10.0).abs() < 1e-6, "{}", outage.from_ms);
        assert!((outage.to_ms - 600.0).abs() < 1e-6, "{}", outage.to_ms);
    }

    #[test]
    fn no_write_after_the_kill_is_no_outage_figure() {
        let t0 = Instant::now();
        let mut acks = vec![t0, t0 + Duration::from_millis(5)];
        assert!(outage(&mut acks, t0 + Duration::from_millis(10)).is_none());
    }
}
