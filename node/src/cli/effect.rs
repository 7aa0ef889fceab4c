//! `baton effect ...`: the side-effect gate.

use std::time::Duration;

use baton_rpc::Client;
use baton_statemachine::effect::{
    Action, ActionView, EffectLease, Outcome, Resolution, Resolved, RetrySafety,
};
use clap::{ArgGroup, Args, Subcommand};
use serde_json::json;

use super::{exit, rfc3339, ttl_ms};

/// The action a command is about.
#[derive(Args, Debug, Clone)]
pub struct ActionArgs {
    /// What must happen at most once.
    #[arg(long)]
    key: String,
    /// What it touches (one live holder per resource).
    #[arg(long)]
    resource: String,
    /// Repeating the action does harm (a "did not happen" needs --force to become retryable).
    #[arg(long = "unsafe")]
    unsafe_: bool,
}

impl ActionArgs {
    fn action(&self) -> Action {
        Action {
            key: self.key.clone(),
            resource: self.resource.clone(),
            safety: if self.unsafe_ {
                RetrySafety::Unsafe
            } else {
                RetrySafety::Safe
            },
        }
    }
}

/// The credentials of a granted attempt, as `acquire` printed them.
#[derive(Args, Debug, Clone)]
pub struct LeaseArgs {
    /// The attempt's fence.
    #[arg(long)]
    fence: u64,
    /// The attempt's holder identity.
    #[arg(long)]
    holder: String,
    /// The lease's resource, when it differs from --resource (to exercise RESOURCE_MISMATCH).
    #[arg(long)]
    lease_resource: Option<String>,
}

impl LeaseArgs {
    fn lease(&self, action: &ActionArgs) -> EffectLease {
        EffectLease {
            key: action.key.clone(),
            resource: self
                .lease_resource
                .clone()
                .unwrap_or_else(|| action.resource.clone()),
            fence: self.fence,
            holder: self.holder.clone(),
            // Not part of the three-way check; the store knows the attempt's deadline.
            until_ms: 0,
        }
    }
}

