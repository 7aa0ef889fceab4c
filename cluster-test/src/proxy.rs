//! Real network partitions between node processes: one TCP proxy per directed link.
//!
//! Node `I` is started with `--peer-addr J=<proxy I->J>` for every other node `J`, so every Raft
//! message `I` sends to `J` (and `J`'s answer on the same connection) crosses the proxy of the
//! link `I -> J`. Cutting a link drops the connections it carries and black-holes new ones: they
//! are accepted and held without forwarding a byte, the way a partitioned network swallows
//! packets (no refusal, no reset — the sender only learns from its own timeouts). Healing the link
//! closes the held connections, so the sender reconnects through a working link.
//!
//! Cutting every link to and from a node isolates it; cutting the links between two groups splits
//! the cluster. Clients are not proxied: they reach the nodes directly, as a client on either side
//! of a partition would.
//!
//! A link can also be slowed: every byte it carries, both ways, is held for a set delay before it
//! is passed on (a long or congested path; order is kept, nothing is lost). A new delay applies to
//! the bytes read from then on, on the connections the link already carries too; bytes already
//! held keep theirs, and later bytes never overtake them. Opening a connection is not delayed.
//! The way back alone can be slowed too (answers late, requests on time), a path no symmetric
//! delay can imitate: what was sent arrives when the sender expects, only the news of it is late.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What a link does with its traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Forward bytes both ways.
    Open,
    /// Drop carried connections, hold new ones without forwarding.
    Cut,
    /// The proxy is gone: every connection ends.
    Closed,
}

