//! `peers-bench`: runs `baton bench`'s workloads against MariaDB, PostgreSQL or etcd, each in
//! its best form, and prints the same JSON keys, so `bench/compare.sh` can set the systems side
//! by side. Closed loop, one connection per client, bounded by `--warmup + --duration` plus set-up.

mod driver;
mod error;
mod etcd;
mod mariadb;
mod meter;
mod postgres;
mod workload;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::driver::{run, Window};
use crate::workload::{Plan, Workload};

/// The system under load.
#[derive(ValueEnum, Clone, Copy, Debug)]
enum Target {
    /// A single durable MariaDB server.
    Mariadb,
    /// A single durable PostgreSQL server.
    Postgres,
    /// A three-member etcd cluster.
    Etcd,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Mariadb => "mariadb",
            Target::Postgres => "postgres",
            Target::Etcd => "etcd",
        }
    }
}

/// Command line of `peers-bench`.
#[derive(Parser, Debug)]
#[command(name = "peers-bench", version, about)]
struct Args {
    /// The system to load.
    #[arg(long, value_enum)]
    target: Target,
    /// What to run (the same definitions as `baton bench`).
    #[arg(long, value_enum)]
    workload: Workload,
    /// Concurrent closed-loop clients, each with its own connection.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Measured time.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Unmeasured time first.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Tasks submitted up front for `queue-claim`.
    #[arg(long, default_value_t = 100_000)]
    queue_tasks: u32,
    /// MariaDB URL (connected over TCP, never the Unix socket).
    #[arg(
        long,
        env = "PEERS_MARIADB_URL",
        default_value = "mysql://bench:bench@127.0.0.1:13306/bench"
    )]
    mariadb_url: String,
    /// PostgreSQL connection string.
    #[arg(
        long,
        env = "PEERS_POSTGRES",
        default_value = "host=127.0.0.1 port=15432 user=bench dbname=bench"
    )]
    postgres: String,
    /// etcd client endpoints, comma-separated.
    #[arg(
        long,
        env = "PEERS_ETCD_ENDPOINTS",
        default_value = "127.0.0.1:12379,127.0.0.1:22379,127.0.0.1:32379"
    )]
    etcd_endpoints: String,
    /// Print one JSON object instead of a line.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.clients == 0 {
        eprintln!("peers-bench: --clients must be at least 1");
        return ExitCode::from(2);
    }
    let plan = Plan {
        workload: args.workload,
        clients: args.clients,
        queue_tasks: args.queue_tasks,
        run_id: rand::random(),
    };
    let window = Window {
        warmup: args.warmup,
        duration: args.duration,
    };
    let system = args.target.name();
    let result = match args.target {
        Target::Mariadb => run::<mariadb::Mariadb>(system, &args.mariadb_url, plan, window).await,
        Target::Postgres => run::<postgres::Postgres>(system, &args.postgres, plan, window).await,
        Target::Etcd => run::<etcd::Etcd>(system, &args.etcd_endpoints, plan, window).await,
    };
    let report = match result {
        Ok(report) => report,
        Err(why) => {
            eprintln!("peers-bench: {why}");
            return ExitCode::FAILURE;
        }
    };
    let ops = report["ops"].as_u64().unwrap_or(0);
    if args.json {
        println!("{report}");
    } else {
        println!(
            "system={} workload={} clients={} ops/s={:.0} contended/s={:.0} requests/s={:.0} \
             p50={:.2}ms p99={:.2}ms p999={:.2}ms errors={} failed_ops={} empty_leases={}",
            report["system"].as_str().unwrap_or_default(),
            report["workload"].as_str().unwrap_or_default(),
            report["clients"],
            report["ops_per_s"].as_f64().unwrap_or_default(),
            report["contended_per_s"].as_f64().unwrap_or_default(),
            report["requests_per_s"].as_f64().unwrap_or_default(),
            report["p50_ms"].as_f64().unwrap_or_default(),
            report["p99_ms"].as_f64().unwrap_or_default(),
            report["p999_ms"].as_f64().unwrap_or_default(),
            report["errors"],
            report["failed_ops"],
            report["empty_leases"],
        );
    }
    if ops == 0 {
        eprintln!("peers-bench: no operation succeeded: the run measured nothing");
        return ExitCode::FAILURE;
    }
    let stalled = report["stalled_clients"].as_u64().unwrap_or(0);
    if stalled > 0 {
        eprintln!(
            "peers-bench: {stalled} of {} clients stopped early (an op got no answer in time): \
             the figures are not those of {} clients",
            args.clients, args.clients
        );
        return ExitCode::FAILURE;
    }
    let empty = report["empty_leases"].as_u64().unwrap_or(0);
    if empty > 0 {
        eprintln!(
            "peers-bench: the queue ran dry: {empty} leases found no task, so the figures are \
             not a claim rate; give --queue-tasks at least the ops/s times (warm-up + duration)"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
