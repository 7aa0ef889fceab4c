//! `baton node` configuration through the real binary: the printed default round-trips, flags
//! beat the environment which beats the file, and a bad key is named with exit code 2.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// `baton node ARGS` with exactly the environment `env` (nothing inherited).
fn baton_node(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(BATON)
        .arg("node")
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The effective settings `--check-config` printed.
fn effective(output: &Output) -> toml::Table {
    assert!(output.status.success(), "check failed: {}", stderr(output));
    stdout(output).parse().unwrap()
}

fn get<'a>(table: &'a toml::Table, key: &str) -> &'a toml::Value {
    let (section, key) = key.split_once('.').unwrap_or(("", key));
    let table = if section.is_empty() {
        table
    } else {
        table[section].as_table().unwrap()
    };
    &table[key]
}

#[test]
fn the_printed_default_config_is_accepted_as_a_config_file() {
    let printed = baton_node(&["--print-default-config"], &[]);
    assert!(printed.status.success());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("baton.toml");
    std::fs::write(&file, stdout(&printed)).unwrap();

    let checked = baton_node(
        &[
            "--check-config",
            "--config",
            file.to_str().unwrap(),
            "--id",
            "1",
        ],
        &[],
    );
    let settings = effective(&checked);
    assert_eq!(get(&settings, "raft.heartbeat").as_str(), Some("50ms"));
    assert_eq!(
        get(&settings, "limits.max_request_bytes").as_integer(),
        Some(4 << 20)
    );
}

/// Output into a pipe whose reader has gone (`baton node --print-default-config | head -1`)
/// ends the command with exit 141, as a filter killed by SIGPIPE ends, and no panic (before:
/// exit 101 and a panic message).
#[test]
fn printing_into_a_closed_pipe_exits_141() {
    let certs = tempfile::tempdir().unwrap();
    let out_dir = certs.path().to_str().unwrap();
    for args in [
        vec!["node", "--print-default-config"],
        vec!["node", "--check-config", "--id", "1"],
        vec![
            "certs",
            "generate",
            "--out",
            out_dir,
            "--hosts",
            "127.0.0.1",
        ],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let ended = Command::new(BATON)
            .args(&args)
            .env_clear()
            .stdout(writer)
            .output()
            .unwrap();
        assert_eq!(
            ended.status.code(),
            Some(141),
            "{args:?}: {}",
            stderr(&ended)
        );
        assert!(
            !stderr(&ended).contains("panicked"),
            "{args:?}: {}",
            stderr(&ended)
        );
    }
}

#[test]
fn flags_beat_the_environment_which_beats_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("baton.toml");
    std::fs::write(
        &file,
        "id = 7\nlisten = \"127.0.0.1:7100\"\n[raft]\nheartbeat = \"10ms\"\nsnapshot_every = 7\nkeep_logs = 5\n",
    )
    .unwrap();
    let checked = baton_node(
        &[
            "--check-config",
            "--config",
            file.to_str().unwrap(),
            "--heartbeat",
            "30ms",
            "--set",
            "watch.stream_buffer=9",
        ],
        &[
            ("BATON_RAFT_HEARTBEAT", "20ms"),
            ("BATON_RAFT_SNAPSHOT_EVERY", "8"),
            ("BATON_LISTEN", "127.0.0.1:7200"),
        ],
    );
    let settings = effective(&checked);
    assert_eq!(
        get(&settings, "raft.heartbeat").as_str(),
        Some("30ms"),
        "flag > env > file"
    );
    assert_eq!(
        get(&settings, "raft.snapshot_every").as_integer(),
        Some(8),
        "env > file"
    );
    assert_eq!(
        get(&settings, "raft.keep_logs").as_integer(),
        Some(5),
        "file > default"
    );
    assert_eq!(
        get(&settings, "listen").as_str(),
        Some("127.0.0.1:7200"),
        "env > file"
    );
    assert_eq!(
        get(&settings, "watch.stream_buffer").as_integer(),
        Some(9),
        "--set"
    );
    assert_eq!(get(&settings, "id").as_integer(), Some(7), "file");
    let report = stdout(&checked);
    assert!(
        report.contains(
            "raft.snapshot_every is set by environment variable BATON_RAFT_SNAPSHOT_EVERY"
        ),
        "{report}"
    );
}

