//! The ClusterStackRelease controller: fetches the release through the cache, waits for the provider
//! object, renders the cluster-class chart and keeps its objects applied (a deleted or edited ClusterClass
//! comes back), with the inventory in `status.resources`. Deleting waits while a Cluster uses the class,
//! then deletes every object of the inventory, without needing the release's files.

use std::sync::Arc;

use cso_api::{
    ClusterStackRelease, ClusterStackReleaseStatus, ReleaseId,
    cluster_stack_release::CLUSTER_STACK_RELEASE_FINALIZER,
    common::ObjectReference,
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
};
use cso_release::{CacheError, Release, SourceError};
use cso_render::parse_manifests;

use crate::metrics::TargetCluster;
use crate::rendering;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{
    Api, Resource, ResourceExt,
    api::{DynamicObject, Patch, PatchParams},
    core::GroupVersionKind,
    runtime::{controller::Action, events::EventType},
};
use serde_json::json;

use crate::{
    Context, Error,
    context::object_key,
    filter::is_paused,
    in_use::{list_clusters, releases_in_use},
    patch,
};

/// Reconciles one ClusterStackRelease (recorded in the reconcile metrics as `clusterstackrelease`, bounded by
/// the reconcile timeout).
pub async fn reconcile(release: Arc<ClusterStackRelease>, ctx: Arc<Context>) -> Result<Action, Error> {
    Context::bounded("clusterstackrelease", release, ctx, reconcile_object).await
}

async fn reconcile_object(queued: Arc<ClusterStackRelease>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<ClusterStackRelease> =
        Api::namespaced(ctx.client.clone(), &queued.namespace().unwrap_or_default());
    let Some(release) = patch::current(&api, queued.as_ref()).await? else {
        return Ok(Action::await_change());
    };
    if is_paused(&release) {
        return Ok(Action::await_change());
    }
    let deleting = release.meta().deletion_timestamp.is_some();
    if deleting
        && !release
            .finalizers()
            .iter()
            .any(|f| f == CLUSTER_STACK_RELEASE_FINALIZER)
    {
        return Ok(Action::await_change());
    }
    if !deleting {
        // Persist the finalizer first: nothing may be applied that a deletion could then leave behind.
        patch::add_finalizer(&api, &release, CLUSTER_STACK_RELEASE_FINALIZER).await?;
    }

    let mut working = release.clone();
    let outcome = if deleting {
        cleanup(&mut working, &ctx).await
    } else {
        sync(&mut working, &api, &ctx).await
    };
    working.set_summary();
    let status = working.status.clone().unwrap_or_default();
    patch::status(&api, &working, release.status.as_ref(), &status).await?;
    match outcome {
        Ok(Outcome::Done(action)) => Ok(action),
        Ok(Outcome::Deleted) => {
            patch::remove_finalizer(&api, &release, CLUSTER_STACK_RELEASE_FINALIZER).await?;
            Ok(Action::await_change())
        }
        Ok(Outcome::Retry(message)) => Err(Error::Reported(message)),
        Err(e) => Err(e),
    }
}

