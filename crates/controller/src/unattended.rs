//! Shards that no replica reconciles, reported by the default shard (issue 18): a Cluster labelled for shard
//! `b` is `b`'s alone, and the default shard never takes it over; when no replica of `b` holds `b`'s Lease for
//! longer than `--shard-grace`, the default shard says so: the gauge `cso_unattended_clusters{shard}` counts
//! those Clusters, and their ClusterAddons get the condition `ShardReconciling` False (reason
//! `NoShardReplica`, Warning) until a replica of `b` reconciles them again (its reconcile removes it).
//!
//! Shape: every round reads the Clusters and ClusterAddons from the default shard's watch caches (they hold
//! every one) and lists the Leases once; [`unattended`] (pure) decides, and the round writes the conditions
//! that are missing.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use cso_api::{
    ClusterAddon,
    capi::Cluster,
    cluster_addon::cluster_addon_name,
    conditions::{ConditionStatus, ConditionsExt, Severity},
    names::{condition, reason},
    shard::Shard,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Resource, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    runtime::reflector::Store,
};
use serde_json::json;

use crate::Context;

/// How often the default shard looks.
const ROUND: Duration = Duration::from_secs(5);

/// The shards whose Clusters no replica has reconciled for longer than `grace`, with those Clusters
/// (`namespace/name`). `clusters` are the labelled Clusters by shard; `live` the shards whose Lease is held;
/// `since` remembers when each shard was first seen without a live Lease (kept up to date here).
pub(crate) fn unattended(
    clusters: &BTreeMap<String, Vec<String>>,
    live: &BTreeSet<String>,
    since: &mut BTreeMap<String, Instant>,
    now: Instant,
    grace: Duration,
) -> BTreeMap<String, Vec<String>> {
    since.retain(|shard, _| clusters.contains_key(shard) && !live.contains(shard));
    clusters
        .iter()
        .filter(|(shard, _)| !live.contains(*shard))
        .filter(|(shard, _)| now.duration_since(*since.entry((*shard).clone()).or_insert(now)) >= grace)
        .map(|(shard, names)| (shard.clone(), names.clone()))
        .collect()
}

/// Runs the rounds until `shutdown` completes (default shard only).
pub(crate) async fn report(
    ctx: Arc<Context>,
    clusters: Store<Cluster>,
    addons: Store<ClusterAddon>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let Some(lease_namespace) = ctx.settings.lease_namespace.clone() else {
        return;
    };
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &lease_namespace);
    let mut since = BTreeMap::new();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    let rounds = async {
        loop {
            tokio::time::sleep(ROUND.min(ctx.settings.shard_grace)).await;
            let mut labelled: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for cluster in clusters.state() {
                if let Shard::Named(shard) = Shard::of(cluster.meta().labels.as_ref()) {
                    labelled.entry(shard).or_default().push(format!(
                        "{}/{}",
                        cluster.namespace().unwrap_or_default(),
                        cluster.name_any()
                    ));
                }
            }
            let live: BTreeSet<String> = match leases.list(&ListParams::default()).await {
                Ok(list) => list
                    .items
                    .iter()
                    .filter(|lease| crate::shard::held(lease))
                    .filter_map(|lease| {
                        let name = lease.name_any();
                        labelled
                            .keys()
                            .find(|shard| Shard::Named((*shard).clone()).lease_name() == name)
                            .cloned()
                    })
                    .collect(),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot list the shards' Leases; trying again");
                    continue;
                }
            };
            let found = unattended(
                &labelled,
                &live,
                &mut since,
                Instant::now(),
                ctx.settings.shard_grace,
            );
            for shard in reported.iter().filter(|s| !found.contains_key(*s)) {
                ctx.metrics.set_unattended(shard, 0);
                tracing::info!(%shard, "a replica reconciles the shard again");
            }
            for (shard, names) in &found {
                ctx.metrics.set_unattended(shard, names.len());
                if !reported.contains(shard) {
                    tracing::warn!(%shard, clusters = names.len(), grace = ?ctx.settings.shard_grace,
                        "no replica reconciles these Clusters' addons: start one with --shard={shard}");
                }
                for name in names {
                    let (namespace, cluster) = name.split_once('/').unwrap_or_default();
                    let reference = kube::runtime::reflector::ObjectRef::new(&cluster_addon_name(cluster))
                        .within(namespace);
                    if let Some(addon) = addons.get(&reference) {
                        mark(&ctx, &addon, shard).await;
                    }
                }
            }
            reported = found.into_keys().collect();
        }
    };
    tokio::select! {
        () = rounds => {}
        () = shutdown => {}
    }
}

/// Sets `ShardReconciling` False on `addon` unless it says so already: all its conditions plus this one, as
/// one merge patch (the owner's next status write takes it away).
async fn mark(ctx: &Context, addon: &ClusterAddon, shard: &str) {
    let already = addon
        .get_condition(condition::SHARD_RECONCILING)
        .is_some_and(|c| c.status == ConditionStatus::False);
    if already {
        return;
    }
    let mut marked = addon.clone();
    marked.mark_false(
        condition::SHARD_RECONCILING,
        reason::NO_SHARD_REPLICA,
        Severity::Warning,
        format!(
            "no replica of shard {shard:?} is running (none holds its Lease); start one with --shard={shard}"
        ),
    );
    marked.set_summary();
    let conditions = marked.status.map(|s| s.conditions).unwrap_or_default();
    let api: Api<ClusterAddon> = Api::namespaced(ctx.client.clone(), &addon.namespace().unwrap_or_default());
    let patch = json!({
        "metadata": {"resourceVersion": addon.resource_version()},
        "status": {"conditions": conditions},
    });
    if let Err(e) = api
        .patch_status(&addon.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::debug!(cluster_addon = %addon.name_any(), error = %e, "cannot mark an unattended ClusterAddon; next round");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_is_reported_once_its_grace_is_over_and_forgotten_when_live() {
        let grace = Duration::from_secs(60);
        let start = Instant::now();
        let clusters = BTreeMap::from([
            ("a".to_owned(), vec!["ns/a-0".to_owned()]),
            ("b".to_owned(), vec!["ns/b-0".to_owned(), "ns/b-1".to_owned()]),
        ]);
        let mut since = BTreeMap::new();
        let live_a = BTreeSet::from(["a".to_owned()]);
        assert!(
            unattended(&clusters, &live_a, &mut since, start, grace).is_empty(),
            "grace not over"
        );
        let later = start + grace;
        let found = unattended(&clusters, &live_a, &mut since, later, grace);
        assert_eq!(found.keys().collect::<Vec<_>>(), ["b"], "a holds its Lease");
        assert_eq!(found["b"].len(), 2);
        // b comes back: forgotten, and its grace starts again when it goes.
        let both = BTreeSet::from(["a".to_owned(), "b".to_owned()]);
        assert!(unattended(&clusters, &both, &mut since, later, grace).is_empty());
        assert!(since.is_empty());
        assert!(
            unattended(
                &clusters,
                &live_a,
                &mut since,
                later + Duration::from_secs(1),
                grace
            )
            .is_empty()
        );
    }
}
