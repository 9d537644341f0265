//! The ClusterAddonCreate controller: a `ClusterAddon` named `cluster-addon-<cluster>` (owned by the Cluster)
//! for every Cluster whose class is a ClusterClass of a cluster stack (a ClusterStackRelease of that name
//! exists), and only for those, so existing Cluster API clusters can be adopted without one; recreated when
//! deleted.

use std::sync::Arc;

use cso_api::{
    ClusterAddon, ClusterAddonSpec, ClusterStackRelease, capi::Cluster, cluster_addon::cluster_addon_name,
    common::ObjectReference,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{
    Api, Resource, ResourceExt,
    api::{ObjectMeta, PostParams},
    runtime::controller::Action,
};

use crate::{
    Context, Error,
    context::object_key,
    filter::{is_paused, propagated_labels},
};

/// Reconciles one Cluster (recorded in the reconcile metrics as `clusteraddoncreate`, bounded by
/// the reconcile timeout).
pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    Context::bounded("clusteraddoncreate", cluster, ctx, reconcile_object).await
}

async fn reconcile_object(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    if is_paused(cluster.as_ref()) || cluster.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let Some((id, class_namespace)) = cluster.stack_release() else {
        return Ok(Action::await_change());
    };
    let releases: Api<ClusterStackRelease> = Api::namespaced(ctx.client.clone(), &class_namespace);
    if releases
        .get_opt(&id.tag())
        .await
        .map_err(|e| Error::kube(format!("read ClusterStackRelease {}", id.tag()), e))?
        .is_none()
    {
        // Not (yet) a class of a cluster stack: the release watch brings us back if it becomes one.
        return Ok(Action::await_change());
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster_addon_name(&cluster.name_any());
    let addons: Api<ClusterAddon> = Api::namespaced(ctx.client.clone(), &namespace);
    if addons
        .get_opt(&name)
        .await
        .map_err(|e| Error::kube(format!("read ClusterAddon {name}"), e))?
        .is_some()
    {
        return Ok(Action::await_change());
    }
    let labels = propagated_labels(&ctx.settings);
    let addon = ClusterAddon {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            labels: (!labels.is_empty()).then_some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: Cluster::api_version(&()).into_owned(),
                kind: Cluster::kind(&()).into_owned(),
                name: cluster.name_any(),
                uid: cluster.uid().unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: ClusterAddonSpec {
            cluster_ref: ObjectReference {
                api_version: Some(Cluster::api_version(&()).into_owned()),
                kind: Some(Cluster::kind(&()).into_owned()),
                name: Some(cluster.name_any()),
                namespace: Some(namespace),
                uid: cluster.uid(),
                ..Default::default()
            },
            ..Default::default()
        },
        status: None,
    };
    match addons.create(&PostParams::default(), &addon).await {
        Ok(_) => tracing::info!(cluster_addon = %name, "created a ClusterAddon"),
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(Error::kube(format!("create ClusterAddon {name}"), e)),
    }
    Ok(Action::await_change())
}

pub fn error_policy(cluster: Arc<Cluster>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.retry_delay(&object_key(cluster.as_ref()));
    tracing::warn!(cluster = %cluster.name_any(), namespace = ?cluster.namespace(), %error, retry_in = ?delay, "creating the ClusterAddon failed");
    Action::requeue(delay)
}
