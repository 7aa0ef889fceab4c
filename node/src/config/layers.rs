//! Layering: defaults, then the TOML file, then `BATON_*` environment variables, then flags —
//! each later layer overriding single keys of the earlier ones.
//!
//! The layers are merged as TOML tables before anything is typed, so one deserialization judges
//! the result and an error names the key and the layer that set it. The environment variable of
//! a key follows from its name (section and key joined by `_`, upper-case, after `BATON_`), so a
//! new key or section needs no mapping code.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::settings::Settings;
use super::NodeConfig;
use crate::auth::Tokens;
use crate::security::Security;

/// Prefix of every configuration environment variable.
const ENV_PREFIX: &str = "BATON_";

/// Sections whose keys are chosen by the operator (node ids), not fixed names.
const MAP_SECTIONS: &[&str] = &["peer_addrs"];

/// Environment variables that set `log.filter` when `BATON_LOG_FILTER` does not, weakest first.
const FILTER_ALIASES: &[&str] = &["RUST_LOG", "BATON_LOG"];

/// `BATON_*` variables that belong to the client commands or the tests, not to a node's
/// configuration: they are neither applied nor reported as ignored.
const NOT_CONFIG: &[&str] = &[
    "BATON_ENDPOINTS",
    "BATON_LOG",
    "BATON_BIN",
    // The token client commands present (a node's own are `auth.token_file`).
    "BATON_TOKEN",
    // What the test suite must not skip (.ci/run); nodes it starts inherit them.
    "BATON_REQUIRE_DOCKER",
    "BATON_REQUIRE_FUSE",
    "BATON_REQUIRE_FAKETIME",
];

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The configuration file.
    File(PathBuf),
    /// An environment variable.
    Env(String),
    /// A command-line flag.
    Flag(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(path) => write!(f, "file {}", path.display()),
            Origin::Env(name) => write!(f, "environment variable {name}"),
            Origin::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// One value given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// The key it sets, as the file spells it (`raft.heartbeat`).
    pub key: String,
    /// Its text, read the way an environment variable's is.
    pub value: String,
    /// The flag that gave it, for messages (`--heartbeat`).
    pub flag: String,
}

/// A configuration that passed every check.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The effective settings, in the file's shape.
    pub settings: Settings,
    /// The node configuration they describe.
    pub node: NodeConfig,
    /// Keys set by the environment or by flags, and by which.
    pub overridden: BTreeMap<String, Origin>,
    /// `BATON_*` environment variables that name no key (likely typos).
    pub ignored_env: Vec<String>,
    /// The configuration file, if one was read.
    pub file: Option<PathBuf>,
}

impl Loaded {
    /// Where `key`'s value came from: the layer that overrode it, else the file (if any).
    pub fn origin(&self, key: &str) -> Option<Origin> {
        origin_of(&self.overridden, self.file.as_deref(), key)
    }

    /// The node's TLS and token settings with their files read, so that a missing file or a bad
    /// token file is reported against its key (by `--check-config` as well as at start).
    pub fn security(&self) -> Result<Security, ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            key: key.to_string(),
            origin: self.origin(key),
            message,
        };
        let tls = self
            .settings
            .tls_files()
            .map_err(|e| invalid(&e.key, e.reason))?;
        if let Some(files) = &tls {
            for (key, path) in [
                ("tls.ca", &files.ca),
                ("tls.cert", &files.cert),
                ("tls.key", &files.key),
            ] {
                std::fs::read(path)
                    .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))?;
            }
            // Parsed as the node will at start, so a file that is not what it should be fails
            // the check too, not only the start.
            crate::tls::NodeTls::load(files).map_err(|e| invalid("tls", format!("{e:#}")))?;
        }
        let tokens = match &self.settings.auth.token_file {
            None => None,
            Some(path) => {
                Some(Tokens::load(path).map_err(|e| invalid("auth.token_file", format!("{e:#}")))?)
            }
        };
        Ok(Security { tls, tokens })
    }
}

