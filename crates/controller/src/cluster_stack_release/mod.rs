//! The ClusterStackRelease controller: fetches the release through the cache, waits for the provider
//! object, renders the cluster-class chart and keeps its objects applied (a deleted or edited ClusterClass
//! comes back), with the inventory in `status.resources`. Deleting waits while a Cluster uses the class,
//! then deletes every object of the inventory, without needing the release's files.
//!
//! Shape: the reconcile reads its object, then `decide::next_step` (pure) names the next step and the
//! driver here carries it out (a read, a download, a render, an apply through `crate::applier`),
//! recording what happened in `decide::Progress`, until nothing is left to do; `decide::conclude`
//! (pure) turns what happened into the status, the events and the retry, and the status is written once.

pub(crate) mod decide;

use std::sync::Arc;

use cso_api::{
    ClusterStackRelease, ReleaseId,
    cluster_stack_release::{CLUSTER_STACK_RELEASE_FINALIZER, ReleaseProvenance},
    common::ObjectReference,
    conditions::ConditionsExt,
};
use cso_apply::discovery::ApiRef;
use cso_release::Release;
use cso_render::Manifest;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{
    Api, Resource, ResourceExt,
    api::{DynamicObject, Patch, PatchParams},
    core::GroupVersionKind,
    runtime::controller::Action,
};
use serde_json::json;

pub(crate) use self::decide::FetchFailure;
use self::decide::{Files, Outcome, Progress, Step, conclude, next_step};
use crate::{
    Error,
    applier::{Target, Work},
    context::ControllerContext,
    context::object_key,
    filter::is_paused,
    in_use::list_clusters,
    patch,
    provider_watch::ProviderWatches,
    rendering,
};

/// The ClusterStackRelease controller's context: the shared one and the watches of the provider objects its
/// releases name.
pub type ReleaseContext = ControllerContext<ProviderWatches>;

/// Reconciles one ClusterStackRelease (recorded in the reconcile metrics as `clusterstackrelease`, bounded by
/// the reconcile timeout).
pub async fn reconcile(release: Arc<ClusterStackRelease>, ctx: Arc<ReleaseContext>) -> Result<Action, Error> {
    ctx.bounded("clusterstackrelease", release, reconcile_object)
        .await
}

async fn reconcile_object(
    queued: Arc<ClusterStackRelease>,
    ctx: Arc<ReleaseContext>,
) -> Result<Action, Error> {
    let api: Api<ClusterStackRelease> =
        Api::namespaced(ctx.client.clone(), &queued.namespace().unwrap_or_default());
    let Some(release) = patch::current(&ctx, &api, queued.as_ref()).await? else {
        return Ok(Action::await_change());
    };
    if is_paused(&release) {
        return Ok(Action::await_change());
    }
    let deleting = release.meta().deletion_timestamp.is_some();
    let has_finalizer = release
        .finalizers()
        .iter()
        .any(|f| f == CLUSTER_STACK_RELEASE_FINALIZER);
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    if !deleting {
        // Persist the finalizer first: nothing may be applied that a deletion could then leave behind.
        patch::add_finalizer(&ctx.written, &api, &release, CLUSTER_STACK_RELEASE_FINALIZER).await?;
    }

    let id = ReleaseId::parse_tag(&release.name_any()).map_err(|e| e.to_string());
    let mut progress = Progress::new(id, deleting, release.spec.provider_ref.is_some());
    progress.checked = ctx.releases.source().verifies() || release.spec.digest.is_some();
    let mut driver = Driver {
        ctx: &ctx,
        release: &release,
        files: None,
        manifests: Vec::new(),
    };
    loop {
        let step = next_step(&progress, &release);
        if step == Step::Conclude {
            break;
        }
        driver.run(step, &mut progress).await?;
    }

    let mut working = release.clone();
    let (events, outcome) = conclude(&progress, &mut working, ctx.settings.resync_interval);
    working.set_summary();
    let status = working.status.clone().unwrap_or_default();
    patch::status(&ctx.written, &api, &working, release.status.as_ref(), &status).await?;
    ctx.publish(&working, events).await;
    match outcome {
        Outcome::Requeue(Some(delay)) => Ok(Action::requeue(delay)),
        Outcome::Requeue(None) => Ok(Action::await_change()),
        Outcome::Deleted => {
            tracing::info!(release = %release.name_any(), "deleted the objects of the release");
            patch::remove_finalizer(&ctx.written, &api, &release, CLUSTER_STACK_RELEASE_FINALIZER).await?;
            Ok(Action::await_change())
        }
        Outcome::Retry(message) => Err(Error::Reported(message)),
    }
}

