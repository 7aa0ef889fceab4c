//! The side-effect gate's vocabulary.

use serde::{Deserialize, Serialize};

/// Whether repeating the action is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetrySafety {
    /// Repeating it does no harm; a "did not happen" resolution makes the key retryable.
    Safe,
    /// Repeating it does harm; only an explicit, forced resolution makes the key retryable.
    Unsafe,
}

impl RetrySafety {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            RetrySafety::Safe => "safe",
            RetrySafety::Unsafe => "unsafe",
        }
    }
}

/// Something that must happen at most once (`key`) and what it touches (`resource`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    /// What must happen at most once.
    pub key: String,
    /// What it touches; one live holder per resource.
    pub resource: String,
    /// Whether a retry is harmless.
    pub safety: RetrySafety,
}

/// The credentials of a granted attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectLease {
    /// The action key.
    pub key: String,
    /// The resource held.
    pub resource: String,
    /// The resource's fence for this attempt: its highest so far, plus one.
    pub fence: u64,
    /// Store-minted holder identity (128 random bits, hex).
    pub holder: String,
    /// The intent and the hold end at this store time (Unix ms).
    pub until_ms: u64,
}

/// What `acquire` decided, judged in this order: completed > uncertain > in progress >
/// contended > granted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Go ahead: the lease is yours.
    Granted(EffectLease),
    /// The resource is held by another live attempt; try later.
    Contended,
    /// An unexpired attempt of this key is running.
    InProgress,
    /// An earlier attempt's outcome is unknown; reconcile before anything else happens.
    Uncertain,
    /// It already happened; here is the recorded result.
    Completed(String),
}

impl Outcome {
    /// The outcome's wire name.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Granted(_) => "granted",
            Outcome::Contended => "contended",
            Outcome::InProgress => "in_progress",
            Outcome::Uncertain => "uncertain",
            Outcome::Completed(_) => "completed",
        }
    }
}

/// Where a key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyStatus {
    /// Nothing running, nothing recorded: the next acquire may grant.
    Idle,
    /// An execution intent is registered.
    InProgress,
    /// The outcome of an attempt is unknown.
    Uncertain,
    /// It happened; the result is recorded.
    Completed,
}

impl KeyStatus {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            KeyStatus::Idle => "idle",
            KeyStatus::InProgress => "in_progress",
            KeyStatus::Uncertain => "uncertain",
            KeyStatus::Completed => "completed",
        }
    }
}

/// The right to reconcile an uncertain key, held by one reconciler at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconcile {
    /// Store-minted identity of this reconciler.
    pub token: String,
    /// The occupancy ends at this store time; after it another reconciler may begin.
    pub until_ms: u64,
}

/// A reconciler's finding about an uncertain key, from downstream facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    /// Whether the side effect happened.
    pub happened: bool,
    /// The result to record when it happened.
    pub result: String,
    /// For an unsafe action that did not happen: the explicit decision to allow a retry anyway.
    pub force_retryable: bool,
}

/// What a resolution left behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resolved {
    /// The key is completed with this result (this resolution's, or the first one's).
    Completed(String),
    /// The key is idle again: the next acquire may grant.
    Retryable,
}

/// One key as `show` presents it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionView {
    /// The key.
    pub key: String,
    /// Its resource.
    pub resource: String,
    /// Its retry safety.
    pub safety: RetrySafety,
    /// Where it stands.
    pub status: KeyStatus,
    /// The latest attempt's fence (0 if none). Its holder identity is not shown: it is the
    /// lease's credential, known only to the holder it was granted to.
    pub fence: u64,
    /// When the registered intent ends (in progress only).
    pub intent_until_ms: Option<u64>,
    /// The recorded result (completed only).
    pub result: Option<String>,
    /// Why the key is uncertain.
    pub reason: String,
    /// When the current reconciler's occupancy ends.
    pub reconcile_until_ms: Option<u64>,
}

/// A side-effect gate command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Judge and maybe grant an attempt.
    Acquire {
        /// The action.
        action: Action,
        /// Intent and hold length in ms (> 0).
        ttl_ms: i64,
    },
    /// Record the result; first completion wins.
    Complete {
        /// The action.
        action: Action,
        /// The attempt's credentials.
        lease: EffectLease,
        /// The result to record.
        result: String,
    },
    /// Free the resource hold; the intent stays.
    Release {
        /// The action.
        action: Action,
        /// The attempt's credentials.
        lease: EffectLease,
    },
    /// Withdraw the intent and free the resource if still ours.
    Abandon {
        /// The action.
        action: Action,
        /// The attempt's credentials.
        lease: EffectLease,
        /// Why.
        reason: String,
    },
    /// Extend a valid attempt's intent and hold.
    Renew {
        /// The action.
        action: Action,
        /// The attempt's credentials.
        lease: EffectLease,
        /// New length from now in ms (> 0).
        ttl_ms: i64,
    },
    /// Declare the outcome unknown; the intent is withdrawn, the hold kept.
    MarkUncertain {
        /// The action.
        action: Action,
        /// The attempt's credentials.
        lease: EffectLease,
        /// Why.
        reason: String,
    },
    /// Become the one reconciler of an uncertain key.
    BeginReconcile {
        /// The action.
        action: Action,
        /// Occupancy length in ms (> 0).
        ttl_ms: i64,
    },
    /// Resolve an uncertain key from downstream facts; first resolution wins.
    ResolveUncertain {
        /// The action.
        action: Action,
        /// The finding.
        resolution: Resolution,
    },
}

impl Command {
    /// The command's name, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Acquire { .. } => "effect.acquire",
            Command::Complete { .. } => "effect.complete",
            Command::Release { .. } => "effect.release",
            Command::Abandon { .. } => "effect.abandon",
            Command::Renew { .. } => "effect.renew",
            Command::MarkUncertain { .. } => "effect.mark_uncertain",
            Command::BeginReconcile { .. } => "effect.begin_reconcile",
            Command::ResolveUncertain { .. } => "effect.resolve_uncertain",
        }
    }
}
