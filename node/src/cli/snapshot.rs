//! `baton snapshot save|inspect|restore`: backups and disaster recovery.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use baton_node::snapshot_file::{
    self, SavedMember, SnapshotFile, SnapshotHeader, FILE_FORMAT, STATE_FORMAT,
};
use baton_rpc::Client;
use clap::Subcommand;

use super::exit;

/// `baton snapshot ...`
#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Save the cluster's state at a linearizable point to FILE (written atomically, with a
    /// header and a SHA-256 checksum).
    Save {
        /// Where to write the snapshot.
        file: PathBuf,
    },
    /// Verify a snapshot file and print its header.
    Inspect {
        /// The snapshot file.
        file: PathBuf,
    },
    /// Seed a NEW node's data dir from a snapshot file (disaster recovery): run it once per
    /// member of the new cluster, with the same --members, then start the nodes; they elect a
    /// leader by themselves (no `cluster init`).
    Restore {
        /// The snapshot file (verified before anything is written).
        #[arg(long)]
        from: PathBuf,
        /// The new node's data dir; it must not exist or be empty.
        #[arg(long)]
        data_dir: PathBuf,
        /// The new node's id (one of --members).
        #[arg(long)]
        id: u64,
        /// Every member of the new cluster (all voters), e.g.
        /// `1=10.0.0.1:7001,2=10.0.0.2:7001,3=10.0.0.3:7001`.
        #[arg(long, value_delimiter = ',', value_name = "ID=ADDR", value_parser = super::parse_peer_addr, required = true)]
        members: Vec<(u64, String)>,
        /// Raise every fence, ticket generation and permit token by N (at most 2^40), so that
        /// none the old cluster handed out after the save is handed out again. Give every member
        /// the same N (the default does); 0 keeps the saved counters.
        #[arg(long, value_name = "N", default_value_t = snapshot_file::RESTORE_FENCE_RAISE,
              value_parser = clap::value_parser!(u64).range(0..=baton_statemachine::MAX_FENCE_RAISE))]
        raise_fences: u64,
    },
}

/// Commands that need no cluster: run before a client connects.
pub async fn run_offline(command: &SnapshotCommand) -> Option<u8> {
    match command {
        // Found out before the whole state is downloaded, not after.
        SnapshotCommand::Save { file } => writable(file).err(),
        SnapshotCommand::Inspect { file } => Some(inspect(file)),
        SnapshotCommand::Restore {
            from,
            data_dir,
            id,
            members,
            raise_fences,
        } => Some(restore(from, data_dir, *id, members, *raise_fences).await),
    }
}

/// Whether `file` can be written where it is (its directory takes a new file: the save writes
/// a temporary file beside it and renames it); the exit code to stop with when it cannot.
fn writable(file: &std::path::Path) -> Result<(), u8> {
    // Known before the download, not at the rename after it.
    if file.is_dir() || file.as_os_str().to_string_lossy().ends_with('/') {
        eprintln!(
            "baton: {} is a directory: name the file to save to; nothing was saved",
            file.display()
        );
        return Err(exit::USAGE);
    }
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    tempfile::NamedTempFile::new_in(dir)
        .map(drop)
        .map_err(|error| {
            eprintln!(
                "baton: cannot write {} ({error}); nothing was saved",
                file.display()
            );
            exit::FAILURE
        })
}

