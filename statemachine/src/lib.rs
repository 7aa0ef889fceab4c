//! Baton's coordination state machine: pure, deterministic, and small.
//!
//! Every mutating call a client makes (offer, take, reply, cancel, ...) becomes exactly one
//! [`Envelope`] in the Raft log, and every replica runs [`apply`] on it. `apply` depends only on
//! the [`State`] and the envelope: the leader decides everything nondeterministic (wall clock and
//! randomness) once, in the envelope's [`Stamp`], before the entry is proposed. That is why all
//! replicas agree on every token, generation and deadline without talking to each other, and why
//! atomicity comes from consensus rather than from row locks.
//!
//! This crate does no I/O, reads no clock and draws no randomness; the node crate is its runtime.
#![deny(missing_docs)]

pub mod board;
mod change;
pub mod checkpoint;
mod command;
pub mod effect;
mod error;
pub mod handoff;
pub mod limits;
pub mod queue;
pub mod rules;
mod session;
pub mod sink;
mod state;
pub mod sweep;
mod time;
mod validate;

pub use change::{Change, ChangeFilter, ChangeKind, ChangeValue, Permit, Primitive};
pub use command::{Command, Envelope, Origin, Reply, Response, Stamp};
pub use error::Refusal;
pub use session::{
    SessionLookup, Sessions, MAX_CLIENTS, MAX_REPLIES_PER_CLIENT, SESSION_IDLE_TTL_MS,
    SESSION_RETRY_WINDOW_MS,
};
pub use state::{apply, apply_with_changes, State, MAX_FENCE_RAISE};
pub use time::{deadline_after, is_overdue};
pub use validate::read_key;
