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
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
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
        (vec![], vec![], "`id`"),
        (
            vec!["--id", "1", "--set", "raft.nope=1"],
            vec![],
            "raft.nope",
        ),
    ];
    for (args, env, named) in cases {
        let mut full = vec!["--check-config"];
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
            "{args:?}: {}",
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
