//! What a client presents to a protected cluster: TLS settings and a bearer token.
//!
//! Both are optional and independent. The token travels as `authorization: Bearer <token>` on
//! every call; over plaintext it can be read by anyone on the path, so use it with TLS.

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};
use tonic::{Request, Status};

use crate::error::Error;

/// TLS and token settings of a [`crate::Client`] (default: plaintext, no token).
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// The bearer token to present.
    pub token: Option<String>,
    /// TLS towards the nodes.
    pub tls: Option<ClientTls>,
}

/// TLS towards the nodes: the CA that signed their certificates, and optionally a client
/// certificate (PEM bytes).
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// The CA certificate (PEM) the nodes' certificates must chain to.
    pub ca_pem: Vec<u8>,
    /// A client certificate chain and its key (PEM), for clusters that want one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl ClientTls {
    /// The tonic configuration.
    pub(super) fn config(&self) -> ClientTlsConfig {
        let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        match &self.identity {
            Some((cert, key)) => config.identity(Identity::from_pem(cert, key)),
            None => config,
        }
    }
}

/// Adds the bearer token to every outgoing call.
#[derive(Clone)]
pub struct Credentials {
    authorization: Option<MetadataValue<Ascii>>,
}

impl Credentials {
    /// The credentials of `security` (fails on a token that cannot travel in a header).
    pub(super) fn new(security: &Security) -> Result<Self, Error> {
        let authorization = match &security.token {
            None => None,
            Some(token) => Some(
                format!("Bearer {}", token.trim())
                    .parse()
                    .map_err(|_| Error::Config("the token must be printable ASCII".into()))?,
            ),
        };
        Ok(Self { authorization })
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}
