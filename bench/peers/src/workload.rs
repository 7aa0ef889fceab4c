//! The workloads, defined exactly as `baton bench` defines them (node/src/cli/bench.rs), so that
//! one op means the same thing on every system and the ratios compare like with like.

use clap::ValueEnum;

/// Board permits seeded for `permit-uniform` and the write part of `mixed-read`.
pub const UNIFORM_TASKS: u32 = 10_000;
/// Board permits for `permit-hot`: most claims find the permit held.
pub const HOT_TASKS: u32 = 8;
/// Tickets offered up front for the reads of `mixed-read`.
pub const READ_TICKETS: u32 = 1_000;
/// Time to live of a permit (seconds), as `baton bench` asks for.
pub const PERMIT_TTL_S: u32 = 30;
/// Time to live of a ticket (seconds), as `baton bench` asks for.
pub const TICKET_TTL_S: u32 = 600;
/// Time to live of a queue lease (seconds), as `baton bench` asks for.
pub const QUEUE_LEASE_TTL_S: u32 = 30;

/// One closed-loop coordination workload (each op atomic and durable).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Claim + release of a random permit out of 10,000 (a held permit counts as contended).
    PermitUniform,
    /// The same over 8 permits: mostly contended.
    PermitHot,
    /// Offer a fresh ticket, take it, reply done (one op).
    Handoff,
    /// Lease the next task of one queue, then complete it (one op).
    QueueClaim,
    /// 90% point reads of one ticket out of 1,000, 10% permit-uniform pairs.
    MixedRead,
}

impl Workload {
    /// The name `baton bench --json` prints.
    pub fn name(self) -> &'static str {
        match self {
            Workload::PermitUniform => "permit-uniform",
            Workload::PermitHot => "permit-hot",
            Workload::Handoff => "handoff",
            Workload::QueueClaim => "queue-claim",
            Workload::MixedRead => "mixed-read",
        }
    }

    /// How many permits the workload draws from.
    pub fn permits(self) -> u32 {
        match self {
            Workload::PermitHot => HOT_TASKS,
            _ => UNIFORM_TASKS,
        }
    }

    /// Whether the workload claims and releases permits.
    pub fn uses_permits(self) -> bool {
        matches!(
            self,
            Workload::PermitUniform | Workload::PermitHot | Workload::MixedRead
        )
    }
}

/// What one run sets up and how its clients name things.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The workload to run.
    pub workload: Workload,
    /// Concurrent closed-loop clients (one connection each).
    pub clients: usize,
    /// Tasks submitted up front for `queue-claim`.
    pub queue_tasks: u32,
    /// Distinguishes this run's keys from an earlier run's (etcd keeps them until cleaned).
    pub run_id: u32,
}

impl Plan {
    /// The key of ticket `n` read by `mixed-read` (the same spelling as `baton bench`).
    pub fn read_ticket(&self, n: u32) -> String {
        format!("{}{n}", self.read_ticket_prefix())
    }

    /// What every `mixed-read` ticket key starts with (the number follows).
    pub fn read_ticket_prefix(&self) -> String {
        format!("bench-{:08x}-ticket-", self.run_id)
    }

    /// The key of the `sequence`-th ticket offered by client `index` in `handoff`.
    pub fn handoff_ticket(&self, index: usize, sequence: u64) -> String {
        format!("bench-{:08x}-c{index}-{sequence}", self.run_id)
    }
}

/// The agent name client `index` claims and takes as.
pub fn agent(index: usize) -> String {
    format!("bench-client-{index}")
}

/// Who offers the tickets of `handoff` and `mixed-read`.
pub const SENDER: &str = "bench";
/// Who takes them.
pub const RECIPIENT: &str = "bench-taker";
/// The summary a `handoff` reply carries.
pub const SUMMARY: &str = "ok";
