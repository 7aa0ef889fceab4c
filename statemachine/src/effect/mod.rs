//! The side-effect gate: at most once for actions that touch the outside world.
//!
//! `acquire` judges in this exact order: completed > uncertain > in progress > contended >
//! granted. The order is the point: were "uncertain" judged after "contended", a caller would hear
//! "busy, retry later", retry, and repeat a side effect that may already have happened. A grant
//! mints, in one step, the resource's next fence, a holder identity, the key's execution intent and
//! the resource hold. An intent that expires unresolved turns the key uncertain, never into a fresh
//! grant. Every holder action passes the three-way check (lease resource is the action's, fence is the
//! resource's latest, holder matches the key's attempt) before anything is written.

mod gate;
mod types;

pub use gate::Gate;
pub use types::{
    Action, ActionView, Command, EffectLease, KeyStatus, Outcome, Reconcile, Resolution, Resolved,
    RetrySafety,
};
