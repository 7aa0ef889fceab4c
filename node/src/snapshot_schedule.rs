//! When this node builds its snapshots: at log points of its own, offset from its peers'.
//!
//! openraft's `LogsSinceLast(n)` policy makes every member build when its applied index reaches
//! the same multiple of `n`, so all of them build at once. A build takes a core while it encodes
//! (~0.3 s per million leases) and then writes a large image to disk beside the log, so with all
//! members building together no quorum is free and every in-flight write stalls
//! (docs/benchmarks.md, "State scale"). Here each member builds at
//! `phase + k * every`, where the phase spreads the members evenly over one interval by their
//! rank among the voters: with three members the builds are a third of an interval apart, and
//! the two members not building still form a quorum.
//!
//! openraft is told never to snapshot on its own (`SnapshotPolicy::Never`); [`run`] checks the
//! applied index a few times a second and asks openraft to build when a point has passed.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::types::{NodeId, Raft};

/// How often [`run`] looks at the applied index. A build starts at most this late after its
/// point: negligible against an interval of thousands of entries, and cheaper than waking on
/// every applied entry.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// Where this member's snapshot points lie within each interval of `every` entries: its rank
/// among the cluster's members (this node counted even while it is a learner) times an equal
/// share of the interval.
pub fn phase(id: NodeId, voters: &BTreeSet<NodeId>, every: u64) -> u64 {
    let mut members = voters.clone();
    members.insert(id);
    let rank = members.iter().position(|m| *m == id).unwrap_or(0) as u64;
    let count = members.len() as u64;
    // Widened so that a large `every` cannot overflow the product.
    ((every as u128 * rank as u128) / count as u128) as u64
}

/// The log index at which a member whose points are `phase + k * every` builds its next
/// snapshot, its latest being at `snapshot` (None: none yet).
///
/// A point counts only if it lies at least half an interval past the latest snapshot, so builds
/// are between half an interval and one and a half intervals apart even when a snapshot was
/// installed from the leader at an arbitrary index, and the member drifts back to its own phase.
pub fn next_point(snapshot: Option<u64>, every: u64, phase: u64) -> u64 {
    let every = every.max(1);
    let phase = phase % every;
    let earliest = match snapshot {
        Some(index) => index.saturating_add(every / 2).saturating_add(1),
        None => every / 2 + 1,
    };
    if earliest <= phase {
        phase
    } else {
        let steps = (earliest - phase).div_ceil(every);
        phase.saturating_add(steps.saturating_mul(every))
    }
}

/// How long after asking for a point's build [`run`] asks again if the point is still the next
/// one. openraft ignores a request while a build is under way, and a build that ends below a
/// snapshot installed meanwhile leaves the snapshot metric (and so the point) where it was:
/// without asking again, this member would never build (nor purge its log) until the next
/// install. A request that arrives during a build is ignored, so asking again costs nothing.
pub const ASK_AGAIN_AFTER: Duration = Duration::from_secs(10);

/// The point last asked for, and when.
#[derive(Clone, Copy, Debug)]
pub struct Asked {
    point: u64,
    at: Instant,
}

/// Whether to ask for a build now: the point has been applied, and it was not asked for already
/// (less than [`ASK_AGAIN_AFTER`] ago: the snapshot metric may still show the previous snapshot
/// while that build finishes, and asking again at once would start a second build after it).
pub fn due(applied: u64, point: u64, asked: Option<Asked>, now: Instant) -> bool {
    applied >= point
        && !asked.is_some_and(|asked| {
            asked.point == point && now.saturating_duration_since(asked.at) < ASK_AGAIN_AFTER
        })
}

