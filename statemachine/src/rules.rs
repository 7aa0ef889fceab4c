//! Versioned apply rules: how a cluster moves to what a newer build does when it applies a
//! command, without two replicas ever applying one entry two ways.
//!
//! Every replica must derive the same state from the same log, on every replay too. A build that
//! changes what a command does when applied (a new bound, a refusal judged in another order, a
//! command older builds cannot read) would break that in a node-by-node upgrade: the new nodes
//! and the old ones would apply the same entry differently, and a new node replaying entries an
//! old leader wrote would apply them as their writer did not. So the rules in force are part of
//! the state ([`crate::State::rules`]) and change only through a log entry,
//! [`crate::Command::AdoptRules`], which the leader proposes once every member runs a build that
//! applies them. Every entry before it is applied, everywhere and at every replay, under the rules
//! before it; every entry after it under the new ones. Rule changes branch on
//! [`crate::State::rules`], never on [`RULES`].
//!
//! The versions:
//!
//! - **0**: every build from before the rules were versioned.
//! - **1**: a sweep forgets at most [`IDLE_SESSIONS_PER_SWEEP`] idle client sessions (under 0,
//!   every idle session at once: up to 200,000 sessions and 256 MiB of stored answers freed in
//!   one apply, on every replica); a fenced-sink resource name may be up to
//!   [`crate::limits::MAX_RESOURCE_BYTES`] long (under 0, a key's 512 bytes: a queue's namespace
//!   and a long concurrency key, fenced as `"{namespace}/{key}"`, did not fit).

/// The newest rules this build applies.
pub const RULES: u32 = 1;

/// The most idle client sessions one sweep forgets, from rules 1 on. The leader sweeps again at
/// once while more are idle, so a table of idle sessions is forgotten in bounded steps.
pub const IDLE_SESSIONS_PER_SWEEP: usize = 10_000;

/// Whether this build applies `rules`; when it does not, why, in words for an operator: a node
/// stops rather than apply commands by rules it does not know, and says so to a leader asking.
pub fn known(rules: u32) -> Result<(), String> {
    if rules <= RULES {
        Ok(())
    } else {
        Err(format!(
            "this build applies rules up to {RULES}, not {rules}: run a newer build"
        ))
    }
}