/// One directed link: a TCP listener on 127.0.0.1 that forwards to a target address.
pub struct Proxy {
    addr: SocketAddr,
    target: Arc<Mutex<String>>,
    mode: watch::Sender<Mode>,
    delay: watch::Sender<Duration>,
    answer_delay: watch::Sender<Duration>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards every connection to `target`.
    pub async fn start(target: &str) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind a proxy listener")?;
        let addr = listener.local_addr()?;
        let target = Arc::new(Mutex::new(target.to_string()));
        let (mode, _) = watch::channel(Mode::Open);
        let (delay, _) = watch::channel(Duration::ZERO);
        let (answer_delay, _) = watch::channel(Duration::ZERO);
        let accept = tokio::spawn(accept_loop(
            listener,
            target.clone(),
            mode.clone(),
            [delay.clone(), answer_delay.clone()],
        ));
        Ok(Proxy {
            addr,
            target,
            mode,
            delay,
            answer_delay,
            accept,
        })
    }

    /// The address to connect to instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Points the link at another address (connections already carried are not moved).
    pub fn retarget(&self, target: &str) {
        *lock(&self.target) = target.to_string();
    }

    /// Drops every carried connection and black-holes new ones until [`Proxy::heal`].
    pub fn cut(&self) {
        self.mode.send_replace(Mode::Cut);
    }

    /// Forwards again; connections held while cut are closed so their senders reconnect.
    pub fn heal(&self) {
        self.mode.send_replace(Mode::Open);
    }

    /// Whether the link is cut.
    pub fn is_cut(&self) -> bool {
        *self.mode.borrow() == Mode::Cut
    }

    /// Holds every byte the link carries from now on, both ways, for `delay` before passing it on
    /// (zero: no delay), on the connections already carried too.
    pub fn slow(&self, delay: Duration) {
        self.delay.send_replace(delay);
    }

    /// Holds the bytes coming back from the target, on top of [`Proxy::slow`]'s delay, for
    /// `delay` (zero: no extra delay), on the connections already carried too.
    pub fn slow_answers(&self, delay: Duration) {
        self.answer_delay.send_replace(delay);
    }

    /// The link's current delay.
    pub fn delay(&self) -> Duration {
        *self.delay.borrow()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.mode.send_replace(Mode::Closed);
        self.accept.abort();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn accept_loop(
    listener: TcpListener,
    target: Arc<Mutex<String>>,
    mode: watch::Sender<Mode>,
    delays: [watch::Sender<Duration>; 2],
) {
    loop {
        let inbound = match listener.accept().await {
            Ok((inbound, _)) => inbound,
            Err(_) => {
                // Out of descriptors or similar: try again shortly rather than spin.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let target = lock(&target).clone();
        let [both, back] = &delays;
        tokio::spawn(carry(
            inbound,
            target,
            mode.subscribe(),
            both.subscribe(),
            back.subscribe(),
        ));
    }
}

/// Carries one connection until it ends or the link changes under it.
async fn carry(
    inbound: TcpStream,
    target: String,
    mut mode: watch::Receiver<Mode>,
    delay: watch::Receiver<Duration>,
    answer_delay: watch::Receiver<Duration>,
) {
    let _ = inbound.set_nodelay(true);
    let current = *mode.borrow_and_update();
    match current {
        Mode::Closed => {}
        Mode::Cut => {
            // Black hole: keep the connection open, forward nothing, until the link heals (then
            // close it: the sender's next connection goes through).
            let _ = mode.wait_for(|m| *m != Mode::Cut).await;
        }
        Mode::Open => {
            let upstream = tokio::select! {
                connected = TcpStream::connect(&target) => connected,
                _ = mode.wait_for(|m| *m != Mode::Open) => return,
            };
            let Ok(upstream) = upstream else {
                // The target is down: the sender sees its connection close, as with a dead node.
                return;
            };
            let _ = upstream.set_nodelay(true);
            let (from_inbound, to_inbound) = inbound.into_split();
            let (from_upstream, to_upstream) = upstream.into_split();
            tokio::select! {
                _ = async {
                    tokio::join!(
                        pass_on(from_inbound, to_upstream, delay.clone(), None),
                        pass_on(from_upstream, to_inbound, delay, Some(answer_delay)),
                    )
                } => {}
                _ = mode.wait_for(|m| *m != Mode::Open) => {}
            }
        }
    }
}

/// How many chunks one direction of a connection holds while they wait out the link's delay;
/// beyond that its reader waits, so a slow link pushes back on the sender as a full path does.
const IN_FLIGHT: usize = 1024;

/// Passes bytes from `from` to `to`, each chunk held until the link's delay plus this
/// direction's `extra` (read when the chunk arrives) has passed, in order; at the end of `from`,
/// shuts `to` down for writing.
async fn pass_on(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delay: watch::Receiver<Duration>,
    extra: Option<watch::Receiver<Duration>>,
) {
    let (held, mut due) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let extra = extra
                .as_ref()
                .map_or(Duration::ZERO, |extra| *extra.borrow());
            let at = Instant::now() + *delay.borrow() + extra;
            if held.send((at, buf[..n].to_vec())).await.is_err() {
                break;
            }
        }
    };
    let write = async move {
        while let Some((at, chunk)) = due.recv().await {
            // Not even a zero-length sleep on an unslowed link: the timer wheel would round it
            // up to the next millisecond tick.
            if at > Instant::now() {
                tokio::time::sleep_until(at).await;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

/// The proxies of every directed link between a set of nodes.
pub struct Network {
    links: BTreeMap<(u64, u64), Proxy>,
}

impl Network {
    /// One proxy per ordered pair of distinct nodes in `nodes` (`id -> address`), each link
    /// `i -> j` forwarding to `j`'s address.
    pub async fn start(nodes: &BTreeMap<u64, String>) -> anyhow::Result<Network> {
        let mut links = BTreeMap::new();
        for from in nodes.keys() {
            for (to, addr) in nodes {
                if from != to {
                    links.insert((*from, *to), Proxy::start(addr).await?);
                }
            }
        }
        Ok(Network { links })
    }

    /// The `--peer-addr` routes of node `from`: `(peer id, proxy address)`.
    pub fn routes(&self, from: u64) -> Vec<(u64, SocketAddr)> {
        self.links
            .iter()
            .filter(|((f, _), _)| *f == from)
            .map(|((_, to), proxy)| (*to, proxy.addr()))
            .collect()
    }

    /// Node `id` now listens at `addr`: every link towards it forwards there.
    pub fn retarget(&self, id: u64, addr: &str) {
        for ((_, to), proxy) in &self.links {
            if *to == id {
                proxy.retarget(addr);
            }
        }
    }

    /// Cuts the link `from -> to` (one direction only).
    pub fn cut(&self, from: u64, to: u64) {
        if let Some(proxy) = self.links.get(&(from, to)) {
            proxy.cut();
        }
    }

    /// Cuts every link to and from `id`.
    pub fn isolate(&self, id: u64) {
        for ((from, to), proxy) in &self.links {
            if *from == id || *to == id {
                proxy.cut();
            }
        }
    }

    /// Splits the nodes into `groups`: links between groups are cut, links within a group are
    /// healed. A node in no group is cut off from everyone.
    pub fn partition(&self, groups: &[Vec<u64>]) {
        let group_of = |id: u64| groups.iter().position(|group| group.contains(&id));
        for ((from, to), proxy) in &self.links {
            match (group_of(*from), group_of(*to)) {
                (Some(a), Some(b)) if a == b => proxy.heal(),
                _ => proxy.cut(),
            }
        }
    }

    /// Heals every link: none is cut or slowed any more.
    pub fn heal_all(&self) {
        for proxy in self.links.values() {
            proxy.heal();
            proxy.slow(Duration::ZERO);
        }
    }

    /// Slows the link `from -> to` (one direction of connection: `from`'s connections to `to`,
    /// requests and answers alike) by `delay` each way.
    pub fn slow(&self, from: u64, to: u64, delay: Duration) {
        if let Some(proxy) = self.links.get(&(from, to)) {
            proxy.slow(delay);
        }
    }

    /// The links that are slowed, as `i->j +delay`.
    pub fn slow_links(&self) -> Vec<String> {
        self.links
            .iter()
            .filter(|(_, proxy)| !proxy.delay().is_zero())
            .map(|((from, to), proxy)| format!("{from}->{to} +{:?}", proxy.delay()))
            .collect()
    }

    /// The links that are cut, as `i->j`.
    pub fn cut_links(&self) -> Vec<String> {
        self.links
            .iter()
            .filter(|(_, proxy)| proxy.is_cut())
            .map(|((from, to), _)| format!("{from}->{to}"))
            .collect()
    }

    /// The nodes the network connects.
    pub fn nodes(&self) -> BTreeSet<u64> {
        self.links.keys().map(|(from, _)| *from).collect()
    }
}
