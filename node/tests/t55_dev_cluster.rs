//! `baton dev`, the README's first command: it starts a working three-node cluster, stops cleanly
//! on Ctrl-C (exit 0, no warning or error from Baton itself on the way), and its data survives a
//! restart.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Generous for a debug build on a loaded 2-core machine; the cluster is usually ready in ~2 s.
const READY_WITHIN: Duration = Duration::from_secs(60);
const STOPPED_WITHIN: Duration = Duration::from_secs(30);

/// A port P with P, P+1 and P+2 free on 127.0.0.1 (`baton dev` listens on three in a row).
fn three_free_ports() -> u16 {
    for _ in 0..200 {
        let first = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        let Some(last) = port.checked_add(2) else {
            continue;
        };
        let rest: Vec<_> = (port + 1..=last)
            .map(|p| TcpListener::bind(("127.0.0.1", p)))
            .collect();
        if rest.iter().all(Result::is_ok) {
            return port;
        }
    }
    panic!("no three consecutive free ports on 127.0.0.1");
}

/// A running `baton dev`: its stdout lines arrive on a channel, its stderr is read whole on a
/// thread of its own (so the pipe never fills), and it is killed if the test fails first.
struct Dev {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

impl Dev {
    fn start(data_dir: &Path, port: u16) -> Dev {
        Dev::start_with(Command::new(env!("CARGO_BIN_EXE_baton")), data_dir, port)
    }

    /// [`Dev::start`] as systemd would run it (`NOTIFY_SOCKET` set; nothing listens there).
    fn start_under_systemd(data_dir: &Path, port: u16) -> Dev {
        let mut command = Command::new(env!("CARGO_BIN_EXE_baton"));
        command.env("NOTIFY_SOCKET", data_dir.join("no-notify-socket"));
        Dev::start_with(command, data_dir, port)
    }

    /// [`Dev::start`] under `nohup`: SIGHUP ignored from the start.
    fn start_under_nohup(data_dir: &Path, port: u16) -> Dev {
        let mut nohup = Command::new("nohup");
        nohup.arg(env!("CARGO_BIN_EXE_baton"));
        Dev::start_with(nohup, data_dir, port)
    }

    fn start_with(command: Command, data_dir: &Path, port: u16) -> Dev {
        let mut child = spawn_dev(command, data_dir, port);
        let (line_tx, stdout) = mpsc::channel();
        let out = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = line_tx.send(line);
            }
        });
        let stderr = read_log(&mut child);
        Dev {
            child,
            stdout,
            stderr,
        }
    }

    /// Waits for the "ready" line and returns it.
    fn wait_ready(&mut self) -> String {
        loop {
            match self.stdout.recv_timeout(READY_WITHIN) {
                Ok(line) if line.starts_with("baton dev: ready") => return line,
                Ok(_) => {}
                Err(e) => {
                    let _ = self.child.kill();
                    let log = self.stderr.recv().unwrap_or_default();
                    panic!(
                        "baton dev was not ready within {READY_WITHIN:?} ({e}); its log:\n{log}"
                    );
                }
            }
        }
    }

    /// Sends SIGINT (Ctrl-C) and returns the exit code, the rest of stdout and all of stderr.
    fn interrupt(self) -> (Option<i32>, String, String) {
        self.stop_with("-INT")
    }

    fn send(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success());
    }

    /// Sends `signal` and returns the exit code, the rest of stdout and all of stderr.
    fn stop_with(mut self, signal: &str) -> (Option<i32>, String, String) {
        self.send(signal);
        let Ok(log) = self.stderr.recv_timeout(STOPPED_WITHIN) else {
            panic!("baton dev did not stop within {STOPPED_WITHIN:?} of {signal}");
        };
        let code = self.child.wait().unwrap().code();
        // The stdout reader ends at EOF, which the exit guarantees.
        let rest: Vec<String> = self.stdout.iter().collect();
        (code, rest.join("\n"), log)
    }
}

