//! Claim: with `--tls-cert/--tls-key/--tls-ca`, a cluster of real processes talks TLS to its
//! clients and mutual TLS between its peers (certificates from `baton certs generate`):
//!
//! - a TLS client (trusting the CA, with or without a client certificate) writes and reads, and
//!   the command line does the same with `--tls-ca`; a leader handover (peer-to-peer TimeoutNow)
//!   works over the peers' TLS links;
//! - a plaintext client gets no answer at all;
//! - the Raft service refuses a caller without a node certificate (none, or a client
//!   certificate) as UNAUTHENTICATED, and lets a node certificate through.
#![allow(clippy::unwrap_used)]

mod admin_support;

use std::path::Path;

use admin_support::{config, show, Procs};
use baton_rpc::proto::raft::raft_client::RaftClient;
use baton_rpc::proto::raft::RaftRequest;
use baton_rpc::{Client, ClientTls, Security};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

fn tls(certs: &Path, identity: Option<&str>) -> Security {
    Security {
        token: None,
        tls: Some(ClientTls {
            ca_pem: std::fs::read(certs.join("ca.pem")).unwrap(),
            identity: identity.map(|name| {
                (
                    std::fs::read(certs.join(format!("{name}.pem"))).unwrap(),
                    std::fs::read(certs.join(format!("{name}-key.pem"))).unwrap(),
                )
            }),
        }),
    }
}

/// Calls the Raft service of `addr` over TLS presenting `identity` (or no certificate).
async fn raft_vote(addr: &str, certs: &Path, identity: Option<&str>) -> tonic::Status {
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(
        std::fs::read(certs.join("ca.pem")).unwrap(),
    ));
    if let Some(name) = identity {
        config = config.identity(Identity::from_pem(
            std::fs::read(certs.join(format!("{name}.pem"))).unwrap(),
            std::fs::read(certs.join(format!("{name}-key.pem"))).unwrap(),
        ));
    }
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(config)
        .unwrap()
        .connect()
        .await
        .unwrap();
    RaftClient::new(channel)
        .vote(RaftRequest {
            body: b"not a vote".to_vec(),
        })
        .await
        .expect_err("a garbage vote is never accepted")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_serves_tls_clients_and_refuses_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let bin = baton_cluster_test::binary::baton_bin().unwrap();
    for args in [
        vec!["--name", "node", "--hosts", "127.0.0.1,localhost"],
        vec!["--name", "ops", "--client"],
    ] {
        let output = std::process::Command::new(&bin)
            .args(["certs", "generate", "--out"])
            .arg(&certs)
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", show(&output));
    }

    let mut procs = Procs::new(tls(&certs, None)).unwrap();
    let flags: Vec<String> = [
        ("--tls-cert", "node.pem"),
        ("--tls-key", "node-key.pem"),
        ("--tls-ca", "ca.pem"),
    ]
    .iter()
    .flat_map(|(flag, file)| [flag.to_string(), certs.join(file).display().to_string()])
    .collect();
    for id in 1..=3 {
        procs.declare(id, &flags).unwrap();
    }
    for id in 1..=3 {
        procs.start(id).await.unwrap();
    }
    procs.initialize(1).await.unwrap();
    let leader = procs.leader().await.unwrap();

    // TLS clients, with and without a client certificate.
    let client = procs.client(tls(&certs, None)).await.unwrap();
    client.save_if_newer("job", 1, b"secret").await.unwrap();
    let with_cert = procs.client(tls(&certs, Some("ops"))).await.unwrap();
    assert_eq!(with_cert.load("job").await.unwrap().data, b"secret");

    // The command line with --tls-ca, including a handover over the peers' TLS links.
    let ca = certs.join("ca.pem").display().to_string();
    let endpoints = procs.endpoints().join(",");
    let output = procs
        .cli(&[
            "--endpoints",
            &endpoints,
            "--tls-ca",
            &ca,
            "checkpoint",
            "load",
            "--run",
            "job",
        ])
        .unwrap();
    assert!(output.status.success(), "{}", show(&output));
    let output = procs
        .cli(&[
            "--endpoints",
            &endpoints,
            "--tls-ca",
            &ca,
            "leader",
            "transfer",
        ])
        .unwrap();
    assert!(output.status.success(), "{}", show(&output));
    let new_leader = procs.leader().await.unwrap();
    assert_ne!(new_leader, leader, "{}", show(&output));

    // Plaintext: no answer, from the library or the command line.
    let quick = baton_rpc::ClientConfig {
        deadline: std::time::Duration::from_secs(1),
        ..config()
    };
    let plain = Client::new(&procs.endpoints(), quick).unwrap();
    for addr in procs.endpoints() {
        let answer = plain.node_info(&addr).await;
        assert!(answer.is_err(), "plaintext answered: {answer:?}");
    }
    assert!(plain.save_if_newer("job", 2, b"plain").await.is_err());
    let output = procs
        .cli(&["--endpoints", &endpoints, "--timeout", "2s", "status"])
        .unwrap();
    assert!(!output.status.success(), "{}", show(&output));
    assert_eq!(client.load("job").await.unwrap().seq, 1, "nothing changed");

    // Raft traffic needs a node certificate.
    let addr = procs.addr(1);
    assert_eq!(
        raft_vote(&addr, &certs, None).await.code(),
        Code::Unauthenticated
    );
    assert_eq!(
        raft_vote(&addr, &certs, Some("ops")).await.code(),
        Code::Unauthenticated,
        "a client certificate is not a node certificate"
    );
    assert_eq!(
        raft_vote(&addr, &certs, Some("node")).await.code(),
        Code::InvalidArgument,
        "a node certificate passes the gate (the body is garbage)"
    );
}