/// `snapshot save`, through a connected client.
pub async fn run(command: SnapshotCommand, client: &Client) -> u8 {
    let SnapshotCommand::Save { file } = command else {
        return exit::USAGE;
    };
    let saved = match client.save_snapshot().await {
        Ok(saved) => saved,
        Err(error) => return exit::report(&error),
    };
    let meta = saved.meta;
    if meta.state_format != STATE_FORMAT {
        eprintln!(
            "baton: the leader sent state format {}, this baton writes format {STATE_FORMAT}; \
             use a baton of the cluster's version",
            meta.state_format
        );
        return exit::FAILURE;
    }
    let snapshot = SnapshotFile {
        header: SnapshotHeader {
            format: FILE_FORMAT,
            state_format: meta.state_format,
            baton_version: env!("CARGO_PKG_VERSION").to_string(),
            last_log_index: meta.last_log_index,
            last_log_term: meta.last_log_term,
            last_log_leader: meta.last_log_leader,
            members: meta
                .members
                .iter()
                .map(|m| SavedMember {
                    id: m.id,
                    addr: m.addr.clone(),
                    voter: m.voter,
                })
                .collect(),
            served_by: meta.served_by,
            saved_at_ms: meta.served_at_ms,
            state_bytes: meta.state_bytes,
        },
        state: saved.state,
    };
    match snapshot.write(&file) {
        Ok(()) => {
            out!(
                "saved snapshot at index {} (term {}), {} bytes of state, to {}",
                meta.last_log_index,
                meta.last_log_term,
                meta.state_bytes,
                file.display()
            );
            exit::OK
        }
        Err(error) => {
            eprintln!("baton: {error:#}");
            exit::FAILURE
        }
    }
}

fn inspect(file: &std::path::Path) -> u8 {
    match SnapshotFile::read_decoded(file) {
        Ok((snapshot, state)) => {
            let h = &snapshot.header;
            out!(
                "file: {} (format {}, checksum ok)",
                file.display(),
                h.format
            );
            out!(
                "last log: index {} term {} (leader {})",
                h.last_log_index,
                h.last_log_term,
                h.last_log_leader
            );
            out!("state: {} bytes, format {}", h.state_bytes, h.state_format);
            out!("apply rules: {}", state.rules);
            out!(
                "saved: {} by node {} (baton {})",
                super::rfc3339(h.saved_at_ms),
                h.served_by,
                h.baton_version
            );
            let members: Vec<String> = h
                .members
                .iter()
                .map(|m| {
                    let role = if m.voter { "voter" } else { "learner" };
                    format!("{}={} ({role})", m.id, m.addr)
                })
                .collect();
            out!("source members: {}", members.join(", "));
            exit::OK
        }
        Err(error) => {
            eprintln!("baton: {error:#}");
            exit::FAILURE
        }
    }
}

async fn restore(
    from: &std::path::Path,
    data_dir: &std::path::Path,
    id: u64,
    members: &[(u64, String)],
    raise_fences: u64,
) -> u8 {
    let members = match new_members(id, members) {
        Ok(members) => members,
        Err(why) => {
            eprintln!("baton snapshot restore: {why}");
            return exit::USAGE;
        }
    };
    let snapshot = match SnapshotFile::read(from) {
        Ok(snapshot) => snapshot,
        Err(error) => {
            eprintln!("baton: {error:#}");
            return exit::FAILURE;
        }
    };
    match snapshot_file::restore(&snapshot, data_dir, id, &members, raise_fences).await {
        Ok(fingerprint) => {
            out!(
                "restored node {id} in {} from index {} (term {}); members {}; fences raised by \
                 {raise_fences}; fingerprint {fingerprint} (every member must show the same)",
                data_dir.display(),
                snapshot.header.last_log_index,
                snapshot.header.last_log_term,
                members
                    .iter()
                    .map(|(id, addr)| format!("{id}={addr}"))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            if raise_fences == 0 {
                eprintln!(
                    "baton: fences were not raised: any the old cluster handed out after the save \
                     will be handed out again"
                );
            }
            exit::OK
        }
        Err(error) => {
            eprintln!("baton: {error:#}");
            exit::FAILURE
        }
    }
}

/// The new cluster's members as given, refused when they cannot be what was meant: an id or an
/// address named twice (one of the two would be dropped, and the nodes restored with different
/// lists would disagree on who is a member), or `--id` not among them.
fn new_members(id: u64, given: &[(u64, String)]) -> Result<BTreeMap<u64, String>, String> {
    let mut members = BTreeMap::new();
    let mut addrs = BTreeSet::new();
    for (member, addr) in given {
        if !addrs.insert(addr) {
            return Err(format!("--members names the address {addr} twice"));
        }
        if members.insert(*member, addr.clone()).is_some() {
            return Err(format!("--members names id {member} twice"));
        }
    }
    if !members.contains_key(&id) {
        return Err(format!("--id {id} is not one of --members"));
    }
    Ok(members)
}
