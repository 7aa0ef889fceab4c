//! TLS for a node (rustls through tonic): its server identity, and mutual TLS between peers.
//!
//! A node given a certificate, its key and the cluster CA serves TLS to clients and peers. It
//! asks every connection for a client certificate signed by the CA: optional for clients (they
//! authenticate with tokens, and may present one), required for Raft traffic (the admission
//! gate, [`crate::admission`], refuses peer calls without one). It dials its peers over TLS too,
//! presenting its own certificate and trusting only the CA; so the CA is required, and a node
//! certificate serves as both server and client identity (`baton certs generate` issues such
//! certificates).

use std::path::{Path, PathBuf};

use anyhow::Context;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// Where a node's TLS material lives (PEM files).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The node's certificate chain.
    pub cert: PathBuf,
    /// The node's private key.
    pub key: PathBuf,
    /// The cluster CA: peers and clients verify certificates against it.
    pub ca: PathBuf,
}

/// A node's loaded TLS settings.
#[derive(Debug, Clone)]
pub struct NodeTls {
    identity: Identity,
    ca: Certificate,
}

impl NodeTls {
    /// Reads the PEM files (and fails early, with the file named, when one is missing).
    pub fn load(files: &TlsFiles) -> anyhow::Result<Self> {
        let cert = read(&files.cert, "certificate")?;
        let key = read(&files.key, "private key")?;
        let ca = Certificate::from_pem(read(&files.ca, "CA certificate")?);
        Ok(Self {
            identity: Identity::from_pem(cert, key),
            ca,
        })
    }

    /// The server side: this node's identity; client certificates signed by the CA are asked
    /// for (optional at the TLS level, required for Raft calls by the admission gate).
    pub fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity.clone())
            .client_ca_root(self.ca.clone())
            .client_auth_optional(true)
    }

    /// The client side for dialing peers: trust the cluster CA, present this node's certificate.
    pub fn peer_client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(self.ca.clone())
            .identity(self.identity.clone())
    }
}

fn read(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read the TLS {what} {}", path.display()))
}
