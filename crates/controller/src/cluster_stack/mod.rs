//! The ClusterStack controller: creates the ClusterStackReleases a ClusterStack needs (spec versions, the
//! newest remote release with auto-subscribe, the newest ready one, every one a Cluster uses), deletes the
//! others, creates the provider objects in provider mode, and reports it all in the status.

pub mod plan;
pub mod provider;
pub mod summary;

use std::{collections::BTreeMap, sync::Arc};

use cso_api::{
    ClusterStack, ClusterStackRelease, ClusterStackStatus, GROUP, ReleaseId, Version,
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
};
use cso_release::{SourceError, StackKey, source::releases_of};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{controller::Action, events::EventType},
};
use serde_json::json;

use self::{
    plan::{ExistingRelease, StackSpec, plan, usable_versions},
    provider::{ProviderChange, ProviderError, sync_provider_object},
    summary::release_summary,
};
use crate::{
    Context, Error,
    context::object_key,
    filter::{is_paused, propagated_labels},
    in_use::{list_clusters, releases_in_use},
    patch,
};

/// Reconciles one ClusterStack (recorded in the reconcile metrics as `clusterstack`, bounded by
/// the reconcile timeout).
pub async fn reconcile(stack: Arc<ClusterStack>, ctx: Arc<Context>) -> Result<Action, Error> {
    Context::bounded("clusterstack", stack, ctx, reconcile_object).await
}

async fn reconcile_object(queued: Arc<ClusterStack>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<ClusterStack> = Api::namespaced(ctx.client.clone(), &queued.namespace().unwrap_or_default());
    let Some(stack) = patch::current(&api, queued.as_ref()).await? else {
        return Ok(Action::await_change());
    };
    if is_paused(&stack) || stack.meta().deletion_timestamp.is_some() {
        // Deletion needs nothing from us: the releases are owned and garbage-collected.
        return Ok(Action::await_change());
    }
    let mut working = stack.clone();
    let outcome = sync(&mut working, &ctx).await;
    working.set_summary();
    let status = working.status.clone().unwrap_or_default();
    patch::status(&api, &working, stack.status.as_ref(), &status).await?;
    outcome
}