/// `baton effect ...`
#[derive(Subcommand, Debug)]
pub enum EffectCommand {
    /// Judge an attempt: completed > uncertain > in_progress > contended > granted.
    Acquire {
        #[command(flatten)]
        action: ActionArgs,
        /// Length of the execution intent and the resource hold, e.g. 5s.
        #[arg(long, value_parser = super::ttl)]
        ttl: Duration,
    },
    /// Record the attempt's result (first completion wins; prints the recorded result).
    Complete {
        #[command(flatten)]
        action: ActionArgs,
        #[command(flatten)]
        lease: LeaseArgs,
        #[arg(long, default_value = "")]
        result: String,
    },
    /// Free the resource hold; the intent stays.
    Release {
        #[command(flatten)]
        action: ActionArgs,
        #[command(flatten)]
        lease: LeaseArgs,
    },
    /// Withdraw the intent (the key becomes idle) and free the resource if still held.
    Abandon {
        #[command(flatten)]
        action: ActionArgs,
        #[command(flatten)]
        lease: LeaseArgs,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Extend a valid attempt's intent and hold.
    Renew {
        #[command(flatten)]
        action: ActionArgs,
        #[command(flatten)]
        lease: LeaseArgs,
        /// New length from now.
        #[arg(long, default_value = "30s", value_parser = super::ttl)]
        ttl: Duration,
    },
    /// Declare the attempt's outcome unknown (the intent is withdrawn, the hold kept).
    MarkUncertain {
        #[command(flatten)]
        action: ActionArgs,
        #[command(flatten)]
        lease: LeaseArgs,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Become the one reconciler of an uncertain key; prints the token and occupancy end.
    Reconcile {
        #[command(flatten)]
        action: ActionArgs,
        /// Occupancy length.
        #[arg(long, value_parser = super::ttl)]
        ttl: Duration,
    },
    /// Resolve an uncertain key from downstream facts (first resolution wins).
    #[command(group(ArgGroup::new("finding").required(true).args(["happened", "did_not_happen"])))]
    Resolve {
        #[command(flatten)]
        action: ActionArgs,
        /// The side effect happened; record --result.
        #[arg(long)]
        happened: bool,
        /// The side effect did not happen; the key becomes retryable (unsafe: only with --force).
        #[arg(long)]
        did_not_happen: bool,
        #[arg(long, default_value = "")]
        result: String,
        /// Make an unsafe action retryable although repeating it does harm.
        #[arg(long)]
        force: bool,
    },
    /// Show one action key (linearizable).
    Show {
        #[arg(long)]
        key: String,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(command: EffectCommand, client: &Client) -> u8 {
    let result = match command {
        EffectCommand::Acquire { action, ttl } => {
            return match client.acquire(&action.action(), ttl_ms(ttl)).await {
                Ok(outcome) => {
                    print_outcome(&outcome);
                    granted_or_refused(&outcome)
                }
                Err(error) => exit::report(&error),
            }
        }
        EffectCommand::Complete {
            action,
            lease,
            result,
        } => client
            .complete_effect(&action.action(), &lease.lease(&action), &result)
            .await
            .map(|recorded| out!("result={recorded}")),
        EffectCommand::Release { action, lease } => client
            .release_effect(&action.action(), &lease.lease(&action))
            .await
            .map(|()| out!("released {}", action.resource)),
        EffectCommand::Abandon {
            action,
            lease,
            reason,
        } => client
            .abandon(&action.action(), &lease.lease(&action), &reason)
            .await
            .map(|()| out!("abandoned {}", action.key)),
        EffectCommand::Renew { action, lease, ttl } => client
            .renew_effect(&action.action(), &lease.lease(&action), ttl_ms(ttl))
            .await
            .map(|lease| {
                out!(
                    "fence={} holder={} until={}",
                    lease.fence,
                    lease.holder,
                    rfc3339(lease.until_ms)
                )
            }),
        EffectCommand::MarkUncertain {
            action,
            lease,
            reason,
        } => client
            .mark_uncertain(&action.action(), &lease.lease(&action), &reason)
            .await
            .map(|()| out!("uncertain {}", action.key)),
        EffectCommand::Reconcile { action, ttl } => client
            .begin_reconcile(&action.action(), ttl_ms(ttl))
            .await
            .map(|slot| out!("token={} until={}", slot.token, rfc3339(slot.until_ms))),
        EffectCommand::Resolve {
            action,
            happened,
            did_not_happen: _,
            result,
            force,
        } => {
            let resolution = Resolution {
                happened,
                result,
                force_retryable: force,
            };
            client
                .resolve_uncertain(&action.action(), &resolution)
                .await
                .map(|resolved| match resolved {
                    Resolved::Completed(result) => {
                        out!("resolved=completed result={result}")
                    }
                    Resolved::Retryable => out!("resolved=retryable"),
                })
        }
        EffectCommand::Show { key, json } => client.show_action(&key).await.map(|view| {
            if json {
                print_json(&view)
            } else {
                print_view(&view)
            }
        }),
    };
    match result {
        Ok(()) => exit::OK,
        Err(error) => exit::report(&error),
    }
}

/// Exit 0 only for a grant: `baton effect acquire ... && perform` must not perform an action
/// that is done, in doubt or in someone else's hands. Every other outcome is the store's "no"
/// (as a lost `board claim` is `TAKEN`).
fn granted_or_refused(outcome: &Outcome) -> u8 {
    match outcome {
        Outcome::Granted(_) => exit::OK,
        Outcome::Completed(_) | Outcome::Contended | Outcome::InProgress | Outcome::Uncertain => {
            exit::REFUSED
        }
    }
}

fn print_outcome(outcome: &Outcome) {
    match outcome {
        Outcome::Granted(lease) => out!(
            "outcome=granted fence={} holder={} until={}",
            lease.fence,
            lease.holder,
            rfc3339(lease.until_ms)
        ),
        Outcome::Completed(result) => out!("outcome=completed result={result}"),
        Outcome::Contended | Outcome::InProgress | Outcome::Uncertain => {
            out!("outcome={}", outcome.name())
        }
    }
}

fn print_view(view: &ActionView) {
    let mut line = format!(
        "key={} resource={} safety={} status={} fence={}",
        view.key,
        view.resource,
        view.safety.as_str(),
        view.status.as_str(),
        view.fence,
    );
    if let Some(until) = view.intent_until_ms {
        line.push_str(&format!(" intent_until={}", rfc3339(until)));
    }
    if let Some(until) = view.reconcile_until_ms {
        line.push_str(&format!(" reconcile_until={}", rfc3339(until)));
    }
    if !view.reason.is_empty() {
        line.push_str(&format!(" reason={:?}", view.reason));
    }
    if let Some(result) = &view.result {
        line.push_str(&format!(" result={result}"));
    }
    out!("{line}");
}

fn print_json(view: &ActionView) {
    let value = json!({
        "key": view.key,
        "resource": view.resource,
        "safety": view.safety.as_str(),
        "status": view.status.as_str(),
        "fence": view.fence,
        "intent_until": view.intent_until_ms.map(rfc3339),
        "intent_until_ms": view.intent_until_ms,
        "result": view.result,
        "reason": view.reason,
        "reconcile_until": view.reconcile_until_ms.map(rfc3339),
        "reconcile_until_ms": view.reconcile_until_ms,
    });
    out!("{value}");
}
