//! Which shard acts on a ClusterAddon, and how one hands it to another (see `cso_api::shard`): the shard of
//! its Cluster's label acts; the ClusterAddon carries the label of the shard that acts on it, so that a named
//! shard's watch selects it. When a Cluster's label moves, the shard labelled on its ClusterAddon hands it over
//! from its own reconcile (so after any reconcile of it in flight: one at a time per object); a shard without a
//! live Lease cannot, and then the new owner takes it over.

use cso_api::{ClusterAddon, shard::SHARD_LABEL, shard::Shard};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};

use crate::{Context, Error};

/// The shard whose replicas act on `addon`: its Cluster's (from the watch cache, else read: a Cluster that
/// moved has left a named shard's cache); once the Cluster is gone, the one the ClusterAddon is labelled for
/// (its clean-up is that shard's).
pub(crate) async fn owner_of(addon: &ClusterAddon, ctx: &Context) -> Result<Shard, Error> {
    let namespace = addon.namespace().unwrap_or_default();
    let cluster_name = addon.cluster_name();
    if let Some(Some(cluster)) = ctx.stores().and_then(|s| s.cluster(&namespace, &cluster_name)) {
        return Ok(Shard::of(cluster.meta().labels.as_ref()));
    }
    let cluster = ctx
        .clusters(Some(&namespace))
        .get_opt(&cluster_name)
        .await
        .map_err(|e| Error::kube(format!("read Cluster {cluster_name}"), e))?;
    Ok(Shard::of(
        cluster
            .as_ref()
            .map_or(addon.meta(), |c| c.meta())
            .labels
            .as_ref(),
    ))
}

/// Labels ClusterAddon `name` for shard `to`: `to`'s watch selects it from now on, and the shard it was
/// labelled for no longer does.
pub(crate) async fn label(ctx: &Context, namespace: &str, name: &str, to: &Shard) -> Result<(), Error> {
    let value = match to {
        Shard::Default => serde_json::Value::Null,
        Shard::Named(name) => name.as_str().into(),
    };
    Api::<ClusterAddon>::namespaced(ctx.client.clone(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {SHARD_LABEL: value}}})),
        )
        .await
        .map_err(|e| Error::kube(format!("move ClusterAddon {name} to shard {to}"), e))?;
    tracing::info!(cluster_addon = %name, %namespace, shard = %to, "ClusterAddon moved to the shard of its Cluster");
    Ok(())
}

/// Whether `lease` is held now: a holder, renewed less than its duration ago.
pub(crate) fn held(lease: &Lease) -> bool {
    let Some(spec) = &lease.spec else { return false };
    let holder = spec.holder_identity.as_deref().is_some_and(|h| !h.is_empty());
    let renewed = spec.renew_time.as_ref().map(|t| t.0.as_second());
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    holder
        && renewed.is_some_and(|renewed| renewed + duration > k8s_openapi::jiff::Timestamp::now().as_second())
}

/// Whether a ClusterAddon labelled for shard `from` may be taken over rather than waited for: no replica of
/// `from` holds its Lease (in `--leader-elect-namespace`). The default shard may run without leader election
/// (no Lease at all): it is then waited for, as it hands its ClusterAddons over itself; a named shard always
/// elects, so a missing Lease means none of its replicas ever ran. Asks the owner to hand over meanwhile.
pub(crate) async fn may_take_over(
    ctx: &Context,
    namespace: &str,
    addon: &str,
    from: &Shard,
) -> Result<bool, Error> {
    let Some(lease_namespace) = &ctx.settings.lease_namespace else {
        return Ok(false);
    };
    let name = from.lease_name();
    let lease = Api::<Lease>::namespaced(ctx.client.clone(), lease_namespace)
        .get_opt(&name)
        .await
        .map_err(|e| Error::kube(format!("read Lease {name}"), e))?;
    let free = match (&lease, from) {
        (Some(lease), _) => !held(lease),
        (None, Shard::Named(_)) => true,
        (None, Shard::Default) => false,
    };
    if !free {
        request_handover(ctx, namespace, addon, &ctx.settings.shard).await?;
    }
    Ok(free)
}

/// Annotates ClusterAddon `name` with the shard that now owns its Cluster: a change of the ClusterAddon, which
/// wakes the shard it is labelled for (whose Cluster watch may have missed the Cluster leaving it) to hand it
/// over. Written once: the same value again changes nothing.
async fn request_handover(ctx: &Context, namespace: &str, name: &str, to: &Shard) -> Result<(), Error> {
    Api::<ClusterAddon>::namespaced(ctx.client.clone(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {HANDOVER_ANNOTATION: to.name()}}})),
        )
        .await
        .map_err(|e| Error::kube(format!("ask for ClusterAddon {name}"), e))?;
    Ok(())
}

/// On a ClusterAddon: the shard that owns its Cluster now and waits for it to be handed over.
pub(crate) const HANDOVER_ANNOTATION: &str = "clusterstack.x-k8s.io/handover-to";
