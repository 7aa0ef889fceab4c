//! The nemesis: injects one scenario's faults into a running cluster while the workloads run,
//! then undoes every fault it left in place.
//!
//! Faults are real: SIGKILL and restart from the data dir, SIGSTOP/SIGCONT, cut or slowed TCP
//! proxies between nodes ([`crate::proxy`]), membership changes through the admin API. The
//! nemesis never asks a node to misbehave. The faults aimed at the leader ([`LeaderFault`]) and
//! the recovery work on any [`Target`], containers included; the others need node processes.
//!
//! When the leader is paused or isolated, the nemesis also probes it: once a new leader was
//! elected on the other side and acknowledged a fresh ticket, it sends reads and writes straight
//! to the old leader (raw gRPC, no redirects, no retries) and records every answer in the history.
//! The old leader must neither serve a stale read nor acknowledge a write it cannot commit; the
//! linearizability checker judges its answers like any other.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use baton_rpc::convert::{handle_from_proto, ticket_from_proto};
use baton_rpc::error::{detail_of, infra, refusal_of};
use baton_rpc::proto::handoff_client::HandoffClient;
use baton_rpc::proto::{GetTicketRequest, OfferRequest, RequestHeader, TakeRequest};
use baton_rpc::Client;
use rand::rngs::StdRng;
use rand::Rng;
use tonic::transport::{Channel, Endpoint};

use super::handoff::{self, FROM, TO, TTL_MS};
use super::history::{Input, Outcome, Output, Recorder};
use super::target::Target;
use super::Scenario;
use crate::cluster::{client_config, Cluster};

/// How long a probe of a paused or isolated old leader may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(8);
/// How long the majority side may take to elect a new leader.
const ELECTION_LIMIT: Duration = Duration::from_secs(20);

/// A fault aimed at the current leader, the kind every [`Target`] can inflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderFault {
    /// Kill the leader (SIGKILL) and restart it from its data ([`Scenario::LeaderKill`]).
    Kill,
    /// Freeze the leader past the election timeout, probe it, let it go on
    /// ([`Scenario::LeaderPause`]).
    Pause,
    /// Cut the leader off from its peers, probe it, heal ([`Scenario::IsolateLeader`]).
    Isolate,
}

/// Injects faults and remembers what it did.
pub struct Nemesis {
    rec: Recorder,
    rng: StdRng,
    /// Faults injected.
    pub faults: usize,
    /// What happened when, for the report.
    pub log: Vec<String>,
    /// Ticket keys the probes used (read again after recovery).
    pub probe_keys: Vec<String>,
    /// The ticket keys the workload uses, for stale-read probes.
    tickets: Vec<String>,
    paused: BTreeSet<u64>,
    /// Rounds so far of each scenario whose kinds of fault take turns ([`Nemesis::turn`]).
    turns: BTreeMap<Scenario, usize>,
    voters: BTreeSet<u64>,
    initial: BTreeSet<u64>,
}

impl Nemesis {
    /// A nemesis recording into `rec`, drawing its choices from `rng`.
    pub fn new(rec: Recorder, rng: StdRng, tickets: &[String], voters: BTreeSet<u64>) -> Self {
        Nemesis {
            rec,
            rng,
            faults: 0,
            log: Vec::new(),
            probe_keys: Vec::new(),
            tickets: tickets.to_vec(),
            paused: BTreeSet::new(),
            turns: BTreeMap::new(),
            initial: voters.clone(),
            voters,
        }
    }

    fn note(&mut self, text: String) {
        let now = self.rec.clock().now();
        self.log.push(format!(
            "{}.{:03}s {text}",
            now / 1_000_000,
            (now / 1_000) % 1_000
        ));
    }

