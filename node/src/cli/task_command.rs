//! How `baton worker run` runs its command for one task, so that the command lives exactly as
//! long as the attempt and its answer means what the store will record.
//!
//! - **Its own process group.** A Ctrl-C at the terminal (or any signal sent to the worker's
//!   group) reaches the worker alone, which drains: the commands in flight finish instead of
//!   dying half-way. When the attempt ends — the command exited, the lease was lost, the drain
//!   timed out — the whole group is killed, so nothing the command started in the background
//!   runs on once the store may have handed the task to another worker (a process that left
//!   the group, with `setsid`, is beyond reach; its output is read for a second more at most).
//! - **The payload on standard input**, byte for byte, and also in `BATON_PAYLOAD` when it is
//!   text small enough for an environment variable (Linux refuses a single variable over
//!   128 KiB, and an environment cannot hold a NUL byte).
//! - **Bounded output.** At most a result's worth of stdout is kept (the rest is read and
//!   dropped, so the command never blocks on a full pipe), and the last [`STDERR_TAIL_BYTES`] of
//!   stderr. A successful command whose stdout does not fit in a result fails for good rather
//!   than completing with a cut result.
//! - **The answer:** exit 0 completes the task with stdout as its result; any other exit code
//!   is a retryable failure (the command said it failed); death by a signal (OOM killer, a
//!   crash) reports the effect unknown, since the command stopped at a point nobody chose (the
//!   command itself: a shell that reports a child's death as exit 137 is an exit code). A
//!   command that cannot be found or executed fails for good; other spawn errors (out of
//!   processes or file descriptors) are retryable.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::Duration;

use baton_rpc::worker::{TaskContext, TaskError};
use baton_statemachine::limits::MAX_PAYLOAD_BYTES;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// The most of stderr a failure carries.
pub const STDERR_TAIL_BYTES: usize = 2_000;

/// How long the command's output is still read after it exited and its group was killed.
const OUTPUT_GRACE: Duration = Duration::from_secs(1);

/// The largest payload also handed over in `BATON_PAYLOAD` (a quarter of Linux's 128 KiB cap on
/// one variable, leaving room for everything else the command inherits).
pub const MAX_ENV_PAYLOAD_BYTES: usize = 32 * 1024;

/// Runs `program` for the task in `ctx` with `env` (how to reach the cluster) besides the
/// task's own variables, and says what to report.
pub async fn run(
    program: &[String],
    env: &[(&'static str, OsString)],
    ctx: TaskContext,
) -> Result<Vec<u8>, TaskError> {
    let Some((cmd, args)) = program.split_first() else {
        return Err(TaskError::non_retryable("no command to run"));
    };
    let mut command = tokio::process::Command::new(cmd);
    command
        .args(args)
        .envs(env.iter().map(|(name, value)| (name, value)))
        .env("BATON_TASK_ID", ctx.task_id.to_string())
        .env("BATON_ATTEMPT", ctx.attempt.to_string())
        .env("BATON_QUEUE", &ctx.queue)
        .env("BATON_NAMESPACE", &ctx.namespace)
        .env("BATON_HANDLER", &ctx.handler)
        .env("BATON_PAYLOAD_BYTES", ctx.payload.len().to_string())
        .env(
            "BATON_CONCURRENCY_KEY",
            ctx.concurrency_key.as_deref().unwrap_or(""),
        )
        .env(
            "BATON_FENCE",
            ctx.token.map_or_else(String::new, |t| t.to_string()),
        )
        .env_remove("BATON_PAYLOAD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(text) = payload_text(&ctx.payload) {
        command.env("BATON_PAYLOAD", text);
    }
    let mut child = command.spawn().map_err(|e| cannot_start(cmd, e))?;
    // Declared after `child`, so dropped first: the group dies while its leader is unreaped.
    let mut group = Group(child.id().and_then(|pid| i32::try_from(pid).ok()));

    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let feed = async {
        if let Some(mut stdin) = stdin {
            // A command that does not read its input closes the pipe: not an error.
            let _ = stdin.write_all(&ctx.payload).await;
        }
    };
    let (mut out, mut overflowed, mut tail) = (Vec::new(), false, Vec::new());
    let status = {
        let waited = async {
            let status = child.wait().await;
            // What the command left running in the background ends with it (and lets go of
            // the pipes read below).
            group.kill();
            status
        };
        let io = async {
            tokio::join!(
                feed,
                read_bounded(stdout, MAX_PAYLOAD_BYTES, &mut out, &mut overflowed),
                read_tail(stderr, STDERR_TAIL_BYTES, &mut tail),
            );
        };
        tokio::pin!(waited, io);
        tokio::select! {
            () = &mut io => (&mut waited).await,
            status = &mut waited => {
                // A process that left the group (setsid) may hold the pipes open for as long
                // as it likes: what it writes after the command's end is not waited for.
                let _ = tokio::time::timeout(OUTPUT_GRACE, &mut io).await;
                status
            }
        }
    };
    let tail = &tail[tail.len().saturating_sub(STDERR_TAIL_BYTES)..];
    let status = status.map_err(|e| {
        TaskError::unknown_effect(format!("lost track of {cmd:?} after starting it: {e}"))
    })?;
    let said = |what: String| {
        let tail = String::from_utf8_lossy(tail).trim().to_string();
        if tail.is_empty() {
            what
        } else {
            format!("{what}: {tail}")
        }
    };
    if status.success() {
        if overflowed {
            return Err(TaskError::non_retryable(format!(
                "{cmd} succeeded but wrote more than the {MAX_PAYLOAD_BYTES} bytes a result may \
                 hold"
            )));
        }
        return Ok(out);
    }
    match status.signal() {
        Some(signal) => Err(TaskError::unknown_effect(said(format!(
            "{cmd} was killed by signal {signal} part-way"
        )))),
        None => Err(TaskError::retryable(said(format!(
            "{cmd} exited with {status}"
        )))),
    }
}

/// The payload as an environment variable's value, when it can be one.
fn payload_text(payload: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(payload).ok()?;
    (text.len() <= MAX_ENV_PAYLOAD_BYTES && !text.contains('\0')).then_some(text)
}

/// What a failure to start the command means: a missing or non-executable program (or an
/// environment the kernel refuses) cannot start on a retry either; anything else (out of
/// processes, descriptors or memory) may.
fn cannot_start(cmd: &str, error: std::io::Error) -> TaskError {
    use std::io::ErrorKind;
    let message = format!("cannot run {cmd:?}: {error}");
    let permanent = matches!(
        error.kind(),
        ErrorKind::NotFound
            | ErrorKind::PermissionDenied
            | ErrorKind::ArgumentListTooLong
            | ErrorKind::IsADirectory
    ) || error.raw_os_error() == Some(nix::libc::ENOEXEC);
    if permanent {
        TaskError::non_retryable(message)
    } else {
        TaskError::retryable(message)
    }
}

/// The command's process group, killed (SIGKILL) at most once: explicitly once the command
/// exited, or when dropped with the attempt.
struct Group(Option<i32>);

impl Group {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // The group this command leads cannot be reused while any member lives. Once none
            // does (the command exited alone), the signal finds nothing (ESRCH, ignored) — unless
            // the kernel handed the same number to a new group in the moment since, which takes
            // the whole pid space (4 million on 64-bit Linux) to wrap around meanwhile.
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads `from` to its end into `kept`, keeping the first `limit` bytes, and says in
/// `overflowed` whether there was more. Both are up to date at every await, so a read cut short
/// still leaves what came.
async fn read_bounded(
    from: Option<impl AsyncRead + Unpin>,
    limit: usize,
    kept: &mut Vec<u8>,
    overflowed: &mut bool,
) {
    let Some(mut from) = from else {
        return;
    };
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let room = limit.saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..n.min(room)]);
        *overflowed |= n > room;
    }
}

