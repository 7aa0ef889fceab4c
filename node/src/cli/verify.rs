//! `baton cluster verify`: do the members hold the same state? Raft applies one log on every
//! member, so members at one applied index must hold one state; a difference (a bug in an apply
//! rule, a damaged snapshot, members restored from different files) stays invisible to clients,
//! whose reads go through the leader, until the odd member leads. Each member reports its
//! applied index and a digest of its state there (`Cluster/StateDigest`); members that stand at
//! different indexes (writes going on) are asked again until they meet or the time is up.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_rpc::replicas::SeenDigests;
use baton_rpc::{Client, ClientConfig, Security};

use super::exit;

/// Asks the members for their digests until all were seen at one applied index, or `within`
/// passes. Exit 0: they agree; 1: two differ at one index; 3: the nodes refused the call (a
/// token) or belong to no cluster; 4: no common index was seen (a member did not answer, or
/// writes kept the indexes apart).
pub async fn verify(
    endpoints: &[String],
    config: ClientConfig,
    security: Security,
    within: Duration,
) -> u8 {
    let client = match Client::new_with_security(endpoints, config, security) {
        Ok(client) => client,
        Err(error) => return exit::report(&error),
    };
    let mut members = None;
    let mut uninitialized = Vec::new();
    // The first answer that was an error other than no answer (a refused token).
    let mut refused = None;
    for endpoint in client.endpoints() {
        match client.node_info(endpoint).await {
            Ok(info) if info.initialized => {
                members = Some(info.members);
                break;
            }
            Ok(_) => uninitialized.push(endpoint.clone()),
            Err(error) if !error.outcome_unknown() => {
                refused.get_or_insert(error);
            }
            Err(_) => {}
        }
    }
    let Some(members) = members else {
        // What the nodes said decides the exit: a refused token is not an outage to wait out
        // (exit 3, as for every command), nor are nodes that answered without a cluster.
        if let Some(error) = refused {
            return exit::report(&error);
        }
        if !uninitialized.is_empty() {
            eprintln!(
                "baton: {uninitialized:?} answered but belong to no cluster yet (`baton cluster \
                 init` forms one)"
            );
            return exit::REFUSED;
        }
        eprintln!("baton: no node at {endpoints:?} answered as a member of a cluster");
        return exit::UNREACHABLE;
    };
    let started = Instant::now();
    let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
    let mut seen = SeenDigests::default();
    let mut last_error = BTreeMap::new();
    loop {
        for member in &members {
            match client.state_digest(&member.addr).await {
                Ok(answer) => {
                    last_error.remove(&member.id);
                    seen.record(member.id, &answer);
                }
                Err(error) => {
                    last_error.insert(member.id, error.to_string());
                }
            }
        }
        if let Some((index, at)) = seen.disagreement() {
            for (id, digest) in at {
                out!("node {id}: applied {index} digest {digest}");
            }
            eprintln!(
                "baton: STATE MISMATCH: the members hold different states at applied index \
                 {index}. Clients read through the leader and see one of them; the others would \
                 answer differently once they lead. Keep their data dirs for a bug report, then \
                 replace the odd ones out as dead nodes (`baton members remove`, then `members \
                 add` under a new id with an empty data dir)"
            );
            return exit::FAILURE;
        }
        if let Some((index, digest)) = seen.common(&ids) {
            out!(
                "ok: {} members agree at applied index {index} (digest {digest})",
                members.len()
            );
            return exit::OK;
        }
        if started.elapsed() >= within {
            let missing: Vec<String> = last_error
                .iter()
                .map(|(id, error)| format!("node {id}: {error}"))
                .collect();
            eprintln!(
                "baton: the members were never all seen at one applied index within {within:?} \
                 (writes going on, or a member not answering{}); no difference was seen where two \
                 were",
                if missing.is_empty() {
                    String::new()
                } else {
                    format!(": {}", missing.join("; "))
                }
            );
            return exit::UNREACHABLE;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
