//! The one place that turns Rust values into bytes and back (log entries, votes, snapshots, Raft
//! RPC bodies), so the encoding can be swapped in one module.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes a value with bincode's standard configuration.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
}

/// Encodes a value as [`encode`] does, appending its bytes to `writer`.
pub fn encode_into<T: Serialize>(
    value: &T,
    writer: &mut impl std::io::Write,
) -> Result<(), bincode::error::EncodeError> {
    bincode::serde::encode_into_std_write(value, writer, bincode::config::standard()).map(|_| ())
}

/// What one [`decode`] may claim. bincode allocates an owned string or byte buffer by the length
/// the input states, before reading it: a crafted length (2^62 in a frame of a few dozen bytes)
/// made that allocation fail and aborted the process. With a limit bincode refuses the claim
/// instead. It counts every value at its width in memory (8 bytes for a u64 however short its
/// varint), up to ~8 times the input; what `decode` reads — Raft frames (appends carry at most
/// `network::APPEND_BUDGET_BYTES`, or one entry), log entries (one batch of commands of at most
/// 1 MiB of payload each), votes, snapshot chunks and metadata — stays far below this.
const DECODE_LIMIT: usize = crate::raft_wire::MAX_FRAME_BYTES;

/// Decodes a value encoded by [`encode`], refusing trailing bytes and lengths past
/// [`DECODE_LIMIT`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let config = bincode::config::standard().with_limit::<DECODE_LIMIT>();
    whole(bytes, bincode::serde::decode_from_slice(bytes, config)?)
}

/// [`decode`] without the limit, for a snapshot's state: it may be of any size (a million
/// leases claim hundreds of MiB), and it comes from this node's own disk, a backup file the
/// operator names, or a member of the cluster, never from an unauthenticated connection.
pub fn decode_state<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    whole(
        bytes,
        bincode::serde::decode_from_slice(bytes, bincode::config::standard())?,
    )
}

/// The decoded value, if it used all of `bytes`.
fn whole<T>(bytes: &[u8], (value, read): (T, usize)) -> Result<T, bincode::error::DecodeError> {
    if read != bytes.len() {
        return Err(bincode::error::DecodeError::OtherString(format!(
            "{} trailing bytes",
            bytes.len() - read
        )));
    }
    Ok(value)
}

/// The number of bytes [`encode`] would produce, computed without allocating.
pub fn encoded_len<T: Serialize>(value: &T) -> usize {
    let mut size = bincode::enc::write::SizeWriter::default();
    match bincode::serde::encode_into_writer(value, &mut size, bincode::config::standard()) {
        Ok(()) => size.bytes_written,
        // Encoding into a counter fails only for values `encode` would refuse too; count them as
        // large so they travel alone.
        Err(_) => usize::MAX,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use baton_statemachine::{Command, Envelope, Stamp};

    use super::*;

    /// bincode writes an enum variant as its index: a log written before `SweepAtMost` existed
    /// holds `Sweep` as variant 6, and must still read as `Sweep` (so variants are only ever
    /// appended). The bytes of a sweep entry are pinned here.
    /// A few bytes that state a string of 2^62 bytes: refused, where the allocation bincode
    /// makes by the stated length used to abort the process. Genuine values pass.
    #[test]
    fn a_crafted_length_is_refused_instead_of_aborting() {
        let crafted = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0x40];
        assert!(decode::<String>(&crafted).is_err());
        assert!(decode::<(u64, Vec<u8>)>(&[[7].as_slice(), &crafted].concat()).is_err());
        let genuine = "x".repeat(1 << 20);
        assert_eq!(
            decode::<String>(&encode(&genuine).unwrap()).unwrap(),
            genuine
        );
    }

    /// bincode counts a number at its width in memory however short its varint: 17 million
    /// small u128s take 17 MiB and claim 272 MiB, past the limit. A state may be like that (a
    /// million leases claim hundreds of MiB), so states decode without it.
    #[test]
    fn a_state_decodes_past_what_the_limit_would_claim() {
        let small_numbers = vec![1u128; 17 << 20];
        let bytes = encode(&small_numbers).unwrap();
        assert!(bytes.len() < DECODE_LIMIT / 8);
        assert!(
            decode::<Vec<u128>>(&bytes).is_err(),
            "claims past the limit"
        );
        assert_eq!(decode_state::<Vec<u128>>(&bytes).unwrap().len(), 17 << 20);
    }

    #[test]
    fn the_sweep_commands_keep_their_encodings() {
        let envelope = |command| Envelope {
            stamp: Stamp {
                now_ms: 5,
                entropy: 7,
            },
            origin: None,
            command,
        };
        let sweep = encode(&envelope(Command::Sweep)).unwrap();
        assert_eq!(sweep, [5, 7, 0, 6]);
        assert_eq!(decode::<Envelope>(&sweep).unwrap().command, Command::Sweep);
        let bounded = encode(&envelope(Command::SweepAtMost { expiries: 200 })).unwrap();
        assert_eq!(bounded, [5, 7, 0, 7, 200]);
        assert_eq!(
            decode::<Envelope>(&bounded).unwrap().command,
            Command::SweepAtMost { expiries: 200 }
        );
    }
}
