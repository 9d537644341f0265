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

/// Whether a replica of `shard` holds its Lease (in `--leader-elect-namespace`; without leader election no
/// shard is known to run).
pub(crate) async fn runs(ctx: &Context, shard: &Shard) -> Result<bool, Error> {
    let Some(namespace) = &ctx.settings.lease_namespace else {
        return Ok(false);
    };
    let name = shard.lease_name();
    Ok(Api::<Lease>::namespaced(ctx.client.clone(), namespace)
        .get_opt(&name)
        .await
        .map_err(|e| Error::kube(format!("read Lease {name}"), e))?
        .is_some_and(|lease| held(&lease)))
}
