//! The process's limit on open files.
//!
//! Every client connection, peer link, store file and snapshot file takes a descriptor. Many
//! systems start a process with a soft limit of 1,024 while allowing far more (the hard limit):
//! a node kept at 1,024 would run out long before its connection cap and then fail to accept its
//! peers or open a snapshot. So a node raises its soft limit to the hard one as it starts, as the
//! Go runtime does for every Go program (etcd's among them), and warns when even that leaves too
//! little room for `limits.max_connections`.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Descriptors left for what is not a client connection: the store's files, peer links in and
/// out, snapshot files, the operator endpoint's connections (at most 128), the runtime's own.
pub const RESERVED: u64 = 1_024;

/// Linux's default `fs.nr_open`, for where it cannot be read.
const DEFAULT_CEILING: u64 = 1 << 20;

/// The most open files the kernel lets a process have (Linux's `fs.nr_open`): no limit, hard or
/// soft, may name more, or the kernel refuses the setting.
fn kernel_ceiling() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(DEFAULT_CEILING)
}

/// Raises the soft limit on open files to the hard limit (both kept within the kernel's
/// ceiling), and returns the soft limit in force afterwards (`None` when it cannot be read).
pub fn raise_limit() -> Option<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    // A hard limit above the ceiling (unlimited, say) could never be used, and naming it would
    // have the setting refused.
    let target = hard.min(kernel_ceiling());
    if soft >= target {
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, target, target) {
        Ok(()) => {
            tracing::debug!(from = soft, to = target, "raised the open-file limit");
            Some(target)
        }
        Err(error) => {
            tracing::debug!(%error, "cannot raise the open-file limit");
            Some(soft)
        }
    }
}

/// Raises the limit as the process starts ([`raise_limit`]; it is the process's, however many
/// nodes it runs) and warns when it leaves too little room for `connections`, the client
/// connections the process's nodes may hold between them (their `limits.max_connections`).
pub fn raise_for(connections: usize) {
    if let Some(warning) = raise_limit().and_then(|limit| shortfall(limit, connections)) {
        tracing::warn!("{warning}");
    }
}

/// What to tell the operator when an open-file `limit` leaves fewer descriptors than
/// `connections` once [`RESERVED`] are set aside; `None` when it leaves enough.
pub fn shortfall(limit: u64, connections: usize) -> Option<String> {
    let room = limit.saturating_sub(RESERVED);
    (room < connections as u64).then(|| {
        format!(
            "the open-file limit is {limit}: with {RESERVED} kept for the store, peers and \
             snapshots, it leaves room for {room} client connections, fewer than the \
             {connections} limits.max_connections allows; a node out of descriptors cannot \
             accept its peers: raise the limit (LimitNOFILE= under systemd, ulimit -n) or lower \
             limits.max_connections"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_raised_as_far_as_allowed_and_reported() {
        let (before, hard_before) = getrlimit(Resource::RLIMIT_NOFILE).expect("readable");
        let raised = raise_limit().expect("the limit can be read");
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("readable");
        assert_eq!(raised, soft, "reports the limit in force");
        assert!(soft >= before, "lowered from {before} to {soft}");
        assert!(soft <= hard, "soft {soft} above hard {hard}");
        // An unprivileged process may raise its soft limit to its hard one, within the
        // kernel's ceiling.
        if cfg!(target_os = "linux") {
            assert_eq!(soft, before.max(hard_before.min(kernel_ceiling())));
        }
    }

    #[test]
    fn a_shortfall_is_reported_only_below_the_connections_plus_the_reserve() {
        assert!(shortfall(1_024, 4_096).is_some_and(|w| w.contains("room for 0 client")));
        assert!(shortfall(5_119, 4_096).is_some());
        assert!(shortfall(5_120, 4_096).is_none());
        assert!(shortfall(65_536, 4_096).is_none());
    }
}