/// Why a configuration cannot be used. Every variant names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's explanation, with the line.
        message: String,
    },
    /// A flag named a key that does not exist.
    #[error("unknown config key `{key}` (from {origin}); `baton node --print-default-config` lists them all")]
    UnknownKey {
        /// The key as given.
        key: String,
        /// Which flag gave it.
        origin: Origin,
    },
    /// A key's value cannot be used.
    #[error("config key `{key}`{}: {message}", origin.as_ref().map(|o| format!(" (from {o})")).unwrap_or_default())]
    Invalid {
        /// The key, e.g. `raft.heartbeat`.
        key: String,
        /// The layer that set it, when known.
        origin: Option<Origin>,
        /// What is wrong.
        message: String,
    },
}

/// Loads a node's configuration: the defaults, overridden by `file` (if any), by the `BATON_*`
/// variables among `env`, and by `flags`, in that order.
pub fn load(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    flags: &[Override],
) -> Result<Loaded, ConfigError> {
    let keys = Keys::of_settings();
    let mut table = match file {
        Some(path) => read_file(path)?,
        None => toml::Table::new(),
    };

    let (from_env, ignored_env) = env_overrides(&keys, env);
    let mut overridden = BTreeMap::new();
    for (key, value, origin) in from_env {
        set(&mut table, &key, keys.typed(&key, &value));
        overridden.insert(key, origin);
    }
    for flag in flags {
        let origin = Origin::Flag(flag.flag.clone());
        if !keys.contains(&flag.key) {
            return Err(ConfigError::UnknownKey {
                key: flag.key.clone(),
                origin,
            });
        }
        set(&mut table, &flag.key, keys.typed(&flag.key, &flag.value));
        overridden.insert(flag.key.clone(), origin);
    }

    let origin_of = |key: &str| origin_of(&overridden, file, key);
    let settings: Settings =
        serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Invalid {
                origin: origin_of(&key),
                message: e.into_inner().message().to_string(),
                key,
            }
        })?;
    let node = settings
        .to_node_config()
        .map_err(|invalid| ConfigError::Invalid {
            origin: origin_of(&invalid.key),
            key: invalid.key,
            message: invalid.reason,
        })?;
    Ok(Loaded {
        settings,
        node,
        overridden,
        ignored_env,
        file: file.map(Path::to_path_buf),
    })
}

/// Where `key`'s value came from: the layer that overrode it, else the file (if any). For a whole
/// section (`tls`, judged as a set), the layer that overrode one of its keys, if any did.
fn origin_of(
    overridden: &BTreeMap<String, Origin>,
    file: Option<&Path>,
    key: &str,
) -> Option<Origin> {
    let section = format!("{key}.");
    overridden
        .get(key)
        .or_else(|| {
            overridden
                .iter()
                .find(|(name, _)| name.starts_with(&section))
                .map(|(_, origin)| origin)
        })
        .cloned()
        .or_else(|| file.map(|path| Origin::File(path.to_path_buf())))
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.parse::<toml::Table>()
        .map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })
}

/// The values the environment sets, weakest first, and the `BATON_*` names that set nothing.
fn env_overrides(
    keys: &Keys,
    env: impl IntoIterator<Item = (String, String)>,
) -> (Vec<(String, String, Origin)>, Vec<String>) {
    let env: BTreeMap<String, String> = env.into_iter().collect();
    let mut values = Vec::new();
    for alias in FILTER_ALIASES {
        if let Some(value) = env.get(*alias) {
            values.push((
                "log.filter".to_string(),
                value.clone(),
                Origin::Env(alias.to_string()),
            ));
        }
    }
    let mut ignored = Vec::new();
    for (name, value) in &env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        match keys.for_env(rest) {
            Some(key) => values.push((key, value.clone(), Origin::Env(name.clone()))),
            None if NOT_CONFIG.contains(&name.as_str()) => {}
            None => ignored.push(name.clone()),
        }
    }
    (values, ignored)
}

