//! A side-effect holder in its own OS process, for tests that SIGKILL or SIGSTOP the process that
//! acquired (see `baton_cluster_test::holder`, which drives it).
//!
//! ```text
//! holder --endpoints A,B,C --key K --resource R --ttl-ms N [--unsafe] [--sink S] [--value V]
//! ```
//!
//! It connects, acquires the action once and prints one line, then obeys one command per line
//! on stdin (`write`, `complete`, `release`, `exit`; end of input exits too), printing one line
//! per command. Every line is `<op> <status> [name=value ...]`:
//!
//! - `acquire granted fence=F holder=H until=U` or `acquire <outcome>`;
//! - `write ok seen=F writes=W` (the sink `S` written with the lease's fence and value `V`);
//! - `complete ok result=R`, `release ok`;
//! - `<op> refused code=CODE` for a contract refusal;
//! - `<op> error message=...` for an infrastructure failure (the rest of the line).

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use baton_rpc::{Client, ClientConfig, Error};
use baton_statemachine::effect::{Action, EffectLease, Outcome, RetrySafety};
use tokio::io::{AsyncBufReadExt, BufReader};

struct Args {
    endpoints: Vec<String>,
    action: Action,
    ttl_ms: i64,
    sink: String,
    value: String,
}

fn parse_args() -> Result<Args, String> {
    let mut endpoints = Vec::new();
    let mut key = None;
    let mut resource = None;
    let mut ttl_ms = None;
    let mut safety = RetrySafety::Safe;
    let mut sink = None;
    let mut value = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--unsafe" {
            safety = RetrySafety::Unsafe;
            continue;
        }
        let value_of = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--endpoints" => endpoints = value_of.split(',').map(str::to_string).collect(),
            "--key" => key = Some(value_of),
            "--resource" => resource = Some(value_of),
            "--ttl-ms" => {
                ttl_ms = Some(
                    value_of
                        .parse::<i64>()
                        .map_err(|e| format!("--ttl-ms: {e}"))?,
                )
            }
            "--sink" => sink = Some(value_of),
            "--value" => value = Some(value_of),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let key = key.ok_or("--key is required")?;
    let resource = resource.ok_or("--resource is required")?;
    Ok(Args {
        endpoints,
        ttl_ms: ttl_ms.ok_or("--ttl-ms is required")?,
        sink: sink.unwrap_or_else(|| format!("sink:{resource}")),
        value: value.unwrap_or_else(|| format!("written by {key}")),
        action: Action {
            key,
            resource,
            safety,
        },
    })
}

/// Prints one protocol line and flushes it (the test is waiting for it).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The line for a failed call.
fn failure(op: &str, error: &Error) -> String {
    match error {
        Error::Refused(refusal) => format!("{op} refused code={}", refusal.code()),
        other => format!(
            "{op} error message={}",
            other.to_string().replace('\n', " ")
        ),
    }
}

fn config() -> ClientConfig {
    ClientConfig {
        deadline: Duration::from_secs(10),
        attempt_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_millis(500),
    }
}

async fn serve(args: Args) -> ExitCode {
    let client = match Client::connect_with(&args.endpoints, config()).await {
        Ok(client) => client,
        Err(error) => {
            say(&failure("connect", &error));
            return ExitCode::from(4);
        }
    };
    let lease: EffectLease = match client.acquire(&args.action, args.ttl_ms).await {
        Ok(Outcome::Granted(lease)) => {
            say(&format!(
                "acquire granted fence={} holder={} until={}",
                lease.fence, lease.holder, lease.until_ms
            ));
            lease
        }
        Ok(other) => {
            say(&format!("acquire {}", other.name()));
            return ExitCode::from(3);
        }
        Err(error) => {
            say(&failure("acquire", &error));
            return ExitCode::from(3);
        }
    };
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        let command = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) | Err(_) => return ExitCode::SUCCESS,
        };
        let line = match command.trim() {
            "write" => match client
                .write_fenced(&args.sink, lease.fence, args.value.as_bytes())
                .await
            {
                Ok(value) => format!("write ok seen={} writes={}", value.seen_fence, value.writes),
                Err(error) => failure("write", &error),
            },
            "complete" => {
                let result = format!("done-by-fence-{}", lease.fence);
                match client.complete_effect(&args.action, &lease, &result).await {
                    Ok(recorded) => format!("complete ok result={recorded}"),
                    Err(error) => failure("complete", &error),
                }
            }
            "release" => match client.release_effect(&args.action, &lease).await {
                Ok(()) => "release ok".to_string(),
                Err(error) => failure("release", &error),
            },
            "exit" => return ExitCode::SUCCESS,
            other => format!("{other} error message=unknown command"),
        };
        say(&line);
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("holder: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("holder: cannot start a runtime: {error}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(serve(args))
}