/// Starts `baton dev` on `port` with `data_dir` by `command`, its stdout and stderr piped.
fn spawn_dev(mut command: Command, data_dir: &Path, port: u16) -> Child {
    command
        .args(["dev", "--base-port", &port.to_string(), "--data-dir"])
        .arg(data_dir)
        // `baton dev`'s own log filter, whatever the test runner's environment says.
        .env_remove("BATON_LOG")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `child`'s whole stderr, read on a thread of its own (so the pipe never fills), once it ends.
fn read_log(child: &mut Child) -> mpsc::Receiver<String> {
    let (log_tx, log) = mpsc::channel();
    let mut err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        let _ = log_tx.send(text);
    });
    log
}

impl Drop for Dev {
    fn drop(&mut self) {
        // A no-op after a clean exit; stops the cluster when an assertion failed first.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client(port: u16, args: &[&str]) -> Output {
    let endpoints = (port..port + 3)
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["--endpoints", &endpoints])
        .args(args)
        .output()
        .unwrap()
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "client command failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Baton's own lines at WARN or ERROR level in `baton dev`'s log. openraft's are left out: it
/// logs an ERROR for any AppendEntries that fails or takes longer than a heartbeat, which a
/// loaded machine or a follower closing its listener first can cause without anything wrong.
fn complaints(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.contains(" WARN baton") || line.contains(" ERROR baton"))
        .collect()
}

#[test]
fn dev_cluster_serves_stops_cleanly_and_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("dev");
    let port = three_free_ports();

    let mut dev = Dev::start(&data_dir, port);
    let ready = dev.wait_ready();
    assert!(ready.contains(&format!("127.0.0.1:{port}")), "{ready}");
    let status = stdout_of(&client(port, &["status"]));
    let with_role = |role: &str| status.lines().filter(|l| l.contains(role)).count();
    assert_eq!(with_role(" leader "), 1, "{status}");
    assert_eq!(with_role(" follower "), 2, "{status}");
    let offered = stdout_of(&client(
        port,
        &[
            "ticket",
            "offer",
            "--key",
            "t55",
            "--from",
            "a",
            "--to",
            "b",
            "--reply-to",
            "a",
            "--ttl",
            "1h",
        ],
    ));
    let (code, rest, log) = dev.interrupt();
    assert_eq!(code, Some(0), "exit code; log:\n{log}");
    assert!(rest.contains("baton dev: stopped"), "stdout: {rest}");
    assert!(
        complaints(&log).is_empty(),
        "a clean stop logs no warning or error of Baton's:\n{}",
        complaints(&log).join("\n")
    );

    // Restarted on the same data: the cluster resumes (no re-initialisation) with the ticket.
    let mut dev = Dev::start(&data_dir, port);
    dev.wait_ready();
    let listed = stdout_of(&client(port, &["ticket", "list"]));
    assert!(
        listed.contains("t55"),
        "after a restart: {listed}\nbefore: {offered}"
    );
    let (code, _, log) = dev.interrupt();
    assert_eq!(code, Some(0), "exit code after the restart; log:\n{log}");
    assert!(
        complaints(&log).is_empty(),
        "{}",
        complaints(&log).join("\n")
    );
}

/// A port in use is said at once, naming it, before any node starts (before: the nodes failed
/// to bind unnoticed and `baton dev` waited minutes for a cluster — or, when another cluster
/// answered there, called that one ready).
#[test]
fn a_port_in_use_is_said_at_once() {
    let port = three_free_ports();
    let _taken = TcpListener::bind(("127.0.0.1", port + 1)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = dev_until_exit(dir.path(), port);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{}", port + 1)),
        "{stderr}"
    );
    assert!(!stdout.contains("ready"), "{stdout}");
}

