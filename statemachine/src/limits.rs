//! Size limits enforced at apply time.
//!
//! They live in the state machine (not only at the gRPC edge) so that every replica judges the
//! same command the same way, and so a log entry can never carry a value that a snapshot or a
//! client could not hold.

/// Longest key (ticket key, task id, ...) in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// Longest fenced-sink resource name in bytes, from apply rules 1 on ([`crate::rules`]; before,
/// [`MAX_KEY_BYTES`]): room for a queue namespace, a slash and the longest concurrency key (512 +
/// 1 + 764 bytes), the name the worker docs fence a key's writes under.
pub const MAX_RESOURCE_BYTES: usize = 2 << 10;
/// Longest agent / holder name in bytes.
pub const MAX_AGENT_BYTES: usize = 256;
/// Longest address (e.g. a ticket's `reply_to`) in bytes.
pub const MAX_ADDRESS_BYTES: usize = 1024;
/// Largest opaque payload in bytes.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;
/// Longest free text (a receipt's summary or failure) in bytes.
pub const MAX_TEXT_BYTES: usize = 64 << 10;
/// Most artifacts one receipt may carry.
pub const MAX_ARTIFACTS: usize = 256;
/// Most dependencies one task may declare.
pub const MAX_DEPENDENCIES: usize = 256;
