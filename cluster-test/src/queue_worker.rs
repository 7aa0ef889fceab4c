//! `baton worker run` as an OS process of its own: the demo queue worker that runs a shell
//! command per task. A test can SIGKILL it mid-run (its attempts are then recovered by lease
//! expiry) or stop it with SIGTERM (it drains and prints its summary).
//!
//! Its standard output and error go to a log file. The per-attempt lines it prints
//! (`task=N attempt=M queue=Q outcome=O [concurrency_key=K] [token=T] ...`) and its closing
//! summary (`completed=N failed=N unknown=N lost=N protocol_errors=N drained=B`) are parsed here.
//! Dropping a [`WorkerProcess`] kills the process; when that happens during a panic, the tail of
//! its log is printed.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::process::{Child, Command};

/// What `baton worker run` is started with.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// `--id`: the worker identity.
    pub id: String,
    /// `--queue` (repeated).
    pub queues: Vec<String>,
    /// `--concurrency-keys`.
    pub concurrency_keys: bool,
    /// `--slots`.
    pub slots: usize,
    /// `--lease-ttl`.
    pub lease_ttl: Duration,
    /// `--drain-timeout`.
    pub drain_timeout: Duration,
    /// The command run per task (after `--`).
    pub command: Vec<String>,
}

/// One attempt the worker printed when it finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedLine {
    /// The task id.
    pub task_id: u64,
    /// The attempt number.
    pub attempt: u32,
    /// `completed`, `retry`, `failed`, `unknown`, `lease_lost`, `unreported`, `protocol_error`.
    pub outcome: String,
    /// The permit token the worker was handed, if any.
    pub token: Option<u64>,
}

/// The summary the worker prints after draining.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Attempts completed.
    pub completed: u64,
    /// Attempts failed by the command.
    pub failed: u64,
    /// Attempts reported unknown.
    pub unknown: u64,
    /// Attempts lost (lease lost or answer not recorded).
    pub lost: u64,
    /// Assignments refused as protocol errors.
    pub protocol_errors: u64,
    /// Whether every in-flight attempt finished within the drain timeout.
    pub drained: bool,
}

/// A running (or ended) `baton worker run` process.
pub struct WorkerProcess {
    id: String,
    child: Child,
    pid: u32,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl WorkerProcess {
    /// Starts `bin worker run` against `endpoints`; its output goes to `log` (created).
    pub fn spawn(
        bin: &Path,
        endpoints: &[String],
        spec: &WorkerSpec,
        log: &Path,
    ) -> anyhow::Result<WorkerProcess> {
        let out = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut command = Command::new(bin);
        command
            .args(["--endpoints", &endpoints.join(",")])
            .args(["worker", "run", "--id", &spec.id]);
        for queue in &spec.queues {
            command.args(["--queue", queue]);
        }
        if spec.concurrency_keys {
            command.arg("--concurrency-keys");
        }
        command
            .args(["--slots", &spec.slots.to_string()])
            .args(["--lease-ttl", &format!("{}ms", spec.lease_ttl.as_millis())])
            .args([
                "--drain-timeout",
                &format!("{}ms", spec.drain_timeout.as_millis()),
            ])
            .arg("--")
            .args(&spec.command)
            .env_remove("BATON_ENDPOINTS")
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            // A group of its own, as a shell gives a foreground job (see `interrupt_group`).
            .process_group(0)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        let pid = child.id().context("the worker has no pid")?;
        Ok(WorkerProcess {
            id: spec.id.clone(),
            child,
            pid,
            log: log.to_path_buf(),
            exited: None,
        })
    }

    /// The worker identity.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// How it ended, if it has (without waiting).
    pub fn exit_status(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        if self.exited.is_none() {
            self.exited = self
                .child
                .try_wait()
                .with_context(|| format!("cannot poll worker {}", self.id))?;
        }
        Ok(self.exited)
    }

    /// Kills the process with SIGKILL (no draining, no reports) and reaps it.
    pub async fn kill(&mut self) -> anyhow::Result<ExitStatus> {
        self.child
            .start_kill()
            .with_context(|| format!("cannot SIGKILL worker {}", self.id))?;
        self.wait(Duration::from_secs(10)).await
    }

    /// Sends SIGTERM (the worker stops leasing and drains) and waits at most `limit` for it to
    /// exit.
    pub async fn terminate(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let pid = self.pid.to_string();
        self.signal("-TERM", &pid, limit).await
    }

    /// Sends SIGINT to the worker's whole process group, as Ctrl-C at its terminal would, and
    /// waits at most `limit` for the worker to exit.
    pub async fn interrupt_group(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let group = format!("-{}", self.pid);
        self.signal("-INT", &group, limit).await
    }

    /// `kill SIGNAL -- TARGET`, then waits at most `limit` for the worker to exit.
    async fn signal(
        &mut self,
        signal: &str,
        target: &str,
        limit: Duration,
    ) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.exit_status()? {
            bail!("worker {} had already exited ({status})", self.id);
        }
        let sent = std::process::Command::new("kill")
            .args([signal, "--", target])
            .status()
            .context("cannot run kill")?;
        if !sent.success() {
            bail!("kill {signal} {target} (worker {}) failed: {sent}", self.id);
        }
        self.wait(limit).await
    }

