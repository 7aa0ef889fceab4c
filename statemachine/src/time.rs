//! The store clock's two rules, in one place so every primitive and every judge agrees on them.

/// The deadline of something granted at `clock_ms` for `ttl_ms` (already validated `> 0`).
///
/// Saturates instead of wrapping: an absurdly long TTL means "practically never", not "already
/// past".
pub fn deadline_after(clock_ms: u64, ttl_ms: i64) -> u64 {
    clock_ms.saturating_add(ttl_ms.max(0) as u64)
}

/// Whether a deadline has passed at `now_ms`.
///
/// A deadline is the first instant at which the grant no longer holds, so reaching it counts as
/// overdue. Apply-time judgements and the snapshot `check` both use this one predicate, so a
/// ticket that `take` would refuse as expired is exactly a ticket that `check` reports as overdue.
pub fn is_overdue(deadline_ms: u64, now_ms: u64) -> bool {
    now_ms >= deadline_ms
}
