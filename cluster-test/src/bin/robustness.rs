//! Soak mode of the robustness suite: random fault scenarios with random seeds against fresh
//! three-node clusters until the time is up.
//!
//! ```text
//! cargo run --release -p baton-cluster-test --bin robustness -- --duration 5m
//! cargo run --release -p baton-cluster-test --bin robustness -- --seed 1234      # replay one
//! ```
//!
//! Every run prints its seed first, then `scenario=<name> seed=<n> ops=<n> ambiguous=<n>
//! faults=<n> verdict=ok|VIOLATION` (and the violating slice of history when there is one). The
//! seed picks the scenario and the fault time, so `--seed S` alone replays a run. The last line
//! is `robustness: scenarios=N ops=M faults=F violations=V` (a scenario that could not run its
//! faults or recover is an error, and the violations its history showed until then count in
//! `V`); the exit status is non-zero when a violation was found or a scenario could not run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use baton_cluster_test::robustness::{self, Scenario, Settings};
use clap::Parser;

/// Random fault scenarios with recorded workloads and history checkers.
#[derive(Parser, Debug)]
#[command(name = "robustness")]
struct Args {
    /// Keep starting scenarios until this much time has passed (the last one runs to its end).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Run exactly one scenario with this seed (a replay), then stop. Without `--scenario` the
    /// seed picks the scenario from this build's list, which grows: to replay a run of another
    /// commit, name its scenario too.
    #[arg(long)]
    seed: Option<u64>,
    /// Only this scenario (default: the seed picks one). One of: leader-kill, follower-kill,
    /// restart-all, leader-pause, isolate-leader, isolate-follower, split-1-2, one-way,
    /// slow-links, membership, mixed.
    #[arg(long, value_parser = parse_scenario)]
    scenario: Option<Scenario>,
    /// How long each scenario injects faults (default: 15-40 s, picked by the seed).
    #[arg(long, value_parser = humantime::parse_duration)]
    fault_time: Option<Duration>,
    /// Where histories of runs with violations are written (default: the temp dir).
    #[arg(long)]
    history_dir: Option<PathBuf>,
    /// Also print how each kind of operation ended (answered, refused by code, unknown).
    #[arg(long)]
    verbose: bool,
}

fn parse_scenario(name: &str) -> Result<Scenario, String> {
    Scenario::parse(name).ok_or_else(|| {
        let names: Vec<&str> = Scenario::ALL.iter().map(Scenario::name).collect();
        format!("unknown scenario {name:?}; one of {}", names.join(", "))
    })
}

/// What a seed decides: the scenario (unless fixed) and the fault time (unless fixed).
fn plan(args: &Args, seed: u64) -> (Scenario, Settings) {
    let scenario = args
        .scenario
        .unwrap_or(Scenario::ALL[(seed % Scenario::ALL.len() as u64) as usize]);
    let fault_time = args
        .fault_time
        .unwrap_or(Duration::from_secs(15 + (seed / 8) % 26));
    let settings = Settings {
        fault_time,
        history_dir: args.history_dir.clone(),
        ..Settings::default()
    };
    (scenario, settings)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // Found (and rebuilt when its sources are newer) before the first scenario, so that no run's
    // time and no `--duration` is spent building it.
    match baton_cluster_test::binary::baton_bin() {
        Ok(bin) => println!("robustness: nodes run {}", bin.display()),
        Err(error) => {
            eprintln!("robustness: no baton binary to run: {error:#}");
            return ExitCode::FAILURE;
        }
    }
    let started = Instant::now();
    let (mut scenarios, mut ops, mut faults, mut violations, mut errors) = (0, 0, 0, 0, 0);
    loop {
        let seed = args
            .seed
            .unwrap_or_else(|| u64::from(rand::random::<u32>()));
        let (scenario, settings) = plan(&args, seed);
        println!(
            "robustness: seed={seed} scenario={scenario} fault_time={:?} (replay: --seed {seed}{})",
            settings.fault_time,
            if args.scenario.is_some() {
                format!(" --scenario {scenario}")
            } else {
                String::new()
            }
        );
        scenarios += 1;
        match robustness::run(scenario, seed, &settings).await {
            Ok(report) => {
                println!("{}", report.summary());
                println!("{}", report.details());
                ops += report.ops();
                faults += report.faults;
                violations += report.violations.len();
                if !report.violations.is_empty() {
                    println!("{}", report.explain());
                }
                if args.verbose {
                    println!("{}", report.outcomes());
                }
            }
            Err(error) => {
                errors += 1;
                // A run that did not recover was still judged on its history until then; what
                // that found counts like any other run's violations.
                let (run_ops, ambiguous, run_faults, found) = error
                    .downcast_ref::<robustness::Unrecovered>()
                    .map_or((0, 0, 0, 0), |run| {
                        (run.ops, run.ambiguous, run.faults, run.violations)
                    });
                ops += run_ops;
                faults += run_faults;
                violations += found;
                println!(
                    "scenario={scenario} seed={seed} ops={run_ops} ambiguous={ambiguous} \
                     faults={run_faults} violations={found} verdict=ERROR"
                );
                println!("{error:#}");
            }
        }
        if args.seed.is_some() || started.elapsed() >= args.duration {
            break;
        }
    }
    if errors > 0 {
        println!("robustness: {errors} scenario(s) could not run (verdict=ERROR above)");
    }
    println!("robustness: scenarios={scenarios} ops={ops} faults={faults} violations={violations}");
    if violations > 0 || errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
