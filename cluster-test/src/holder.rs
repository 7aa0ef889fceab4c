//! Driving the `holder` binary (`src/bin/holder.rs`): a side-effect holder in its own OS
//! process, so a test can SIGKILL the process that acquired, or freeze it with SIGSTOP between
//! two of its steps and let it go on with SIGCONT.
//!
//! Integration tests find the binary with `env!("CARGO_BIN_EXE_holder")`. Every read of its
//! output is bounded; dropping a [`Holder`] kills the process.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use baton_statemachine::effect::{Action, EffectLease, RetrySafety};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// One line the holder printed: `<op> <status> [name=value ...]`.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The operation (`acquire`, `write`, `complete`, `release`).
    pub op: String,
    /// `ok`, `granted`, another acquire outcome, `refused` or `error`.
    pub status: String,
    /// The `name=value` fields (`message` takes the rest of the line).
    pub fields: BTreeMap<String, String>,
    /// The line as printed.
    pub raw: String,
}

impl Reply {
    fn parse(raw: &str) -> anyhow::Result<Reply> {
        let mut words = raw.splitn(3, ' ');
        let op = words.next().unwrap_or_default().to_string();
        let status = words
            .next()
            .with_context(|| format!("holder line without a status: {raw:?}"))?
            .to_string();
        let mut fields = BTreeMap::new();
        let mut rest = words.next().unwrap_or_default();
        while !rest.is_empty() {
            if let Some(message) = rest.strip_prefix("message=") {
                fields.insert("message".to_string(), message.to_string());
                break;
            }
            let (field, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let (name, value) = field
                .split_once('=')
                .with_context(|| format!("holder field without '=': {field:?} in {raw:?}"))?;
            fields.insert(name.to_string(), value.to_string());
            rest = tail;
        }
        Ok(Reply {
            op,
            status,
            fields,
            raw: raw.to_string(),
        })
    }

    /// A field's value.
    pub fn field(&self, name: &str) -> anyhow::Result<&str> {
        self.fields
            .get(name)
            .map(String::as_str)
            .with_context(|| format!("no {name}= in {:?}", self.raw))
    }

    /// The refusal code of a `refused` line (`None` otherwise).
    pub fn refusal(&self) -> Option<&str> {
        (self.status == "refused")
            .then(|| self.fields.get("code").map(String::as_str))
            .flatten()
    }
}

/// A running holder process that holds a granted lease.
pub struct Holder {
    child: Child,
    pid: u32,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    /// The lease the process was granted (parsed from its first line).
    pub lease: EffectLease,
}

impl Holder {
    /// Runs `bin`, which acquires `action` for `ttl_ms`, and waits (at most `limit`) for its
    /// grant. Writes go to `sink` with `value`. Fails if it was not granted.
    pub async fn spawn(
        bin: &Path,
        endpoints: &[String],
        action: &Action,
        ttl_ms: i64,
        sink: &str,
        value: &str,
        limit: Duration,
    ) -> anyhow::Result<Holder> {
        let mut command = Command::new(bin);
        command
            .args(["--endpoints", &endpoints.join(",")])
            .args(["--key", &action.key])
            .args(["--resource", &action.resource])
            .args(["--ttl-ms", &ttl_ms.to_string()])
            .args(["--sink", sink])
            .args(["--value", value])
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if action.safety == RetrySafety::Unsafe {
            command.arg("--unsafe");
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        let pid = child.id().context("the holder has no pid")?;
        let stdin = child.stdin.take().context("no stdin pipe")?;
        let stdout = child.stdout.take().context("no stdout pipe")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = next_reply(&mut lines, limit).await?;
        if first.op != "acquire" || first.status != "granted" {
            bail!("the holder was not granted: {}", first.raw);
        }
        let lease = EffectLease {
            key: action.key.clone(),
            resource: action.resource.clone(),
            fence: first.field("fence")?.parse()?,
            holder: first.field("holder")?.to_string(),
            until_ms: first.field("until")?.parse()?,
        };
        Ok(Holder {
            child,
            pid,
            stdin: Some(stdin),
            lines,
            lease,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends one command line and waits (at most `limit`) for the line that answers it.
    pub async fn command(&mut self, command: &str, limit: Duration) -> anyhow::Result<Reply> {
        let stdin = self
            .stdin
            .as_mut()
            .context("the holder's stdin is closed")?;
        stdin.write_all(format!("{command}\n").as_bytes()).await?;
        stdin.flush().await?;
        let reply = next_reply(&mut self.lines, limit).await?;
        if reply.op != command {
            bail!("sent {command:?}, the holder answered {:?}", reply.raw);
        }
        Ok(reply)
    }

    /// Freezes the process (SIGSTOP).
    pub fn stop(&self) -> anyhow::Result<()> {
        signal(self.pid, "STOP")
    }

    /// Lets a frozen process go on (SIGCONT).
    pub fn resume(&self) -> anyhow::Result<()> {
        signal(self.pid, "CONT")
    }

    /// Kills the process with SIGKILL and reaps it (bounded).
    pub async fn kill(&mut self) -> anyhow::Result<ExitStatus> {
        self.child
            .start_kill()
            .context("cannot SIGKILL the holder")?;
        self.wait(Duration::from_secs(10)).await
    }

    /// Closes its stdin (it exits) and waits at most `limit` for it to end.
    pub async fn finish(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        self.stdin = None;
        self.wait(limit).await
    }

    async fn wait(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .with_context(|| format!("the holder (pid {}) did not end within {limit:?}", self.pid))?
            .context("cannot reap the holder")
    }
}

/// Sends `SIG<name>` to `pid` with `kill(1)` (this workspace forbids `unsafe`, so no `libc`).
pub fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .context("cannot run kill")?;
    if !status.success() {
        bail!("kill -{name} {pid} failed: {status}");
    }
    Ok(())
}

async fn next_reply(
    lines: &mut Lines<BufReader<ChildStdout>>,
    limit: Duration,
) -> anyhow::Result<Reply> {
    match tokio::time::timeout(limit, lines.next_line()).await {
        Err(_) => bail!("the holder printed nothing within {limit:?}"),
        Ok(Err(error)) => Err(error).context("cannot read the holder's output"),
        Ok(Ok(None)) => bail!("the holder exited without answering"),
        Ok(Ok(Some(line))) => Reply::parse(line.trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::Reply;

    #[test]
    fn lines_parse() {
        let r = Reply::parse("acquire granted fence=3 holder=ab until=99").unwrap_or_else(|e| {
            panic!("{e}");
        });
        assert_eq!((r.op.as_str(), r.status.as_str()), ("acquire", "granted"));
        assert_eq!(r.fields["fence"], "3");
        let r =
            Reply::parse("write error message=cluster unavailable: a=b c").unwrap_or_else(|e| {
                panic!("{e}");
            });
        assert_eq!(r.fields["message"], "cluster unavailable: a=b c");
        let r = Reply::parse("complete refused code=FENCE_STALE").unwrap_or_else(|e| {
            panic!("{e}");
        });
        assert_eq!(r.refusal(), Some("FENCE_STALE"));
    }
}