/// Reads `from` to its end into `kept`, keeping (at least) its last `limit` bytes and at most
/// twice that.
async fn read_tail(from: Option<impl AsyncRead + Unpin>, limit: usize, kept: &mut Vec<u8>) {
    let Some(mut from) = from else {
        return;
    };
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => kept.extend_from_slice(&chunk[..n]),
        }
        if kept.len() > 2 * limit {
            kept.drain(..kept.len() - limit);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn only_small_nul_free_text_travels_in_the_environment() {
        assert_eq!(payload_text(b"{\"k\":1}"), Some("{\"k\":1}"));
        assert_eq!(payload_text(b""), Some(""));
        assert_eq!(payload_text(b"a\0b"), None);
        assert_eq!(payload_text(&[0xff, 0xfe]), None);
        let big = vec![b'a'; MAX_ENV_PAYLOAD_BYTES + 1];
        assert_eq!(payload_text(&big), None);
        assert!(payload_text(&big[..MAX_ENV_PAYLOAD_BYTES]).is_some());
    }

    #[tokio::test]
    async fn output_is_kept_up_to_its_bound_and_the_rest_drained() {
        let bounded = |input: &'static [u8]| async move {
            let (mut kept, mut overflowed) = (Vec::new(), false);
            read_bounded(Some(input), 4, &mut kept, &mut overflowed).await;
            (kept, overflowed)
        };
        assert_eq!(bounded(b"abcdef").await, (b"abcd".to_vec(), true));
        assert_eq!(bounded(b"abcd").await, (b"abcd".to_vec(), false));
        let long: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let mut tail = Vec::new();
        read_tail(Some(long.as_slice()), 100, &mut tail).await;
        assert!(tail.len() >= 100 && tail.len() <= 200, "{}", tail.len());
        assert!(long.ends_with(&tail));
    }

    #[test]
    fn a_program_that_cannot_start_again_fails_for_good() {
        use std::io::{Error, ErrorKind};
        for error in [
            Error::from(ErrorKind::NotFound),
            Error::from(ErrorKind::PermissionDenied),
            Error::from(ErrorKind::IsADirectory),
            Error::from_raw_os_error(nix::libc::ENOEXEC),
        ] {
            assert!(matches!(
                cannot_start("x", error),
                TaskError::NonRetryable(_)
            ));
        }
        assert!(matches!(
            cannot_start("x", Error::from(ErrorKind::WouldBlock)),
            TaskError::Retryable(_)
        ));
    }
}
