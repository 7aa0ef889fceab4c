//! Finding the `baton` binary the cluster tests run (and the examples some run), and building it
//! when it is missing or older than its sources.
//!
//! `cargo nextest run -p baton-cluster-test` builds this crate's tests but not another package's
//! binary, so a test could otherwise run yesterday's server against today's client. The check is
//! done once per test process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

use anyhow::{bail, Context};

/// Environment variable naming a `baton` binary to use as-is (no staleness check, no build).
pub const BIN_ENV: &str = "BATON_BIN";

/// The workspace root, known at compile time.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The path of the `baton` binary, built (once per process) if it is missing or stale.
pub fn baton_bin() -> anyhow::Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| locate().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn locate() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os(BIN_ENV) {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            bail!("{BIN_ENV}={} is not a file", bin.display());
        }
        return Ok(bin);
    }
    let bin = profile_dir()?.join(format!("baton{}", std::env::consts::EXE_SUFFIX));
    built(bin, &["-p", "baton-node", "--bin", "baton"])
}

/// The path of example `name` of package `package`, built (by cargo) if it is missing or stale.
/// `cargo nextest run` builds the workspace's examples with the tests, so in a suite run it is
/// fresh: building it again for one package alone would compile much of its dependency tree
/// anew (features are unified per build), in the middle of the run.
pub fn example_bin(package: &str, name: &str) -> anyhow::Result<PathBuf> {
    let bin = profile_dir()?
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    built(bin, &["-p", package, "--example", name])
}

/// `bin`, built with `cargo build <what>` first if it is missing or older than its sources.
fn built(bin: PathBuf, what: &[&str]) -> anyhow::Result<PathBuf> {
    let fresh = match modified(&bin) {
        None => false,
        Some(built) => newest_source(&bin).is_none_or(|source| source <= built),
    };
    if !fresh {
        match build(&bin, what) {
            Ok(()) => {}
            // A half-edited workspace may not compile; an existing binary is still useful.
            Err(error) if bin.is_file() => {
                eprintln!(
                    "cluster-test: rebuilding {} failed ({error:#}); using the existing binary",
                    bin.display()
                )
            }
            Err(error) => return Err(error),
        }
    }
    if !bin.is_file() {
        bail!("{} does not exist after building it", bin.display());
    }
    Ok(bin)
}

/// `<target>/<profile>`, derived from this test executable
/// (`<target>/<profile>/deps/<test>-<hash>`).
fn profile_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot tell where this test executable is")?;
    let mut dir = exe.parent().context("test executable has no directory")?;
    if dir.file_name().is_some_and(|name| name == "deps") {
        dir = dir.parent().context("deps directory has no parent")?;
    }
    Ok(dir.to_path_buf())
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The newest modification time among the sources the binary is built from: the files its
/// dep-info (`baton.d`, written by cargo next to it) lists, or, without one, every `.rs`,
/// `.proto` and `.toml` file of the crates it is made of. A listed file that no longer exists
/// counts as changed.
fn newest_source(bin: &Path) -> Option<SystemTime> {
    let root = workspace_root();
    let mut newest = modified(&root.join("Cargo.lock"));
    match std::fs::read_to_string(bin.with_extension("d")) {
        Ok(dep_info) => {
            for path in dep_info_paths(&dep_info) {
                newest = newest.max(Some(modified(&path).unwrap_or_else(SystemTime::now)));
            }
        }
        Err(_) => {
            for dir in ["node", "rpc", "statemachine"] {
                newest_in(&root.join(dir), &mut newest);
            }
        }
    }
    newest
}

/// The prerequisites a Makefile-style dep-info file lists (`target: dep dep ...`, spaces in
/// paths escaped as `\ `).
fn dep_info_paths(dep_info: &str) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for line in dep_info.lines() {
        let Some((_, deps)) = line.split_once(": ") else {
            continue;
        };
        let mut current = String::new();
        let mut chars = deps.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => {
                    current.push(' ');
                    chars.next();
                }
                ' ' => {
                    if !current.is_empty() {
                        paths.push(PathBuf::from(std::mem::take(&mut current)));
                    }
                }
                c => current.push(c),
            }
        }
        if !current.is_empty() {
            paths.push(PathBuf::from(current));
        }
    }
    paths
}

fn newest_in(dir: &Path, newest: &mut Option<SystemTime>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            // Tests and benches of other crates do not go into the binary.
            if name != "tests" && name != "benches" && name != "target" {
                newest_in(&path, newest);
            }
        } else if path
            .extension()
            .is_some_and(|ext| ext == "rs" || ext == "proto" || ext == "toml")
        {
            *newest = (*newest).max(modified(&path));
        }
    }
}

/// Builds `bin` (`cargo build <what>`) with the profile of the directory it is expected in
/// (`debug` -> `dev`).
fn build(bin: &Path, what: &[&str]) -> anyhow::Result<()> {
    let profile = match profile_dir()?.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_string(),
        Some(other) => other.to_string(),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let what = what.join(" ");
    eprintln!(
        "cluster-test: building {} (cargo build {what} --profile {profile})",
        bin.display()
    );
    let status = Command::new(cargo)
        .arg("build")
        .args(what.split(' '))
        .args(["--profile", &profile])
        .current_dir(workspace_root())
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("cargo build {what} failed: {status}");
    }
    Ok(())
}