#[test]
fn bad_configuration_names_the_key_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("baton.toml");
    std::fs::write(&file, "id = 1\n[raft]\nhearbeat = \"10ms\"\n").unwrap();
    let cases: Vec<Case> = vec![
        (
            vec!["--config", file.to_str().unwrap()],
            vec![],
            "raft.hearbeat",
        ),
        (
            vec!["--id", "1"],
            vec![("BATON_RAFT_HEARTBEAT", "soon")],
            "BATON_RAFT_HEARTBEAT",
        ),
        (
            vec!["--id", "1", "--max-in-flight", "0"],
            vec![],
            "limits.max_in_flight",
        ),
        (
            vec!["--id", "1", "--max-connections", "0"],
            vec![],
            "limits.max_connections",
        ),
        (vec![], vec![], "`id`"),
        (
            vec!["--id", "1", "--set", "raft.nope=1"],
            vec![],
            "raft.nope",
        ),
    ];
    assert_each_refused(&["--check-config"], cases);
}

/// Values that parse but could not work: `--check-config` says so (exit 2, naming the key)
/// rather than passing them to a node that fails to start or misbehaves.
#[test]
fn unworkable_values_are_refused_by_the_check() {
    let cases: Vec<Case> = vec![
        // An election timeout one late heartbeat would trip.
        (
            vec!["--heartbeat", "100ms", "--election-timeout", "250ms"],
            vec![],
            "raft.election_timeout",
        ),
        // Doubled for the upper bound, it would overflow.
        (
            vec!["--election-timeout", "300000000000y"],
            vec![],
            "raft.election_timeout",
        ),
        // An address peers and clients cannot dial.
        (vec!["--advertise", "10.0.0.5"], vec![], "advertise"),
        (vec!["--set", "peer_addrs.2=peer2"], vec![], "peer_addrs.2"),
        // The metrics endpoint on the gRPC port, also where one address covers the other.
        (
            vec!["--listen", "127.0.0.1:7100", "--http", "127.0.0.1:7100"],
            vec![],
            "http",
        ),
        (
            vec![
                "--listen",
                "0.0.0.0:7100",
                "--advertise",
                "h:7100",
                "--http",
                "10.0.0.1:7100",
            ],
            vec![],
            "http",
        ),
        (
            vec!["--listen", "127.0.0.1:7100", "--http", "0.0.0.0:7100"],
            vec![],
            "http",
        ),
        // A port picked at start, which nobody could be told.
        (vec!["--listen", "127.0.0.1:0"], vec![], "advertise"),
        // Smaller than a request carrying the largest payload.
        (
            vec!["--max-request-bytes", "262144"],
            vec![],
            "limits.max_request_bytes",
        ),
        // So large that its log entry could claim more than a node decodes: the leader would
        // append an entry no member (itself included, at its next start) could read back.
        (
            vec!["--max-request-bytes", "67108864"],
            vec![],
            "limits.max_request_bytes",
        ),
        // A slow stream would be cut only after its resume point left the history.
        (
            vec![
                "--set",
                "watch.history=1000",
                "--set",
                "watch.max_backlog=1000",
            ],
            vec![],
            "watch.max_backlog",
        ),
        // Idle streams would go silent long enough for clients to drop them.
        (
            vec!["--set", "watch.progress_every=10s"],
            vec![],
            "watch.progress_every",
        ),
        // A slow stream cut at half of it could not resume where its reader stopped.
        (
            vec!["--set", "watch.history_bytes=1048576"],
            vec![],
            "watch.history_bytes",
        ),
        // Raft counts in whole milliseconds: 900us would become a 0 ms heartbeat, a timeout no
        // AppendEntries meets (replication stopped).
        (
            vec!["--heartbeat", "900us", "--election-timeout", "3ms"],
            vec![],
            "raft.heartbeat",
        ),
        // "Unlimited" counts the node's semaphores and channels cannot hold (it panicked).
        (
            vec!["--max-in-flight", "9223372036854775807"],
            vec![],
            "limits.max_in_flight",
        ),
        (
            vec!["--set", "watch.stream_buffer=9223372036854775807"],
            vec![],
            "watch.stream_buffer",
        ),
        // Healthy followers would take a gap between heartbeats for a partition.
        (
            vec![
                "--heartbeat",
                "2s",
                "--election-timeout",
                "6s",
                "--set",
                "watch.leaderless_cutoff=3s",
            ],
            vec![],
            "watch.leaderless_cutoff",
        ),
    ];
    assert_each_refused(&["--check-config", "--id", "1"], cases);
}

