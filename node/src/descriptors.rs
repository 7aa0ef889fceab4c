//! The process's limit on open files.
//!
//! Every client connection, peer link, store file and snapshot file takes a descriptor. Many
//! systems start a process with a soft limit of 1,024 while allowing far more (the hard limit):
//! a node kept at 1,024 would run out long before its connection cap and then fail to accept its
//! peers or open a snapshot. So a node raises its soft limit to the hard one as it starts, as the
//! Go runtime does for every Go program (etcd's among them), and warns when even that leaves too
//! little room for `limits.max_connections`.

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};

/// Descriptors left for what is not a client connection: the store's files, peer links in and
/// out, snapshot files, the operator endpoint's connections (at most 128), the runtime's own.
pub const RESERVED: u64 = 1_024;

/// The most a soft limit is raised to when the hard limit is unlimited (Linux's default cap on
/// open files per process, `fs.nr_open`).
const CEILING: u64 = 1 << 20;

/// Raises the soft limit on open files to the hard limit, and returns the soft limit in force
/// afterwards (`None` when it cannot be read).
pub fn raise_limit() -> Option<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let target = if hard == RLIM_INFINITY { CEILING } else { hard };
    // A kernel may allow less than the hard limit says (an unlimited one, or `fs.nr_open`
    // lowered): each refusal halves the ask.
    let mut ask = target;
    while soft != RLIM_INFINITY && soft < ask {
        match setrlimit(Resource::RLIMIT_NOFILE, ask, hard) {
            Ok(()) => {
                tracing::debug!(from = soft, to = ask, "raised the open-file limit");
                return Some(ask);
            }
            Err(error) => {
                tracing::debug!(%error, ask, "cannot raise the open-file limit that far");
                ask /= 2;
            }
        }
    }
    Some(soft)
}

/// What to tell the operator when an open-file `limit` leaves fewer descriptors than
/// `max_connections` once [`RESERVED`] are set aside; `None` when it leaves enough.
pub fn shortfall(limit: u64, max_connections: usize) -> Option<String> {
    let room = limit.saturating_sub(RESERVED);
    (room < max_connections as u64).then(|| {
        format!(
            "the open-file limit is {limit}: with {RESERVED} kept for the store, peers and \
             snapshots, it leaves room for {room} client connections, fewer than \
             limits.max_connections ({max_connections}); a node out of descriptors cannot \
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
        let (before, _) = getrlimit(Resource::RLIMIT_NOFILE).expect("the limit can be read");
        let raised = raise_limit().expect("the limit can be read");
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("the limit can be read");
        assert_eq!(raised, soft, "reports the limit in force");
        assert!(soft >= before, "lowered from {before} to {soft}");
        assert!(soft <= hard, "soft {soft} above hard {hard}");
        // On Linux an unprivileged process may raise its soft limit to its hard one, up to
        // `fs.nr_open` (2^20 by default).
        if cfg!(target_os = "linux") && hard != RLIM_INFINITY && hard <= CEILING {
            assert_eq!(soft, hard, "soft limit not raised to the hard one");
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