/// Sets `key` (dotted) in `table`, creating its section when needed.
fn set(table: &mut toml::Table, key: &str, value: toml::Value) {
    match key.split_once('.') {
        None => {
            table.insert(key.to_string(), value);
        }
        Some((section, rest)) => {
            let entry = table
                .entry(section.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(inner) = entry {
                set(inner, rest, value);
            }
        }
    }
}

/// Every key of [`Settings`] with a sample of its TOML type.
struct Keys {
    samples: BTreeMap<String, toml::Value>,
}

impl Keys {
    fn of_settings() -> Self {
        let mut samples = BTreeMap::new();
        // Serializing settings that give every optional key lists every key.
        let every = toml::Table::try_from(Settings::with_every_key()).unwrap_or_default();
        for (name, value) in every {
            match value {
                toml::Value::Table(section) if !MAP_SECTIONS.contains(&name.as_str()) => {
                    for (inner, sample) in section {
                        samples.insert(format!("{name}.{inner}"), sample);
                    }
                }
                toml::Value::Table(_) => {}
                sample => {
                    samples.insert(name, sample);
                }
            }
        }
        Self { samples }
    }

    fn contains(&self, key: &str) -> bool {
        self.samples.contains_key(key) || map_entry(key).is_some()
    }

    /// The key an environment variable (without `BATON_`) sets, if any.
    fn for_env(&self, name: &str) -> Option<String> {
        if let Some(key) = self.samples.keys().find(|key| env_name(key) == name) {
            return Some(key.clone());
        }
        MAP_SECTIONS.iter().find_map(|section| {
            let rest = name.strip_prefix(&format!("{}_", section.to_uppercase()))?;
            (!rest.is_empty()).then(|| format!("{section}.{}", rest.to_lowercase()))
        })
    }

    /// `raw` as a value of the key's type: a number where the key holds a number, and so on.
    /// Text that does not fit stays text, so deserialization reports it against the key.
    fn typed(&self, key: &str, raw: &str) -> toml::Value {
        let text = || toml::Value::String(raw.to_string());
        match self.samples.get(key) {
            Some(toml::Value::Integer(_)) => raw
                .trim()
                .replace('_', "")
                .parse()
                .map(toml::Value::Integer)
                .unwrap_or_else(|_| text()),
            Some(toml::Value::Boolean(_)) => raw
                .trim()
                .parse()
                .map(toml::Value::Boolean)
                .unwrap_or_else(|_| text()),
            Some(toml::Value::Float(_)) => raw
                .trim()
                .parse()
                .map(toml::Value::Float)
                .unwrap_or_else(|_| text()),
            _ => text(),
        }
    }
}

/// `(section, entry)` when `key` is an entry of a map section.
fn map_entry(key: &str) -> Option<(&str, &str)> {
    let (section, entry) = key.split_once('.')?;
    (MAP_SECTIONS.contains(&section) && !entry.is_empty()).then_some((section, entry))
}

/// A key's environment variable without the `BATON_` prefix: `raft.heartbeat` ->
/// `RAFT_HEARTBEAT`.
fn env_name(key: &str) -> String {
    key.replace('.', "_").to_uppercase()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn flag(key: &str, value: &str) -> Override {
        Override {
            key: key.into(),
            value: value.into(),
            flag: format!("--{key}"),
        }
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), text).expect("write");
        file
    }

    #[test]
    fn flags_beat_env_beat_file_beat_defaults() {
        let f = file(
            "id = 1\n[raft]\nheartbeat = \"10ms\"\nelection_timeout = \"1s\"\nsnapshot_every = 7\n",
        );
        let loaded = load(
            Some(f.path()),
            env(&[
                ("BATON_RAFT_HEARTBEAT", "20ms"),
                ("BATON_RAFT_SNAPSHOT_EVERY", "8"),
            ]),
            &[flag("raft.heartbeat", "30ms")],
        )
        .expect("valid");
        let raft = &loaded.settings.raft;
        assert_eq!(raft.heartbeat, Duration::from_millis(30), "flag wins");
        assert_eq!(raft.snapshot_every, 8, "env beats the file");
        assert_eq!(
            raft.election_timeout,
            Duration::from_secs(1),
            "file beats defaults"
        );
        assert_eq!(raft.keep_logs, 1_000, "default");
        assert_eq!(
            loaded.overridden.get("raft.heartbeat"),
            Some(&Origin::Flag("--raft.heartbeat".into()))
        );
    }

    #[test]
    fn every_key_has_a_distinct_environment_variable() {
        let keys = Keys::of_settings();
        let mut seen = BTreeMap::new();
        for key in keys.samples.keys() {
            if let Some(other) = seen.insert(env_name(key), key) {
                panic!("{key} and {other} share BATON_{}", env_name(key));
            }
            assert_eq!(keys.for_env(&env_name(key)).as_deref(), Some(key.as_str()));
        }
        assert!(seen.len() > 20, "keys found: {seen:?}");
    }

    #[test]
    fn env_sets_top_level_keys_map_entries_and_the_log_filter() {
        let loaded = load(
            None,
            env(&[
                ("BATON_ID", "4"),
                ("BATON_LISTEN", "127.0.0.1:9999"),
                ("BATON_DATA_DIR", "123"),
                ("BATON_PEER_ADDRS_2", "10.0.0.7:7001"),
                ("RUST_LOG", "debug"),
                ("BATON_LOG", "trace"),
                ("BATON_ENDPOINTS", "a:1"),
                ("BATON_RAFT_HEARTBEET", "1ms"),
                ("HOME", "/root"),
            ]),
            &[],
        )
        .expect("valid");
        assert_eq!(loaded.node.id, 4);
        assert_eq!(loaded.node.listen.port(), 9999);
        assert_eq!(
            loaded.node.data_dir,
            PathBuf::from("123"),
            "text keys stay text"
        );
        assert_eq!(
            loaded.node.peer_addrs.get(&2).map(String::as_str),
            Some("10.0.0.7:7001")
        );
        assert_eq!(
            loaded.settings.log.filter, "trace",
            "BATON_LOG beats RUST_LOG"
        );
        assert_eq!(loaded.ignored_env, vec!["BATON_RAFT_HEARTBEET".to_string()]);
    }

    #[test]
    fn errors_name_the_key_and_where_it_came_from() {
        let bad_env = load(
            None,
            env(&[("BATON_ID", "1"), ("BATON_RAFT_HEARTBEAT", "soon")]),
            &[],
        )
        .expect_err("bad duration");
        let text = bad_env.to_string();
        assert!(
            text.contains("raft.heartbeat") && text.contains("BATON_RAFT_HEARTBEAT"),
            "{text}"
        );

        let f = file("id = 1\n[raft]\nhearbeat = \"10ms\"\n");
        let text = load(Some(f.path()), env(&[]), &[])
            .expect_err("unknown key")
            .to_string();
        assert!(text.contains("hearbeat") && text.contains("raft"), "{text}");

        let text = load(None, env(&[("BATON_ID", "1")]), &[flag("raft.nope", "1")])
            .expect_err("unknown flag key")
            .to_string();
        assert!(text.contains("raft.nope"), "{text}");

        let text = load(None, env(&[("BATON_ID", "x")]), &[])
            .expect_err("id is a number")
            .to_string();
        assert!(text.contains("`id`") && text.contains("BATON_ID"), "{text}");

        let f = file("id = [\n");
        assert!(matches!(
            load(Some(f.path()), env(&[]), &[]),
            Err(ConfigError::Syntax { .. })
        ));
    }

    #[test]
    fn validation_errors_name_the_layer_that_set_the_key() {
        let text = load(
            None,
            env(&[("BATON_ID", "1"), ("BATON_LIMITS_MAX_IN_FLIGHT", "0")]),
            &[],
        )
        .expect_err("zero")
        .to_string();
        assert!(
            text.contains("limits.max_in_flight") && text.contains("BATON_LIMITS_MAX_IN_FLIGHT"),
            "{text}"
        );
    }
}