/// An environment variable that is not UTF-8 (here one Baton never reads, as a container runtime
/// may set) does not stop a node: it used to panic before reading its configuration.
#[test]
fn a_variable_that_is_not_utf8_is_no_obstacle() {
    use std::os::unix::ffi::OsStrExt;
    let output = Command::new(BATON)
        .args(["node", "--check-config", "--id", "1"])
        .env_clear()
        .env("LEGACY_PATH", std::ffi::OsStr::from_bytes(b"/srv/caf\xe9"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    // One it reads is refused by name: read lossily, the path would be another path.
    let output = Command::new(BATON)
        .args(["node", "--check-config", "--id", "1"])
        .env_clear()
        .env(
            "BATON_DATA_DIR",
            std::ffi::OsStr::from_bytes(b"/srv/caf\xe9"),
        )
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("BATON_DATA_DIR"),
        "{}",
        stderr(&output)
    );
}

/// A case of a refused configuration: flags, environment, and what the error must say.
type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);

/// Each case, after `base` flags, exits 2 with an error that contains its text.
fn assert_each_refused(base: &[&str], cases: Vec<Case>) {
    for (args, env, named) in cases {
        let mut full = base.to_vec();
        full.extend(args.iter().copied());
        let output = baton_node(&full, &env);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(named),
            "{args:?} {env:?}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn the_example_config_shipped_in_deploy_is_valid() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/baton.example.toml");
    let checked = baton_node(&["--check-config", "--config", example], &[]);
    assert!(
        checked.status.success(),
        "deploy/baton.example.toml is refused: {}",
        stderr(&checked)
    );
    let settings = effective(&checked);
    assert_eq!(get(&settings, "id").as_integer(), Some(1));
    assert_eq!(get(&settings, "data_dir").as_str(), Some("/var/lib/baton"));
}

