//! Claim: a command retried with the same `(client_id, seq)` after the leader that applied it
//! was SIGKILLed gets the original response from the new leader — a retried take returns the
//! winner's own handle, never `TAKEN` — while a genuinely new take (another client, or a new
//! seq) is refused `TAKEN` (contract §0 "retries are safe").
//!
//! Uses the raw gRPC client so the test, not the client library, controls the request header.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_cluster_test::{Cluster, Options};
use baton_rpc::error::detail_of;
use baton_rpc::proto::handoff_client::HandoffClient;
use baton_rpc::proto::{Handle, OfferRequest, RequestHeader, TakeRequest};
use tonic::transport::Channel;
use tonic::Code;

async fn raw(addr: &str) -> HandoffClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    HandoffClient::new(channel)
}

fn header(client_id: u64, seq: u64, acked_below: u64) -> Option<RequestHeader> {
    Some(RequestHeader {
        client_id,
        seq,
        acked_below,
        ..Default::default()
    })
}

fn take_request(client_id: u64, seq: u64, acked_below: u64) -> TakeRequest {
    TakeRequest {
        header: header(client_id, seq, acked_below),
        key: "t40-ticket".into(),
        to: "worker".into(),
    }
}

async fn take(
    client: &mut HandoffClient<Channel>,
    request: TakeRequest,
) -> Result<Handle, tonic::Status> {
    Ok(client.take(request).await?.into_inner().handle.unwrap())
}

/// The Baton code a status carries.
fn code_of(status: &tonic::Status) -> String {
    detail_of(status)
        .map(|d| d.code)
        .unwrap_or_else(|| format!("no detail ({status})"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_retried_take_after_leader_kill_returns_the_original_handle() {
    let mut cluster = Cluster::start(3, Options::default()).await.unwrap();
    let old_leader = cluster.leader().await.unwrap();
    let mut on_old = raw(cluster.addr(old_leader)).await;
    let client_id: u64 = rand::random();

    let offer = OfferRequest {
        header: header(client_id, 1, 1),
        key: "t40-ticket".into(),
        from: "source".into(),
        to: "worker".into(),
        payload: b"work".to_vec(),
        reply_to: "source".into(),
        ttl_ms: 600_000,
    };
    let ticket = on_old
        .offer(offer.clone())
        .await
        .unwrap()
        .into_inner()
        .ticket
        .unwrap();
    assert_eq!(ticket.generation, 1);
    // seq 2; the offer (seq 1) has been answered, so acked_below = 2.
    let original = take(&mut on_old, take_request(client_id, 2, 2))
        .await
        .unwrap();
    assert_eq!(original.fence, 1);
    let again = take(&mut on_old, take_request(client_id, 2, 2))
        .await
        .unwrap();
    assert_eq!(
        again, original,
        "a retry to the same leader returns the original handle"
    );

    cluster.kill(old_leader).unwrap();
    let new_leader = cluster.leader().await.unwrap();
    let mut on_new = raw(cluster.addr(new_leader)).await;

    let retried = take(&mut on_new, take_request(client_id, 2, 2))
        .await
        .unwrap();
    assert_eq!(
        retried, original,
        "the retried take (same client_id, seq 2) must return the original handle from the new leader"
    );

    // A follower does not apply the retry itself: it names the new leader.
    let follower = *cluster
        .live_ids()
        .iter()
        .find(|id| **id != new_leader)
        .unwrap();
    let mut on_follower = raw(cluster.addr(follower)).await;
    let follower_answer = match take(&mut on_follower, take_request(client_id, 2, 2)).await {
        Ok(handle) => {
            assert_eq!(
                handle, original,
                "a forwarded retry returns the original handle"
            );
            "forwarded it and returned the original handle"
        }
        Err(status) => {
            let detail = detail_of(&status)
                .unwrap_or_else(|| panic!("follower status without detail: {status}"));
            assert_eq!(detail.code, "NOT_LEADER", "{status}");
            assert_eq!(detail.leader_addr, cluster.addr(new_leader), "{status}");
            assert_eq!(detail.leader_id, new_leader, "{status}");
            "answered NOT_LEADER naming the new leader"
        }
    };

    // Another client's take is a new command: TAKEN.
    let other = take(&mut on_new, take_request(rand::random(), 1, 1))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::Aborted, "{other}");
    assert_eq!(code_of(&other), "TAKEN", "{other}");
    // So is the same client's take under a new seq.
    let new_seq = take(&mut on_new, take_request(client_id, 3, 3))
        .await
        .unwrap_err();
    assert_eq!(code_of(&new_seq), "TAKEN", "{new_seq}");
    // The offer (seq 1) was acknowledged (acked_below = 2): its answer is forgotten, and a
    // resend is told its outcome is unknown — an infrastructure answer, never a contract one.
    let forgotten = on_new.offer(offer).await.unwrap_err();
    assert_eq!(code_of(&forgotten), "SESSION_EXPIRED", "{forgotten}");

    println!(
        "t40: take (client {client_id:x}, seq 2) won fence {} on node {old_leader}; after SIGKILL the retry on \
         node {new_leader} returned the same token and fence; follower {follower} {follower_answer}; \
         other client and new seq got TAKEN; a forgotten seq got SESSION_EXPIRED",
        original.fence
    );
}

/// Claim: a client that knows only a follower reaches the leader through the follower's
/// `NOT_LEADER` answer, for writes and for linearizable reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t41_client_given_only_a_follower_follows_it_to_the_leader() {
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    let leader = cluster.leader().await.unwrap();
    let follower = *cluster.live_ids().iter().find(|id| **id != leader).unwrap();
    let client = baton_rpc::Client::connect_with(
        &[cluster.addr(follower)],
        baton_cluster_test::client_config(),
    )
    .await
    .unwrap();
    let ticket = client
        .offer(baton_statemachine::handoff::OfferArgs {
            key: "t41".into(),
            from: "source".into(),
            to: "worker".into(),
            payload: Vec::new(),
            reply_to: "source".into(),
            ttl_ms: 60_000,
        })
        .await
        .unwrap();
    let handle = client.take("t41", "worker").await.unwrap();
    assert_eq!(handle.fence, ticket.generation);
    let read = client.ticket("t41").await.unwrap();
    assert_eq!(read.holder.as_deref(), Some("worker"));
    println!("t41: a client given only follower {follower} offered, took and read through leader {leader}");
}