    async fn sleep_between(&mut self, low_ms: u64, high_ms: u64) {
        let ms = self.rng.random_range(low_ms..=high_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// Which of `scenario`'s kinds of fault this round injects: they take turns.
    fn turn(&mut self, scenario: Scenario) -> usize {
        let rounds = self.turns.entry(scenario).or_default();
        let turn = *rounds % turns_of(scenario).max(1);
        *rounds += 1;
        turn
    }

    /// How many rounds of `scenario` ran so far.
    fn rounds(&self, scenario: Scenario) -> usize {
        self.turns.get(&scenario).copied().unwrap_or(0)
    }

    /// The cluster as a round of link faults finds it, after a pause of 1–2 s.
    async fn link_round(&mut self, cluster: &Cluster) -> anyhow::Result<LinkRound> {
        self.sleep_between(1_000, 2_000).await;
        let leader = cluster.leader().await?;
        let term = cluster.node_info(leader).await?.term;
        let nodes: Vec<u64> = cluster.network()?.nodes().into_iter().collect();
        let followers = nodes.iter().copied().filter(|id| *id != leader).collect();
        Ok(LinkRound {
            leader,
            term,
            nodes,
            followers,
        })
    }

    /// Runs `scenario`'s faults for about `duration` (the fault in progress is finished).
    pub async fn run(
        &mut self,
        scenario: Scenario,
        cluster: &mut Cluster,
        duration: Duration,
    ) -> anyhow::Result<()> {
        let until = Instant::now() + duration;
        // A scenario whose kinds of fault take turns runs each at least once.
        while Instant::now() < until || self.rounds(scenario) < turns_of(scenario) {
            match scenario {
                Scenario::LeaderKill => self.leader_kill(cluster).await?,
                Scenario::FollowerKill => self.follower_kill(cluster).await?,
                Scenario::RestartAll => self.restart_all(cluster).await?,
                Scenario::LeaderPause => self.leader_pause(cluster).await?,
                Scenario::IsolateLeader => self.isolate_leader(cluster).await?,
                Scenario::IsolateFollower => self.isolate_follower(cluster).await?,
                Scenario::Split => self.split(cluster).await?,
                Scenario::OneWay => self.one_way(cluster).await?,
                Scenario::SlowLinks => self.slow_links(cluster).await?,
                Scenario::Membership => self.membership(cluster).await?,
                Scenario::Mixed => self.mixed(cluster).await?,
            }
        }
        Ok(())
    }

    /// Runs `faults` in turn, one per round, for about `duration` and at least once each (the
    /// fault in progress is finished).
    pub async fn run_leader_faults<T: Target>(
        &mut self,
        faults: &[LeaderFault],
        cluster: &mut T,
        duration: Duration,
    ) -> anyhow::Result<()> {
        let until = Instant::now() + duration;
        for (round, fault) in faults.iter().cycle().enumerate() {
            if round >= faults.len() && Instant::now() >= until {
                break;
            }
            match fault {
                LeaderFault::Kill => self.leader_kill(cluster).await?,
                LeaderFault::Pause => self.leader_pause(cluster).await?,
                LeaderFault::Isolate => self.isolate_leader(cluster).await?,
            }
        }
        Ok(())
    }

    /// Undoes every fault: heals the network, resumes paused nodes, restarts killed members,
    /// and waits until they agree on a leader and have caught up.
    pub async fn recover<T: Target>(&mut self, cluster: &mut T) -> anyhow::Result<()> {
        cluster.heal_all().await?;
        for id in std::mem::take(&mut self.paused) {
            cluster.resume(id).await?;
        }
        let running: BTreeSet<u64> = cluster.live_ids().into_iter().collect();
        for id in cluster.ids() {
            if !running.contains(&id) {
                cluster.restart(id).await?;
            }
        }
        self.note("recovery: network healed, every node running".into());
        cluster.leader().await?;
        cluster.wait_all_caught_up().await?;
        for id in cluster.live_ids() {
            let info = cluster.node_info(id).await?;
            self.note(format!(
                "node {id}: {} at term {}, applied {}, snapshot at {}",
                info.role, info.term, info.applied_index, info.snapshot_index
            ));
        }
        Ok(())
    }

    /// One fault of a kind chosen at random (membership changes excepted: they outlive the
    /// round and would leave the proxies guarding removed nodes).
    async fn mixed(&mut self, cluster: &mut Cluster) -> anyhow::Result<()> {
        match self.rng.random_range(0..9) {
            0 => self.leader_kill(cluster).await,
            1 => self.follower_kill(cluster).await,
            2 => self.restart_all(cluster).await,
            3 => self.leader_pause(cluster).await,
            4 => self.isolate_leader(cluster).await,
            5 => self.isolate_follower(cluster).await,
            6 => self.one_way(cluster).await,
            7 => self.slow_links(cluster).await,
            8 => {
                self.split(cluster).await?;
                cluster.network()?.heal_all();
                Ok(())
            }
            _ => unreachable!("mixed draws one of nine faults"),
        }
    }

    async fn leader_kill<T: Target>(&mut self, cluster: &mut T) -> anyhow::Result<()> {
        self.sleep_between(1_000, 2_500).await;
        let leader = cluster.leader().await?;
        let (kill, restart) = cluster.fault_words(LeaderFault::Kill);
        cluster.kill(leader).await?;
        self.faults += 1;
        self.note(format!("{kill} leader {leader}"));
        self.sleep_between(300, 2_000).await;
        cluster.restart(leader).await?;
        self.note(format!("{restart} node {leader}"));
        self.read_first(cluster).await?;
        Ok(())
    }

    /// The leader and a random live follower (an error, not a panic, when none is running).
    async fn leader_and_follower(&mut self, cluster: &Cluster) -> anyhow::Result<(u64, u64)> {
        let leader = cluster.leader().await?;
        let followers: Vec<u64> = cluster
            .live_ids()
            .into_iter()
            .filter(|id| *id != leader)
            .collect();
        anyhow::ensure!(
            !followers.is_empty(),
            "no follower of leader {leader} is running"
        );
        Ok((leader, followers[self.rng.random_range(0..followers.len())]))
    }

    async fn follower_kill(&mut self, cluster: &mut Cluster) -> anyhow::Result<()> {
        self.sleep_between(1_000, 2_500).await;
        let (leader, victim) = self.leader_and_follower(cluster).await?;
        let cut = cluster.lose_power_of(victim).await?;
        self.faults += 1;
        self.note(match cut {
            Some(cut) => {
                format!("power loss of follower {victim} (leader {leader}): SIGKILL, then {cut}")
            }
            None => format!("SIGKILL follower {victim} (leader {leader})"),
        });
        self.sleep_between(500, 3_000).await;
        cluster.restart(victim).await?;
        self.note(format!("restarted node {victim}"));
        Ok(())
    }

    async fn restart_all(&mut self, cluster: &mut Cluster) -> anyhow::Result<()> {
        self.sleep_between(1_500, 3_000).await;
        let (killed, note) = if cluster.can_lose_power() {
            let (killed, cut) = cluster.lose_power().await?;
            let note = format!("power loss of every node {killed:?}: SIGKILL, then {cut}");
            (killed, note)
        } else {
            let killed = cluster.kill_all()?;
            let note = format!("SIGKILL every node {killed:?}");
            (killed, note)
        };
        self.faults += 1;
        self.note(note);
        self.sleep_between(200, 1_500).await;
        cluster.restart_all(&killed).await?;
        self.note(format!("restarted every node {killed:?}"));
        self.read_first(cluster).await?;
        let leader = cluster.leader().await?;
        self.note(format!("node {leader} leads after the full restart"));
        Ok(())
    }

    async fn leader_pause<T: Target>(&mut self, cluster: &mut T) -> anyhow::Result<()> {
        self.sleep_between(1_000, 2_000).await;
        let leader = cluster.leader().await?;
        let term = cluster.node_info(leader).await?.term;
        let hold = Duration::from_millis(self.rng.random_range(2_000..=4_000));
        let (pause, resume) = cluster.fault_words(LeaderFault::Pause);
        let paused_at = Instant::now();
        cluster.pause(leader).await?;
        self.paused.insert(leader);
        self.faults += 1;
        self.note(format!(
            "{pause} leader {leader} (term {term}) for {hold:?}"
        ));
        let probes = self.probe_old_leader(cluster, leader, term).await?;
        tokio::time::sleep(hold.saturating_sub(paused_at.elapsed())).await;
        cluster.resume(leader).await?;
        self.paused.remove(&leader);
        self.note(format!("{resume} node {leader}"));
        self.finish_probes(probes).await;
        self.sleep_between(500, 1_000).await;
        Ok(())
    }

    async fn isolate_leader<T: Target>(&mut self, cluster: &mut T) -> anyhow::Result<()> {
        self.sleep_between(1_000, 2_000).await;
        let leader = cluster.leader().await?;
        let term = cluster.node_info(leader).await?.term;
        let hold = Duration::from_millis(self.rng.random_range(2_000..=4_000));
        let (isolate, heal) = cluster.fault_words(LeaderFault::Isolate);
        let cut_at = Instant::now();
        cluster.isolate(leader).await?;
        self.faults += 1;
        self.note(format!(
            "{isolate} leader {leader} (term {term}) for {hold:?}"
        ));
        let probes = self.probe_old_leader(cluster, leader, term).await?;
        tokio::time::sleep(hold.saturating_sub(cut_at.elapsed())).await;
        cluster.heal_all().await?;
        self.note(heal.into());
        self.finish_probes(probes).await;
        self.sleep_between(500, 1_000).await;
        Ok(())
    }

    async fn isolate_follower(&mut self, cluster: &mut Cluster) -> anyhow::Result<()> {
        self.sleep_between(1_000, 2_000).await;
        let (leader, victim) = self.leader_and_follower(cluster).await?;
        cluster.network()?.isolate(victim);
        self.faults += 1;
        self.note(format!("isolate follower {victim} (leader {leader})"));
        self.sleep_between(1_500, 4_000).await;
        cluster.network()?.heal_all();
        self.note("heal".into());
        self.sleep_between(300, 1_000).await;
        Ok(())
    }

    /// Rolling 1|2 splits: a random node (leader or not) alone against the other two, sometimes
    /// moving straight to the next split without healing in between.
    async fn split(&mut self, cluster: &mut Cluster) -> anyhow::Result<()> {
        self.sleep_between(500, 1_500).await;
        let nodes: Vec<u64> = cluster.network()?.nodes().into_iter().collect();
        let alone = nodes[self.rng.random_range(0..nodes.len())];
        let rest: Vec<u64> = nodes.iter().copied().filter(|id| *id != alone).collect();
        cluster.network()?.partition(&[vec![alone], rest.clone()]);
        self.faults += 1;
        self.note(format!("split {alone} | {rest:?}"));
        self.sleep_between(1_500, 3_000).await;
        if self.rng.random_bool(0.5) {
            cluster.network()?.heal_all();
            self.note("heal".into());
        }
        Ok(())
    }

    /// Link faults a clean partition cannot make, one per round and taking turns, healed after
    /// 1.5–4 s:
    ///
    /// - **the leader's outgoing links**: its followers' requests (and the leader's answers to
    ///   them) still get through, but nothing the leader starts (entries, heartbeats) arrives.
    ///   The followers stop hearing from it, elect a new leader among themselves, and that
    ///   leader's messages depose the old one. The old leader is probed as in
    ///   [`Scenario::IsolateLeader`], though by then it usually knows it was deposed.
    /// - **the leader and one follower cut off from each other** (both ways) while the third
    ///   node still reaches both: the follower cut off asks for pre-votes and gets no yes, because
    ///   the third node still hears from the leader.
    /// - **each directed link cut with probability 1/3** (at least one): any mix of the above,
    ///   with or without a connected quorum.
    async fn one_way(&mut self, cluster: &mut Cluster) -> anyhow::Result<()> {
        let LinkRound {
            leader,
            term,
            nodes,
            followers,
        } = self.link_round(cluster).await?;
        let hold = Duration::from_millis(self.rng.random_range(1_500..=4_000));
        let cut_at = Instant::now();
        let mut probes = Vec::new();
        match self.turn(Scenario::OneWay) {
            0 => {
                for follower in &followers {
                    cluster.network()?.cut(leader, *follower);
                }
                self.faults += 1;
                self.note(format!(
                    "cut the outgoing links of leader {leader} (term {term}) for {hold:?}; \
                     it still hears {followers:?}"
                ));
                probes = self.probe_old_leader(cluster, leader, term).await?;
            }
            1 => {
                let victim = followers[self.rng.random_range(0..followers.len())];
                cluster.network()?.cut(leader, victim);
                cluster.network()?.cut(victim, leader);
                self.faults += 1;
                self.note(format!(
                    "cut leader {leader} (term {term}) and follower {victim} off from each \
                     other for {hold:?}; the third node reaches both"
                ));
            }
            _ => {
                while cluster.network()?.cut_links().is_empty() {
                    for from in &nodes {
                        for to in nodes.iter().filter(|to| *to != from) {
                            if self.rng.random_bool(1.0 / 3.0) {
                                cluster.network()?.cut(*from, *to);
                            }
                        }
                    }
                }
                self.faults += 1;
                let cut = cluster.network()?.cut_links();
                self.note(format!(
                    "cut the links {cut:?} for {hold:?} (leader {leader}, term {term})"
                ));
            }
        }
        tokio::time::sleep(hold.saturating_sub(cut_at.elapsed())).await;
        let views = roles(cluster).await;
        cluster.network()?.heal_all();
        self.note(format!("heal (before healing: {views})"));
        self.finish_probes(probes).await;
        self.sleep_between(300, 1_000).await;
        Ok(())
    }

    /// Slow links instead of cut ones, one kind per round and taking turns, for 2–4 s; every byte
    /// a slowed link carries is held for the link's delay, each way (order kept, nothing lost).
    /// The nodes' heartbeat (50 ms) is also openraft 0.9's deadline for an AppendEntries to be
    /// answered:
    ///
    /// - **every link 2–15 ms each way**: round trips (plus a follower's sync) should stay within
    ///   that deadline, as in a cluster spread over nearby sites; everything keeps working, only
    ///   slower.
    /// - **one follower's links 60–300 ms each way**: its AppendEntries time out, although they
    ///   arrive; the leader commits with the other follower, and the slow one catches up after.
    /// - **the leader's links 60–300 ms each way**: nothing it sends is answered in time, so it
    ///   commits nothing, although its followers still hear from it; they judge it stalled after
    ///   two leases (`node/src/stalled_leader.rs`) and elect one of themselves, usually before
    ///   the links are fast again. Either way the cluster must serve again once they are.
    async fn slow_links(&mut self, cluster: &mut Cluster) -> anyhow::Result<()> {
        let LinkRound {
            leader,
            term,
            nodes,
            followers,
        } = self.link_round(cluster).await?;
        let hold = Duration::from_millis(self.rng.random_range(2_000..=4_000));
        let (slowed, delay) = match self.turn(Scenario::SlowLinks) {
            0 => (None, self.rng.random_range(2..=15)),
            1 => (
                Some(followers[self.rng.random_range(0..followers.len())]),
                self.rng.random_range(60..=300),
            ),
            _ => (Some(leader), self.rng.random_range(60..=300)),
        };
        let delay = Duration::from_millis(delay);
        for from in &nodes {
            for to in nodes.iter().filter(|to| *to != from) {
                if slowed.is_none_or(|id| id == *from || id == *to) {
                    cluster.network()?.slow(*from, *to, delay);
                }
            }
        }
        self.faults += 1;
        let links = cluster.network()?.slow_links();
        self.note(format!(
            "slowed {} for {hold:?} (leader {leader}, term {term}): {links:?}",
            match slowed {
                None => "every link".to_string(),
                Some(id) if id == leader => format!("the links of leader {id}"),
                Some(id) => format!("the links of follower {id}"),
            }
        ));
        tokio::time::sleep(hold).await;
        let views = roles(cluster).await;
        cluster.network()?.heal_all();
        self.note(format!("links fast again (before: {views})"));
        self.sleep_between(300, 1_000).await;
        Ok(())
    }

    /// Adds the next node as a learner, promotes it, removes a random old voter (maybe the
    /// leader), and stops the removed node.
    async fn membership(&mut self, cluster: &mut Cluster) -> anyhow::Result<()> {
        self.sleep_between(1_000, 2_000).await;
        let admin = self.admin(cluster).await?;
        let new = cluster.add_node().await?;
        let addr = cluster.addr(new).to_string();
        self.note(format!("started node {new} at {addr}"));
        retry("add learner", || admin.add_learner(new, &addr)).await?;
        self.faults += 1;
        self.note(format!("node {new} added as a learner (caught up)"));
        retry("promote", || admin.promote_member(new)).await?;
        self.voters.insert(new);
        self.faults += 1;
        self.note(format!("voters {:?}", self.voters));
        self.sleep_between(1_000, 2_000).await;
        // Clients know only the first nodes' addresses: keep one of them a voter.
        let first: Vec<u64> = self
            .voters
            .iter()
            .copied()
            .filter(|id| self.initial.contains(id))
            .collect();
        let old: Vec<u64> = self
            .voters
            .iter()
            .copied()
            .filter(|id| *id != new && !(first.len() == 1 && first.contains(id)))
            .collect();
        let leader = current_leader(cluster, &self.voters).await;
        let victim = match leader {
            Some(leader) if old.contains(&leader) && self.rng.random_bool(0.5) => leader,
            _ => {
                let followers: Vec<u64> = old
                    .iter()
                    .copied()
                    .filter(|id| Some(*id) != leader)
                    .collect();
                let pool = if followers.is_empty() {
                    &old
                } else {
                    &followers
                };
                pool[self.rng.random_range(0..pool.len())]
            }
        };
        let role = if Some(victim) == leader {
            "the leader"
        } else {
            "a follower"
        };
        retry("remove", || admin.remove_member(victim)).await?;
        self.voters.remove(&victim);
        self.faults += 1;
        self.note(format!(
            "removed node {victim} ({role}): voters {:?}",
            self.voters
        ));
        self.sleep_between(300, 800).await;
        cluster.remove_node(victim)?;
        self.note(format!("stopped removed node {victim}"));
        Ok(())
    }

    /// Reads every workload ticket at once, right after a restart, racing the workload's own
    /// (backing-off) retries to be among the first requests a new leader serves: a leader that
    /// answered reads before it knew everything committed before the crash would show it here.
    async fn read_first<T: Target>(&mut self, cluster: &T) -> anyhow::Result<()> {
        let client = Client::new(&cluster.endpoints(), client_config())?;
        let reads = self
            .tickets
            .iter()
            .map(|key| handoff::read(&self.rec, &client, "nemesis", key));
        futures::future::join_all(reads).await;
        self.note(format!(
            "read {} tickets right after the restart",
            self.tickets.len()
        ));
        Ok(())
    }

    /// A client for membership calls, knowing the current voters.
    async fn admin(&self, cluster: &Cluster) -> anyhow::Result<Client> {
        let endpoints: Vec<String> = self
            .voters
            .iter()
            .map(|id| cluster.addr(*id).to_string())
            .collect();
        Ok(Client::connect_with(&endpoints, client_config()).await?)
    }

    /// With `old` (leader at `term`) cut off: waits for a new leader on the other side, has it
    /// acknowledge a fresh ticket, then sends probes to `old`. Returns the probes in flight.
    async fn probe_old_leader<T: Target>(
        &mut self,
        cluster: &T,
        old: u64,
        term: u64,
    ) -> anyhow::Result<Vec<tokio::task::JoinHandle<String>>> {
        let others: Vec<u64> = cluster
            .live_ids()
            .into_iter()
            .filter(|id| *id != old)
            .collect();
        let new = cluster.new_leader(&others, term, ELECTION_LIMIT).await?;
        self.note(format!("node {new} leads the other side"));
        let key = format!("probe-{}", self.probe_keys.len() / 2);
        let written = format!("{key}-via-old-leader");
        self.probe_keys.push(key.clone());
        self.probe_keys.push(written.clone());
        let endpoints: Vec<String> = others.iter().map(|id| cluster.addr(*id)).collect();
        let majority = Client::connect_with(&endpoints, client_config()).await?;
        let offered = handoff::offer(&self.rec, &majority, "nemesis", &key).await;
        self.note(format!(
            "offered {key} through the new side: {}",
            offered.map_or("no answer".to_string(), |t| format!(
                "generation {}",
                t.generation
            ))
        ));
        let channel = Endpoint::from_shared(format!("http://{}", cluster.addr(old)))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(PROBE_TIMEOUT)
            .connect_lazy();
        let client = format!("old-leader-{old}");
        let mut probes = Vec::new();
        for probe in [
            Probe::Read(key.clone()),
            Probe::Read(self.tickets[0].clone()),
            Probe::Take(key.clone()),
            Probe::Offer(written),
        ] {
            let rec = self.rec.clone();
            let channel = channel.clone();
            let client = client.clone();
            probes.push(tokio::spawn(async move {
                probe.send(&rec, &client, channel).await
            }));
        }
        self.note(format!("sent 4 probes to old leader {old}"));
        Ok(probes)
    }

    async fn finish_probes(&mut self, probes: Vec<tokio::task::JoinHandle<String>>) {
        for probe in probes {
            let line = match tokio::time::timeout(PROBE_TIMEOUT * 2, probe).await {
                Ok(Ok(line)) => line,
                Ok(Err(error)) => format!("probe task failed: {error}"),
                Err(_) => "probe did not finish".into(),
            };
            self.note(format!("probe: {line}"));
        }
    }
}

/// Where a round of link faults starts: the leader, its term, every node and the followers.
struct LinkRound {
    leader: u64,
    term: u64,
    nodes: Vec<u64>,
    followers: Vec<u64>,
}

/// How many kinds of fault `scenario` has that take turns (0: it has no turns).
fn turns_of(scenario: Scenario) -> usize {
    match scenario {
        Scenario::OneWay | Scenario::SlowLinks => 3,
        _ => 0,
    }
}

/// Each running node's role and term as it sees them now (one attempt each), for the fault log.
async fn roles<T: Target>(cluster: &T) -> String {
    let mut views = Vec::new();
    for id in cluster.live_ids() {
        views.push(match cluster.node_info(id).await {
            Ok(info) => format!("node {id} {} at term {}", info.role, info.term),
            Err(error) => format!("node {id} did not answer: {error}"),
        });
    }
    views.join(", ")
}

/// Runs an admin call, retrying infrastructure failures a few times.
async fn retry<T, F, Fut>(what: &str, call: F) -> anyhow::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, baton_rpc::Error>>,
{
    let mut last = None;
    for _ in 0..5 {
        match call().await {
            Ok(value) => return Ok(value),
            Err(error) => last = Some(error),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last.map_or_else(|| anyhow::anyhow!("{what} failed"), anyhow::Error::from))
        .with_context(|| format!("{what} kept failing"))
}

/// The node among `ids` that says it leads, if one answers so right now.
async fn current_leader(cluster: &Cluster, ids: &BTreeSet<u64>) -> Option<u64> {
    for id in ids {
        if let Ok(info) = cluster.node_info(*id).await {
            if info.role == "leader" {
                return Some(*id);
            }
        }
    }
    None
}

/// One request sent straight to an old leader.
enum Probe {
    Read(String),
    Take(String),
    Offer(String),
}

impl Probe {
    /// Sends the probe, records it, and returns a line describing the answer.
    async fn send(self, rec: &Recorder, client: &str, channel: Channel) -> String {
        let mut handoff = HandoffClient::new(channel);
        let header = Some(RequestHeader {
            client_id: rand::random(),
            seq: 1,
            acked_below: 1,
            ..Default::default()
        });
        let (input, outcome) = match self {
            Probe::Read(key) => {
                let input = Input::Read { key: key.clone() };
                let index = rec.invoke(client, input.clone());
                let answer = handoff.get(GetTicketRequest { key }).await;
                let outcome = match answer {
                    Ok(reply) => match reply.into_inner().ticket {
                        Some(ticket) => {
                            let ticket = ticket_from_proto(ticket);
                            Outcome::Ok(Output::Ticket {
                                generation: ticket.generation,
                                state: ticket.state.as_str().to_string(),
                                holder: ticket.holder,
                            })
                        }
                        None => Outcome::Unexpected("get answered without a ticket".into()),
                    },
                    Err(status) => status_outcome(&status),
                };
                rec.complete(index, outcome.clone());
                (input, outcome)
            }
            Probe::Take(key) => {
                let input = Input::Take {
                    key: key.clone(),
                    to: TO.into(),
                };
                let index = rec.invoke(client, input.clone());
                let answer = handoff
                    .take(TakeRequest {
                        header,
                        key,
                        to: TO.into(),
                    })
                    .await;
                let outcome = match answer {
                    Ok(reply) => match reply.into_inner().handle {
                        Some(handle) => {
                            let handle = handle_from_proto(handle);
                            Outcome::Ok(Output::Handle {
                                fence: handle.fence,
                                token: handle.token,
                            })
                        }
                        None => Outcome::Unexpected("take answered without a handle".into()),
                    },
                    Err(status) => status_outcome(&status),
                };
                rec.complete(index, outcome.clone());
                (input, outcome)
            }
            Probe::Offer(key) => {
                let input = Input::Offer {
                    key: key.clone(),
                    from: FROM.into(),
                    to: TO.into(),
                };
                let index = rec.invoke(client, input.clone());
                let answer = handoff
                    .offer(OfferRequest {
                        header,
                        key: key.clone(),
                        from: FROM.into(),
                        to: TO.into(),
                        payload: key.into_bytes(),
                        reply_to: FROM.into(),
                        ttl_ms: TTL_MS,
                    })
                    .await;
                let outcome = match answer {
                    Ok(reply) => match reply.into_inner().ticket {
                        Some(ticket) => {
                            let ticket = ticket_from_proto(ticket);
                            Outcome::Ok(Output::Ticket {
                                generation: ticket.generation,
                                state: ticket.state.as_str().to_string(),
                                holder: ticket.holder,
                            })
                        }
                        None => Outcome::Unexpected("offer answered without a ticket".into()),
                    },
                    Err(status) => status_outcome(&status),
                };
                rec.complete(index, outcome.clone());
                (input, outcome)
            }
        };
        format!("{input} => {outcome:?}")
    }
}

/// A refusal is definite; what a node that may not lead, may not be reached or may be stopping
/// answers is ambiguous (a status without Baton's detail: the node never answered); any other
/// Baton code is unexpected.
fn status_outcome(status: &tonic::Status) -> Outcome {
    match detail_of(status) {
        Some(detail) => match refusal_of(&detail) {
            Some(refusal) => Outcome::Refused(refusal.code().to_string()),
            None => {
                let text = format!("{}: {}", detail.code, status.message());
                match detail.code.as_str() {
                    infra::NOT_LEADER
                    | infra::NO_LEADER
                    | infra::SHUTTING_DOWN
                    | infra::OVERLOADED
                    | infra::INTERNAL
                    | infra::NOT_INITIALIZED
                    | infra::SESSION_EXPIRED => Outcome::Ambiguous(text),
                    _ => Outcome::Unexpected(text),
                }
            }
        },
        None => Outcome::Ambiguous(format!("{:?}: {}", status.code(), status.message())),
    }
}
