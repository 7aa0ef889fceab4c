//! TLS and token flags, shared by the node and the client commands.
//!
//! For `baton node` the certificate and key are the node's identity (served to clients and
//! presented to peers) and the CA is the one peers and client certificates must chain to. For
//! client commands the CA is what the nodes' certificates must chain to, and the certificate and
//! key (optional) are the client's own.

use std::path::PathBuf;

use anyhow::Context;
use baton_node::auth::Tokens;
use baton_node::security::Security as NodeSecurity;
use baton_node::tls::TlsFiles;
use baton_rpc::{ClientTls, Security};
use clap::Args;

/// `--tls-ca`, `--tls-cert`, `--tls-key`, `--auth-token`.
#[derive(Args, Debug, Clone)]
pub struct SecurityArgs {
    /// The cluster CA certificate (PEM). Enables TLS: a node verifies peers with it, a client
    /// verifies the nodes with it.
    #[arg(long, global = true, env = "BATON_TLS_CA", value_name = "PEM")]
    tls_ca: Option<PathBuf>,
    /// A certificate (PEM): a node's identity, or a client's optional client certificate.
    #[arg(long, global = true, env = "BATON_TLS_CERT", value_name = "PEM")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, global = true, env = "BATON_TLS_KEY", value_name = "PEM")]
    tls_key: Option<PathBuf>,
    /// The token client commands present (`authorization: Bearer <token>`). Named apart from
    /// the lease `--token` some commands take.
    #[arg(long, global = true, env = "BATON_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
}

impl SecurityArgs {
    /// What a client command presents.
    pub fn client(&self) -> anyhow::Result<Security> {
        let tls = match &self.tls_ca {
            None => {
                anyhow::ensure!(
                    self.tls_cert.is_none() && self.tls_key.is_none(),
                    "--tls-cert and --tls-key need --tls-ca (the CA the nodes' certificates chain to)"
                );
                None
            }
            Some(ca) => {
                let ca_pem = read(ca)?;
                let identity = match (&self.tls_cert, &self.tls_key) {
                    (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
                    (None, None) => None,
                    _ => anyhow::bail!("--tls-cert and --tls-key go together"),
                };
                Some(ClientTls { ca_pem, identity })
            }
        };
        Ok(Security {
            token: self.auth_token.clone(),
            tls,
        })
    }

    /// What a node runs with; `auth_token_file` holds the client tokens it accepts.
    pub fn node(&self, auth_token_file: Option<&PathBuf>) -> anyhow::Result<NodeSecurity> {
        let tls = match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (None, None, None) => None,
            (Some(cert), Some(key), Some(ca)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            }),
            _ => anyhow::bail!(
                "a node needs all of --tls-cert, --tls-key and --tls-ca for TLS \
                 (peers verify each other with the CA), or none of them"
            ),
        };
        let tokens = auth_token_file.map(|path| Tokens::load(path)).transpose()?;
        Ok(NodeSecurity { tls, tokens })
    }
}

fn read(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}
