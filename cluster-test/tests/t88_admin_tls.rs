//! Claim: with `--tls-cert/--tls-key/--tls-ca`, a cluster of real processes talks TLS to its
//! clients and mutual TLS between its peers (certificates from `baton certs generate`):
//!
//! - a TLS client (trusting the CA, with or without a client certificate) writes and reads, and
//!   the command line does the same with `--tls-ca`; a leader handover (peer-to-peer TimeoutNow)
//!   works over the peers' TLS links;
//! - a plaintext client gets no answer at all;
//! - a peer's Raft connection is refused without a node certificate (none, or a client
//!   certificate), and a node certificate gets through;
//! - the per-connection in-flight limit applies to TLS connections too;
//! - the same holds when the nodes take their TLS files and client tokens from `[tls]` and
//!   `[auth]` in a configuration file.
#![allow(clippy::unwrap_used)]

mod admin_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use admin_support::{config, show, Procs};
use baton_node::cluster_id::ClusterId;
use baton_node::raft_wire::{self, Header, Kind, Outcome};
use baton_node::tls::PeerConnector;
use baton_rpc::error::{detail_of, infra};
use baton_rpc::proto::checkpoint_client::CheckpointClient;
use baton_rpc::proto::queue_client::QueueClient;
use baton_rpc::proto::{LeaseRequest, LoadCheckpointRequest, RequestHeader};
use baton_rpc::{Client, ClientTls, Security};
use baton_statemachine::{ChangeFilter, Primitive};
use futures::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
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

