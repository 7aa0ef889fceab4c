//! What protects a node's traffic: TLS and client tokens, both optional.

use crate::auth::Tokens;
use crate::tls::TlsFiles;

/// A node's protection settings (default: plaintext, no tokens).
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// TLS for clients and mutual TLS between peers.
    pub tls: Option<TlsFiles>,
    /// The tokens clients must present.
    pub tokens: Option<Tokens>,
}
