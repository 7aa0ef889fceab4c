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

/// Decodes a value encoded by [`encode`], refusing trailing bytes.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let (value, read) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())?;
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
