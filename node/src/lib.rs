//! The Baton server: openraft wired to sled storage and tonic gRPC, the client-facing services,
//! leader stamping and sweeps, configuration and the `baton` command line.

pub mod admission;
pub mod auth;
pub mod codec;
pub mod config;
pub mod deposed;
pub mod durable_file;
pub mod handover;
pub mod health;
pub mod history;
pub mod http;
pub mod limits;
pub mod metered;
pub mod metrics;
pub mod network;
pub mod newer_log_stands;
pub mod node;
pub mod pre_vote;
pub mod proposer;
pub mod raft_server;
pub mod raft_wire;
pub mod read_index;
pub mod readiness;
pub mod security;
pub mod server;
pub mod service;
pub mod shutdown;
pub mod snapshot_file;
pub mod snapshot_schedule;
pub mod stalled_leader;
pub mod stamp;
pub mod store;
pub mod sweeper;
pub mod systemd;
pub mod tls;
pub mod types;