/// Retry after a failed reconcile, with per-object backoff.
pub fn error_policy(release: Arc<ClusterStackRelease>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.retry_delay(&object_key(release.as_ref()));
    tracing::warn!(release = %release.name_any(), namespace = ?release.namespace(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

enum Outcome {
    Done(Action),
    /// The finalizer may go.
    Deleted,
    /// Reported in the conditions; try again with backoff.
    Retry(String),
}

fn status_of(release: &mut ClusterStackRelease) -> &mut ClusterStackReleaseStatus {
    release.status.get_or_insert_with(Default::default)
}

async fn sync(
    release: &mut ClusterStackRelease,
    api: &Api<ClusterStackRelease>,
    ctx: &Context,
) -> Result<Outcome, Error> {
    let name = release.name_any();
    let namespace = release.namespace().unwrap_or_default();
    let id = match ReleaseId::parse_tag(&name) {
        Ok(id) => id,
        Err(e) => {
            release.mark_false(
                condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                reason::ISSUE_WITH_RELEASE_ASSETS,
                Severity::Error,
                e.to_string(),
            );
            // The name never changes: nothing to retry.
            return Ok(Outcome::Done(Action::await_change()));
        }
    };

    let assets = match fetch(release, &id, api, ctx).await? {
        Ok(assets) => assets,
        Err(retry) => return Ok(retry),
    };
    release.mark_true(condition::CLUSTER_STACK_RELEASE_DOWNLOADED);
    status_of(release).kubernetes_version = assets.metadata.kubernetes.clone();

    if let Some(provider_ref) = release.spec.provider_ref.clone() {
        match provider_ready(release, &provider_ref, ctx).await {
            Ok(true) => {}
            Ok(false) => {
                release.mark_false(
                    condition::PROVIDER_CLUSTER_STACK_RELEASE_READY,
                    reason::PROCESS_ONGOING,
                    Severity::Info,
                    "providerClusterStackRelease not ready yet",
                );
                // The provider-object watch brings us back when it changes; the resync is a safety net.
                return Ok(Outcome::Done(Action::requeue(ctx.settings.resync_interval)));
            }
            Err(message) => {
                release.mark_false(
                    condition::PROVIDER_CLUSTER_STACK_RELEASE_READY,
                    reason::PROVIDER_OBJECT_NOT_FOUND,
                    Severity::Warning,
                    message.clone(),
                );
                return Ok(Outcome::Retry(message));
            }
        }
    }
    release.mark_true(condition::PROVIDER_CLUSTER_STACK_RELEASE_READY);

    let rendered = ctx
        .renderer
        .render(rendering::cluster_class_request(&assets, &namespace))
        .await
        .map_err(|e| e.to_string())
        .and_then(|text| parse_manifests(&text).map_err(|e| e.to_string()))
        .and_then(|manifests| {
            if manifests.is_empty() {
                Err("the cluster-class chart rendered no objects".to_owned())
            } else {
                Ok(manifests)
            }
        });
    let manifests = match rendered {
        Ok(manifests) => manifests,
        Err(message) => {
            ctx.report_false(
                release,
                (
                    condition::HELM_CHART_APPLIED,
                    reason::FAILED_TO_RENDER_CHART,
                    Severity::Error,
                ),
                &message,
                (EventType::Warning, event::FAILED_TO_RENDER_CHART),
            )
            .await;
            return Ok(Outcome::Retry(message));
        }
    };

    let labels = rendering::release_labels(name.clone());
    let previous = status_of(release).resources.clone();
    let report = ctx.engine.apply(&manifests, &namespace, &labels, &previous).await;
    ctx.metrics.applied(TargetCluster::Management, &report);
    status_of(release).resources = report.resources.clone();
    ctx.report_drift(release, TargetCluster::Management, &report)
        .await;
    if !report.is_complete() {
        let message = report.failure_summary();
        ctx.report_false(
            release,
            (
                condition::HELM_CHART_APPLIED,
                reason::OBJECTS_APPLYING_ONGOING,
                Severity::Warning,
            ),
            &message,
            (EventType::Warning, event::FAILED_TO_APPLY_OBJECTS),
        )
        .await;
        return Ok(Outcome::Retry(message));
    }
    release.mark_true(condition::HELM_CHART_APPLIED);
    status_of(release).ready = true;
    Ok(Outcome::Done(Action::requeue(ctx.settings.resync_interval)))
}

/// The release's files, from the cache or downloaded. `Err(outcome)` when they cannot be had now; the
/// conditions say why.
async fn fetch(
    release: &mut ClusterStackRelease,
    id: &ReleaseId,
    api: &Api<ClusterStackRelease>,
    ctx: &Context,
) -> Result<Result<Arc<Release>, Outcome>, Error> {
    let cached = ctx.releases.cached(id);
    let downloading = matches!(cached, Ok(None));
    // Say "downloading" before the first attempt only: after a failure the condition keeps saying why,
    // and a status that flips back and forth would trigger reconcile after reconcile.
    if downloading && !release.is_condition_false(condition::CLUSTER_STACK_RELEASE_DOWNLOADED) {
        // Say so before a download that may take a while.
        release.mark_false(
            condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
            reason::RELEASE_ASSETS_NOT_DOWNLOADED_YET,
            Severity::Info,
            "assets not downloaded yet",
        );
        let mut shown = release.clone();
        shown.set_summary();
        if let Some(status) = &shown.status {
            patch::status(api, &shown, None, status).await?;
        }
    }
    let result = match cached {
        Ok(Some(assets)) => Ok(assets),
        Ok(None) => ctx.releases.get(id).await,
        Err(e) => Err(e),
    };
    let error = match result {
        Ok(assets) => {
            if downloading {
                release.mark_true(condition::ASSETS_CLIENT_API_AVAILABLE);
            }
            return Ok(Ok(assets));
        }
        Err(error) => error,
    };
    let message = error.to_string();
    let failure = FetchFailure::of(&error);
    ctx.report_false(
        release,
        (failure.condition, failure.reason, failure.severity),
        &message,
        (EventType::Warning, failure.event),
    )
    .await;
    let outcome = match failure.retry_after {
        // Rate limited: come back when the source allows it, not earlier.
        Some(delay) => Outcome::Done(Action::requeue(delay)),
        None => Outcome::Retry(message),
    };
    Ok(Err(outcome))
}

/// How a release that cannot be had is reported, on a ClusterStackRelease or a ClusterAddon.
pub(crate) struct FetchFailure {
    pub(crate) condition: &'static str,
    pub(crate) reason: &'static str,
    pub(crate) severity: Severity,
    pub(crate) event: &'static str,
    /// How long the source asked us to wait.
    pub(crate) retry_after: Option<std::time::Duration>,
}

impl FetchFailure {
    pub(crate) fn of(error: &CacheError) -> Self {
        let downloaded = |reason, severity, event| FetchFailure {
            condition: condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
            reason,
            severity,
            event,
            retry_after: None,
        };
        match error {
            CacheError::Source {
                error: SourceError::Config(_),
                ..
            } => FetchFailure {
                condition: condition::ASSETS_CLIENT_API_AVAILABLE,
                reason: reason::FAILED_CREATE_ASSETS_CLIENT,
                severity: Severity::Error,
                event: event::FAILED_CREATE_ASSETS_CLIENT,
                retry_after: None,
            },
            CacheError::Source {
                error: SourceError::NotFound { .. },
                ..
            } => downloaded(
                reason::RELEASE_NOT_FOUND,
                Severity::Error,
                event::RELEASE_DOWNLOAD_FAILED,
            ),
            CacheError::Source {
                error: source_error, ..
            } => FetchFailure {
                retry_after: source_error.retry_after(),
                ..downloaded(
                    reason::RELEASE_ASSETS_NOT_DOWNLOADED_YET,
                    Severity::Warning,
                    event::RELEASE_DOWNLOAD_FAILED,
                )
            },
            CacheError::Release { .. } => downloaded(
                reason::ISSUE_WITH_RELEASE_ASSETS,
                Severity::Error,
                event::VALIDATE_HELM_CHART_FAILED,
            ),
            CacheError::Io { .. } => downloaded(
                reason::ISSUE_WITH_RELEASE_ASSETS,
                Severity::Error,
                event::RELEASE_DOWNLOAD_FAILED,
            ),
        }
    }
}

/// Whether the provider object is ready; makes the release its controller owner and watches its kind.
async fn provider_ready(
    release: &ClusterStackRelease,
    reference: &ObjectReference,
    ctx: &Context,
) -> Result<bool, String> {
    let api_version = reference.api_version.clone().unwrap_or_default();
    let kind = reference.kind.clone().unwrap_or_default();
    let name = reference.name.clone().unwrap_or_default();
    // Like the Go operator: the release's namespace, whatever the reference says.
    let namespace = release.namespace().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version.as_str()));
    let gvk = GroupVersionKind::gvk(group, version, &kind);
    let resolved = ctx.discovery.resolve(&gvk).await.map_err(|e| e.to_string())?;
    ctx.provider_watches.ensure(&gvk, &resolved.resource);
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, &resolved.resource);
    let object = api
        .get_opt(&name)
        .await
        .map_err(|e| format!("failed to read the provider object {kind} {namespace}/{name}: {e}"))?
        .ok_or_else(|| format!("the provider object {kind} {namespace}/{name} does not exist"))?;

    let owner = OwnerReference {
        api_version: ClusterStackRelease::api_version(&()).into_owned(),
        kind: ClusterStackRelease::kind(&()).into_owned(),
        name: release.name_any(),
        uid: release.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let owners = object.owner_references();
    if !owners.iter().any(|o| o.uid == owner.uid) {
        let mut updated: Vec<OwnerReference> = owners
            .iter()
            .filter(|o| o.controller != Some(true))
            .cloned()
            .collect();
        updated.push(owner);
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": updated, "resourceVersion": object.resource_version()}})),
        )
        .await
        .map_err(|e| format!("failed to set the owner of the provider object {kind} {namespace}/{name}: {e}"))?;
    }
    match object.data.pointer("/status/ready") {
        None => Ok(false),
        Some(serde_json::Value::Bool(ready)) => Ok(*ready),
        Some(other) => Err(format!(
            "status.ready of the provider object {kind} {namespace}/{name} is not a boolean: {other}"
        )),
    }
}

