//! Nodes whose wall clock is off: libfaketime (Debian's `faketime` package) preloaded into one
//! node's process with a fixed offset — the clock fault of Jepsen's nemeses, on a real process.
//!
//! Only the wall clock moves (`FAKETIME_DONT_FAKE_MONOTONIC=1`): Raft timeouts, heartbeats and
//! every timer measured on the monotonic clock run as before, as on a machine whose NTP went
//! wrong. The wall clock is what a leader stamps into each command, so a skewed leader is how a
//! test reaches the store clock's rule across leaders (contract §0).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// Set to `1` to fail, instead of skip, the clock-skew tests on a machine without libfaketime.
pub const REQUIRE_ENV: &str = "BATON_REQUIRE_FAKETIME";

/// Names the libfaketime library to preload, where it is not in one of `LIBRARIES`.
pub const LIBRARY_ENV: &str = "BATON_FAKETIME_LIB";

/// Where Debian's and a source build's libfaketime live.
const LIBRARIES: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// The environment that runs a process with its wall clock `offset_s` seconds off (negative:
/// behind), after checking on `date` that it does. The error says why it cannot.
pub fn offset_env(offset_s: i64) -> Result<Vec<(String, String)>, String> {
    let library = library().ok_or_else(|| {
        format!(
            "no libfaketime (install Debian's `faketime` package, or name the library in \
             {LIBRARY_ENV})"
        )
    })?;
    let env = vec![
        ("LD_PRELOAD".to_string(), library.display().to_string()),
        ("FAKETIME".to_string(), format!("{offset_s:+}")),
        ("FAKETIME_DONT_FAKE_MONOTONIC".to_string(), "1".to_string()),
    ];
    let seen = Command::new("date")
        .arg("+%s")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .map_err(|e| format!("cannot run `date` to try libfaketime: {e}"))?;
    let seen: i64 = String::from_utf8_lossy(&seen.stdout)
        .trim()
        .parse()
        .map_err(|_| "`date` under libfaketime printed no time".to_string())?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs() as i64;
    let off_by = seen - now;
    if (off_by - offset_s).abs() > 5 {
        return Err(format!(
            "libfaketime at {} moved `date` by {off_by} s, not {offset_s} s",
            library.display()
        ));
    }
    Ok(env)
}

fn library() -> Option<PathBuf> {
    if let Some(named) = std::env::var_os(LIBRARY_ENV) {
        return Some(PathBuf::from(named)).filter(|path| path.exists());
    }
    LIBRARIES
        .iter()
        .map(Path::new)
        .find(|path| path.exists())
        .map(Path::to_path_buf)
}

/// [`offset_env`] for test `test`, or `None` after printing `<test>: skipped: ...` when this
/// machine cannot skew a clock. Fails instead with [`REQUIRE_ENV`]=1.
pub fn offset_env_or_skip(
    test: &str,
    offset_s: i64,
) -> anyhow::Result<Option<Vec<(String, String)>>> {
    match offset_env(offset_s) {
        Ok(env) => Ok(Some(env)),
        Err(why) if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") => {
            anyhow::bail!("{test}: libfaketime is required ({REQUIRE_ENV}=1) but unusable: {why}")
        }
        Err(why) => {
            println!("{test}: skipped: cannot skew a node's clock ({why})");
            Ok(None)
        }
    }
}
