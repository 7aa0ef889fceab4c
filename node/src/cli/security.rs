//! TLS and token flags, shared by the node and the client commands (for `baton node` they are
//! overrides of its `[tls]` keys, like its other flags).
//!
//! For `baton node` the certificate and key are the node's identity (served to clients and
//! presented to peers) and the CA is the one peers and client certificates must chain to. For
//! client commands the CA is what the nodes' certificates must chain to, and the certificate and
//! key (optional) are the client's own.

use std::path::PathBuf;

use anyhow::Context;
use baton_node::config::Override;
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
    /// These settings as the environment variables client commands read, so a command the
    /// worker runs (`baton sink write ...`) reaches the cluster the way the worker does.
    pub fn child_env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        let paths = [
            ("BATON_TLS_CA", &self.tls_ca),
            ("BATON_TLS_CERT", &self.tls_cert),
            ("BATON_TLS_KEY", &self.tls_key),
        ];
        let mut env: Vec<_> = paths
            .into_iter()
            .filter_map(|(name, path)| Some((name, path.as_ref()?.clone().into_os_string())))
            .collect();
        if let Some(token) = &self.auth_token {
            env.push(("BATON_TOKEN", token.into()));
        }
        env
    }

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

    /// The node settings these flags give (`tls.ca`, `tls.cert`, `tls.key`). clap also fills
    /// the flags from their environment variables; a value that is just that variable's is left
    /// to the configuration's own environment layer, so that `--check-config` names the
    /// variable, not the flag, as where it came from (the value is the same either way).
    pub fn node_overrides(&self) -> Vec<Override> {
        [
            ("--tls-ca", "tls.ca", "BATON_TLS_CA", &self.tls_ca),
            ("--tls-cert", "tls.cert", "BATON_TLS_CERT", &self.tls_cert),
            ("--tls-key", "tls.key", "BATON_TLS_KEY", &self.tls_key),
        ]
        .into_iter()
        .filter_map(|(flag, key, variable, value)| {
            let value = value.as_ref()?;
            if std::env::var_os(variable).as_deref() == Some(value.as_os_str()) {
                return None;
            }
            Some(Override {
                key: key.into(),
                value: value.to_string_lossy().into_owned(),
                flag: flag.into(),
            })
        })
        .collect()
    }
}

fn read(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}
