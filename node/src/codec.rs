//! The one place that turns Rust values into bytes and back (log entries, votes, snapshots, Raft
//! RPC bodies), so the encoding can be swapped in one module.

use baton_statemachine::rules;
use baton_statemachine::State;
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
/// varint), up to 16 times the input (a small u128); what `decode` reads — Raft frames (appends
/// carry at most `network::APPEND_BUDGET_BYTES`, or one entry), log entries (one batch of
/// commands of at most 1 MiB of payload each), votes, snapshot chunks and metadata — stays far
/// below this.
const DECODE_LIMIT: usize = crate::raft_wire::MAX_FRAME_BYTES;

/// Decodes a value encoded by [`encode`], refusing trailing bytes and lengths past
/// `DECODE_LIMIT`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let config = bincode::config::standard().with_limit::<DECODE_LIMIT>();
    whole(bytes, bincode::serde::decode_from_slice(bytes, config)?)
}

/// A state's image, for snapshots and backups: its encoding, then, in a state a restore raised or
/// one under apply rules newer than 0, its fence floor ([`State::fence_floor`]), and in the
/// latter its rules ([`State::rules`]) after the floor. The state's own encoding leaves both out
/// so that every other state keeps the layout it always had. A build from before the floor
/// refuses an image that has one, and a build from before versioned rules one that has rules —
/// "trailing bytes" — rather than hand out fences again or apply later entries by older rules.
pub fn encode_state(state: &State) -> Result<Vec<u8>, bincode::error::EncodeError> {
    let mut bytes = Vec::new();
    encode_state_into(state, &mut bytes)?;
    Ok(bytes)
}

/// Writes a state's image ([`encode_state`]) to `writer` (a hasher needs no copy of it).
pub fn encode_state_into(
    state: &State,
    writer: &mut impl std::io::Write,
) -> Result<(), bincode::error::EncodeError> {
    encode_into(state, writer)?;
    if state.fence_floor > 0 || state.rules > 0 {
        encode_into(&state.fence_floor, writer)?;
    }
    if state.rules > 0 {
        encode_into(&state.rules, writer)?;
    }
    Ok(())
}

/// Decodes a state's image ([`encode_state`]) with a limit that grows with the image
/// (`decode_sized`) rather than [`decode`]'s: a state may be of any size (a million leases
/// claim hundreds of MiB).
///
/// Refuses the image of a state under apply rules this build does not know
/// ([`rules::known`]): the entries after it would be applied by older rules than every other
/// member's.
pub fn decode_state(bytes: &[u8]) -> Result<State, bincode::error::DecodeError> {
    let config = bincode::config::standard();
    let (mut state, mut read): (State, usize) = decode_sized(bytes)?;
    if read < bytes.len() {
        let (floor, used) = bincode::serde::decode_from_slice(&bytes[read..], config)?;
        (state.fence_floor, read) = (floor, read + used);
    }
    if read < bytes.len() {
        state.rules = decode(&bytes[read..])?;
    }
    rules::known(state.rules).map_err(|why| {
        bincode::error::DecodeError::OtherString(format!("the state's apply rules: {why}"))
    })?;
    Ok(state)
}

/// How many times its encoding a value may claim in memory, in [`decode_sized`]: twice the most
/// any encoding claims (bincode counts each number at its width in memory: 16 for a u128 written
/// as a one-byte varint; a string or byte buffer at its length plus 8).
const SIZED_LIMIT_FACTOR: usize = 32;

/// A value at the start of `bytes`, and how many bytes it took, claiming at most about
/// [`SIZED_LIMIT_FACTOR`] times `bytes` (the next of a few fixed limits, which bincode takes as
/// constants). A backup file is anyone's bytes once its checksum is recomputed: without a
/// limit, a string length of 2^40 in a file of a few hundred bytes made bincode's up-front
/// allocation fail and abort `baton snapshot inspect` instead of refusing the file.
fn decode_sized<T: DeserializeOwned>(
    bytes: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    const GIB: usize = 1 << 30;
    let config = bincode::config::standard();
    let claim = bytes.len().saturating_mul(SIZED_LIMIT_FACTOR);
    if claim <= GIB {
        bincode::serde::decode_from_slice(bytes, config.with_limit::<GIB>())
    } else if claim <= 16 * GIB {
        bincode::serde::decode_from_slice(bytes, config.with_limit::<{ 16 * GIB }>())
    } else if claim <= 256 * GIB {
        bincode::serde::decode_from_slice(bytes, config.with_limit::<{ 256 * GIB }>())
    } else {
        bincode::serde::decode_from_slice(bytes, config)
    }
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

    /// A crafted length far past what the bytes could hold is refused, not allocated (which
    /// aborted the process).
    #[test]
    fn a_state_image_claiming_far_more_than_it_holds_is_refused() {
        let mut crafted = vec![0xFD];
        crafted.extend((1u64 << 40).to_le_bytes());
        let refused = decode_sized::<String>(&crafted).unwrap_err();
        assert!(
            matches!(refused, bincode::error::DecodeError::LimitExceeded),
            "{refused:?}"
        );
        assert!(decode_state(&crafted).is_err());
    }

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
        let (decoded, _) = decode_sized::<Vec<u128>>(&bytes).unwrap();
        assert_eq!(decoded.len(), 17 << 20);
    }

    /// A state never raised has the image it always had (older builds read it); a raised one
    /// carries its fence floor after the state, which a build from before the floor refuses as
    /// trailing bytes rather than lose.
    #[test]
    fn a_state_image_carries_its_fence_floor_only_when_raised() {
        let state = State::default();
        assert_eq!(encode_state(&state).unwrap(), encode(&state).unwrap());
        assert_eq!(decode_state(&encode_state(&state).unwrap()).unwrap(), state);
        let mut raised = State::default();
        raised.raise_fences(1_000);
        let image = encode_state(&raised).unwrap();
        assert_eq!(decode_state(&image).unwrap().fence_floor, 1_000);
        let before_the_floor = whole(&image, decode_sized::<State>(&image).unwrap());
        assert!(
            before_the_floor.is_err(),
            "an older build would drop the floor"
        );
    }

    /// A state under newer apply rules carries them after its floor (0 when never raised),
    /// which a build from before versioned rules refuses as trailing bytes; a build refuses the
    /// image of a state under rules it does not know.
    #[test]
    fn a_state_image_carries_its_rules_once_newer_than_0() {
        for floor in [0, 1_000] {
            let mut state = State::default();
            state.raise_fences(floor);
            state.rules = rules::RULES;
            let image = encode_state(&state).unwrap();
            let read = decode_state(&image).unwrap();
            assert_eq!((read.fence_floor, read.rules), (floor, rules::RULES));
            assert_eq!(read, state);
            let before_rules = decode_sized::<State>(&image).unwrap();
            assert!(before_rules.1 < image.len(), "older builds must refuse it");
        }
        let beyond = State {
            rules: rules::RULES + 1,
            ..State::default()
        };
        let refused = decode_state(&encode_state(&beyond).unwrap()).unwrap_err();
        assert!(
            refused.to_string().contains("run a newer build"),
            "{refused}"
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