/// Asks openraft to build a snapshot whenever this member's next point has been applied, until
/// `stop` turns true (or its sender is gone).
pub async fn run(raft: Raft, id: NodeId, every: u64, mut stop: watch::Receiver<bool>) {
    let mut asked = None;
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = stop.changed() => if changed.is_err() { return },
        }
        if *stop.borrow() {
            return;
        }
        let (applied, snapshot, voters) = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            let voters: BTreeSet<NodeId> =
                metrics.membership_config.membership().voter_ids().collect();
            (
                metrics.last_applied.map(|id| id.index),
                metrics.snapshot.map(|id| id.index),
                voters,
            )
        };
        let Some(applied) = applied else { continue };
        let point = next_point(snapshot, every, phase(id, &voters, every));
        let now = Instant::now();
        if due(applied, point, asked, now) {
            asked = Some(Asked { point, at: now });
            tracing::debug!(applied, point, ?snapshot, "snapshot point reached");
            // openraft ignores the request while a build is under way; an error means Raft
            // has stopped, which the server notices on its own.
            if raft.trigger().snapshot().await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voters(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn three_members_get_phases_a_third_apart() {
        let v = voters(&[1, 2, 3]);
        assert_eq!(phase(1, &v, 9_000), 0);
        assert_eq!(phase(2, &v, 9_000), 3_000);
        assert_eq!(phase(3, &v, 9_000), 6_000);
        // Ids need not be 1..=n.
        let v = voters(&[10, 42, 7]);
        let phases: BTreeSet<u64> = [7, 10, 42].iter().map(|id| phase(*id, &v, 9_000)).collect();
        assert_eq!(phases, BTreeSet::from([0, 3_000, 6_000]));
    }

    #[test]
    fn a_learner_takes_a_slot_of_its_own() {
        let v = voters(&[1, 2, 3]);
        assert_eq!(phase(4, &v, 8_000), 6_000);
        assert_eq!(phase(1, &v, 8_000), 0);
        assert_eq!(phase(1, &BTreeSet::new(), 8_000), 0);
    }

    /// A point asked for is not asked for again at once (a build may be under way), but is after
    /// [`ASK_AGAIN_AFTER`] if it is still the next one: the request may have been ignored during
    /// a build that ended below a snapshot installed meanwhile, which leaves the point as it was.
    #[test]
    fn a_point_still_next_is_asked_for_again_after_a_while() {
        let now = Instant::now();
        let asked = |point, ago| {
            Some(Asked {
                point,
                at: now - ago,
            })
        };
        assert!(!due(99, 100, None, now), "not applied yet");
        assert!(due(100, 100, None, now));
        assert!(!due(150, 100, asked(100, Duration::from_secs(1)), now));
        assert!(due(150, 100, asked(100, ASK_AGAIN_AFTER), now));
        assert!(
            due(150, 100, asked(50, Duration::ZERO), now),
            "another point"
        );
    }

    #[test]
    fn a_huge_interval_does_not_overflow() {
        let v = voters(&[1, 2, 3]);
        assert_eq!(phase(3, &v, u64::MAX), u64::MAX / 3 * 2);
        assert_eq!(next_point(None, u64::MAX, u64::MAX / 3), u64::MAX);
    }

    /// The indexes at which a member applying one entry at a time builds, starting from `start`.
    fn builds(every: u64, phase: u64, start: Option<u64>, until: u64) -> Vec<u64> {
        let mut snapshot = start;
        let mut built = Vec::new();
        for applied in 1..=until {
            if applied >= next_point(snapshot, every, phase) {
                built.push(applied);
                snapshot = Some(applied);
            }
        }
        built
    }

    #[test]
    fn each_member_builds_at_its_own_points() {
        assert_eq!(builds(100, 0, None, 450), vec![100, 200, 300, 400]);
        assert_eq!(builds(100, 33, None, 450), vec![133, 233, 333, 433]);
        assert_eq!(builds(100, 66, None, 450), vec![66, 166, 266, 366]);
    }

    #[test]
    fn members_never_build_at_the_same_index() {
        let v = voters(&[1, 2, 3]);
        let all: Vec<Vec<u64>> = [1, 2, 3]
            .iter()
            .map(|id| builds(1_000, phase(*id, &v, 1_000), None, 20_000))
            .collect();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                for x in a {
                    for y in b {
                        assert!(x.abs_diff(*y) >= 333, "builds at {x} and {y} are too close");
                    }
                }
            }
        }
    }

    #[test]
    fn after_an_installed_snapshot_the_member_returns_to_its_phase() {
        // This member's points are 1_050, 2_050, ...; a snapshot installed from the leader at
        // 1_290 moves its next build to its own next point, 2_050.
        assert_eq!(builds(1_000, 50, Some(1_290), 4_000), vec![2_050, 3_050]);
        // Installed less than half an interval before its point: that point is skipped.
        assert_eq!(builds(1_000, 50, Some(1_600), 4_000), vec![3_050]);
    }

    #[test]
    fn a_late_build_moves_the_next_point_past_it() {
        // With the last snapshot at 1_000 the next point is 2_000; a build that ran late, at
        // 5_000, moves it to 6_000: one build, not one per point missed.
        assert_eq!(next_point(Some(1_000), 1_000, 0), 2_000);
        assert_eq!(next_point(Some(5_000), 1_000, 0), 6_000);
    }

    #[test]
    fn an_interval_of_one_builds_at_most_every_entry() {
        assert_eq!(builds(1, 0, None, 4), vec![1, 2, 3, 4]);
        assert_eq!(next_point(None, 1, 0), 1);
    }
}
