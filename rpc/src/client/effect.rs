//! The side-effect gate: acquire, the holder's actions, reconciliation, and a linearizable view.

use baton_statemachine::effect::{
    Action, ActionView, EffectLease, Outcome, Reconcile, Resolution, Resolved,
};

use super::{answered, credential, decoded, Client};
use crate::convert;
use crate::error::Error;
use crate::proto;
use crate::proto::effect_client::EffectClient;

impl Client {
    /// Judges an attempt at `action`: completed > uncertain > in progress > contended > granted.
    /// Only [`Outcome::Granted`] carries a lease; the other outcomes are answers, not refusals.
    pub async fn acquire(&self, action: &Action, ttl_ms: i64) -> Result<Outcome, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::AcquireRequest {
                    header: Some(header),
                    action: Some(convert::action_to_proto(action)),
                    ttl_ms,
                };
                async move { EffectClient::new(channel).acquire(request).await }
            })
            .await?;
        let outcome = decoded(convert::outcome_from_proto(reply.outcome), "acquire")?;
        if let Outcome::Granted(lease) = &outcome {
            credential("acquire", &lease.holder, lease.fence)?;
        }
        Ok(outcome)
    }

    /// Records the attempt's result; the first completion wins and a repeat gets the first
    /// result back. `FenceStale` / `NotHolder` / `ResourceMismatch` when the three-way check
    /// fails (nothing written).
    pub async fn complete_effect(
        &self,
        action: &Action,
        lease: &EffectLease,
        result: &str,
    ) -> Result<String, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::CompleteEffectRequest {
                    header: Some(header),
                    action: Some(convert::action_to_proto(action)),
                    lease: Some(convert::effect_lease_to_proto(lease)),
                    result: result.to_string(),
                };
                async move { EffectClient::new(channel).complete(request).await }
            })
            .await?;
        Ok(reply.result)
    }

    /// Frees the resource hold if it is still this attempt's; the intent is not touched.
    pub async fn release_effect(&self, action: &Action, lease: &EffectLease) -> Result<(), Error> {
        self.write(|header, channel| {
            let request = proto::ReleaseEffectRequest {
                header: Some(header),
                action: Some(convert::action_to_proto(action)),
                lease: Some(convert::effect_lease_to_proto(lease)),
            };
            async move { EffectClient::new(channel).release(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Withdraws the attempt's intent (the key becomes idle) and frees the resource if still
    /// ours.
    pub async fn abandon(
        &self,
        action: &Action,
        lease: &EffectLease,
        reason: &str,
    ) -> Result<(), Error> {
        self.write(|header, channel| {
            let request = proto::AbandonRequest {
                header: Some(header),
                action: Some(convert::action_to_proto(action)),
                lease: Some(convert::effect_lease_to_proto(lease)),
                reason: reason.to_string(),
            };
            async move { EffectClient::new(channel).abandon(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Extends a valid attempt's intent and hold to now + `ttl_ms`; returns the extended lease.
    pub async fn renew_effect(
        &self,
        action: &Action,
        lease: &EffectLease,
        ttl_ms: i64,
    ) -> Result<EffectLease, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::RenewEffectRequest {
                    header: Some(header),
                    action: Some(convert::action_to_proto(action)),
                    lease: Some(convert::effect_lease_to_proto(lease)),
                    ttl_ms,
                };
                async move { EffectClient::new(channel).renew(request).await }
            })
            .await?;
        decoded(
            convert::effect_lease_from_proto("lease", reply.lease),
            "renew",
        )
    }

    /// Declares the attempt's outcome unknown: the key becomes uncertain, the intent is
    /// withdrawn, the resource stays held (release it explicitly).
    pub async fn mark_uncertain(
        &self,
        action: &Action,
        lease: &EffectLease,
        reason: &str,
    ) -> Result<(), Error> {
        self.write(|header, channel| {
            let request = proto::MarkUncertainRequest {
                header: Some(header),
                action: Some(convert::action_to_proto(action)),
                lease: Some(convert::effect_lease_to_proto(lease)),
                reason: reason.to_string(),
            };
            async move { EffectClient::new(channel).mark_uncertain(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Becomes the one reconciler of an uncertain key for `ttl_ms` (`NotUncertain`,
    /// `ReconcileTaken`).
    pub async fn begin_reconcile(&self, action: &Action, ttl_ms: i64) -> Result<Reconcile, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::BeginReconcileRequest {
                    header: Some(header),
                    action: Some(convert::action_to_proto(action)),
                    ttl_ms,
                };
                async move { EffectClient::new(channel).begin_reconcile(request).await }
            })
            .await?;
        answered(reply.reconcile, "begin_reconcile", "a reconcile slot")
            .map(convert::reconcile_from_proto)
    }

    /// Resolves an uncertain key from downstream facts; the first resolution wins. For an unsafe
    /// action "did not happen" is refused `UnsafeNotRetryable` unless it is forced.
    pub async fn resolve_uncertain(
        &self,
        action: &Action,
        resolution: &Resolution,
    ) -> Result<Resolved, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::ResolveUncertainRequest {
                    header: Some(header),
                    action: Some(convert::action_to_proto(action)),
                    resolution: Some(convert::resolution_to_proto(resolution)),
                };
                async move { EffectClient::new(channel).resolve_uncertain(request).await }
            })
            .await?;
        decoded(convert::resolved_from_proto(reply), "resolve_uncertain")
    }

    /// Linearizable view of one action key (`UnknownAction` when it was never acquired).
    pub async fn show_action(&self, key: &str) -> Result<ActionView, Error> {
        let reply = self
            .call(|channel| {
                let request = proto::ShowActionRequest {
                    key: key.to_string(),
                };
                async move { EffectClient::new(channel).show(request).await }
            })
            .await?;
        let view = answered(reply.action, "show", "an action")?;
        decoded(convert::action_view_from_proto(view), "show")
    }
}