/// Deletion: wait while Clusters use the class, then delete everything in the inventory.
async fn cleanup(release: &mut ClusterStackRelease, ctx: &Context) -> Result<Outcome, Error> {
    let name = release.name_any();
    let namespace = release.namespace().unwrap_or_default();
    if let Ok(id) = ReleaseId::parse_tag(&name) {
        let clusters = list_clusters(ctx).await?;
        if let Some(users) = releases_in_use(&clusters, &namespace).remove(&id) {
            let users: Vec<String> = users.into_iter().collect();
            let message = format!(
                "ClusterClass {} is used by Cluster(s) {}; deletion waits until they move on",
                id.cluster_class_name(),
                users.join(", ")
            );
            ctx.report_false(
                release,
                (
                    condition::CLUSTER_CLASS_UNUSED,
                    reason::CLUSTER_CLASS_IN_USE,
                    Severity::Info,
                ),
                &message,
                (EventType::Normal, event::CLUSTER_CLASS_IN_USE),
            )
            .await;
            // The Cluster watch brings us back when a Cluster moves on; the resync is a safety net.
            return Ok(Outcome::Done(Action::requeue(ctx.settings.resync_interval)));
        }
    }
    release.mark_true(condition::CLUSTER_CLASS_UNUSED);

    // Delete from the inventory, with no render: works when the files are gone or never came.
    let labels = rendering::release_labels(name.clone());
    let previous = status_of(release).resources.clone();
    let report = ctx.engine.apply(&[], &namespace, &labels, &previous).await;
    ctx.metrics.applied(TargetCluster::Management, &report);
    status_of(release).resources = report.resources.clone();
    if !report.is_complete() {
        let message = report.failure_summary();
        ctx.report_false(
            release,
            (
                condition::HELM_CHART_DELETED,
                reason::FAILED_TO_DELETE_OBJECTS,
                Severity::Warning,
            ),
            &message,
            (EventType::Warning, event::FAILED_TO_DELETE_OBJECTS),
        )
        .await;
        return Ok(Outcome::Retry(message));
    }
    tracing::info!(release = %name, deleted = report.pruned.len(), "deleted the objects of the release");
    Ok(Outcome::Deleted)
}