/// Tuning `baton node` would refuse is refused by `baton dev` too, naming the flag, before any
/// port is bound (before: a sweep interval of 0 made every node's sweeper spin, a heartbeat of
/// 0 stopped replication; both were taken as given).
#[test]
fn tuning_that_cannot_work_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    for (flags, said) in [
        (
            ["--sweep-interval", "0s"],
            "--sweep-interval must be longer than 0",
        ),
        (["--heartbeat", "0s"], "--heartbeat must be at least 1ms"),
        (
            ["--election-timeout", "100ms"],
            "--election-timeout must be at least 3 times",
        ),
    ] {
        let (code, _, stderr) = dev_until_exit_with(dir.path(), three_free_ports(), &flags);
        assert_eq!(code, Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(said), "{flags:?}: {stderr}");
        assert!(
            !dir.path().join("node-1").exists(),
            "{flags:?}: a node started"
        );
    }
}

/// Flags `baton dev` has no use for (its cluster is plaintext, without tokens) are refused, not
/// ignored; the environment's client settings do not concern it (before, an exported
/// `BATON_TLS_CA` that did not exist stopped it).
#[test]
fn client_flags_given_to_dev_are_refused_and_exported_ones_ignored() {
    let dir = tempfile::tempdir().unwrap();
    for flags in [["--auth-token", "s3cret"], ["--tls-ca", "ca.pem"]] {
        let (code, _, stderr) = dev_until_exit_with(dir.path(), three_free_ports(), &flags);
        assert_eq!(code, Some(2), "{flags:?}: {stderr}");
        let said = format!("baton dev: {} does not apply", flags[0]);
        assert!(stderr.contains(&said), "{flags:?}: {stderr}");
    }
    // A setting of its own refused, to end it early: that, not the CA file, is what it says.
    let output = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["dev", "--sweep-interval", "0s", "--data-dir"])
        .arg(dir.path())
        .env("BATON_TLS_CA", dir.path().join("missing.pem"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--sweep-interval"), "{stderr}");
    assert!(!stderr.contains("missing.pem"), "{stderr}");
}

/// SIGHUP (the terminal went away) ends `baton dev` as gracefully as Ctrl-C (before: killed by
/// the signal); started under `nohup`, which ignores SIGHUP, or by systemd, it keeps running.
#[test]
fn sighup_ends_baton_dev_gracefully_unless_nohup_or_systemd_run_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = three_free_ports();
    let mut dev = Dev::start(dir.path(), port);
    dev.wait_ready();
    let (code, _, log) = dev.stop_with("-HUP");
    assert_eq!(code, Some(0), "{log}");

    let dir = tempfile::tempdir().unwrap();
    let port = three_free_ports();
    let mut dev = Dev::start_under_nohup(dir.path(), port);
    dev.wait_ready();
    dev.send("-HUP");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        dev.child.try_wait().unwrap().is_none(),
        "baton dev under nohup stopped on SIGHUP"
    );
    let (code, _, log) = dev.interrupt();
    assert_eq!(code, Some(0), "{log}");

    // Under systemd a HUP asks for a reload: said and ignored, not a stop for good.
    let dir = tempfile::tempdir().unwrap();
    let port = three_free_ports();
    let mut dev = Dev::start_under_systemd(dir.path(), port);
    dev.wait_ready();
    dev.send("-HUP");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        dev.child.try_wait().unwrap().is_none(),
        "baton dev under systemd stopped on SIGHUP"
    );
    let (code, _, log) = dev.interrupt();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("SIGHUP ignored"), "{log}");
}

/// Runs `baton dev` until it exits by itself (it is killed if it is still running after
/// [`READY_WITHIN`]); its exit code, stdout and stderr.
fn dev_until_exit(data_dir: &Path, port: u16) -> (Option<i32>, String, String) {
    dev_until_exit_with(data_dir, port, &[])
}