/// Retry after a failed reconcile, with per-object backoff.
pub fn error_policy(stack: Arc<ClusterStack>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.retry_delay(&object_key(stack.as_ref()));
    tracing::warn!(cluster_stack = %stack.name_any(), namespace = ?stack.namespace(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// The spec as a [`StackSpec`], or why it is not one.
pub fn stack_spec(stack: &ClusterStack) -> Result<StackSpec, String> {
    let spec = &stack.spec;
    let probe = ReleaseId::from_stack_spec(&spec.provider, &spec.name, &spec.kubernetes_version, "v1")
        .map_err(|e| e.to_string())?;
    let versions = spec
        .versions
        .iter()
        .map(|v| {
            let version = Version::parse_dot(v).map_err(|e| format!("spec.versions: {v:?}: {e}"))?;
            if version.channel() != spec.channel {
                return Err(format!(
                    "spec.versions: {v:?} is not a version of channel {}",
                    spec.channel.as_str()
                ));
            }
            Ok(version)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(StackSpec {
        stack: StackKey {
            provider: probe.provider,
            name: probe.name,
            kubernetes: probe.kubernetes,
        },
        channel: spec.channel,
        versions,
        auto_subscribe: spec.auto_subscribe,
    })
}

/// Whether `release` belongs to the ClusterStack `stack_name` (by owner reference; the uid is not compared,
/// as in the Go operator, so releases survive a ClusterStack that is deleted and re-created).
fn owned_by(release: &ClusterStackRelease, stack_name: &str) -> bool {
    release.owner_references().iter().any(|o| {
        o.kind == "ClusterStack" && o.name == stack_name && o.api_version.split('/').next() == Some(GROUP)
    })
}

async fn sync(stack: &mut ClusterStack, ctx: &Context) -> Result<Action, Error> {
    let namespace = stack.namespace().unwrap_or_default();
    let spec = match stack_spec(stack) {
        Ok(spec) => spec,
        Err(message) => {
            stack.mark_false(
                condition::CLUSTER_STACK_RELEASES_SYNCED,
                reason::INVALID_SPEC,
                Severity::Error,
                message,
            );
            // Only a change of the spec can help.
            return Ok(Action::await_change());
        }
    };
    let releases: Api<ClusterStackRelease> = Api::namespaced(ctx.client.clone(), &namespace);
    let owned: Vec<ClusterStackRelease> = releases
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("list ClusterStackReleases", e))?
        .items
        .into_iter()
        .filter(|r| owned_by(r, &stack.name_any()))
        .collect();
    let existing: Vec<ExistingRelease> = owned
        .iter()
        .filter_map(|r| match ReleaseId::parse_tag(&r.name_any()) {
            Ok(id) => Some(ExistingRelease {
                id,
                ready: r.status.as_ref().is_some_and(|s| s.ready),
            }),
            Err(e) => {
                tracing::debug!(release = %r.name_any(), error = %e, "ignoring a ClusterStackRelease whose name does not parse");
                None
            }
        })
        .collect();

    let mut next_poll = ctx.settings.poll_interval;
    let mut failed: Vec<String> = Vec::new();
    let latest_remote = if spec.auto_subscribe {
        latest_remote_release(stack, &spec, ctx, &mut next_poll, &mut failed).await
    } else {
        // Not asked: say nothing about the source rather than something stale.
        stack.delete_condition(condition::RELEASES_SYNCED);
        stack.delete_condition(condition::ASSETS_CLIENT_API_AVAILABLE);
        None
    };

    let clusters = list_clusters(ctx).await?;
    let in_use = releases_in_use(&clusters, &namespace).into_keys().collect();
    let plan = plan(&spec, &existing, latest_remote.as_ref(), &in_use);

    let mut release_errors: Vec<String> = Vec::new();
    for id in &plan.delete {
        let name = id.tag();
        match releases.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(release = %name, "deleting a ClusterStackRelease nobody needs any more");
                ctx.event(
                    stack,
                    EventType::Normal,
                    event::CLUSTER_STACK_RELEASE_DELETED,
                    format!("deleted {name}"),
                )
                .await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                let message = format!("failed to delete {name}: {e}");
                ctx.event(
                    stack,
                    EventType::Warning,
                    event::FAILED_TO_DELETE_CLUSTER_STACK_RELEASE,
                    &message,
                )
                .await;
                release_errors.push(message);
            }
        }
    }

    let owner = owner_reference(stack);
    let labels = propagated_labels(&ctx.settings);
    let mut provider_errors: Vec<(bool, String)> = Vec::new();
    for id in &plan.wanted {
        let name = id.tag();
        let provider_ref = if stack.spec.no_provider {
            None
        } else {
            match sync_provider_object(ctx, stack, &name).await {
                Ok((reference, change)) => {
                    match change {
                        ProviderChange::Create(_) => {
                            ctx.event(
                                stack,
                                EventType::Normal,
                                event::CREATE_PROVIDER_STACK_RELEASE,
                                format!("created the provider object {name}"),
                            )
                            .await;
                        }
                        ProviderChange::Update(_) => {
                            ctx.event(
                                stack,
                                EventType::Normal,
                                event::UPDATE_PROVIDER_STACK_RELEASE,
                                format!("updated the provider object {name}"),
                            )
                            .await;
                        }
                        ProviderChange::Unchanged => {}
                    }
                    Some(reference)
                }
                Err(e) => {
                    provider_errors.push((matches!(e, ProviderError::TemplateNotFound(_)), e.to_string()));
                    continue;
                }
            }
        };
        let existing = owned.iter().find(|r| r.name_any() == name);
        let result = match existing {
            Some(release) if release.spec.provider_ref != provider_ref => releases
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"providerRef": provider_ref}})),
                )
                .await
                .map(|_| ()),
            Some(_) => Ok(()),
            None => {
                create_release(
                    &releases,
                    &name,
                    &owner,
                    &labels,
                    provider_ref.clone(),
                    stack,
                    ctx,
                )
                .await
            }
        };
        if let Err(e) = result {
            release_errors.push(format!("failed to create or update {name}: {e}"));
        }
    }

    if release_errors.is_empty() {
        stack.mark_true(condition::CLUSTER_STACK_RELEASES_SYNCED);
    } else {
        stack.mark_false(
            condition::CLUSTER_STACK_RELEASES_SYNCED,
            reason::FAILED_TO_CREATE_OR_UPDATE,
            Severity::Warning,
            release_errors.join("; "),
        );
        failed.extend(release_errors);
    }
    if stack.spec.no_provider {
        stack.delete_condition(condition::PROVIDER_CLUSTER_STACK_RELEASES_SYNCED);
    } else if provider_errors.is_empty() {
        stack.mark_true(condition::PROVIDER_CLUSTER_STACK_RELEASES_SYNCED);
    } else {
        let (not_found, _) = provider_errors[0];
        let message = provider_errors
            .iter()
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        if not_found {
            stack.mark_false(
                condition::PROVIDER_CLUSTER_STACK_RELEASES_SYNCED,
                reason::PROVIDER_TEMPLATE_NOT_FOUND,
                Severity::Error,
                message.clone(),
            );
        } else {
            stack.mark_false(
                condition::PROVIDER_CLUSTER_STACK_RELEASES_SYNCED,
                reason::FAILED_TO_CREATE_OR_UPDATE,
                Severity::Warning,
                message.clone(),
            );
        }
        failed.push(message);
    }

    // Status from what exists now (a release created in this pass has no status yet).
    let by_name: BTreeMap<String, &ClusterStackRelease> = owned.iter().map(|r| (r.name_any(), r)).collect();
    let status = stack.status.get_or_insert_with(ClusterStackStatus::default);
    status.summary = plan
        .wanted
        .iter()
        .map(|id| release_summary(id, by_name.get(&id.tag()).copied()))
        .collect();
    status.usable_versions = usable_versions(&existing, &plan);
    match &plan.latest_ready {
        Some(latest) => {
            let kubernetes = by_name
                .get(&latest.tag())
                .and_then(|r| r.status.as_ref())
                .map(|s| s.kubernetes_version.clone())
                .unwrap_or_default();
            status.latest_release = format!("{} | {kubernetes}", latest.cluster_class_name());
            stack.mark_true(condition::CLUSTER_STACK_RELEASE_AVAILABLE);
        }
        None => {
            status.latest_release.clear();
            stack.mark_false(
                condition::CLUSTER_STACK_RELEASE_AVAILABLE,
                reason::NO_READY_RELEASE,
                Severity::Info,
                "no release of the cluster stack is ready yet",
            );
        }
    }

    if !failed.is_empty() {
        return Err(Error::Reported(failed.join("; ")));
    }
    Ok(if spec.auto_subscribe {
        Action::requeue(next_poll)
    } else {
        Action::await_change()
    })
}

