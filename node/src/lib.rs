//! The Baton server: openraft wired to sled storage and tonic gRPC, the client-facing services,
//! leader stamping and sweeps, configuration and the `baton` command line.

pub mod codec;
pub mod config;
pub mod history;
pub mod network;
pub mod node;
pub mod proposer;
pub mod read_index;
pub mod server;
pub mod service;
pub mod stamp;
pub mod store;
pub mod types;