/// A new TLS connection to `addr`, presenting `identity` (or no certificate).
async fn tls_channel(
    addr: &str,
    certs: &Path,
    identity: Option<&str>,
) -> tonic::transport::Channel {
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(
        std::fs::read(certs.join("ca.pem")).unwrap(),
    ));
    if let Some(name) = identity {
        config = config.identity(Identity::from_pem(
            std::fs::read(certs.join(format!("{name}.pem"))).unwrap(),
            std::fs::read(certs.join(format!("{name}-key.pem"))).unwrap(),
        ));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(config)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Generates a CA, a node certificate for 127.0.0.1 and a client certificate `ops` in `certs`.
fn generate_certs(certs: &Path) {
    let bin = baton_cluster_test::binary::baton_bin().unwrap();
    for args in [
        vec!["--name", "node", "--hosts", "127.0.0.1,localhost"],
        vec!["--name", "ops", "--client"],
    ] {
        let output = std::process::Command::new(&bin)
            .args(["certs", "generate", "--out"])
            .arg(certs)
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", show(&output));
    }
}

/// Fresh certificates in a temporary directory (kept while it lives) and `count` nodes declared
/// to run TLS with them, with `extra` flags; the harness's own calls use TLS too.
fn tls_nodes(count: u64, extra: &[&str]) -> (tempfile::TempDir, PathBuf, Procs) {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    generate_certs(&certs);
    let mut flags: Vec<String> = [
        ("--tls-cert", "node.pem"),
        ("--tls-key", "node-key.pem"),
        ("--tls-ca", "ca.pem"),
    ]
    .iter()
    .flat_map(|(flag, file)| [flag.to_string(), certs.join(file).display().to_string()])
    .collect();
    flags.extend(extra.iter().map(|arg| arg.to_string()));
    let mut procs = Procs::new(tls(&certs, None)).unwrap();
    for id in 1..=count {
        procs.declare(id, &flags).unwrap();
    }
    (dir, certs, procs)
}

/// What the node at `addr` (asked through `client`) wants in front of its peers' requests.
async fn header_of(client: &Client, addr: &str) -> Header {
    let info = client.node_info(addr).await.unwrap();
    Header {
        cluster: Some(ClusterId::parse(&info.cluster_id).unwrap()),
        to: info.id,
    }
}

/// Opens a Raft connection to `addr` as a peer would, over TLS presenting `identity` (or no
/// certificate), and sends a vote request with `header` whose body is not a vote: the outcome
/// the node answers and its body as text, or why there was no answer.
async fn raft_vote(
    addr: &str,
    header: Header,
    certs: &Path,
    identity: Option<&str>,
) -> Result<(Outcome, String), String> {
    let ca = std::fs::read(certs.join("ca.pem")).unwrap();
    let identity = identity.map(|name| {
        (
            std::fs::read(certs.join(format!("{name}.pem"))).unwrap(),
            std::fs::read(certs.join(format!("{name}-key.pem"))).unwrap(),
        )
    });
    let connector = PeerConnector::from_pem(
        &ca,
        identity.as_ref().map(|(cert, key)| (&cert[..], &key[..])),
    )
    .unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(&raft_wire::PREAMBLE).await.unwrap();
    let mut link = raft_wire::link(Box::new(connector.connect(addr, stream).await?));
    let garbage = raft_wire::request(Kind::Vote, header, &"not a vote").unwrap();
    link.send(garbage).await.map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(10), link.next()).await {
        Err(_) => panic!("the node neither answered nor closed the connection"),
        Ok(None) => Err("closed without an answer".into()),
        Ok(Some(Err(e))) => Err(e.to_string()),
        Ok(Some(Ok(frame))) => {
            let (outcome, body) = raft_wire::parse_answer(frame.freeze()).unwrap();
            Ok((outcome, String::from_utf8_lossy(&body).into_owned()))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_serves_tls_clients_and_refuses_plaintext() {
    let (_dir, certs, mut procs) = tls_nodes(3, &[]);
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
    let header = header_of(&client, &addr).await;
    let refused = raft_vote(&addr, header, &certs, None).await;
    assert!(refused.is_err(), "no certificate: {refused:?}");
    let refused = raft_vote(&addr, header, &certs, Some("ops")).await;
    assert!(
        refused.is_err(),
        "a client certificate is not a node certificate: {refused:?}"
    );
    // The node says why it refuses (a node with such a certificate could never join in).
    baton_cluster_test::wait::until("the refusal logged", Duration::from_secs(10), || async {
        if procs.log(1).contains("TLS handshake refused") {
            Ok(())
        } else {
            Err("not in node 1's log".to_string())
        }
    })
    .await
    .unwrap();
    // A node certificate gets through: the body is garbage, and said to be.
    let (outcome, why) = raft_vote(&addr, header, &certs, Some("node"))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Failed);
    assert!(why.contains("undecodable Vote"), "{why}");
}

/// Loads a checkpoint over `channel`: the status of the refusal (nothing is ever saved here).
async fn load(channel: &tonic::transport::Channel) -> tonic::Status {
    CheckpointClient::new(channel.clone())
        .load(LoadCheckpointRequest { run: "r".into() })
        .await
        .unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_applies_to_tls_connections() {
    let (_dir, certs, mut procs) = tls_nodes(1, &["--max-in-flight-per-connection", "1"]);
    procs.start(1).await.unwrap();
    procs.initialize(1).await.unwrap();
    let client = procs.client(tls(&certs, None)).await.unwrap();
    client.create_queue("q", "ns").await.unwrap();
    client.register_worker("w", false).await.unwrap();
    let addr = procs.addr(1);

    // One connection holds its only place with a long-poll lease (nothing is ever leasable);
    // then every other call on that connection is refused at once, while another connection is
    // served. A load that reaches the node before the lease takes the place first: then the
    // lease is the one refused, and the round starts again.
    let busy = tls_channel(&addr, &certs, None).await;
    let mut refused = None;
    for round in 0..20 {
        let channel = busy.clone();
        let held = tokio::spawn(async move {
            let request = LeaseRequest {
                header: Some(RequestHeader {
                    client_id: 77,
                    seq: round + 1,
                    acked_below: round + 1,
                    ..Default::default()
                }),
                worker_id: "w".into(),
                queues: vec!["q".into()],
                limit: 1,
                lease_ttl_ms: 10_000,
                wait_ms: 2_000,
            };
            QueueClient::new(channel).lease(request).await.map(|_| ())
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let status = load(&busy).await;
        if detail_of(&status).is_some_and(|d| d.code == infra::OVERLOADED) {
            assert!(!held.is_finished(), "the held lease is still waiting");
            refused = Some(status);
            let other = load(&tls_channel(&addr, &certs, None).await).await;
            assert_eq!(
                other.code(),
                Code::NotFound,
                "another connection is served: {other:?}"
            );
            held.await.unwrap().unwrap();
            break;
        }
        let _ = held.await;
    }
    let status = refused.expect("a second call on the busy TLS connection was refused");
    let names_the_limit = status.message().contains("max_in_flight_per_connection");
    assert!(
        status.code() == Code::ResourceExhausted && names_the_limit,
        "{status:?}"
    );
}

/// The same protection from a configuration file instead of flags: `[tls]` and `[auth]`, as a
/// systemd deployment (deploy/baton.service) gives them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_configured_by_file_runs_tls_and_asks_for_tokens() {
    const TOKEN: &str = "file-token-5d2e8a1c9f";
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    generate_certs(&certs);
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();
    let file = dir.path().join("baton.toml");
    std::fs::write(
        &file,
        format!(
            "[tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n\n[auth]\ntoken_file = {:?}\n",
            certs.join("ca.pem"),
            certs.join("node.pem"),
            certs.join("node-key.pem"),
            tokens
        ),
    )
    .unwrap();
    let with_token = |identity| Security {
        token: Some(TOKEN.into()),
        ..tls(&certs, identity)
    };
    let mut procs = Procs::new(with_token(None)).unwrap();
    let args = ["--config".to_string(), file.display().to_string()];
    procs.form_cluster(3, &args).await.unwrap();
    assert!(
        !procs.log(1).contains("TLS is not"),
        "warned of missing TLS on a TLS node"
    );

    let client = procs.client(with_token(None)).await.unwrap();
    client.save_if_newer("job", 1, b"secret").await.unwrap();

    // A watch travels over TLS with the token too: it replays the save above.
    let mut watch = client
        .watch(
            ChangeFilter::all().primitive(Primitive::Checkpoint),
            Some(1),
        )
        .await;
    let first = tokio::time::timeout(Duration::from_secs(10), watch.next()).await;
    match first {
        Ok(Some(Ok(event))) => assert_eq!(event.change.key, "job"),
        other => panic!("the watch saw no change over TLS with a token: {other:?}"),
    }

    // TLS without the token: refused before anything runs.
    let no_token =
        Client::new_with_security(&procs.endpoints(), config(), tls(&certs, None)).unwrap();
    match no_token.save_if_newer("job", 2, b"intruder").await {
        Err(baton_rpc::Error::Server { code, .. }) => assert_eq!(code, "UNAUTHENTICATED"),
        other => panic!("expected UNAUTHENTICATED, got {other:?}"),
    }
    // A watch without it too, at once rather than after the client's whole deadline.
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        no_token.watch(ChangeFilter::all(), Some(1)).await.next(),
    )
    .await;
    match refused {
        Ok(Some(Err(baton_rpc::Error::Server { code, .. }))) => {
            assert_eq!(code, "UNAUTHENTICATED")
        }
        other => panic!("expected the watch refused UNAUTHENTICATED, got {other:?}"),
    }
    // The token without TLS: no answer at all.
    let quick = baton_rpc::ClientConfig {
        deadline: Duration::from_secs(1),
        ..config()
    };
    let plain = Client::new_with_security(
        &procs.endpoints(),
        quick,
        Security {
            token: Some(TOKEN.into()),
            tls: None,
        },
    )
    .unwrap();
    assert!(plain.save_if_newer("job", 3, b"plain").await.is_err());
    // Raft traffic between the nodes needs a node certificate here too.
    let header = header_of(&client, &procs.addr(1)).await;
    let refused = raft_vote(&procs.addr(1), header, &certs, Some("ops")).await;
    assert!(refused.is_err(), "a client certificate: {refused:?}");
    assert_eq!(client.load("job").await.unwrap().seq, 1, "nothing changed");
}