/// The newest release of the stack's channel at the source; conditions and events say why there is none.
async fn latest_remote_release(
    stack: &mut ClusterStack,
    spec: &StackSpec,
    ctx: &Context,
    next_poll: &mut std::time::Duration,
    failed: &mut Vec<String>,
) -> Option<ReleaseId> {
    let source = ctx.releases.source();
    match source.list_tags().await {
        Ok(tags) => {
            stack.mark_true(condition::ASSETS_CLIENT_API_AVAILABLE);
            stack.mark_true(condition::RELEASES_SYNCED);
            releases_of(&tags, &spec.stack, spec.channel).pop()
        }
        Err(SourceError::Config(message)) => {
            ctx.report_false(
                stack,
                (
                    condition::ASSETS_CLIENT_API_AVAILABLE,
                    reason::FAILED_CREATE_ASSETS_CLIENT,
                    Severity::Error,
                ),
                &message,
                (EventType::Warning, event::FAILED_CREATE_ASSETS_CLIENT),
            )
            .await;
            failed.push(message);
            None
        }
        Err(e) => {
            let message = format!("failed to list the releases at {}: {e}", source.kind());
            ctx.report_false(
                stack,
                (
                    condition::RELEASES_SYNCED,
                    reason::FAILED_TO_SYNC,
                    Severity::Warning,
                ),
                &message,
                (EventType::Warning, event::FAILED_TO_SYNC),
            )
            .await;
            match e.retry_after() {
                // Rate limited: come back when the source allows it, not earlier.
                Some(delay) => *next_poll = delay.max(std::time::Duration::from_secs(1)),
                None => failed.push(message),
            }
            None
        }
    }
}

fn owner_reference(stack: &ClusterStack) -> OwnerReference {
    OwnerReference {
        api_version: ClusterStack::api_version(&()).into_owned(),
        kind: ClusterStack::kind(&()).into_owned(),
        name: stack.name_any(),
        uid: stack.uid().unwrap_or_default(),
        ..Default::default()
    }
}

async fn create_release(
    releases: &Api<ClusterStackRelease>,
    name: &str,
    owner: &OwnerReference,
    labels: &BTreeMap<String, String>,
    provider_ref: Option<cso_api::common::ObjectReference>,
    stack: &ClusterStack,
    ctx: &Context,
) -> Result<(), kube::Error> {
    let release = ClusterStackRelease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: stack.namespace(),
            owner_references: Some(vec![owner.clone()]),
            labels: (!labels.is_empty()).then(|| labels.clone()),
            ..Default::default()
        },
        spec: cso_api::ClusterStackReleaseSpec { provider_ref },
        status: None,
    };
    match releases.create(&PostParams::default(), &release).await {
        Ok(created) => {
            tracing::info!(release = %name, "created a ClusterStackRelease");
            ctx.event(
                &created,
                EventType::Normal,
                event::CLUSTER_STACK_RELEASE_CREATED,
                format!("created by ClusterStack {}", stack.name_any()),
            )
            .await;
            Ok(())
        }
        // Created meanwhile (an earlier pass whose list was stale): fine.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => {
            ctx.event(
                stack,
                EventType::Warning,
                event::ERROR_CREATING_CLUSTER_STACK_RELEASE,
                format!("failed to create {name}: {e}"),
            )
            .await;
            Err(e)
        }
    }
}
