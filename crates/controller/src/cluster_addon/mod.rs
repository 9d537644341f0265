//! The ClusterAddon controller: the core addons of a workload cluster. It waits for the workload cluster
//! (its kubeconfig Secret and `/readyz`), templates the release's values over the Cluster, renders the addon
//! chart against the workload cluster, applies it there with an inventory, and prunes what an upgrade no
//! longer has. A class change that keeps the addon version and the Kubernetes minor changes nothing; the
//! objects are re-applied every resync interval, so deleted or edited addon objects come back.
//!
//! Releases with one addon chart (`cluster-addon-values.yaml`) are handled here; multi-stage releases
//! (`clusteraddon.yaml`, stages per lifecycle hook) in [`staged`].

pub mod decision;
mod staged;

use std::sync::Arc;

use cso_api::{
    ClusterAddon, ClusterAddonStatus,
    capi::Cluster,
    cluster_addon::{CLUSTER_ADDON_FINALIZER, STAGE_ANNOTATION},
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
};
use cso_apply::template_data::template_data;
use cso_release::{AddonStyle, Release};
use cso_render::parse_manifests;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{controller::Action, events::EventType},
};
use serde_json::json;

use self::decision::{Applied, Decision, decide};
use crate::metrics::TargetCluster;
use crate::rendering::{self, ADDON_NAMESPACE};
use crate::{
    Context, Error, cluster_stack_release::FetchFailure, context::object_key, filter::is_paused, patch,
};

/// What the reconcile decided to record in the spec (the Go operator's fields, written after the fact).
#[derive(Default)]
struct SpecUpdate {
    cluster_stack: Option<String>,
    version: Option<String>,
    /// `Some("")` clears `spec.hook`.
    hook: Option<String>,
    stage: Option<&'static str>,
    /// The status was written during the reconcile (stage progress): write the final one unconditionally.
    status_written: bool,
}

/// Reconciles one ClusterAddon (recorded in the reconcile metrics as `clusteraddon`, bounded by
/// the reconcile timeout).
pub async fn reconcile(addon: Arc<ClusterAddon>, ctx: Arc<Context>) -> Result<Action, Error> {
    Context::bounded("clusteraddon", addon, ctx, reconcile_object).await
}

async fn reconcile_object(queued: Arc<ClusterAddon>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<ClusterAddon> = Api::namespaced(ctx.client.clone(), &queued.namespace().unwrap_or_default());
    let Some(addon) = patch::current(&api, queued.as_ref()).await? else {
        return Ok(Action::await_change());
    };
    if is_paused(&addon) {
        return Ok(Action::await_change());
    }
    if addon.meta().deletion_timestamp.is_some() {
        // Deleting never waits: the addons live in the workload cluster and go with it. The Go operator's
        // finalizer (kept only while its Cluster exists) is removed so a Cluster deletion cannot deadlock.
        patch::remove_finalizer(&api, &addon, CLUSTER_ADDON_FINALIZER).await?;
        ctx.workloads
            .forget(&addon.namespace().unwrap_or_default(), &cluster_name(&addon));
        return Ok(Action::await_change());
    }
    let mut working = addon.clone();
    let mut spec_update = SpecUpdate::default();
    let outcome = sync(&mut working, &api, &mut spec_update, &ctx).await;
    working.set_summary();
    let status = working.status.clone().unwrap_or_default();
    let before = if spec_update.status_written {
        None
    } else {
        addon.status.as_ref()
    };
    patch::status(&api, &working, before, &status).await?;
    write_spec(&api, &working, spec_update).await?;
    outcome
}

/// The Cluster of a ClusterAddon: `spec.clusterRef.name`, else the name after `cluster-addon-`.
fn cluster_name(addon: &ClusterAddon) -> String {
    addon
        .spec
        .cluster_ref
        .name
        .clone()
        .unwrap_or_else(|| addon.name_any().trim_start_matches("cluster-addon-").to_owned())
}

