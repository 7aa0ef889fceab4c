//! The keyed-concurrency task queue (seed 004): resource keys that allow one active attempt per
//! `(namespace, concurrency_key)` across all queues, with a per-key permit token.
//!
//! A task carries an optional concurrency key, frozen at submission. Leasing a keyed task takes
//! the key's permit and mints its next token: non-zero, strictly increasing, never reset, gaps
//! allowed, and refused (never wrapped) at `u64::MAX`. A busy key leaves its tasks `WAITING`
//! without consuming attempts, and leasing skips busy keys before applying its limit, so a batch
//! of blocked tasks never stands in front of other keys. The permit is released exactly as the
//! seed's table says: on finish, on cancel before start, on lease expiry, on a retryable failure
//! (so the back-off does not hold the resource), and on an unknown outcome (the history and the
//! unknown effect stay); it is kept across renewals and resumes, and a duplicate result or an old
//! attempt's late report never releases it twice or touches a later attempt's permit.
//! Workers declare at registration whether they support concurrency keys; one that does not is
//! never handed a keyed task. The resource side fences with the token (see [`crate::sink`]).

mod key;
mod leasable;
mod scheduler;
mod types;

pub use key::{
    validate as validate_concurrency_key, validate_bytes as validate_concurrency_key_bytes,
    MAX_KEY_CHARS,
};
pub use scheduler::{
    backoff_ms, TaskFilter, TaskPage, TaskQueue, MAX_ATTEMPTS, MAX_LEASE_BATCH, MAX_LEASE_BYTES,
    MAX_LEASE_QUEUES, MAX_LEASE_SWEEP, MAX_LEASE_TTL_MS, MAX_LIST_PAGE, MAX_LIST_SCAN,
};
pub use types::{
    Assignment, Attempt, AttemptOutcome, Command, Queue, SubmitReceipt, Task, TaskSpec, TaskState,
    Worker,
};