/// A directory with a CA and a node certificate made by `baton certs` (copies of the CA stand
/// in for other CAs), a file that is not a certificate, and token files.
fn security_files() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let made = Command::new(BATON)
        .args(["certs", "generate", "--out", &out, "--name", "node"])
        .args(["--hosts", "127.0.0.1"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", stderr(&made));
    for copy in ["other-ca.pem", "flag-ca.pem"] {
        std::fs::copy(dir.path().join("ca.pem"), dir.path().join(copy)).unwrap();
    }
    std::fs::write(
        dir.path().join("not-a-cert.pem"),
        "-----BEGIN CERTIFICATE-----\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("tokens"), "# ops\n0123456789abcdef0123\n").unwrap();
    std::fs::write(dir.path().join("short-tokens"), "abc\n").unwrap();
    dir
}

#[test]
fn tls_and_tokens_are_config_keys_like_any_other() {
    let dir = security_files();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let file = dir.path().join("baton.toml");
    std::fs::write(
        &file,
        format!(
            "id = 1\n[tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n[auth]\ntoken_file = {:?}\n",
            path("ca.pem"),
            path("node.pem"),
            path("node-key.pem"),
            path("tokens")
        ),
    )
    .unwrap();
    let config = file.to_str().unwrap();

    let from_file = effective(&baton_node(&["--check-config", "--config", config], &[]));
    assert_eq!(get(&from_file, "tls.ca").as_str(), Some(&*path("ca.pem")));
    assert_eq!(
        get(&from_file, "tls.key").as_str(),
        Some(&*path("node-key.pem"))
    );
    assert_eq!(
        get(&from_file, "auth.token_file").as_str(),
        Some(&*path("tokens"))
    );

    let other_ca = path("other-ca.pem");
    let from_env = baton_node(
        &["--check-config", "--config", config],
        &[("BATON_TLS_CA", &other_ca)],
    );
    assert_eq!(
        get(&effective(&from_env), "tls.ca").as_str(),
        Some(&*other_ca),
        "env > file"
    );
    assert!(
        stdout(&from_env).contains("tls.ca is set by environment variable BATON_TLS_CA"),
        "{}",
        stdout(&from_env)
    );

    let flag_ca = path("flag-ca.pem");
    let from_flag = baton_node(
        &["--check-config", "--config", config, "--tls-ca", &flag_ca],
        &[("BATON_TLS_CA", &other_ca)],
    );
    assert_eq!(
        get(&effective(&from_flag), "tls.ca").as_str(),
        Some(&*flag_ca),
        "flag > env"
    );
    assert!(
        stdout(&from_flag).contains("tls.ca is set by flag --tls-ca"),
        "{}",
        stdout(&from_flag)
    );
}

#[test]
fn unusable_tls_or_token_settings_name_their_key_and_exit_2() {
    let dir = security_files();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (ca, cert, key) = (path("ca.pem"), path("node.pem"), path("node-key.pem"));
    let missing = path("missing.pem");
    let garbage = path("not-a-cert.pem");
    let (tokens, short) = (path("tokens"), path("short-tokens"));
    let folder = dir.path().display().to_string();
    let config = dir.path().join("baton.toml");
    std::fs::write(&config, "[raft]\nkeep_logs = 10\n").unwrap();
    let config = config.display().to_string();
    let cases: Vec<Case> = vec![
        (vec!["--tls-ca", &ca], vec![], "config key `tls`"),
        (
            vec!["--config", &config, "--tls-ca", &ca],
            vec![],
            "config key `tls` (from flag --tls-ca)",
        ),
        (
            vec!["--tls-ca", &folder, "--tls-cert", &cert, "--tls-key", &key],
            vec![],
            "config key `tls.ca` (from flag --tls-ca): cannot read",
        ),
        (
            vec!["--tls-key", &key],
            vec![("BATON_TLS_CERT", &cert)],
            "config key `tls`",
        ),
        (
            vec!["--tls-ca", &ca, "--tls-cert", &missing, "--tls-key", &key],
            vec![],
            "config key `tls.cert` (from flag --tls-cert): cannot read",
        ),
        // Readable, but not a certificate: the check parses the files as the start would.
        (
            vec!["--tls-ca", &ca, "--tls-cert", &garbage, "--tls-key", &key],
            vec![],
            "config key `tls`",
        ),
        (
            vec![],
            vec![("BATON_AUTH_TOKEN_FILE", &missing)],
            "config key `auth.token_file` (from environment variable BATON_AUTH_TOKEN_FILE)",
        ),
        (
            vec!["--auth-token-file", &short],
            vec![],
            "at least 16 characters",
        ),
    ];
    assert_each_refused(&["--check-config", "--id", "1"], cases);
    let good = baton_node(
        &["--check-config", "--id", "1", "--auth-token-file", &tokens],
        &[],
    );
    assert!(good.status.success(), "{}", stderr(&good));
    let good_tls = baton_node(
        &[
            "--check-config",
            "--id",
            "1",
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
        &[],
    );
    assert!(good_tls.status.success(), "{}", stderr(&good_tls));
}

/// Client flags given to `baton node` on its command line are refused, saying what to use
/// instead; before, they were ignored, and a node given `--auth-token` accepted every client.
/// From the environment (a shell that exported a client's settings) they are no obstacle.
/// A node that cannot start says why on stderr whatever the log filter lets through: with
/// `RUST_LOG=off` (or a filter naming other targets only) the failure was logged nowhere, and
/// the node exited 1 without a word.
#[test]
fn a_node_that_cannot_start_says_why_whatever_the_log_filter() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap();
    for filter in ["off", "baton_node::network=debug", "info"] {
        let output = baton_node(
            &["--id", "1", "--listen", &addr, "--data-dir", data_dir],
            &[("RUST_LOG", filter)],
        );
        assert_eq!(output.status.code(), Some(1), "RUST_LOG={filter}");
        let said = format!("{}{}", stdout(&output), stderr(&output));
        assert!(
            said.contains("cannot listen") || said.contains("in use"),
            "RUST_LOG={filter}: {said}"
        );
    }
}

/// A relative data dir is said to be one, with the directory it resolves to here: started from
/// another working directory (a service manager starts in /), the same settings would name an
/// empty data dir under the node's old id.
#[test]
fn a_relative_data_dir_is_warned_about_with_where_it_resolves() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let cwd = tempfile::tempdir().unwrap();
    let output = Command::new(BATON)
        .current_dir(cwd.path())
        .args([
            "node",
            "--id",
            "1",
            "--listen",
            &addr,
            "--data-dir",
            "rel-data",
        ])
        .env_clear()
        .output()
        .unwrap();
    let said = stderr(&output);
    let resolved = cwd.path().join("rel-data");
    assert!(said.contains("is relative"), "{said}");
    assert!(said.contains(resolved.to_str().unwrap()), "{said}");
}

/// `snapshot inspect` and `snapshot restore` work on files and a data dir only: a client flag
/// given to them is refused rather than ignored (with --endpoints, a restore looked as if it
/// went into the running cluster). Exported ones are no obstacle.
#[test]
fn client_flags_given_to_offline_snapshot_commands_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("none.snapshot");
    let file = file.to_str().unwrap();
    let data_dir = dir.path().join("new");
    let data_dir = data_dir.to_str().unwrap();
    let inspect = vec!["snapshot", "inspect", file];
    let restore = vec![
        "snapshot",
        "restore",
        "--from",
        file,
        "--data-dir",
        data_dir,
        "--id",
        "1",
        "--members",
        "1=127.0.0.1:7001",
    ];
    for command in [&inspect, &restore] {
        for flag in [["--endpoints", "127.0.0.1:7001"], ["--timeout", "5s"]] {
            let output = Command::new(BATON)
                .args(flag)
                .args(command)
                .env_clear()
                .output()
                .unwrap();
            assert_eq!(
                output.status.code(),
                Some(2),
                "{command:?} {flag:?}: {}",
                stderr(&output)
            );
            assert!(
                stderr(&output).contains(&format!("{} does not apply", flag[0])),
                "{command:?} {flag:?}: {}",
                stderr(&output)
            );
        }
        let exported = Command::new(BATON)
            .args(command)
            .env_clear()
            .env("BATON_ENDPOINTS", "127.0.0.1:7001")
            .output()
            .unwrap();
        assert!(
            stderr(&exported).contains("none.snapshot")
                && !stderr(&exported).contains("does not apply"),
            "{command:?}: {}",
            stderr(&exported)
        );
    }
}

