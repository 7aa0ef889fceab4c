//! What a million live leases cost the state machine alone, with no network, Raft or disk.
//!
//! ```sh
//! cargo run --release -p baton-statemachine --example scale -- --leases 1000000 [--batch 20000]
//! ```
//!
//! Builds the state a node holds after `baton bench --workload scale` (N seeded board tasks, each
//! claimed through `apply` with a lease ending at one common moment), then times what a node does
//! with it: a copy of the state, a snapshot encode and decode (bincode's standard configuration
//! through serde, as the node's codec does), the one `Command::Sweep` that expired all N at once
//! before the leader's sweeps were bounded, and the `Command::SweepAtMost` series a leader now
//! proposes (`--batch` expiries each, [`SWEEP_BATCH`] by default). It prints the process's
//! resident memory after each step. Figures only, never assertions.

use std::time::{Duration, Instant};

use baton_statemachine::board::{self, TaskSpec, MAX_SEED_TASKS};
use baton_statemachine::sweep::SWEEP_BATCH;
use baton_statemachine::{
    apply, apply_with_changes, Change, Command, Envelope, Origin, Reply, Response, Stamp, State,
};

/// Clients whose requests the loaded commands pretend to be (the session table keeps one entry
/// per client, as it would for the bench's connections).
const CLIENTS: u64 = 64;
/// The store time loading starts at (Unix ms; any value works, the state machine reads no clock).
const START_MS: u64 = 1_800_000_000_000;
/// Claims applied per millisecond of store time while loading (the clock advances as it would).
const CLAIMS_PER_MS: u64 = 10;

