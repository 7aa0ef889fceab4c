//! Which InstallSnapshot chunk offsets a follower accepts.
//!
//! openraft writes each chunk at the offset the request states, into the in-memory buffer the
//! snapshot is received in: a chunk stating an offset far past what was received (a bug in a
//! sender, or garbage from a peer) would make the buffer grow to that offset, terabytes zeroed,
//! and abort the node. A leader sends a snapshot's chunks in order, each starting where the last
//! accepted one ended, and may send one again (its answer lost), so no legitimate chunk starts
//! past the end of what was received of its snapshot. Any other chunk is answered as openraft
//! answers a chunk of a snapshot it is not receiving: a mismatch, on which the leader sends the
//! snapshot again from its start. The last chunk ends the snapshot's reception, here as in
//! openraft (which drops its buffer then): the same snapshot sent again starts a new buffer at 0,
//! and a late chunk of the first sending must not land in it past what the new one received.

use std::sync::{Arc, Mutex};

use openraft::error::{InstallSnapshotError, SnapshotMismatch};
use openraft::raft::InstallSnapshotRequest;
use openraft::SnapshotSegmentId;

use crate::types::TypeConfig;

/// What has been received of the snapshot last streamed to this node.
#[derive(Clone, Debug, Default)]
pub struct ChunkIntake {
    received: Arc<Mutex<Option<Received>>>,
}

#[derive(Debug)]
struct Received {
    snapshot_id: String,
    /// The end of the furthest chunk accepted.
    end: u64,
}

/// An admitted chunk: its snapshot, where it ends and whether it is the last one, recorded once
/// openraft wrote it.
#[derive(Debug)]
pub struct Admitted {
    chunk: Received,
    last: bool,
}

impl ChunkIntake {
    /// Whether `chunk` starts within what was received of its snapshot (or at the start of a
    /// snapshot); if not, the mismatch to answer.
    pub fn admit(
        &self,
        chunk: &InstallSnapshotRequest<TypeConfig>,
    ) -> Result<Admitted, InstallSnapshotError> {
        let received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        let end = match &*received {
            Some(received) if received.snapshot_id == chunk.meta.snapshot_id => received.end,
            _ => 0,
        };
        if chunk.offset <= end {
            return Ok(Admitted {
                chunk: Received {
                    snapshot_id: chunk.meta.snapshot_id.clone(),
                    end: chunk.offset.saturating_add(chunk.data.len() as u64),
                },
                last: chunk.done,
            });
        }
        let at = |offset| SnapshotSegmentId {
            id: chunk.meta.snapshot_id.clone(),
            offset,
        };
        Err(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
            expect: at(end),
            got: at(chunk.offset),
        }))
    }

    /// Records that the `admitted` chunk was written; after the last one, nothing is being
    /// received.
    pub fn accepted(&self, Admitted { chunk, last }: Admitted) {
        let mut received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        if last {
            *received = None;
            return;
        }
        match &mut *received {
            Some(received) if received.snapshot_id == chunk.snapshot_id => {
                received.end = received.end.max(chunk.end);
            }
            other => *other = Some(chunk),
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::SnapshotMeta;

    use super::*;

    fn chunk(id: &str, offset: u64, len: usize) -> InstallSnapshotRequest<TypeConfig> {
        InstallSnapshotRequest {
            vote: openraft::Vote::new_committed(1, 1),
            meta: SnapshotMeta {
                last_log_id: None,
                last_membership: Default::default(),
                snapshot_id: id.into(),
            },
            offset,
            data: vec![7; len],
            done: false,
        }
    }

    fn take(intake: &ChunkIntake, chunk: &InstallSnapshotRequest<TypeConfig>) -> bool {
        match intake.admit(chunk) {
            Ok(admitted) => {
                intake.accepted(admitted);
                true
            }
            Err(_) => false,
        }
    }

    #[test]
    fn chunks_in_order_and_resent_ones_are_admitted() {
        let intake = ChunkIntake::default();
        assert!(take(&intake, &chunk("a", 0, 10)));
        assert!(take(&intake, &chunk("a", 10, 10)));
        // The same chunk again (its answer lost), and the first one again.
        assert!(take(&intake, &chunk("a", 10, 10)));
        assert!(take(&intake, &chunk("a", 0, 10)));
        assert!(take(&intake, &chunk("a", 20, 5)));
        // Another snapshot starts at its start.
        assert!(take(&intake, &chunk("b", 0, 4)));
        assert!(take(&intake, &chunk("b", 4, 4)));
    }

    /// After the last chunk, the same snapshot sent again starts from nothing received: a late
    /// chunk of the first sending is a mismatch, not written past the start of the new buffer.
    #[test]
    fn a_snapshot_received_whole_is_received_anew_from_its_start() {
        let intake = ChunkIntake::default();
        assert!(take(&intake, &chunk("a", 0, 50)));
        let mut last = chunk("a", 50, 50);
        last.done = true;
        assert!(take(&intake, &last));
        assert!(!take(&intake, &chunk("a", 50, 10)), "a late chunk");
        assert!(take(&intake, &chunk("a", 0, 10)));
        assert!(!take(&intake, &chunk("a", 90, 10)), "a late chunk");
        assert!(take(&intake, &chunk("a", 10, 10)));
    }

    #[test]
    fn a_chunk_past_what_was_received_is_a_mismatch() {
        let intake = ChunkIntake::default();
        // Nothing received yet: only a start.
        let Err(InstallSnapshotError::SnapshotMismatch(mismatch)) = intake.admit(&chunk("a", 1, 1))
        else {
            panic!("a first chunk past the start admitted");
        };
        assert_eq!((mismatch.expect.offset, mismatch.got.offset), (0, 1));
        assert!(take(&intake, &chunk("a", 0, 10)));
        // A gap of one byte, a far offset, and a later chunk of another snapshot.
        assert!(!take(&intake, &chunk("a", 11, 1)));
        assert!(!take(&intake, &chunk("a", 1 << 40, 1)));
        assert!(!take(&intake, &chunk("b", 10, 1)));
        // What was received is unchanged by the refusals.
        assert!(take(&intake, &chunk("a", 10, 1)));
        assert!(!take(&intake, &chunk("a", 12, 1)));
    }
}
