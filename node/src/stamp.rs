//! Leader stamping: the wall clock and randomness a command carries into the log.
//!
//! Called on the node that proposes, right before `client_write`. If that node is not the leader
//! the proposal is refused and the stamp discarded, so every stamp in the log was drawn by the
//! leader that appended it.

use std::time::{SystemTime, UNIX_EPOCH};

use baton_statemachine::Stamp;

/// This node's wall clock in Unix milliseconds.
pub fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A fresh stamp: now, and 128 bits from the OS-seeded thread RNG.
pub fn stamp() -> Stamp {
    Stamp {
        now_ms: wall_clock_ms(),
        entropy: rand::random(),
    }
}
