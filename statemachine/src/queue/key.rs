//! The concurrency key's validation rules (seed 004 §2).
//!
//! Keys are matched byte-exactly: no case folding and no Unicode normalisation, so `object/A`,
//! `object/a` and the composed and decomposed forms of an accented letter are different keys.

use crate::error::Refusal;

/// Longest concurrency key, in Unicode scalar values.
pub const MAX_KEY_CHARS: usize = 191;

/// Validates a concurrency key; the empty key means "none" and is always valid.
pub fn validate(key: &str) -> Result<(), Refusal> {
    const FIELD: &str = "concurrency_key";
    if key.is_empty() {
        return Ok(());
    }
    if key.chars().count() > MAX_KEY_CHARS {
        return Err(Refusal::invalid(
            FIELD,
            format!("must be 1-{MAX_KEY_CHARS} Unicode characters"),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(Refusal::invalid(
            FIELD,
            "must not contain control characters",
        ));
    }
    let starts = key.chars().next().is_some_and(char::is_whitespace);
    let ends = key.chars().next_back().is_some_and(char::is_whitespace);
    if starts || ends {
        return Err(Refusal::invalid(
            FIELD,
            "must not start or end with Unicode whitespace",
        ));
    }
    Ok(())
}

/// Validates raw bytes from the wire as a concurrency key: they must be valid UTF-8 first.
pub fn validate_bytes(bytes: &[u8]) -> Result<String, Refusal> {
    let key = std::str::from_utf8(bytes)
        .map_err(|_| Refusal::invalid("concurrency_key", "must be valid UTF-8"))?;
    validate(key)?;
    Ok(key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(key: &str) -> Option<String> {
        match validate(key) {
            Ok(()) => None,
            Err(Refusal::Invalid { field, rule }) => {
                assert_eq!(field, "concurrency_key");
                Some(rule)
            }
            Err(other) => panic!("unexpected refusal {other:?}"),
        }
    }

    #[test]
    fn empty_means_none() {
        assert_eq!(rule(""), None);
    }

    #[test]
    fn length_counts_characters_not_bytes() {
        let at_limit: String = "é".repeat(MAX_KEY_CHARS);
        assert!(at_limit.len() > MAX_KEY_CHARS, "multi-byte characters");
        assert_eq!(rule(&at_limit), None);
        let over: String = "a".repeat(MAX_KEY_CHARS + 1);
        assert!(rule(&over).is_some());
        assert_eq!(rule("x"), None);
    }

    #[test]
    fn control_characters_are_refused() {
        for key in ["a\u{0}b", "a\nb", "a\u{7f}b", "a\u{9f}b"] {
            assert!(rule(key).is_some(), "{key:?}");
        }
    }

    #[test]
    fn leading_or_trailing_unicode_whitespace_is_refused_inner_is_fine() {
        for key in [" a", "a ", "\u{3000}a", "a\u{a0}", "\u{2003}x"] {
            assert!(rule(key).is_some(), "{key:?}");
        }
        assert_eq!(rule("object 42"), None);
    }

    #[test]
    fn invalid_utf8_is_refused() {
        assert!(validate_bytes(&[0x6f, 0xff, 0x6f]).is_err());
        assert_eq!(
            validate_bytes("object/42".as_bytes()).as_deref(),
            Ok("object/42")
        );
    }

    #[test]
    fn keys_are_not_normalised() {
        let composed = "caf\u{e9}";
        let decomposed = "cafe\u{301}";
        assert_eq!(rule(composed), None);
        assert_eq!(rule(decomposed), None);
        assert_ne!(composed.as_bytes(), decomposed.as_bytes());
    }
}
