//! What a million live leases cost the state machine alone, with no network, Raft or disk.
//!
//! ```sh
//! cargo run --release -p baton-statemachine --example scale -- --leases 1000000
//! ```
//!
//! Builds the state a node holds after `baton bench --workload scale` (N seeded board tasks, each
//! claimed through `apply` with a lease ending at one common moment), then times what a node does
//! with it: a snapshot encode and decode (bincode's standard configuration through serde, as the
//! node's codec does), and the one `Command::Sweep` that expires all N at once. It prints the
//! process's resident memory after each step. Figures only, never assertions.

use std::time::{Duration, Instant};

use baton_statemachine::board::{self, TaskSpec, MAX_SEED_TASKS};
use baton_statemachine::{
    apply, apply_with_changes, Command, Envelope, Origin, Reply, Response, Stamp, State,
};

/// Clients whose requests the loaded commands pretend to be (the session table keeps one entry
/// per client, as it would for the bench's connections).
const CLIENTS: u64 = 64;
/// The store time loading starts at (Unix ms; any value works, the state machine reads no clock).
const START_MS: u64 = 1_800_000_000_000;
/// Claims applied per millisecond of store time while loading (the clock advances as it would).
const CLAIMS_PER_MS: u64 = 10;

fn main() {
    let leases = match leases_arg() {
        Ok(leases) => leases,
        Err(why) => {
            eprintln!("scale: {why}\nusage: scale [--leases N]");
            std::process::exit(2);
        }
    };
    println!("leases={leases}");
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
    drop(decoded);
    drop(image);

    let started = Instant::now();
    let sweep = Envelope {
        stamp: Stamp {
            now_ms: due,
            entropy: 0,
        },
        origin: None,
        command: Command::Sweep,
    };
    let (response, changes) = apply_with_changes(&mut state, &sweep);
    let swept = started.elapsed();
    let expired = match response {
        Response::Answer(Ok(Reply::Swept { expired })) => expired,
        other => fail(&format!("sweep answered {other:?}")),
    };
    println!(
        "sweep: expired {expired} leases in {:.3} s ({} changes recorded for watches); live leases left={}",
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
}

fn task_id(n: usize) -> String {
    format!("scale-00000000-{n}")
}

fn leases_arg() -> Result<usize, String> {
    let mut args = std::env::args().skip(1);
    let mut leases = 1_000_000;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--leases" => {
                let value = args.next().ok_or("--leases needs a value")?;
                leases = value
                    .replace(['_', ','], "")
                    .parse()
                    .map_err(|_| format!("--leases: not a number: {value}"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(leases)
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
