//! The one place that turns Rust values into bytes and back (log entries, votes, snapshots, Raft
//! RPC bodies), so the encoding can be swapped in one module.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes a value with bincode's standard configuration.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
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
