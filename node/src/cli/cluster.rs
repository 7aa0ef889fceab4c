//! `baton cluster init` and `baton status` (`baton cluster verify` is in [`super::verify`]).

use std::collections::BTreeMap;

use futures::future::join_all;

use baton_rpc::proto::NodeInfoResponse;
use baton_rpc::{Client, ClientConfig, Error, Security};
use clap::Subcommand;
use serde_json::json;

use super::exit;

/// `baton cluster ...`
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Form one cluster from the running nodes named by --endpoints (each reports its own id).
    Init,
    /// Check that the members hold the same state: each reports a digest of its state at its
    /// applied index, and members at one index must agree (exit 1 when two differ, 3 when the
    /// nodes refuse the call or belong to no cluster, 4 when they were never all seen at one
    /// index).
    Verify {
        /// How long to keep asking while writes keep the members' applied indexes apart.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
}

pub async fn run(
    command: ClusterCommand,
    endpoints: &[String],
    config: ClientConfig,
    security: Security,
) -> u8 {
    match command {
        ClusterCommand::Init => init(endpoints, config, security).await,
        ClusterCommand::Verify { timeout } => {
            super::verify::verify(endpoints, config, security, timeout).await
        }
    }
}

async fn init(endpoints: &[String], config: ClientConfig, security: Security) -> u8 {
    let client = match Client::new_with_security(endpoints, config, security) {
        Ok(client) => client,
        Err(error) => return exit::report(&error),
    };
    let mut members = Vec::new();
    for endpoint in client.endpoints() {
        match client.node_info(endpoint).await {
            Ok(info) if info.initialized => {
                eprintln!(
                    "ALREADY_INITIALIZED: node {} at {endpoint} already belongs to a cluster",
                    info.id
                );
                return exit::REFUSED;
            }
            Ok(info) => members.push((info.id, info.addr)),
            Err(error) => {
                // (A wrong token, say, is an answer: what it said follows.)
                let failed = match error {
                    Error::Unavailable { .. } => "did not answer",
                    _ => "refused to say who it is",
                };
                eprintln!("baton: node at {endpoint} {failed}");
                return exit::report(&error);
            }
        }
    }
    let mut ids: Vec<u64> = members.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() != members.len() {
        eprintln!("baton: two endpoints reported the same node id: {members:?}");
        return exit::USAGE;
    }
    if let Err(error) = client.initialize(&client.endpoints()[0], &members).await {
        return exit::report(&error);
    }
    match client.discover_leader().await {
        Ok(leader) => {
            let list: Vec<String> = members
                .iter()
                .map(|(id, addr)| format!("{id}={addr}"))
                .collect();
            out!("initialized cluster {}; leader at {leader}", list.join(","));
            super::members::warn_if_fragile(members.len());
            exit::OK
        }
        Err(error) => exit::report(&error),
    }
}

/// The node whose membership `status` lists: among the nodes that answered, the one in the
/// newest term — its leader if it answered, else the one that applied most — and on a tie the
/// first endpoint. A node removed from the cluster, or cut off from it (a deposed leader
/// included), knows an older membership. Only nodes of the cluster most of them name count (and
/// those in no cluster yet): a node of another cluster — or one that holds a log without an id
/// while others have one — knows another cluster's membership and term, however new.
fn membership_source(answered: &[NodeInfoResponse]) -> Option<&NodeInfoResponse> {
    // Initialized nodes without an id form a group of their own; nodes in no cluster yet (their
    // id, if any, is provisional), none.
    fn group(info: &NodeInfoResponse) -> Option<&str> {
        match info.cluster_id.as_str() {
            _ if !info.initialized => None,
            "" => Some(NO_CLUSTER_ID),
            cluster => Some(cluster),
        }
    }
    let named = |cluster: &str| {
        answered
            .iter()
            .filter(|info| group(info) == Some(cluster))
            .count()
    };
    let main = answered
        .iter()
        .filter_map(|info| group(info))
        .rev()
        .max_by_key(|cluster| (named(cluster), *cluster != NO_CLUSTER_ID));
    answered
        .iter()
        .filter(|info| main.is_none() || group(info) == main || !info.initialized)
        .rev()
        .max_by_key(|info| (info.term, info.role == "leader", info.applied_index))
}

