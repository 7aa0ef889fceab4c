//! Baton's wire protocol and client library.
//!
//! - [`proto`]: the generated gRPC messages and services of the client API.
//! - [`convert`]: protobuf <-> state-machine types.
//! - [`batch`]: the calls that may travel together in one `Batch.Call`.
//! - [`error`]: the one place where codes map to gRPC statuses and back.
//! - [`Client`]: leader discovery, redirects, retries with the same `(client_id, seq)`, typed
//!   errors, and [`Client::watch`]: every committed change matching a filter, in commit order,
//!   resumed across node failures without a gap or a duplicate.
//! - [`judge`]: the contract's judges driven against a live store.
//! - [`worker`]: the task-queue worker runtime (long-poll leasing, start-before-run, renewals,
//!   protocol checks, graceful draining).
#![deny(missing_docs)]

pub mod batch;
mod client;
pub mod convert;
pub mod error;
pub mod judge;
pub mod replicas;
pub mod worker;

pub use client::{
    AttemptHistory, Client, ClientConfig, ClientTls, Event, QueueTaskPage, SavedSnapshot, Security,
    TaskSnapshot, TicketSnapshot, Watch, WatchPosition, CLUSTER_ID_HEADER, HANDOVER_WAIT,
    MAX_LEASE_WAIT, WATCH_SILENCE,
};
pub use error::Error;

/// Generated protobuf and gRPC code.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("baton.v1");

    /// The encoded descriptors of every Baton service and message, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("baton_descriptor");
}