    async fn wait(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .with_context(|| format!("worker {} did not exit within {limit:?}", self.id))?
            .with_context(|| format!("cannot reap worker {}", self.id))?;
        self.exited = Some(status);
        Ok(status)
    }

    /// Everything it printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines it printed.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Every finished-attempt line it printed.
    pub fn finished(&self) -> Vec<FinishedLine> {
        self.log().lines().filter_map(parse_finished).collect()
    }

    /// Its closing summary, once printed.
    pub fn summary(&self) -> Option<Summary> {
        self.log().lines().rev().find_map(parse_summary)
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.start_kill();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- worker {} log (tail) ---\n{}",
                self.id,
                self.log_tail(30)
            );
        }
    }
}

/// The `name=value` words of a line before its free-text `detail=` (values have no spaces).
fn fields(line: &str) -> BTreeMap<&str, &str> {
    let line = line.split_once(" detail=").map_or(line, |(head, _)| head);
    line.split_whitespace()
        .filter_map(|word| word.split_once('='))
        .collect()
}

fn parse_finished(line: &str) -> Option<FinishedLine> {
    if !line.starts_with("task=") {
        return None;
    }
    let f = fields(line);
    Some(FinishedLine {
        task_id: f.get("task")?.parse().ok()?,
        attempt: f.get("attempt")?.parse().ok()?,
        outcome: f.get("outcome")?.to_string(),
        token: match f.get("token") {
            Some(token) => Some(token.parse().ok()?),
            None => None,
        },
    })
}

fn parse_summary(line: &str) -> Option<Summary> {
    if !line.starts_with("completed=") {
        return None;
    }
    let f = fields(line);
    let count = |name: &str| f.get(name).and_then(|v| v.parse().ok());
    Some(Summary {
        completed: count("completed")?,
        failed: count("failed")?,
        unknown: count("unknown")?,
        lost: count("lost")?,
        protocol_errors: count("protocol_errors")?,
        drained: f.get("drained")?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_lines_parse() {
        let line = "task=17 attempt=2 queue=q1 outcome=completed concurrency_key=k-3 token=9";
        assert_eq!(
            parse_finished(line),
            Some(FinishedLine {
                task_id: 17,
                attempt: 2,
                outcome: "completed".into(),
                token: Some(9),
            })
        );
        let unkeyed = "task=18 attempt=1 queue=q2 outcome=lease_lost detail=\"x token=3 task=1\"";
        assert_eq!(parse_finished(unkeyed).map(|f| f.token), Some(None));
        assert_eq!(parse_finished("baton worker: w1 on q1"), None);
        assert_eq!(
            parse_summary("completed=5 failed=1 unknown=0 lost=2 protocol_errors=0 drained=true"),
            Some(Summary {
                completed: 5,
                failed: 1,
                unknown: 0,
                lost: 2,
                protocol_errors: 0,
                drained: true,
            })
        );
    }
}