/// `group on [ids], ...`: which nodes hold which cluster id (or restore fingerprint).
fn on_nodes(groups: &BTreeMap<&str, Vec<u64>>) -> String {
    groups
        .iter()
        .map(|(group, ids)| format!("{group} on {ids:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `status`'s line on the apply rules the `members` that answered apply commands by (the newest
/// any of them shows: a lagging member has not applied the adopting entry yet), and on newer
/// rules a build among them applies: waiting for the members whose builds do not (upgrade them)
/// or for the `unreachable` ones (the leader must hear from every member), or about to be
/// adopted. `None` before any member reports rules (versions before they were versioned).
fn rules_line(members: &[&NodeInfoResponse], unreachable: &[u64]) -> Option<String> {
    let in_force = members.iter().map(|info| info.apply_rules).max()?;
    let newest = members
        .iter()
        .map(|info| info.apply_rules_supported)
        .max()?;
    if newest == 0 {
        return None;
    }
    if newest <= in_force {
        return Some(format!("apply rules: {in_force}"));
    }
    let behind: Vec<u64> = members
        .iter()
        .filter(|info| info.apply_rules_supported < newest)
        .map(|info| info.id)
        .collect();
    let mut waiting = Vec::new();
    if !behind.is_empty() {
        waiting.push(format!(
            "until nodes {behind:?} run a build that applies them"
        ));
    }
    if !unreachable.is_empty() {
        waiting.push(format!("for unreachable nodes {unreachable:?}"));
    }
    Some(if waiting.is_empty() {
        format!("apply rules: {in_force} (adopting {newest})")
    } else {
        format!(
            "apply rules: {in_force} (rules {newest} wait {})",
            waiting.join(" and ")
        )
    })
}

/// How `status` names the group of initialized nodes that have no cluster id.
const NO_CLUSTER_ID: &str = "(no cluster id)";

/// What `baton status` was asked for.
pub struct StatusOptions {
    /// One JSON object instead of a table.
    pub json: bool,
    /// Exit 1 when no member leads.
    pub require_leader: bool,
}

pub async fn status(
    endpoints: &[String],
    config: ClientConfig,
    security: Security,
    options: StatusOptions,
) -> u8 {
    let as_json = options.json;
    let within = config.deadline;
    let client = match Client::new_with_security(endpoints, config, security) {
        Ok(client) => client,
        Err(error) => return exit::report(&error),
    };
    // Every endpoint is asked: the first to answer may be a node removed from the cluster or cut
    // off from it, which knows an older membership.
    // All at once, and the members below too: frozen nodes cost one probe (at most `--timeout`)
    // per round, not one each.
    let mut answered: Vec<NodeInfoResponse> = Vec::new();
    let mut silent: Vec<&String> = Vec::new();
    let mut last_error: Option<Error> = None;
    let asked = join_all(
        client
            .endpoints()
            .iter()
            .map(|e| super::probe(&client, e, within)),
    )
    .await;
    for (endpoint, reply) in client.endpoints().iter().zip(asked) {
        match reply {
            Ok(info) => answered.push(info),
            Err(error) => {
                silent.push(endpoint);
                last_error = Some(error);
            }
        }
    }
    let Some(source) = membership_source(&answered) else {
        let tried = client.endpoints().join(", ");
        // Nodes that answered with an error (a token refused, say) are not a cluster that is
        // down: say which it was.
        let error = match &last_error {
            Some(error) if !error.outcome_unknown() => {
                format!("no node gave a usable answer: {error}")
            }
            _ => "no node answered".to_string(),
        };
        if as_json {
            // A script reading stdout gets an answer it can parse, not an empty string.
            out!("{}", json!({ "error": error, "tried": client.endpoints() }));
        }
        eprintln!("baton: {error} (tried {tried})");
        return last_error
            .map(|e| exit::report(&e))
            .unwrap_or(exit::UNREACHABLE);
    };
    // Members come from the membership a node knows; a node not yet in a cluster lists itself.
    let addrs: Vec<(u64, String)> = if source.members.is_empty() {
        vec![(source.id, source.addr.clone())]
    } else {
        source
            .members
            .iter()
            .map(|m| (m.id, m.addr.clone()))
            .collect()
    };
    let initialized = source.initialized;
    let source_id = source.id;
    let source_cluster = source.cluster_id.clone();
    // An answer already had is reused only from that very member (id and address); an endpoint
    // that did not answer is not asked again.
    let client = &client;
    let infos = join_all(addrs.iter().map(|(id, addr)| {
        let known = answered
            .iter()
            .find(|info| info.id == *id && info.addr == *addr)
            .cloned();
        let silent = silent.contains(&addr);
        async move {
            match known {
                Some(info) => Some(info),
                None if silent => None,
                None => super::probe(client, addr, within).await.ok(),
            }
        }
    }))
    .await;
    let mut rows = Vec::new();
    for ((id, addr), info) in addrs.into_iter().zip(infos) {
        match info {
            Some(info) => rows.push((id, addr, info.role.clone(), Some(info))),
            None => rows.push((id, addr, "unreachable".to_string(), None)),
        }
    }
    // A leader cut off from the others still calls itself leader (in its older term) until it
    // hears of the newer one: only a claim in the highest term any member reports is the
    // leader (none while that term's election is still on); older claims are stale. Terms of
    // another cluster's nodes say nothing of this one's.
    let ours = |info: &&NodeInfoResponse| {
        source_cluster.is_empty() || info.cluster_id == source_cluster || !info.initialized
    };
    let newest_term = rows
        .iter()
        .filter_map(|(_, _, _, info)| info.as_ref())
        .filter(ours)
        .map(|info| info.term)
        .max()
        .unwrap_or(0);
    let mut leader = None;
    let mut stale = Vec::new();
    for info in rows
        .iter()
        .filter_map(|(_, _, _, info)| info.as_ref())
        .filter(ours)
    {
        if info.role == "leader" {
            if info.term == newest_term {
                leader = Some(info.id);
            } else {
                stale.push((info.term, info.id));
            }
        }
    }
    // The members of one cluster show one cluster id. Two mean that some belong to another
    // cluster (started on its data dir, or restored otherwise): the two sides refuse each
    // other's Raft requests.
    // Endpoints outside the membership listed count too: a node of another cluster may be one.
    let outsiders = answered.iter().filter(|info| {
        !rows
            .iter()
            .any(|(id, addr, _, _)| info.id == *id && info.addr == *addr)
    });
    let mut clusters: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut restores: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let listed: Vec<&NodeInfoResponse> = rows
        .iter()
        .filter_map(|(_, _, _, info)| info.as_ref())
        .chain(outsiders)
        .collect();
    let any_id = listed
        .iter()
        .any(|info| info.initialized && !info.cluster_id.is_empty());
    for info in &listed {
        // A node in a cluster without an id, next to nodes with one, refuses them and they it.
        // A node in no cluster yet holds at most a provisional id: the next invitation wins.
        let cluster = match info.cluster_id.as_str() {
            _ if !info.initialized => "",
            "" if any_id => NO_CLUSTER_ID,
            cluster => cluster,
        };
        for (groups, key) in [
            (&mut clusters, cluster),
            (&mut restores, info.restored_from.as_str()),
        ] {
            if !key.is_empty() {
                groups.entry(key).or_default().push(info.id);
            }
        }
    }
    // One node reached at two addresses counts once.
    for ids in clusters.values_mut().chain(restores.values_mut()) {
        ids.sort_unstable();
        ids.dedup();
    }
    let cluster_mismatch = clusters.len() > 1;
    // Members restored by builds before cluster ids have no id to compare: their fingerprints.
    let restore_mismatch = restores.len() > 1;
    if as_json {
        let members: Vec<_> = rows
            .iter()
            .map(|(id, addr, role, info)| {
                json!({
                    "id": id,
                    "addr": addr,
                    "role": role,
                    "term": info.as_ref().map(|i| i.term),
                    "last_log_index": info.as_ref().map(|i| i.last_log_index),
                    "applied_index": info.as_ref().map(|i| i.applied_index),
                    "watch_oldest_revision": info.as_ref().map(|i| i.watch_oldest_revision),
                    "watch_events": info.as_ref().map(|i| i.watch_events),
                    "watch_bytes": info.as_ref().map(|i| i.watch_bytes),
                    "watch_streams": info.as_ref().map(|i| i.watch_streams),
                    "version": info.as_ref().map(|i| i.version.as_str()).filter(|v| !v.is_empty()),
                    "restored_from": info.as_ref().map(|i| i.restored_from.as_str()).filter(|f| !f.is_empty()),
                    "cluster_id": info.as_ref().map(|i| i.cluster_id.as_str()).filter(|c| !c.is_empty()),
                    "apply_rules": info.as_ref().map(|i| i.apply_rules),
                    "apply_rules_supported": info.as_ref().map(|i| i.apply_rules_supported).filter(|r| *r > 0),
                })
            })
            .collect();
        let stale: Vec<u64> = stale.iter().map(|(_, id)| *id).collect();
        out!(
            "{}",
            json!({
                "leader": leader,
                "stale_leaders": stale,
                "members": members,
                "clusters": clusters,
                "cluster_mismatch": cluster_mismatch,
                "restore_mismatch": restore_mismatch,
            })
        );
    } else {
        out!(
            "{:<4} {:<22} {:<12} {:>6} {:>10} {:>10}  VERSION",
            "ID",
            "ADDR",
            "ROLE",
            "TERM",
            "LAST_LOG",
            "APPLIED"
        );
        for (id, addr, role, info) in &rows {
            let (term, last, applied, version) = info
                .as_ref()
                .map(|i| {
                    (
                        i.term.to_string(),
                        i.last_log_index.to_string(),
                        i.applied_index.to_string(),
                        // Older versions do not say.
                        if i.version.is_empty() {
                            "-".to_string()
                        } else {
                            i.version.clone()
                        },
                    )
                })
                .unwrap_or_else(|| ("-".into(), "-".into(), "-".into(), "-".into()));
            out!("{id:<4} {addr:<22} {role:<12} {term:>6} {last:>10} {applied:>10}  {version}");
        }
        match leader {
            Some(id) => out!("leader: node {id}"),
            None => out!("leader: none"),
        }
        if !initialized {
            out!(
                "node {source_id} is not in a cluster yet: form a new one with `baton cluster \
                 init --endpoints <every node's host:port>`, or, to add it to a running cluster, \
                 `baton members add` at that cluster"
            );
        }
        for (term, id) in stale {
            out!(
                "stale leader: node {id} still claims term {term}'s leadership (cut off from the \
                 others?)"
            );
        }
        for (fingerprint, ids) in &restores {
            out!("restored: fingerprint {fingerprint} on nodes {ids:?}");
        }
        if let [(id, _)] = clusters.iter().collect::<Vec<_>>()[..] {
            out!("cluster: {id}");
        }
        let members: Vec<&NodeInfoResponse> = rows
            .iter()
            .filter_map(|(_, _, _, info)| info.as_ref())
            .filter(ours)
            .collect();
        let unreachable: Vec<u64> = rows
            .iter()
            .filter(|(_, _, _, info)| info.is_none())
            .map(|(id, _, _, _)| *id)
            .collect();
        if let Some(line) = rules_line(&members, &unreachable) {
            out!("{line}");
        }
    }
    if cluster_mismatch {
        eprintln!(
            "baton: CLUSTER MISMATCH: these nodes belong to different clusters ({}) and refuse \
             each other's Raft requests. A node was started on another cluster's data dir, or the \
             members were restored from different backups or with different --members or \
             --raise-fences. Stop the odd ones out; replace each as a dead node (`baton members \
             remove`, then `members add` under a new id with an empty data dir), or restore every \
             member from one file with the same options (docs/operations.md, \"Cluster ids\")",
            on_nodes(&clusters)
        );
        return exit::FAILURE;
    }
    if restore_mismatch {
        eprintln!(
            "baton: RESTORE MISMATCH: these members were restored from different backups, or \
             with different --members or --raise-fences ({}); their states differ at the same log \
             position. Stop them and restore every member from one file with the same options \
             (docs/backup.md)",
            on_nodes(&restores)
        );
        return exit::FAILURE;
    }
    if options.require_leader && leader.is_none() {
        eprintln!(
            "baton: no member leads (an election is on, no quorum is reachable, or the cluster is \
             not formed yet)"
        );
        return exit::FAILURE;
    }
    exit::OK
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64, role: &str, term: u64, applied_index: u64) -> NodeInfoResponse {
        NodeInfoResponse {
            id,
            role: role.into(),
            term,
            applied_index,
            ..NodeInfoResponse::default()
        }
    }

    #[test]
    fn the_membership_listed_is_the_newest_leaders() {
        // Node 4 was removed (it still answers; pre-votes keep it from raising its term), node 2
        // is a leader cut off in an older term, node 1 leads now.
        let answered = [
            info(4, "follower", 8, 600),
            info(2, "leader", 7, 500),
            info(1, "leader", 8, 800),
            info(3, "follower", 8, 800),
        ];
        assert_eq!(membership_source(&answered).map(|i| i.id), Some(1));
        // The leader did not answer: a follower in its term, not the deposed leader.
        let answered = [info(2, "leader", 7, 500), info(3, "follower", 8, 800)];
        assert_eq!(membership_source(&answered).map(|i| i.id), Some(3));
        // No leader (an election is on): the node furthest on.
        let answered = [info(2, "candidate", 8, 700), info(3, "follower", 8, 800)];
        assert_eq!(membership_source(&answered).map(|i| i.id), Some(3));
        // Nodes in no cluster yet: the first endpoint.
        let answered = [info(5, "learner", 0, 0), info(6, "learner", 0, 0)];
        assert_eq!(membership_source(&answered).map(|i| i.id), Some(5));
        assert!(membership_source(&[]).is_none());
    }

    #[test]
    fn a_node_of_another_cluster_does_not_give_the_membership() {
        let of = |cluster: &str, info: NodeInfoResponse| NodeInfoResponse {
            cluster_id: cluster.into(),
            initialized: info.term > 0,
            ..info
        };
        // Node 3 runs on an earlier cluster's data dir: a higher term, another id.
        let answered = [
            of("bb", info(3, "candidate", 40, 900)),
            of("aa", info(1, "leader", 8, 800)),
            of("aa", info(2, "follower", 8, 800)),
        ];
        assert_eq!(membership_source(&answered).map(|i| i.id), Some(1));
        // One each: the first endpoint's cluster. A node in no cluster yet counts with any.
        let answered = [
            of("aa", info(1, "follower", 8, 800)),
            of("", info(4, "learner", 0, 0)),
            of("bb", info(3, "leader", 40, 900)),
        ];
        assert_eq!(membership_source(&answered).map(|i| i.id), Some(1));
        // Nodes holding a log without an id are a group of their own: the smaller one on a
        // tie with a named cluster, the main one when they are more (a cluster formed before
        // ids, and a node of another cluster started among them).
        let answered = [
            of("", info(3, "leader", 40, 900)),
            of("aa", info(1, "leader", 8, 800)),
        ];
        assert_eq!(membership_source(&answered).map(|i| i.id), Some(1));
        let answered = [
            of("bb", info(3, "leader", 40, 900)),
            of("", info(1, "leader", 8, 800)),
            of("", info(2, "follower", 8, 800)),
        ];
        assert_eq!(membership_source(&answered).map(|i| i.id), Some(1));
    }

    #[test]
    fn status_says_which_rules_apply_and_who_holds_newer_ones_back() {
        let member = |id, apply_rules, apply_rules_supported| NodeInfoResponse {
            id,
            apply_rules,
            apply_rules_supported,
            ..NodeInfoResponse::default()
        };
        let line =
            |members: &[NodeInfoResponse]| rules_line(&members.iter().collect::<Vec<_>>(), &[]);
        // Every member from before versioned rules: nothing to say.
        assert_eq!(line(&[member(1, 0, 0), member(2, 0, 0)]), None);
        assert_eq!(
            line(&[member(1, 1, 1), member(2, 1, 1), member(3, 0, 1)]).as_deref(),
            Some("apply rules: 1")
        );
        assert_eq!(
            line(&[member(1, 0, 1), member(2, 0, 0), member(3, 0, 1)]).as_deref(),
            Some("apply rules: 0 (rules 1 wait until nodes [2] run a build that applies them)")
        );
        assert_eq!(
            line(&[member(1, 0, 1), member(2, 0, 1)]).as_deref(),
            Some("apply rules: 0 (adopting 1)")
        );
        // A member that did not answer holds the adoption back too.
        let answered = [member(1, 0, 1), member(2, 0, 1)];
        assert_eq!(
            rules_line(&answered.iter().collect::<Vec<_>>(), &[3]).as_deref(),
            Some("apply rules: 0 (rules 1 wait for unreachable nodes [3])")
        );
        let answered = [member(1, 0, 1), member(2, 0, 0)];
        assert_eq!(
            rules_line(&answered.iter().collect::<Vec<_>>(), &[3]).as_deref(),
            Some(
                "apply rules: 0 (rules 1 wait until nodes [2] run a build that applies them and \
                 for unreachable nodes [3])"
            )
        );
    }
}
