//! `baton board ...`: the task board.

use std::time::Duration;

use baton_rpc::judge;
use baton_rpc::Client;
use baton_statemachine::board::{Task, TaskSpec};
use clap::Subcommand;
use serde_json::json;

use super::{exit, rfc3339, ttl_ms};

/// `baton board ...`
#[derive(Subcommand, Debug)]
pub enum BoardCommand {
    /// Seed (or re-seed) a task: the same id overwrites its dependencies and clears its lease.
    Seed {
        #[arg(long)]
        task: String,
        /// Ids that must be done before TASK can be claimed (comma-separated).
        #[arg(long, value_delimiter = ',')]
        deps: Vec<String>,
    },
    /// Claim a task; prints the token, fence and lease end.
    Claim {
        #[arg(long)]
        task: String,
        #[arg(long)]
        agent: String,
        /// Lease length, e.g. 30s.
        #[arg(long, value_parser = super::ttl)]
        ttl: Duration,
    },
    /// Extend a live claim (same token, same fence); prints the new lease end.
    Renew {
        #[arg(long)]
        task: String,
        #[arg(long)]
        token: String,
        /// New lease length from now, e.g. 30s.
        #[arg(long, value_parser = super::ttl)]
        ttl: Duration,
    },
    /// Give a claim back; the task is open again.
    Release {
        #[arg(long)]
        task: String,
        #[arg(long)]
        token: String,
    },
    /// Mark a claimed task done.
    Complete {
        #[arg(long)]
        task: String,
        #[arg(long)]
        token: String,
    },
    /// List every task (linearizable; tokens are never shown).
    List {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Judge the current board snapshot; exits 1 and lists the problems when there are any.
    Check,
    /// Seed TASK (an id of its own: an existing task is refused), let N agents claim it at
    /// once, and judge the race.
    Race {
        #[arg(long)]
        task: String,
        #[arg(long, default_value_t = 8)]
        claimers: usize,
        /// Lease length of the winner and time limit of the whole judgement.
        #[arg(long, default_value = "30s", value_parser = super::ttl)]
        ttl: Duration,
    },
}

pub async fn run(command: BoardCommand, client: &Client) -> u8 {
    let result = match command {
        BoardCommand::Seed { task, deps } => client
            .seed(&[TaskSpec {
                id: task.clone(),
                deps: deps.clone(),
            }])
            .await
            .map(|_| out!("seeded {task} deps={}", deps.join(","))),
        BoardCommand::Claim { task, agent, ttl } => client
            .claim(&task, &agent, ttl_ms(ttl))
            .await
            .map(|task| print_lease(&task)),
        BoardCommand::Renew { task, token, ttl } => client
            .renew_task(&task, &token, ttl_ms(ttl))
            .await
            .map(|task| print_lease(&task)),
        BoardCommand::Release { task, token } => client
            .release_task(&task, &token)
            .await
            .map(|()| out!("released {task}")),
        BoardCommand::Complete { task, token } => client
            .complete_task(&task, &token)
            .await
            .map(|()| out!("done {task}")),
        BoardCommand::List { json } => client.tasks().await.map(|snapshot| {
            if json {
                print_json(&snapshot.tasks)
            } else {
                print_table(&snapshot.tasks)
            }
        }),
        BoardCommand::Check => return check(client).await,
        BoardCommand::Race {
            task,
            claimers,
            ttl,
        } => return race(client, task, claimers, ttl).await,
    };
    match result {
        Ok(()) => exit::OK,
        Err(error) => exit::report(&error),
    }
}

fn print_lease(task: &Task) {
    match &task.lease {
        Some(lease) => out!(
            "token={} fence={} until={}",
            lease.token,
            lease.fence,
            rfc3339(lease.until_ms)
        ),
        // A claim or renew always answers with a lease; say so rather than print nothing.
        None => out!("task={} state={} (no lease)", task.id, task.state.as_str()),
    }
}

fn print_table(tasks: &[Task]) {
    out!(
        "{:<24} {:<8} {:>5} {:<16} {:<26} DEPS",
        "ID",
        "STATE",
        "FENCE",
        "AGENT",
        "UNTIL"
    );
    for t in tasks {
        let lease = t.lease.as_ref();
        out!(
            "{:<24} {:<8} {:>5} {:<16} {:<26} {}",
            t.id,
            t.state.as_str(),
            lease.map_or_else(|| "-".to_string(), |l| l.fence.to_string()),
            lease.map_or("-", |l| l.agent.as_str()),
            lease.map_or_else(|| "-".to_string(), |l| rfc3339(l.until_ms)),
            if t.deps.is_empty() {
                "-".to_string()
            } else {
                t.deps.join(",")
            }
        );
    }
}

fn print_json(tasks: &[Task]) {
    let list: Vec<_> = tasks
        .iter()
        .map(|t| {
            let lease = t.lease.as_ref();
            json!({
                "id": t.id,
                "state": t.state.as_str(),
                "deps": t.deps,
                "agent": lease.map(|l| l.agent.clone()),
                "fence": lease.map(|l| l.fence),
                "until": lease.map(|l| rfc3339(l.until_ms)),
                "until_ms": lease.map(|l| l.until_ms),
                "max_fence": t.max_fence,
            })
        })
        .collect();
    out!("{}", serde_json::Value::Array(list));
}

async fn race(client: &Client, task: String, claimers: usize, ttl: Duration) -> u8 {
    if claimers == 0 {
        eprintln!("baton: --claimers must be at least 1");
        return exit::USAGE;
    }
    // Refused at every claim, but only after the seed: judged here, nothing is left behind.
    let max = Duration::from_millis(baton_statemachine::queue::MAX_LEASE_TTL_MS.unsigned_abs());
    if ttl > max {
        eprintln!("baton: --ttl must be at most {max:?} (a claim's longest hold)");
        return exit::USAGE;
    }
    let known = match client.tasks().await {
        Ok(snapshot) => snapshot.tasks.iter().any(|t| t.id == task),
        Err(error) => return exit::report(&error),
    };
    if known {
        // The winner keeps it claimed for --ttl: never a task someone seeded for real work.
        eprintln!(
            "baton: task {task:?} exists: a race would claim it and hold it for --ttl; race an id \
             of its own"
        );
        return exit::USAGE;
    }
    let seeded = client
        .seed(&[TaskSpec {
            id: task.clone(),
            deps: Vec::new(),
        }])
        .await;
    if let Err(error) = seeded {
        return exit::report(&error);
    }
    let agents: Vec<String> = (1..=claimers).map(|i| format!("claimer-{i}")).collect();
    let outcome = judge::concurrent_claim(client, &task, &agents, ttl).await;
    super::report_race(&outcome)
}

async fn check(client: &Client) -> u8 {
    let snapshot = match client.tasks().await {
        Ok(snapshot) => snapshot,
        Err(error) => return exit::report(&error),
    };
    let problems = baton_statemachine::board::check(&snapshot.tasks, snapshot.now_ms);
    super::report_problems(
        "tasks",
        snapshot.tasks.len(),
        snapshot.revision,
        problems
            .iter()
            .map(|p| (p.id.as_str(), p.code.as_str(), p.text.as_str())),
    )
}
