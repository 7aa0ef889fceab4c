//! Client tokens: the bearer secrets a node accepts from clients.
//!
//! A token file holds one token per line; blank lines and lines starting with `#` are ignored,
//! so an operator can rotate a token by adding the new one, moving clients over, then deleting
//! the old one. Tokens are compared in constant time (for a given length) so response timing
//! does not reveal how much of a guess was right.

use std::path::Path;

use anyhow::Context;

/// The shortest token accepted: shorter ones are too easy to guess.
pub const MIN_TOKEN_LEN: usize = 16;

/// The tokens a node accepts.
#[derive(Clone)]
pub struct Tokens {
    accepted: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secrets themselves.
        write!(f, "Tokens({} accepted)", self.accepted.len())
    }
}

/// Why a request was not authenticated (the text the client sees).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// No `authorization` header.
    #[error(
        "this cluster requires a client token: send `authorization: Bearer <token>` \
         (baton: --auth-token or BATON_TOKEN)"
    )]
    Missing,
    /// A header that is not `Bearer <token>`.
    #[error("the authorization header must be `Bearer <token>`")]
    Malformed,
    /// A token that is not accepted.
    #[error("the client token is not accepted by this cluster")]
    Rejected,
}

impl Tokens {
    /// `Bearer <token>` for each accepted token: what this node may present when it calls
    /// another node's client port (the members of a cluster share their tokens; during a
    /// rotation one of them is on both sides).
    pub fn bearers(&self) -> Vec<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> {
        self.accepted
            .iter()
            .filter_map(|token| std::str::from_utf8(token).ok())
            .filter_map(|token| format!("Bearer {token}").parse().ok())
            .collect()
    }

    /// Reads a token file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the token file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("bad token file {}", path.display()))
    }

    /// Parses a token file's text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut accepted = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let token = line.trim();
            if token.is_empty() || token.starts_with('#') {
                continue;
            }
            anyhow::ensure!(
                token.len() >= MIN_TOKEN_LEN,
                "line {}: a token must have at least {MIN_TOKEN_LEN} characters",
                number + 1
            );
            anyhow::ensure!(
                token.bytes().all(|b| b.is_ascii_graphic()),
                "line {}: a token must be printable ASCII without spaces",
                number + 1
            );
            accepted.push(token.as_bytes().to_vec());
        }
        anyhow::ensure!(!accepted.is_empty(), "the file holds no token");
        Ok(Self { accepted })
    }

    /// Checks a request's `authorization` header.
    pub fn check(&self, headers: &http::HeaderMap) -> Result<(), AuthError> {
        let value = headers
            .get(http::header::AUTHORIZATION)
            .ok_or(AuthError::Missing)?;
        let value = value.to_str().map_err(|_| AuthError::Malformed)?;
        let token = value
            .strip_prefix("Bearer ")
            .ok_or(AuthError::Malformed)?
            .trim();
        // Compare against every token, without stopping early, so timing says nothing either.
        let mut matched = false;
        for accepted in &self.accepted {
            matched |= constant_time_eq(accepted, token.as_bytes());
        }
        if matched {
            Ok(())
        } else {
            Err(AuthError::Rejected)
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: Option<&str>) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        if let Some(value) = value {
            headers.insert(
                http::header::AUTHORIZATION,
                value.parse().expect("header value"),
            );
        }
        headers
    }

    #[test]
    fn accepts_any_listed_token_and_names_what_is_wrong_otherwise() {
        let tokens = Tokens::parse("# ops\nold-token-0123456789\n\nnew-token-0123456789\n")
            .expect("valid file");
        assert_eq!(
            tokens.check(&headers(Some("Bearer old-token-0123456789"))),
            Ok(())
        );
        assert_eq!(
            tokens.check(&headers(Some("Bearer new-token-0123456789"))),
            Ok(())
        );
        assert_eq!(tokens.check(&headers(None)), Err(AuthError::Missing));
        assert_eq!(
            tokens.check(&headers(Some("Basic abc"))),
            Err(AuthError::Malformed)
        );
        assert_eq!(
            tokens.check(&headers(Some("Bearer new-token-012345678"))),
            Err(AuthError::Rejected)
        );
    }

    #[test]
    fn refuses_short_or_empty_token_files() {
        assert!(Tokens::parse("short\n").is_err());
        assert!(Tokens::parse("# only a comment\n\n").is_err());
        assert!(Tokens::parse("has a space in it 0123\n").is_err());
    }
}
