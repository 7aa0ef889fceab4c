//! Warnings about peers, which would otherwise repeat as often as the peers retry (a misplaced
//! node's, or a node with a certificate its peers refuse, several times a second).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// At most one warning per [`Throttle::EVERY`]; clones share the count.
#[derive(Debug, Clone, Default)]
pub struct Throttle(Arc<Mutex<Option<Instant>>>);

impl Throttle {
    /// The least time between two warnings.
    pub const EVERY: Duration = Duration::from_secs(10);

    /// Whether a warning may be logged now; if so, the next may only after [`Self::EVERY`].
    pub fn due(&self) -> bool {
        let now = Instant::now();
        let mut last = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if last.is_some_and(|at| now.duration_since(at) < Self::EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_warning_per_period() {
        let throttle = Throttle::default();
        assert!(throttle.due());
        assert!(!throttle.clone().due(), "clones share the count");
        tokio::time::advance(Throttle::EVERY - Duration::from_millis(1)).await;
        assert!(!throttle.due());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(throttle.due());
    }
}
