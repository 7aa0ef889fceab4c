//! openraft's type configuration for Baton: a batch of client commands is the log payload, their
//! responses in the same order are what `client_write` returns.

use std::io::Cursor;

use baton_statemachine::{Envelope, Response};
use serde::{Deserialize, Serialize};

/// One log entry's payload: client commands the leader gathered while earlier entries were being
/// replicated (see [`crate::proposer`]). Each is applied on its own, in order, exactly as if it had
/// been an entry by itself; batching only shares the entry's fsyncs, replication round and apply
/// call among them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch(pub Vec<Envelope>);

/// The responses to a [`Batch`], one per command, in the batch's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Responses(pub Vec<Response>);

openraft::declare_raft_types!(
    /// Baton's Raft type configuration.
    pub TypeConfig:
        D = Batch,
        R = Responses,
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
