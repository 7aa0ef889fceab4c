//! `baton certs generate`: a private CA and certificates for nodes and clients (rcgen).
//!
//! The CA is created on the first run in the output directory (`ca.pem`, `ca-key.pem`) and reused
//! by later runs, so one directory holds a cluster's CA and every certificate it issued. Node
//! certificates name the node's hosts (DNS names or IP addresses) and are valid for both server
//! and client authentication, because a node presents the same certificate to clients and, when
//! it dials them, to its peers.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Subcommand;
use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use super::exit;

/// How long the CA is valid, in years.
const CA_YEARS: i32 = 10;
/// How long a node or client certificate is valid, in years.
const LEAF_YEARS: i32 = 2;

/// `baton certs ...`
#[derive(Subcommand, Debug)]
pub enum CertsCommand {
    /// Issue a certificate (and create the CA in --out on the first run).
    ///
    /// Node: `baton certs generate --out certs --name node1 --hosts 10.0.0.1,node1.example`.
    /// Client: `baton certs generate --out certs --name ops --client`.
    Generate {
        /// Directory for the CA and the certificates (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// File name stem of the certificate: NAME.pem and NAME-key.pem.
        #[arg(long, default_value = "node")]
        name: String,
        /// Hosts (DNS names or IP addresses) the node is reached at.
        #[arg(
            long,
            value_delimiter = ',',
            required_unless_present = "client",
            conflicts_with = "client"
        )]
        hosts: Vec<String>,
        /// Issue a client certificate instead (client authentication only, no hosts).
        #[arg(long)]
        client: bool,
    },
}

pub fn run(command: CertsCommand) -> u8 {
    let CertsCommand::Generate {
        out,
        name,
        hosts,
        client,
    } = command;
    match generate(&out, &name, &hosts, client) {
        Ok(written) => {
            for path in written {
                out!("wrote {}", path.display());
            }
            exit::OK
        }
        Err(error) => {
            eprintln!("baton: {error:#}");
            exit::FAILURE
        }
    }
}

/// Issues NAME.pem / NAME-key.pem in `out` (and the CA when missing); returns the files written.
fn generate(
    out: &Path,
    name: &str,
    hosts: &[String],
    client: bool,
) -> anyhow::Result<Vec<PathBuf>> {
    anyhow::ensure!(
        !name.is_empty() && name != "ca" && !name.contains(['/', '\\']),
        "--name must be a plain file name other than `ca`"
    );
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut written = Vec::new();
    let (ca_cert_path, ca_key_path) = (out.join("ca.pem"), out.join("ca-key.pem"));
    let (cert_path, key_path) = (
        out.join(format!("{name}.pem")),
        out.join(format!("{name}-key.pem")),
    );
    // Judged before anything is written: a run that fails writes nothing.
    for path in [&cert_path, &key_path] {
        anyhow::ensure!(
            !path.exists(),
            "{} exists (an existing file is never overwritten): choose another --name",
            path.display()
        );
    }
    match (ca_cert_path.exists(), ca_key_path.exists()) {
        (true, true) => {}
        (false, false) => {
            let (cert, key) = new_ca()?;
            write_pair((&ca_cert_path, &cert), (&ca_key_path, &key))?;
            written.extend([ca_cert_path.clone(), ca_key_path.clone()]);
        }
        // A new CA certificate beside the old key (or the reverse) would issue certificates
        // that verify against neither: nothing is made.
        (cert, _) => anyhow::bail!(
            "{} exists without {}: the CA is a pair; put the missing file back, or move the \
             other away to make a new CA (certificates the old one issued are then no longer \
             trusted by nodes given the new ca.pem)",
            if cert { &ca_cert_path } else { &ca_key_path }.display(),
            if cert { &ca_key_path } else { &ca_cert_path }.display(),
        ),
    }
    let ca_key = KeyPair::from_pem(&read(&ca_key_path)?).context("unreadable CA key")?;
    let ca_cert = read(&ca_cert_path)?;
    // A key from another CA would sign certificates that verify against neither: nothing is
    // made (rcgen signs with the key it is given whatever the certificate says).
    anyhow::ensure!(
        certified_key(&ca_cert)? == ca_key.public_key_raw(),
        "{} and {} are not a pair (the key is not the one the certificate is for): put back the \
         key this CA was made with, or move both away to make a new CA",
        ca_cert_path.display(),
        ca_key_path.display()
    );
    let issuer = Issuer::from_ca_cert_pem(&ca_cert, ca_key).context("unreadable CA certificate")?;

    let mut params = CertificateParams::new(if client { Vec::new() } else { hosts.to_vec() })
        .context("invalid host name")?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = if client {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    } else {
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    };
    let year = current_year();
    params.not_before = date_time_ymd(year - 1, 1, 1);
    params.not_after = date_time_ymd(year + LEAF_YEARS, 12, 31);
    let key = KeyPair::generate().context("cannot generate a key")?;
    let cert = params
        .signed_by(&key, &issuer)
        .context("cannot sign the certificate")?;
    write_pair((&cert_path, &cert.pem()), (&key_path, &key.serialize_pem()))?;
    written.extend([cert_path, key_path]);
    Ok(written)
}