/// Retry after a failed reconcile, with per-object backoff.
pub fn error_policy(release: Arc<ClusterStackRelease>, error: &Error, ctx: Arc<ReleaseContext>) -> Action {
    let delay = ctx.retry_delay(&object_key(release.as_ref()));
    tracing::warn!(release = %release.name_any(), namespace = ?release.namespace(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Carries out the steps; keeps what they produce that the decisions do not need (files, objects).
struct Driver<'a> {
    ctx: &'a ReleaseContext,
    release: &'a ClusterStackRelease,
    files: Option<Arc<Release>>,
    manifests: Vec<Manifest>,
}

impl Driver<'_> {
    async fn run(&mut self, step: Step, progress: &mut Progress) -> Result<(), Error> {
        let namespace = self.release.namespace().unwrap_or_default();
        match step {
            Step::LookInCache | Step::Download => {
                let id = progress.id.clone().map_err(Error::Internal)?;
                let pin = self.release.spec.digest.as_deref();
                let found = match step {
                    Step::LookInCache => self.ctx.releases.cached_pinned(&id, pin),
                    _ => self.ctx.releases.get_pinned(&id, pin).await.map(Some),
                };
                progress.files = match found {
                    Ok(Some(files)) => {
                        let ready = Files::Ready {
                            kubernetes: files.metadata.kubernetes.clone(),
                            downloaded_now: step == Step::Download,
                            // Cached before records were kept: nothing known but the kind of source.
                            source: files.provenance.clone().unwrap_or_else(|| {
                                ReleaseProvenance::of_kind(self.ctx.releases.source().kind())
                            }),
                        };
                        self.files = Some(files);
                        ready
                    }
                    Ok(None) => Files::Missing,
                    Err(error) => Files::Failed {
                        failure: FetchFailure::of(&error),
                        message: error.to_string(),
                    },
                };
            }
            Step::CheckProvider => {
                let reference = self.release.spec.provider_ref.clone().unwrap_or_default();
                progress.provider = Some(provider_ready(self.release, &reference, self.ctx).await);
            }
            Step::Render => {
                let files = self
                    .files
                    .clone()
                    .ok_or_else(|| Error::Internal("render before fetch".into()))?;
                let request = rendering::cluster_class_request(&files, &namespace);
                progress.rendered = Some(
                    match rendering::render(self.ctx.renderer.as_ref(), request).await {
                        Ok(manifests) if manifests.is_empty() => {
                            Err("the cluster-class chart rendered no objects".to_owned())
                        }
                        Ok(manifests) => {
                            let count = manifests.len();
                            self.manifests = manifests;
                            Ok(count)
                        }
                        Err(message) => Err(message),
                    },
                );
            }
            Step::Apply => {
                let previous = self.recorded();
                progress.applied = Some(
                    self.work(&namespace)
                        .apply(self.ctx, &self.manifests, &previous, false)
                        .await,
                );
            }
            Step::FindUsers => {
                let id = progress.id.clone().map_err(Error::Internal)?;
                let clusters = list_clusters(self.ctx).await?;
                progress.users = Some(cso_api::rules::release_users(&clusters, &namespace, &id));
            }
            Step::Delete => {
                // From the inventory, with no render: works when the files are gone or never came.
                let recorded = self.recorded();
                progress.deleted = Some(self.work(&namespace).delete(self.ctx, &recorded).await);
            }
            Step::Conclude => {}
        }
        Ok(())
    }

    /// The release's inventory as last recorded (shared, not copied).
    fn recorded(&self) -> cso_api::inventory::Inventory {
        self.release
            .status
            .as_ref()
            .map(|s| s.resources.clone())
            .unwrap_or_default()
    }

    fn work<'w>(&'w self, namespace: &'w str) -> Work<'w, ClusterStackRelease> {
        Work {
            about: self.release,
            owner: self.release.name_any(),
            target: Target::Management { namespace },
        }
    }
}

/// Whether the provider object is ready; makes the release its controller owner and watches its kind.
async fn provider_ready(
    release: &ClusterStackRelease,
    reference: &ObjectReference,
    ctx: &ReleaseContext,
) -> Result<bool, String> {
    let api_version = reference.api_version.clone().unwrap_or_default();
    let kind = reference.kind.clone().unwrap_or_default();
    let name = reference.name.clone().unwrap_or_default();
    // Like the Go operator: the release's namespace, whatever the reference says.
    let namespace = release.namespace().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version.as_str()));
    let gvk = GroupVersionKind::gvk(group, version, &kind);
    let resolved = ctx.discovery.resolve(&gvk).await.map_err(|e| e.to_string())?;
    ctx.own.ensure(&gvk, &resolved.resource);
    let object = ctx
        .discovery
        .get_object(ApiRef::Version(&api_version), &kind, Some(&namespace), &name)
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
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &namespace, &resolved.resource);
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
