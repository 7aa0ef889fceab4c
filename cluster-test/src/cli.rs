//! Running the `baton` command line as a separate process, bounded in time.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

/// What one CLI run produced.
#[derive(Debug)]
pub struct Run {
    /// The exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\nstdout: {}\nstderr: {}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `bin args...` and waits at most `limit` for it to finish (it is killed otherwise).
pub async fn run<S: AsRef<str>>(bin: &Path, args: &[S], limit: Duration) -> anyhow::Result<Run> {
    let mut command = tokio::process::Command::new(bin);
    command
        .args(args.iter().map(AsRef::as_ref))
        .env_remove("BATON_ENDPOINTS")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(limit, command.output())
        .await
        .with_context(|| format!("{} did not finish within {limit:?}", bin.display()))?
        .with_context(|| format!("cannot run {}", bin.display()))?;
    Ok(Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}