/// The public key a PEM certificate is for, as its raw bytes.
fn certified_key(pem: &str) -> anyhow::Result<Vec<u8>> {
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).context("unreadable CA certificate")?;
    let cert = pem.parse_x509().context("unreadable CA certificate")?;
    Ok(cert.public_key().subject_public_key.data.to_vec())
}

fn new_ca() -> anyhow::Result<(String, String)> {
    let mut params = CertificateParams::new(Vec::new()).context("CA parameters")?;
    params
        .distinguished_name
        .push(DnType::CommonName, "Baton cluster CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let year = current_year();
    params.not_before = date_time_ymd(year - 1, 1, 1);
    params.not_after = date_time_ymd(year + CA_YEARS, 12, 31);
    let key = KeyPair::generate().context("cannot generate the CA key")?;
    let cert = params.self_signed(&key).context("cannot sign the CA")?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The current calendar year (UTC), near enough for validity periods that start a year early.
fn current_year() -> i32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    1970 + i32::try_from(secs / 31_556_952).unwrap_or(0)
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Writes a certificate and its private key, or neither: a certificate left without its key
/// would make every later run refuse the name (or, for the CA, be taken for a CA with no key).
fn write_pair(cert: (&Path, &str), key: (&Path, &str)) -> anyhow::Result<()> {
    write_file(cert.0, cert.1, false)?;
    write_file(key.0, key.1, true).inspect_err(|_| {
        let _ = std::fs::remove_file(cert.0);
    })
}

/// Writes a file, refusing to overwrite one; private keys are readable by the owner only.
fn write_file(path: &Path, contents: &str, private: bool) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(path).with_context(|| {
        format!(
            "cannot create {} (an existing file is never overwritten)",
            path.display()
        )
    })?;
    std::io::Write::write_all(&mut file, contents.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_ca_certificate_without_its_key_is_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        let hosts = ["127.0.0.1".to_string()];
        generate(out, "node1", &hosts, false).unwrap();
        std::fs::remove_file(out.join("ca-key.pem")).unwrap();
        let error = generate(out, "node2", &hosts, false).unwrap_err();
        assert!(format!("{error:#}").contains("without"), "{error:#}");
        assert!(!out.join("ca-key.pem").exists());
        assert!(!out.join("node2.pem").exists());
        // The reverse: a key without its certificate.
        std::fs::remove_file(out.join("ca.pem")).unwrap();
        std::fs::write(out.join("ca-key.pem"), "key").unwrap();
        assert!(generate(out, "node2", &hosts, false).is_err());
        assert!(!out.join("ca.pem").exists());
    }

    #[test]
    fn a_ca_certificate_with_another_cas_key_is_refused_and_nothing_is_written() {
        let (dir, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let hosts = ["127.0.0.1".to_string()];
        generate(dir.path(), "node1", &hosts, false).unwrap();
        generate(other.path(), "node1", &hosts, false).unwrap();
        // The pair as it is still issues.
        generate(dir.path(), "node2", &hosts, false).unwrap();
        std::fs::copy(
            other.path().join("ca-key.pem"),
            dir.path().join("ca-key.pem"),
        )
        .unwrap();
        let error = generate(dir.path(), "node3", &hosts, false).unwrap_err();
        assert!(format!("{error:#}").contains("not a pair"), "{error:#}");
        assert!(!dir.path().join("node3.pem").exists());
        assert!(!dir.path().join("node3-key.pem").exists());
    }

    #[test]
    fn an_existing_name_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        std::fs::write(out.join("node-key.pem"), "a key kept").unwrap();
        let error = generate(out, "node", &["h".to_string()], false).unwrap_err();
        assert!(format!("{error:#}").contains("node-key.pem"), "{error:#}");
        assert!(
            !out.join("node.pem").exists(),
            "no certificate without its key"
        );
        assert!(
            !out.join("ca.pem").exists(),
            "no CA made for a run that fails"
        );
        assert_eq!(
            std::fs::read_to_string(out.join("node-key.pem")).unwrap(),
            "a key kept"
        );
    }

    #[test]
    fn hosts_are_refused_for_a_client_certificate() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            certs: CertsCommand,
        }
        let parsed = <Cli as clap::Parser>::try_parse_from([
            "certs", "generate", "--out", "d", "--client", "--hosts", "x",
        ]);
        assert!(parsed.is_err(), "--client with --hosts was accepted");
    }
}
