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

/// Inputs up to this size (every Raft frame, log entry and vote) are decoded with a limit: bincode
/// allocates an owned string or byte buffer by the length the input states before reading it, so
/// a crafted length (2^62 in a few-byte frame) would make the allocation fail and abort the
/// process. Together those buffers never need more bytes than the input holds, so a limit of
/// this size refuses nothing genuine. Larger inputs are snapshot states, read from this node's
/// disk or installed by a member of its cluster.
const LIMITED_INPUT_BYTES: usize = crate::raft_wire::MAX_FRAME_BYTES;

/// Decodes a value encoded by [`encode`], refusing trailing bytes.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let (value, read) = if bytes.len() <= LIMITED_INPUT_BYTES {
        let config = bincode::config::standard().with_limit::<LIMITED_INPUT_BYTES>();
        bincode::serde::decode_from_slice(bytes, config)?
    } else {
        bincode::serde::decode_from_slice(bytes, bincode::config::standard())?
    };
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
