//! openraft's type configuration for Baton: our envelope is the log payload, our response is
//! what `client_write` returns.

use std::io::Cursor;

use baton_statemachine::{Envelope, Response};

openraft::declare_raft_types!(
    /// Baton's Raft type configuration.
    pub TypeConfig:
        D = Envelope,
        R = Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A node's identity in the cluster.
pub type NodeId = u64;
/// A Raft instance of Baton.
pub type Raft = openraft::Raft<TypeConfig>;
/// A log identifier.
pub type LogId = openraft::LogId<NodeId>;
/// A storage error.
pub type StorageError = openraft::StorageError<NodeId>;