fn main() {
    let (leases, batch) = match args() {
        Ok(args) => args,
        Err(why) => {
            eprintln!("scale: {why}\nusage: scale [--leases N] [--batch N]");
            std::process::exit(2);
        }
    };
    println!("leases={leases} batch={batch}");
    let mut state = State::default();
    let mut seq = 0u64;
    let mut envelope = |now_ms: u64, entropy: u128, command: Command| {
        seq += 1;
        Envelope {
            stamp: Stamp { now_ms, entropy },
            origin: Some(Origin {
                client_id: seq % CLIENTS + 1,
                seq: seq / CLIENTS + 1,
                acked_below: seq / CLIENTS + 1,
            }),
            command,
        }
    };

    let started = Instant::now();
    for chunk_start in (0..leases).step_by(MAX_SEED_TASKS) {
        let specs = (chunk_start..(chunk_start + MAX_SEED_TASKS).min(leases))
            .map(|n| TaskSpec {
                id: task_id(n),
                deps: vec![],
            })
            .collect();
        let seed = envelope(START_MS, 0, Command::Board(board::Command::Seed(specs)));
        expect_ok(apply(&mut state, &seed), "seed");
    }
    report("seed", started.elapsed(), leases);

    // Every lease ends at `due`: the clock advances while loading, the TTL shrinks with it.
    let due = START_MS + leases as u64 / CLAIMS_PER_MS + 60_000;
    let started = Instant::now();
    for n in 0..leases {
        let now = START_MS + n as u64 / CLAIMS_PER_MS;
        let claim = board::Command::Claim {
            id: task_id(n),
            agent: format!("scale-client-{}", n % 128),
            ttl_ms: (due - now) as i64,
        };
        let claim = envelope(
            now,
            u128::from(n as u64) << 64 | 0x5eed,
            Command::Board(claim),
        );
        expect_ok(apply(&mut state, &claim), "claim");
    }
    report("claims", started.elapsed(), leases);
    println!("live leases={} rss={} MiB", state.board.leases(), rss_mib());

    // What a snapshot build holds the node's state lock for: a copy of the state (tasks and
    // their ids are shared, the trees' nodes copied), which it encodes after releasing the lock.
    let started = Instant::now();
    let copy = state.clone();
    let copied = started.elapsed();
    let started = Instant::now();
    drop(copy);
    println!(
        "state copy: {:.3} s (dropped in {:.3} s)",
        copied.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let image = bincode::serde::encode_to_vec(&state, bincode::config::standard())
        .unwrap_or_else(|e| fail(&format!("encode: {e}")));
    let encoded = started.elapsed();
    println!(
        "snapshot encode: {} bytes ({:.1} MiB) in {:.3} s; rss={} MiB",
        image.len(),
        image.len() as f64 / (1 << 20) as f64,
        encoded.as_secs_f64(),
        rss_mib()
    );
    let started = Instant::now();
    let (decoded, read): (State, usize) =
        bincode::serde::decode_from_slice(&image, bincode::config::standard())
            .unwrap_or_else(|e| fail(&format!("decode: {e}")));
    println!(
        "snapshot decode: {read} bytes in {:.3} s; rss={} MiB (two states and the image)",
        started.elapsed().as_secs_f64(),
        rss_mib()
    );
    let started = Instant::now();
    let same = decoded == state;
    println!(
        "decoded state equals the original: {same} (compared in {:.3} s)",
        started.elapsed().as_secs_f64()
    );
    drop(image);
    // The decoded copy shares nothing with `state` (a clone would share the tasks, and the first
    // sweep would then pay for copying them).
    let mut bounded = decoded;

    let started = Instant::now();
    let (expired, changes) = sweep(&mut state, due, Command::Sweep);
    let swept = started.elapsed();
    println!(
        "one unbounded sweep: expired {expired} leases in {:.3} s ({} changes recorded for watches); live leases left={}",
        swept.as_secs_f64(),
        changes.len(),
        state.board.leases()
    );
    let started = Instant::now();
    drop(changes);
    println!(
        "dropping the sweep's changes: {:.3} s; rss={} MiB",
        started.elapsed().as_secs_f64(),
        rss_mib()
    );
    drop(state);

    // What a leader does now: bounded sweeps back to back while more is due; each sweep's changes
    // are dropped before the next, as a node's watch history forgets all but the newest.
    let started = Instant::now();
    let (mut sweeps, mut total, mut slowest) = (0, 0, Duration::ZERO);
    loop {
        let one = Instant::now();
        let (expired, changes) = sweep(&mut bounded, due, Command::SweepAtMost { expiries: batch });
        drop(changes);
        slowest = slowest.max(one.elapsed());
        sweeps += 1;
        total += expired;
        if expired < u64::from(batch) {
            break;
        }
    }
    println!(
        "bounded sweeps: expired {total} leases in {sweeps} sweeps of at most {batch} in {:.3} s (changes dropped included; slowest sweep {:.1} ms); live leases left={}; rss={} MiB",
        started.elapsed().as_secs_f64(),
        slowest.as_secs_f64() * 1e3,
        bounded.board.leases(),
        rss_mib()
    );
}

/// Applies a leader's sweep command at store time `now_ms`; returns how many it expired and its
/// changes.
fn sweep(state: &mut State, now_ms: u64, command: Command) -> (u64, Vec<Change>) {
    let envelope = Envelope {
        stamp: Stamp { now_ms, entropy: 0 },
        origin: None,
        command,
    };
    match apply_with_changes(state, &envelope) {
        (Response::Answer(Ok(Reply::Swept { expired })), changes) => (expired, changes),
        (other, _) => fail(&format!("sweep answered {other:?}")),
    }
}

fn task_id(n: usize) -> String {
    format!("scale-00000000-{n}")
}

/// `--leases N` (1,000,000) and `--batch N` ([`SWEEP_BATCH`]).
fn args() -> Result<(usize, u32), String> {
    let mut args = std::env::args().skip(1);
    let mut leases = 1_000_000;
    let mut batch = SWEEP_BATCH;
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            let value = args.next().ok_or(format!("{name} needs a value"))?;
            value
                .replace(['_', ','], "")
                .parse()
                .map_err(|_| format!("{name}: not a number: {value}"))
        };
        match arg.as_str() {
            "--leases" => leases = number("--leases")? as usize,
            "--batch" => {
                batch = u32::try_from(number("--batch")?)
                    .ok()
                    .filter(|batch| *batch > 0)
                    .ok_or("--batch: must be 1 to 2^32 - 1")?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok((leases, batch))
}

fn expect_ok(response: Response, what: &str) {
    if !matches!(response, Response::Answer(Ok(_))) {
        fail(&format!("{what} answered {response:?}"));
    }
}

fn fail(why: &str) -> ! {
    eprintln!("scale: {why}");
    std::process::exit(1);
}

fn report(what: &str, took: Duration, n: usize) {
    println!(
        "{what}: {n} in {:.3} s ({:.0}/s); rss={} MiB",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64().max(1e-9),
        rss_mib()
    );
}

/// This process's resident memory in MiB (Linux /proc), or 0 where it cannot be read.
fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}
