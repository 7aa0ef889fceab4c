//! Validation rules shared by every primitive: required and bounded strings, positive TTLs.

use crate::error::Refusal;
use crate::limits::MAX_KEY_BYTES;

/// A key a read names (a ticket key, an action key, a resource, a run): the rule every command
/// applies to it, so a read of a key no command could have written is refused as invalid rather
/// than answered "not found".
pub fn read_key(field: &str, value: &str) -> Result<(), Refusal> {
    required(field, value, MAX_KEY_BYTES)
}

/// A required string of at most `max` bytes.
pub(crate) fn required(field: &str, value: &str, max: usize) -> Result<(), Refusal> {
    if value.is_empty() {
        return Err(Refusal::invalid(field, "must not be empty"));
    }
    bounded(field, value, max)
}

/// An optional string of at most `max` bytes.
pub(crate) fn bounded(field: &str, value: &str, max: usize) -> Result<(), Refusal> {
    if value.len() > max {
        return Err(Refusal::invalid(
            field,
            format!("must be at most {max} bytes"),
        ));
    }
    Ok(())
}

/// A bytes value of at most `max` bytes.
pub(crate) fn bounded_bytes(field: &str, value: &[u8], max: usize) -> Result<(), Refusal> {
    if value.len() > max {
        return Err(Refusal::invalid(
            field,
            format!("must be at most {max} bytes"),
        ));
    }
    Ok(())
}

/// A time limit: callers give durations, and a grant without a positive one is forbidden.
pub(crate) fn ttl(ttl_ms: i64) -> Result<(), Refusal> {
    if ttl_ms <= 0 {
        return Err(Refusal::invalid("ttl", "must be > 0"));
    }
    Ok(())
}
