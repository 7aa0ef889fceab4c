//! The process's async runtime, sized so that a node's log sync never stalls the whole process.
//!
//! A node syncs its Raft log on the task that appends to it, blocking that task's worker thread
//! for one sled flush and one `fdatasync` (`baton_node::store`, the log module). The Raft core
//! waits for that sync anyway, but the rest of the node must not: client requests, reads, health
//! checks and, in `baton dev`, the other two nodes. So a process that runs nodes gets at least one
//! worker per node plus one, whatever its core count. A worker blocked in `fdatasync` uses no CPU,
//! so on a one-core host the extra worker costs nothing while the disk works.

use std::io;
use std::num::NonZeroUsize;

use tokio::runtime::{Builder, Runtime};

/// Builds a multi-threaded runtime for a process running `nodes` Baton nodes (0 for a client
/// command). `TOKIO_WORKER_THREADS`, when set, is obeyed as tokio documents it.
pub fn build(nodes: usize) -> io::Result<Runtime> {
    let mut builder = Builder::new_multi_thread();
    builder.enable_all();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        builder.worker_threads(worker_threads(cores, nodes));
    }
    builder.build()
}

/// One worker per core, and never fewer than one per node plus one.
fn worker_threads(cores: usize, nodes: usize) -> usize {
    if nodes == 0 {
        cores.max(1)
    } else {
        cores.max(nodes + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::worker_threads;

    #[test]
    fn a_node_on_one_core_keeps_a_worker_free_while_it_syncs() {
        assert_eq!(worker_threads(1, 1), 2);
        assert_eq!(worker_threads(1, 0), 1, "client commands need no spare");
    }

    #[test]
    fn the_dev_cluster_gets_a_worker_per_node_plus_one() {
        assert_eq!(worker_threads(2, 3), 4);
        assert_eq!(
            worker_threads(16, 3),
            16,
            "more cores than nodes: one worker per core"
        );
    }

    #[test]
    fn one_node_on_many_cores_uses_them_all() {
        assert_eq!(worker_threads(2, 1), 2);
        assert_eq!(worker_threads(8, 1), 8);
    }
}