/// Addresses that can both be bound are accepted: an IPv4 wildcard and an IPv6 address on one
/// port, and port 0 (picked at start) for the HTTP endpoint beside an advertised gRPC one.
#[test]
fn listen_and_http_that_can_both_be_bound_are_accepted() {
    for extra in [
        ["--listen", "0.0.0.0:7100", "--http", "[::1]:7100"],
        ["--listen", "127.0.0.1:7100", "--http", "127.0.0.1:0"],
    ] {
        let mut args = vec!["--check-config", "--id", "1", "--advertise", "h:7100"];
        args.extend(extra);
        let output = baton_node(&args, &[]);
        assert!(output.status.success(), "{extra:?}: {}", stderr(&output));
    }
}

#[test]
fn client_flags_given_to_a_node_are_refused() {
    for (flags, said) in [
        (
            ["--auth-token", "s3cret"],
            "--auth-token does not apply (a node reads the tokens",
        ),
        (
            ["--endpoints", "127.0.0.1:7001"],
            "--endpoints does not apply",
        ),
        (["--timeout", "5s"], "--timeout does not apply"),
    ] {
        let mut args = vec!["--check-config", "--id", "1"];
        args.extend(flags);
        let refused = baton_node(&args, &[]);
        assert_eq!(
            refused.status.code(),
            Some(2),
            "{flags:?}: {}",
            stderr(&refused)
        );
        assert!(
            stderr(&refused).contains(said),
            "{flags:?}: {}",
            stderr(&refused)
        );
    }
    let exported = baton_node(
        &["--check-config", "--id", "1"],
        &[
            ("BATON_TOKEN", "s3cret"),
            ("BATON_ENDPOINTS", "127.0.0.1:7001"),
        ],
    );
    assert!(exported.status.success(), "{}", stderr(&exported));
}