/// [`dev_until_exit`] with `flags` added.
fn dev_until_exit_with(
    data_dir: &Path,
    port: u16,
    flags: &[&str],
) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["dev", "--base-port", &port.to_string(), "--data-dir"])
        .arg(data_dir)
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > READY_WITHIN {
            let _ = child.kill();
            let _ = child.wait();
            panic!("baton dev still ran after {READY_WITHIN:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |from: &mut dyn Read| {
        let mut text = String::new();
        from.read_to_string(&mut text).unwrap();
        text
    };
    let stdout = read(&mut child.stdout.take().unwrap());
    let stderr = read(&mut child.stderr.take().unwrap());
    (status.code(), stdout, stderr)
}

/// What `baton dev` cannot run on is said first, not after a wait for the cluster that can never
/// end well: data made on other ports (its members would dial the old ports, so no leader ever
/// came: "NO_LEADER" after 30 s), and a data dir another `baton dev` holds (every node failed to
/// open its store; the first message was "node at ... did not start: connection refused").
#[test]
fn data_it_cannot_run_on_is_said_first() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("dev");
    let port = three_free_ports();
    let mut dev = Dev::start(&data_dir, port);
    dev.wait_ready();

    // The same data dir while the first one runs: its stores are locked.
    let other = three_free_ports();
    let (code, _, stderr) = dev_until_exit(&data_dir, other);
    assert_eq!(code, Some(1), "{stderr}");
    let first = stderr
        .lines()
        .find(|l| l.starts_with("baton dev:"))
        .unwrap_or_default();
    assert!(first.contains("node failed"), "{stderr}");
    let (code, _, log) = dev.interrupt();
    assert_eq!(code, Some(0), "{log}");

    // The data of a cluster on `port`, started on other ports.
    let (code, _, stderr) = dev_until_exit(&data_dir, other);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("belongs to a cluster at 127.0.0.1:{port}"))
            && stderr.contains("--base-port"),
        "{stderr}"
    );
}

/// A reader of `baton dev`'s output that goes away (`baton dev | tee dev.log`, and Ctrl-C
/// reaches `tee` too) neither stops the cluster nor turns its clean stop into a panic (exit 101
/// on the closed pipe, before): the lines are dropped.
#[test]
fn a_reader_that_went_away_does_not_spoil_a_clean_stop() {
    let dir = tempfile::tempdir().unwrap();
    let port = three_free_ports();
    let mut child = spawn_dev(Command::new(env!("CARGO_BIN_EXE_baton")), dir.path(), port);
    // The reader takes lines up to the ready one, then goes away, closing the pipe.
    let (ready_tx, ready) = mpsc::channel();
    let out = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if line.starts_with("baton dev: ready") {
                let _ = ready_tx.send(line);
                return;
            }
        }
    });
    let stderr = read_log(&mut child);
    let guard = Dev {
        child,
        stdout: mpsc::channel().1,
        stderr,
    };
    if ready.recv_timeout(READY_WITHIN).is_err() {
        panic!("baton dev was not ready within {READY_WITHIN:?}");
    }
    // Still serving after its next line met the closed pipe.
    std::thread::sleep(Duration::from_millis(500));
    let status = stdout_of(&client(port, &["status", "--require-leader"]));
    assert!(status.contains("leader"), "{status}");
    let (code, _, log) = guard.interrupt();
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// A base port that leaves no room for three ports, or asks for any free one (0: each node
/// would get its own, which nobody could be told), is bad usage naming the flag, before
/// anything starts (before: 0 failed naming `advertise`, a key `baton dev` has no flag for).
#[test]
fn a_base_port_without_room_for_three_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    for port in ["0", "65534"] {
        let output = Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(["dev", "--base-port", port, "--data-dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{port}: {stderr}");
        assert!(stderr.contains("--base-port"), "{port}: {stderr}");
        assert!(!stderr.contains("advertise"), "{port}: {stderr}");
        assert!(
            !dir.path().join("node-1").exists(),
            "{port}: a node started"
        );
    }
}