pub fn error_policy(addon: Arc<ClusterAddon>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.retry_delay(&object_key(addon.as_ref()));
    tracing::warn!(cluster_addon = %addon.name_any(), namespace = ?addon.namespace(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn status_of(addon: &mut ClusterAddon) -> &mut ClusterAddonStatus {
    addon.status.get_or_insert_with(Default::default)
}

async fn sync(
    addon: &mut ClusterAddon,
    api: &Api<ClusterAddon>,
    spec_update: &mut SpecUpdate,
    ctx: &Context,
) -> Result<Action, Error> {
    let namespace = addon.namespace().unwrap_or_default();
    let cluster_name = cluster_name(addon);
    let clusters: Api<Cluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(cluster) = clusters
        .get_opt(&cluster_name)
        .await
        .map_err(|e| Error::kube(format!("read Cluster {cluster_name}"), e))?
    else {
        // The Cluster is gone; its ClusterAddon goes with it (owner reference), and so does its client.
        ctx.workloads.forget(&namespace, &cluster_name);
        return Ok(Action::await_change());
    };
    let Some((id, _)) = cluster.stack_release() else {
        addon.mark_false(
            condition::CLUSTER_READY,
            reason::NO_CLUSTER_STACK_CLASS,
            Severity::Warning,
            format!("Cluster {cluster_name} has no ClusterClass of a cluster stack"),
        );
        return Ok(Action::await_change());
    };

    let workload = match ctx.workloads.get(&namespace, &cluster_name).await {
        Ok(workload) => workload,
        Err(e) => {
            addon.mark_false(
                condition::CLUSTER_READY,
                reason::CONTROL_PLANE_NOT_READY,
                Severity::Warning,
                format!("kubeconfig not there (yet): {e}"),
            );
            return Ok(Action::requeue(ctx.settings.workload_retry_interval));
        }
    };
    if let Err(e) = ctx.workloads.ready(&workload).await {
        addon.mark_false(
            condition::CLUSTER_READY,
            reason::CONTROL_PLANE_NOT_READY,
            Severity::Info,
            format!("control plane not ready yet: {e}"),
        );
        return Ok(Action::requeue(ctx.settings.workload_retry_interval));
    }
    addon.mark_true(condition::CLUSTER_READY);

    let release = match ctx.releases.get(&id).await {
        Ok(release) => release,
        Err(error) => {
            let failure = FetchFailure::of(&error);
            let message = error.to_string();
            ctx.report_false(
                addon,
                (failure.condition, failure.reason, failure.severity),
                &message,
                (EventType::Warning, failure.event),
            )
            .await;
            return match failure.retry_after {
                Some(delay) => Ok(Action::requeue(delay)),
                None => Err(Error::Reported(message)),
            };
        }
    };
    addon.mark_true(condition::CLUSTER_STACK_RELEASE_DOWNLOADED);
    let key = object_key(&*addon);
    let applied = Applied::of(&addon.spec.cluster_stack, &addon.spec.version);
    let complete = addon.is_condition_true(condition::HELM_CHART_APPLIED);
    let decision = decide(
        &applied,
        &id,
        &release.metadata.cluster_addon.to_dash(),
        complete,
        ctx.addon_apply_due(&key),
    );
    let values_file = match &release.addons {
        AddonStyle::Single { values_file } => values_file.clone(),
        AddonStyle::Staged { config } => {
            let run = staged::StagedRun {
                ctx,
                api,
                cluster: &cluster,
                release: &release,
                workload: &workload,
                config,
            };
            let action = run.sync(addon, spec_update, decision).await?;
            return Ok(action);
        }
    };
    match decision {
        Decision::RecordOnly => {
            // Same addons as applied: a class switch is recorded, nothing is rendered or applied.
            spec_update.cluster_stack = Some(id.cluster_class_name());
            // A hook set by the hook server is done too (the Go operator never finishes it: upgrades hang).
            spec_update.hook = Some(String::new());
            status_of(addon).ready = true;
            return Ok(Action::requeue(ctx.settings.resync_interval));
        }
        Decision::Apply { upgrade } => {
            if upgrade {
                status_of(addon).ready = false;
            }
            apply(
                addon,
                spec_update,
                ctx,
                &cluster,
                &release,
                &workload,
                &values_file,
                upgrade,
            )
            .await?;
            ctx.addon_applied(&key);
        }
    }
    Ok(Action::requeue(ctx.settings.resync_interval))
}

#[allow(
    clippy::too_many_arguments,
    reason = "the steps of one apply, kept in one place"
)]
async fn apply(
    addon: &mut ClusterAddon,
    spec_update: &mut SpecUpdate,
    ctx: &Context,
    cluster: &Cluster,
    release: &Release,
    workload: &cso_apply::WorkloadCluster,
    values_file: &std::path::Path,
    upgrade: bool,
) -> Result<(), Error> {
    let id = &release.id;
    let manifests = match render(
        ctx,
        cluster,
        workload,
        release,
        &release.cluster_addon_archive,
        Some(values_file),
    )
    .await
    {
        Ok(manifests) => manifests,
        Err((reason, message)) => {
            ctx.report_false(
                addon,
                (condition::HELM_CHART_TEMPLATED, reason, Severity::Error),
                &message,
                (EventType::Warning, reason),
            )
            .await;
            return Err(Error::Reported(message));
        }
    };
    addon.delete_condition(condition::HELM_CHART_TEMPLATED);

    let labels = rendering::release_labels(id.tag());
    let previous = status_of(addon).resources.clone();
    let report = workload
        .engine
        .apply(&manifests, ADDON_NAMESPACE, &labels, &previous)
        .await;
    ctx.metrics.applied(TargetCluster::Workload, &report);
    status_of(addon).resources = report.resources.clone();
    ctx.report_drift(addon, TargetCluster::Workload, &report).await;
    if !report.is_complete() {
        let message = report.failure_summary();
        ctx.report_false(
            addon,
            (
                condition::HELM_CHART_APPLIED,
                reason::FAILED_TO_APPLY_OBJECTS,
                Severity::Warning,
            ),
            &message,
            (EventType::Warning, event::FAILED_TO_APPLY_OBJECTS),
        )
        .await;
        return Err(Error::Reported(message));
    }
    let first = !addon.is_condition_true(condition::HELM_CHART_APPLIED);
    addon.mark_true(condition::HELM_CHART_APPLIED);
    status_of(addon).ready = true;
    if first || upgrade {
        ctx.event(
            addon,
            EventType::Normal,
            event::CLUSTER_ADDON_APPLIED,
            format!(
                "applied the addons of {} ({} objects, {} pruned)",
                id.cluster_class_name(),
                report.applied,
                report.pruned.len()
            ),
        )
        .await;
    }
    // Recorded once the work is done (the Go operator records intent before it).
    let was_installed = !addon.spec.cluster_stack.is_empty();
    spec_update.cluster_stack = Some(id.cluster_class_name());
    spec_update.version = Some(release.metadata.cluster_addon.to_dash());
    spec_update.hook = Some(String::new());
    spec_update.stage = Some(if was_installed && upgrade {
        "upgraded"
    } else {
        "created"
    });
    Ok(())
}

/// Renders `chart` for the workload cluster: values from `values_file` (templated over the Cluster) if
/// given, rendered against the workload cluster. On failure, the `HelmChartTemplated` reason and a message.
pub(crate) async fn render(
    ctx: &Context,
    cluster: &Cluster,
    workload: &cso_apply::WorkloadCluster,
    release: &Release,
    chart: &std::path::Path,
    values_file: Option<&std::path::Path>,
) -> Result<Vec<cso_render::Manifest>, (&'static str, String)> {
    let values = match values_file {
        Some(file) => {
            let overwrite = |message| (reason::TEMPLATE_NEW_CLUSTER_STACK_OVERWRITE_FAILED, message);
            let data = template_data(&ctx.discovery, cluster)
                .await
                .map_err(|e| overwrite(e.to_string()))?;
            Some(
                rendering::addon_values(&ctx.values, file, &data)
                    .await
                    .map_err(overwrite)?,
            )
        }
        None => None,
    };
    let failed = |message: String| (reason::TEMPLATE_NEW_CLUSTER_STACK_FAILED, message);
    let rendered = ctx
        .renderer
        .render(rendering::addon_request(
            release,
            chart,
            values,
            Some(workload.kubeconfig_path.clone()),
        ))
        .await
        .map_err(|e| failed(e.to_string()))?;
    parse_manifests(&rendered).map_err(|e| failed(e.to_string()))
}

/// Writes the spec fields and the stage annotation that changed (merge patch on fields we own).
async fn write_spec(api: &Api<ClusterAddon>, addon: &ClusterAddon, update: SpecUpdate) -> Result<(), Error> {
    let mut spec = serde_json::Map::new();
    if let Some(cluster_stack) = update.cluster_stack.filter(|c| *c != addon.spec.cluster_stack) {
        spec.insert("clusterStack".into(), cluster_stack.into());
    }
    if let Some(version) = update.version.filter(|v| *v != addon.spec.version) {
        spec.insert("version".into(), version.into());
    }
    if let Some(hook) = update.hook.filter(|h| *h != addon.spec.hook) {
        spec.insert("hook".into(), hook.into());
    }
    let stage = update
        .stage
        .filter(|s| addon.annotations().get(STAGE_ANNOTATION).map(String::as_str) != Some(*s));
    if spec.is_empty() && stage.is_none() {
        return Ok(());
    }
    let mut body = json!({"spec": spec});
    if let Some(stage) = stage {
        body["metadata"] = json!({"annotations": {STAGE_ANNOTATION: stage}});
    }
    api.patch(&addon.name_any(), &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(|e| Error::kube(format!("update ClusterAddon {}", addon.name_any()), e))?;
    Ok(())
}
