//! What a lease over every queue costs the state machine when many queues each hold a waiting
//! task of one concurrency key: the worst case for the lease's merge of the queues, which every
//! replica runs inside the apply.
//!
//! ```sh
//! cargo run --release -p baton-statemachine --example many_queues -- --queues 20000 [--leases 20]
//! ```
//!
//! Creates `--queues` queues in one namespace, submits one task with key `K` to each, then
//! applies `--leases` leases over every queue (`queues: []`, limit 2, a 1 ms lease, so each lease
//! first expires the one before it and finds every queue's head of `K` leasable again). Only one
//! task is handed out per lease (the others share its key), but the merge walks past all the
//! others. Prints the time per lease. Figures only, never assertions.

use std::time::Instant;

use baton_statemachine::queue::{self, Queue, TaskSpec, Worker};
use baton_statemachine::{apply, Command, Envelope, Reply, Response, Stamp, State};

/// The store time the run starts at (Unix ms; the state machine reads no clock).
const START_MS: u64 = 1_800_000_000_000;

fn main() {
    let (queues, leases) = match args() {
        Ok(args) => args,
        Err(why) => {
            eprintln!("many_queues: {why}\nusage: many_queues [--queues N] [--leases N]");
            std::process::exit(2);
        }
    };
    let mut state = State::default();
    let at = |now_ms: u64, command: queue::Command| Envelope {
        stamp: Stamp { now_ms, entropy: 0 },
        origin: None,
        command: Command::Queue(command),
    };
    let started = Instant::now();
    for n in 0..queues {
        let queue = Queue {
            name: format!("q{n:06}"),
            namespace: "ns".into(),
        };
        expect_ok(apply(
            &mut state,
            &at(START_MS, queue::Command::CreateQueue(queue)),
        ));
        let spec = TaskSpec {
            queue: format!("q{n:06}"),
            idempotency_key: format!("t{n}"),
            handler: "h".into(),
            handler_version: "v1".into(),
            payload_version: "v1".into(),
            payload: Vec::new(),
            concurrency_key: "K".into(),
            business_key: String::new(),
            max_attempts: 100,
            ttl_ms: 86_400_000,
        };
        expect_ok(apply(
            &mut state,
            &at(START_MS, queue::Command::Submit(spec)),
        ));
    }
    let worker = Worker {
        id: "w".into(),
        concurrency_keys: true,
    };
    expect_ok(apply(
        &mut state,
        &at(START_MS, queue::Command::RegisterWorker(worker)),
    ));
    println!(
        "queues={queues} set up in {:.3} s",
        started.elapsed().as_secs_f64()
    );

    let mut took = Vec::new();
    for n in 0..leases {
        let lease = queue::Command::Lease {
            worker: "w".into(),
            queues: Vec::new(),
            limit: 2,
            lease_ttl_ms: 1,
        };
        let started = Instant::now();
        let response = apply(&mut state, &at(START_MS + 2 * (n as u64 + 1), lease));
        took.push(started.elapsed());
        match response {
            Response::Answer(Ok(Reply::Assignments(assignments))) if assignments.len() == 1 => {}
            other => fail(&format!("lease {n} answered {other:?}")),
        }
    }
    took.sort();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "leases={leases} per lease: p50={:.3} ms max={:.3} ms",
        ms(took[took.len() / 2]),
        ms(took[took.len() - 1])
    );
}

fn args() -> Result<(usize, usize), String> {
    let (mut queues, mut leases) = (20_000, 20);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number: usize = value
            .parse()
            .map_err(|_| format!("{flag}: not a count: {value}"))?;
        match flag.as_str() {
            "--queues" if number > 0 => queues = number,
            "--leases" if number > 0 => leases = number,
            _ => return Err(format!("unknown flag or zero count: {flag} {value}")),
        }
    }
    Ok((queues, leases))
}

fn expect_ok(response: Response) {
    if !matches!(response, Response::Answer(Ok(_))) {
        fail(&format!("answered {response:?}"));
    }
}

fn fail(why: &str) -> ! {
    eprintln!("many_queues: {why}");
    std::process::exit(1);
}
