//! The fenced sink: the downstream side of fencing.
//!
//! A resource that only a fence holder may write keeps the highest fence it has seen. A write
//! presenting a lower fence is refused `FENCE_STALE` and writes nothing; otherwise the value is
//! stored and "highest seen = presented" happen in the same step (an equal fence is allowed: one
//! holder may write several times). Comparing and writing in one atomic command is the whole
//! point: read-compare-write in three steps lets two holders both pass the comparison.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::Refusal;
use crate::limits::{MAX_KEY_BYTES, MAX_PAYLOAD_BYTES, MAX_RESOURCE_BYTES};
use crate::validate;

/// What a resource holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkValue {
    /// The highest fence ever presented by an accepted write.
    pub seen_fence: u64,
    /// The latest accepted value.
    pub value: Vec<u8>,
    /// How many writes were accepted.
    pub writes: u64,
}

/// A sink command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Write `value` to `resource` if `fence` is not stale.
    Write {
        /// The resource.
        resource: String,
        /// The writer's fence (> 0).
        fence: u64,
        /// The value to store.
        value: Vec<u8>,
    },
}

impl Command {
    /// The command's name, for logs and metrics.
    pub fn name(&self) -> &'static str {
        "sink.write"
    }
}

/// Every fenced resource. Each value is shared (`Arc`, written into snapshots as the value itself),
/// so a copy of the state, which a snapshot build takes under the state lock, does not copy the
/// bytes; a write to a value a copy still holds copies it first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sink {
    resources: BTreeMap<String, Arc<SinkValue>>,
}

impl Sink {
    /// Writes if `fence >= highest seen`, under apply `rules` ([`crate::rules`]); returns the
    /// resource after the write.
    pub fn write(
        &mut self,
        rules: u32,
        resource: &str,
        fence: u64,
        value: Vec<u8>,
    ) -> Result<SinkValue, Refusal> {
        let longest = if rules >= 1 {
            MAX_RESOURCE_BYTES
        } else {
            MAX_KEY_BYTES
        };
        validate::required("resource", resource, longest)?;
        validate::bounded_bytes("value", &value, MAX_PAYLOAD_BYTES)?;
        if fence == 0 {
            return Err(Refusal::invalid("fence", "must be > 0"));
        }
        if fence < self.seen_fence(resource) {
            return Err(Refusal::FenceStale);
        }
        let entry = self
            .resources
            .entry(resource.to_string())
            .or_insert_with(|| {
                Arc::new(SinkValue {
                    seen_fence: 0,
                    value: Vec::new(),
                    writes: 0,
                })
            });
        let entry = Arc::make_mut(entry);
        entry.seen_fence = fence;
        entry.value = value;
        entry.writes += 1;
        Ok(entry.clone())
    }

    /// Checks a resource name to read: any a write may give under the newest rules.
    pub fn read_name(resource: &str) -> Result<(), Refusal> {
        validate::required("resource", resource, MAX_RESOURCE_BYTES)
    }

    /// The highest fence a resource has accepted (0 if never written).
    pub fn seen_fence(&self, resource: &str) -> u64 {
        self.resources.get(resource).map_or(0, |r| r.seen_fence)
    }

    /// A resource's current value, if it was ever written.
    pub fn read(&self, resource: &str) -> Option<&SinkValue> {
        self.resources.get(resource).map(|value| &**value)
    }
}
