//! Administrative calls the leader may work on for long (a learner catching up, a snapshot of a
//! big state) get the client's whole deadline for one attempt: cutting them off at the attempt
//! timeout would send them again, starting the work over each time, and report a failure for
//! work that succeeded. A leadership handover to one voter that another won is reported as
//! failed, never as done.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_rpc::proto::cluster_server::{Cluster, ClusterServer};
use baton_rpc::proto::{self};
use baton_rpc::{Client, ClientConfig, Error};
use tonic::transport::Server;
use tonic::{Request, Response, Status};

mod support;

/// How long the stand-in leader works on a learner before answering.
const CATCH_UP: Duration = Duration::from_millis(1_500);

/// A stand-in leader whose learners take [`CATCH_UP`] to catch up and whose handovers elect
/// `elected`; it counts the requests.
#[derive(Default)]
struct SlowLeader {
    add_learner: Arc<AtomicUsize>,
    /// Its own address, which `node_info` names as the leader's.
    addr: String,
    /// Who a handover elects: id and address.
    elected: (u64, String),
    transfers: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Cluster for SlowLeader {
    async fn node_info(
        &self,
        _: Request<proto::NodeInfoRequest>,
    ) -> Result<Response<proto::NodeInfoResponse>, Status> {
        Ok(Response::new(proto::NodeInfoResponse {
            leader_addr: self.addr.clone(),
            ..Default::default()
        }))
    }
    async fn initialize(
        &self,
        _: Request<proto::InitializeRequest>,
    ) -> Result<Response<proto::InitializeResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn add_learner(
        &self,
        _: Request<proto::AddLearnerRequest>,
    ) -> Result<Response<proto::MembershipResponse>, Status> {
        self.add_learner.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(CATCH_UP).await;
        Ok(Response::new(proto::MembershipResponse::default()))
    }
    async fn change_membership(
        &self,
        _: Request<proto::ChangeMembershipRequest>,
    ) -> Result<Response<proto::MembershipResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn state_digest(
        &self,
        _: Request<proto::StateDigestRequest>,
    ) -> Result<Response<proto::StateDigestResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn promote_member(
        &self,
        _: Request<proto::PromoteMemberRequest>,
    ) -> Result<Response<proto::MembershipResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn remove_member(
        &self,
        _: Request<proto::RemoveMemberRequest>,
    ) -> Result<Response<proto::MembershipResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn transfer_leader(
        &self,
        _: Request<proto::TransferLeaderRequest>,
    ) -> Result<Response<proto::TransferLeaderResponse>, Status> {
        self.transfers.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(proto::TransferLeaderResponse {
            leader_id: self.elected.0,
            leader_addr: self.elected.1.clone(),
            ..Default::default()
        }))
    }
    type SaveSnapshotStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<proto::SnapshotPart, Status>> + Send>>;
    async fn save_snapshot(
        &self,
        _: Request<proto::SaveSnapshotRequest>,
    ) -> Result<Response<Self::SaveSnapshotStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// Serves `leader` on a listener bound beforehand.
fn serve(listener: tokio::net::TcpListener, leader: SlowLeader) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let _ = Server::builder()
            .add_service(ClusterServer::new(leader))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    })
}

async fn listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_that_takes_longer_than_an_attempt_is_added_in_one_request() {
    let (listener, addr) = listener().await;
    let leader = SlowLeader::default();
    let requests = leader.add_learner.clone();
    let server = serve(listener, leader);
    let client = Client::new(
        &[addr],
        ClientConfig {
            deadline: Duration::from_secs(10),
            attempt_timeout: Duration::from_millis(500),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    let added = client.add_learner(4, "127.0.0.1:1").await;
    assert!(added.is_ok(), "{added:?}");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        1,
        "the learner was asked for once, not again at every attempt timeout"
    );
    server.abort();
}

/// Node 1 hands over to node 3, but node 2 wins the election (its own timer fired first): the
/// call fails `HANDOVER_FAILED` naming node 2, and node 2 is not asked to hand over in turn (while
/// node 3 cannot win, that would move leadership back and forth). Without a target, whoever is
/// elected is the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_another_voter_won_is_reported_as_failed() {
    let (first, first_addr) = listener().await;
    let (second, second_addr) = listener().await;
    let one = SlowLeader {
        addr: first_addr.clone(),
        elected: (2, second_addr.clone()),
        ..SlowLeader::default()
    };
    let two = SlowLeader {
        addr: second_addr.clone(),
        elected: (3, "127.0.0.1:7003".into()),
        ..SlowLeader::default()
    };
    let asked = [one.transfers.clone(), two.transfers.clone()];
    let servers = [serve(first, one), serve(second, two)];
    let client = Client::new(&[first_addr], ClientConfig::default()).unwrap();
    match client.transfer_leader(Some(3)).await {
        Err(Error::Server { code, message }) => {
            assert_eq!(code, "HANDOVER_FAILED");
            assert!(
                message.contains(&format!("node 2 at {second_addr} was elected"))
                    && message.contains("instead of node 3"),
                "{message}"
            );
        }
        other => panic!("a handover node 2 won was answered {other:?}"),
    }
    let anyone = client.transfer_leader(None).await.unwrap();
    assert_eq!(anyone.leader_id, 2);
    let asked: Vec<usize> = asked.iter().map(|n| n.load(Ordering::SeqCst)).collect();
    assert_eq!(asked, [2, 0], "only the leader was asked");
    servers.iter().for_each(|server| server.abort());
}

/// A snapshot save holds an encoded copy of the whole state until its client has read it, and
/// cluster administration is never refused by the client limits: a node serves one save at a
/// time and answers another `OVERLOADED` (retried by the client library) meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serves_one_snapshot_save_at_a_time() {
    use baton_rpc::error::detail_of;
    use baton_rpc::proto::cluster_client::ClusterClient;

    let cluster = support::Cluster::start().await;
    // More state than the transport buffers, so an unread save stays in flight.
    for i in 0..8 {
        let mut args = support::offer(&format!("big-{i}"));
        args.payload = vec![b'x'; 1_000_000];
        cluster.client.offer(args).await.unwrap();
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut admin = ClusterClient::new(channel).max_decoding_message_size(64 << 20);
    let unread = admin
        .save_snapshot(proto::SaveSnapshotRequest {})
        .await
        .unwrap()
        .into_inner();

    let second = admin
        .save_snapshot(proto::SaveSnapshotRequest {})
        .await
        .unwrap_err();
    assert_eq!(second.code(), tonic::Code::ResourceExhausted, "{second:?}");
    assert_eq!(detail_of(&second).unwrap().code, "OVERLOADED");

    // Once the first client goes away, the next save is served (and read to the end).
    drop(unread);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let saved = loop {
        match cluster.client.save_snapshot().await {
            Ok(saved) => break saved,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(saved.state.len() > 8_000_000, "{}", saved.state.len());
    cluster.stop().await;
}
