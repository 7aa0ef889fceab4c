//! TLS for a node (rustls through tonic): its server identity, and mutual TLS between peers.
//!
//! A node given a certificate, its key and the cluster CA serves TLS to clients and peers. It
//! asks every connection for a client certificate signed by the CA: optional for clients (they
//! authenticate with tokens, and may present one), required for Raft traffic (the admission
//! gate, [`crate::admission`], refuses peer calls without one). It dials its peers over TLS too,
//! presenting its own certificate and trusting only the CA; so the CA is required, and a node
//! certificate serves as both server and client identity (`baton certs generate` issues such
//! certificates).
//!
//! gRPC's TLS goes through tonic; the Raft transport's own connections ([`crate::raft_wire`])
//! use rustls directly, with the same files: [`PeerConnector`] dials, [`PeerAcceptor`] accepts
//! and admits only node certificates.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{client, server, TlsAcceptor, TlsConnector};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

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
#[derive(Clone)]
pub struct NodeTls {
    identity: Identity,
    ca: Certificate,
    peer_connector: PeerConnector,
    peer_acceptor: PeerAcceptor,
}

impl NodeTls {
    /// Reads the PEM files (and fails early, with the file named, when one is missing).
    pub fn load(files: &TlsFiles) -> anyhow::Result<Self> {
        let cert = read(&files.cert, "certificate")?;
        let key = read(&files.key, "private key")?;
        let ca = read(&files.ca, "CA certificate")?;
        let peer_connector = PeerConnector::from_pem(&ca, Some((&cert, &key)))?;
        let peer_acceptor = PeerAcceptor::from_pem(&ca, &cert, &key)?;
        Ok(Self {
            identity: Identity::from_pem(cert, key),
            ca: Certificate::from_pem(ca),
            peer_connector,
            peer_acceptor,
        })
    }

    /// The server side: this node's identity; client certificates signed by the CA are asked
    /// for (optional at the TLS level, required for Raft calls by the admission gate).
    pub fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity.clone())
            .client_ca_root(self.ca.clone())
            .client_auth_optional(true)
            // A client that stalls in the handshake is let go (without a limit, held for good).
            .timeout(crate::raft_server::OPENING_LIMIT)
    }

    /// Calls another node's client port as a client: trusts the cluster CA, presents this
    /// node's certificate.
    pub fn client(&self) -> tonic::transport::ClientTlsConfig {
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(self.ca.clone())
            .identity(self.identity.clone())
    }

    /// Dials peers' Raft connections: trusts the cluster CA, presents this node's certificate.
    pub fn peer_connector(&self) -> PeerConnector {
        self.peer_connector.clone()
    }

    /// Accepts peers' Raft connections: a client certificate signed by the cluster CA is
    /// required, and it must be a node certificate.
    pub fn peer_acceptor(&self) -> PeerAcceptor {
        self.peer_acceptor.clone()
    }
}

/// The client side of a Raft connection's TLS.
#[derive(Clone)]
pub struct PeerConnector {
    connector: TlsConnector,
}

impl PeerConnector {
    /// Trusts the CA in `ca_pem` and presents `identity` (certificate chain and key, PEM), or no
    /// certificate: nodes always present theirs; no identity is for tests of the refusal.
    pub fn from_pem(ca_pem: &[u8], identity: Option<(&[u8], &[u8])>) -> anyhow::Result<Self> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_root_certificates(roots(ca_pem)?);
        let config = match identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(certs(cert)?, private_key(key)?)
                .context("invalid node certificate or key")?,
            None => builder.with_no_client_auth(),
        };
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    /// TLS over `stream` to the peer at `addr` (host:port), whose certificate must name the
    /// host and be signed by the CA.
    pub async fn connect(
        &self,
        addr: &str,
        stream: TcpStream,
    ) -> Result<client::TlsStream<TcpStream>, String> {
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host} is not a valid TLS server name: {e}"))?;
        self.connector
            .connect(name, stream)
            .await
            .map_err(|e| format!("with {addr}: {}", handshake_error(&e)))
    }
}

/// The server side of a Raft connection's TLS.
#[derive(Clone)]
pub struct PeerAcceptor {
    acceptor: TlsAcceptor,
}

impl PeerAcceptor {
    fn from_pem(ca_pem: &[u8], cert: &[u8], key: &[u8]) -> anyhow::Result<Self> {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca_pem)?), provider())
                .build()
                .context("cannot verify client certificates with this CA")?;
        let config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs(cert)?, private_key(key)?)
            .context("invalid node certificate or key")?;
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The TLS handshake on `stream`, refused unless the peer presented a node certificate
    /// signed by the CA (a client certificate allows client authentication only).
    pub async fn accept(&self, stream: TcpStream) -> Result<server::TlsStream<TcpStream>, String> {
        let tls = self
            .acceptor
            .accept(stream)
            .await
            .map_err(|e| handshake_error(&e))?;
        let leaf = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first());
        if !leaf.is_some_and(|leaf| allows_server_auth(leaf)) {
            return Err(format!(
                "{TLS_REFUSAL}: the peer did not present a node certificate"
            ));
        }
        Ok(tls)
    }
}

/// Whether a DER certificate's extended key usage allows server authentication.
fn allows_server_auth(der: &[u8]) -> bool {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return false;
    };
    matches!(
        cert.extended_key_usage(),
        Ok(Some(usage)) if usage.value.server_auth || usage.value.any
    )
}

fn provider() -> Arc<tokio_rustls::rustls::crypto::CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::ring::default_provider())
}

fn roots(ca_pem: &[u8]) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certs(ca_pem)? {
        roots.add(cert).context("invalid CA certificate")?;
    }
    Ok(roots)
}

fn certs(pem: &[u8]) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .context("invalid PEM certificate")?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in the PEM file");
    Ok(certs)
}

fn private_key(pem: &[u8]) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem).context("invalid PEM private key")
}

fn read(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read the TLS {what} {}", path.display()))
}

/// How the error of a TLS handshake refused on either side (a certificate another CA signed,
/// expired, without a node's usages; a protocol the other side does not speak) begins. A
/// handshake that broke off (the peer restarting, a reset) says otherwise.
pub const TLS_REFUSAL: &str = "TLS handshake refused";

/// What a failed handshake's error says: rustls reports a refusal as invalid data, anything
/// else is the connection's.
fn handshake_error(error: &std::io::Error) -> String {
    if error.kind() == std::io::ErrorKind::InvalidData {
        format!("{TLS_REFUSAL}: {error}")
    } else {
        format!("TLS handshake broke off: {error}")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn certificate(usages: Vec<rcgen::ExtendedKeyUsagePurpose>) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["node".to_string()]).expect("params");
        params.extended_key_usages = usages;
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn only_node_certificates_may_speak_raft() {
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        assert!(allows_server_auth(&certificate(vec![
            ServerAuth, ClientAuth
        ])));
        assert!(!allows_server_auth(&certificate(vec![ClientAuth])));
        assert!(!allows_server_auth(&certificate(vec![])), "no usage stated");
        assert!(!allows_server_auth(b"not a certificate"));
    }
}
