//! The ClusterStack controller: creates the ClusterStackReleases a ClusterStack needs (spec versions, the
//! newest remote release with auto-subscribe, the newest ready one, every one a Cluster uses), deletes the
//! others, creates the provider objects in provider mode, and reports it all in the status.
//!
//! Shape: `observe` reads everything the decision needs, `decide::actions` (pure) names the writes, the
//! act step here makes them and records what happened in `decide::Done`, and `decide::conclude` (pure)
//! turns that into the status, the events and the retry; the status is written once. A Cluster whose class
//! names a release the stack does not have and cannot get is told by an event on the Cluster
//! (`decide::cluster_reports`), once while it lasts.

pub(crate) mod decide;
pub mod plan;
pub mod provider;
pub mod summary;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use cso_api::rules::StackSpec;
use cso_api::{
    ClusterStack, ClusterStackRelease, GROUP, ReleaseId, capi::Cluster, conditions::ConditionsExt,
    names::event,
};
use cso_release::{SourceError, source::releases_of};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::controller::Action,
};
use serde_json::json;

use self::{
    decide::{
        Actions, ClusterReport, Done, Observed, Outcome, SourceListing, actions, cluster_reports, conclude,
        conclude_invalid,
    },
    plan::{Available, ExistingRelease},
    provider::{ProviderChange, ProviderError, sync_provider_object},
};
use crate::{
    Context, Error,
    context::ControllerContext,
    context::object_key,
    events::Announced,
    filter::{is_paused, propagated_labels},
    in_use::list_clusters,
    patch,
};

/// The ClusterStack controller's context: the shared one, and which Clusters were told about a release they
/// name that cannot be had.
pub type StackContext = ControllerContext<Announced>;

/// Reconciles one ClusterStack (recorded in the reconcile metrics as `clusterstack`, bounded by
/// the reconcile timeout).
pub async fn reconcile(stack: Arc<ClusterStack>, ctx: Arc<StackContext>) -> Result<Action, Error> {
    ctx.bounded("clusterstack", stack, reconcile_object).await
}

async fn reconcile_object(queued: Arc<ClusterStack>, ctx: Arc<StackContext>) -> Result<Action, Error> {
    let api: Api<ClusterStack> = Api::namespaced(ctx.client.clone(), &queued.namespace().unwrap_or_default());
    let key = object_key(queued.as_ref());
    let Some(stack) = patch::current(&ctx, &api, queued.as_ref()).await? else {
        ctx.own.news(&key, BTreeSet::new());
        return Ok(Action::await_change());
    };
    if is_paused(&stack) || stack.meta().deletion_timestamp.is_some() {
        // Deletion needs nothing from us: the releases are owned and garbage-collected.
        return Ok(Action::await_change());
    }
    let mut working = stack.clone();
    let mut reports = Vec::new();
    let mut clusters = Vec::new();
    let (events, outcome) = match StackSpec::parse(&stack) {
        Err(message) => (Default::default(), conclude_invalid(&mut working, &message)),
        Ok(spec) => {
            let (observed, seen) = observe(&stack, spec, &ctx).await?;
            clusters = seen;
            let actions = actions(&observed, stack.spec.no_provider);
            let done = act(&stack, &actions, &ctx).await;
            reports = cluster_reports(
                &stack.name_any(),
                &observed,
                &actions,
                ctx.releases.source().kind(),
            );
            conclude(
                &mut working,
                &observed,
                &actions,
                &done,
                ctx.settings.poll_interval,
            )
        }
    };
    working.set_summary();
    let status = working.status.clone().unwrap_or_default();
    patch::status(&ctx.written, &api, &working, stack.status.as_ref(), &status).await?;
    ctx.publish(&working, events).await;
    tell_clusters(&ctx, &key, &clusters, reports).await;
    match outcome {
        Outcome::Requeue(Some(delay)) => Ok(Action::requeue(delay)),
        Outcome::Requeue(None) => Ok(Action::await_change()),
        Outcome::Retry(message) => Err(Error::Reported(message)),
    }
}

/// Publishes the reports on their Clusters, each once while it lasts (`key` is the ClusterStack's).
async fn tell_clusters(
    ctx: &StackContext,
    key: &str,
    clusters: &[Arc<Cluster>],
    reports: Vec<ClusterReport>,
) {
    let problems = reports
        .iter()
        .map(|r| format!("{}/{}", r.cluster, r.about))
        .collect();
    let news = ctx.own.news(key, problems);
    for report in reports {
        if !news.contains(&format!("{}/{}", report.cluster, report.about)) {
            continue;
        }
        tracing::warn!(cluster = %report.cluster, note = %report.note, "a Cluster names a release that cannot be had");
        let Some(cluster) = clusters
            .iter()
            .find(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()) == report.cluster)
        else {
            continue;
        };
        ctx.event(
            cluster.as_ref(),
            crate::events::Kind::Warning,
            report.reason,
            report.note,
        )
        .await;
    }
}

/// Retry after a failed reconcile, with per-object backoff.
pub fn error_policy(stack: Arc<ClusterStack>, error: &Error, ctx: Arc<StackContext>) -> Action {
    let delay = ctx.retry_delay(&object_key(stack.as_ref()));
    tracing::warn!(cluster_stack = %stack.name_any(), namespace = ?stack.namespace(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Whether `release` belongs to the ClusterStack `stack_name` (by owner reference; the uid is not compared,
/// as in the Go operator, so releases survive a ClusterStack that is deleted and re-created).
fn owned_by(release: &ClusterStackRelease, stack_name: &str) -> bool {
    release.owner_references().iter().any(|o| {
        o.kind == "ClusterStack" && o.name == stack_name && o.api_version.split('/').next() == Some(GROUP)
    })
}

/// Reads the stack's releases, the source (with auto-subscribe, or when a Cluster names a release nothing
/// else wants) and the Clusters, which it returns too (events about them go on them).
async fn observe(
    stack: &ClusterStack,
    spec: StackSpec,
    ctx: &Context,
) -> Result<(Observed, Vec<Arc<Cluster>>), Error> {
    let namespace = stack.namespace().unwrap_or_default();
    let in_namespace: Vec<ClusterStackRelease> = match ctx.stores().and_then(|s| s.releases()) {
        // A release created or deleted a moment ago and not in the store yet is made again (409) or deleted
        // again (404); its event triggers this stack once the store has it.
        Some(store) => store
            .state()
            .iter()
            .filter(|r| r.namespace().as_deref() == Some(namespace.as_str()))
            .map(|r| r.as_ref().clone())
            .collect(),
        None => {
            Api::<ClusterStackRelease>::namespaced(ctx.client.clone(), &namespace)
                .list(&ListParams::default())
                .await
                .map_err(|e| Error::kube("list ClusterStackReleases", e))?
                .items
        }
    };
    let owned: Vec<ClusterStackRelease> = in_namespace
        .into_iter()
        .filter(|r| owned_by(r, &stack.name_any()))
        .collect();
    let source = ctx.releases.source();
    let mut listed: Option<Vec<ReleaseId>> = None;
    let listing = if spec.auto_subscribe {
        match source.list_tags().await {
            Ok(tags) => {
                let releases = releases_of(&tags, &spec.stack, spec.channel);
                let latest = releases.last().cloned();
                listed = Some(releases);
                SourceListing::Latest(latest)
            }
            Err(SourceError::Config(message)) => SourceListing::Unconfigured(message),
            Err(e) => SourceListing::Failed {
                message: format!("failed to list the releases at {}: {e}", source.kind()),
                retry_after: e.retry_after(),
            },
        }
    } else {
        SourceListing::NotAsked
    };
    let clusters = list_clusters(ctx).await?;
    let users = cso_api::rules::releases_in_use(&clusters, &namespace);
    let in_use: BTreeSet<ReleaseId> = users.keys().cloned().collect();

    // What can be had matters only for a release that a Cluster names and nothing else wants.
    let existing: Vec<ExistingRelease> = owned
        .iter()
        .filter_map(|r| {
            Some(ExistingRelease {
                id: ReleaseId::parse_tag(&r.name_any()).ok()?,
                ready: r.status.as_ref().is_some_and(|s| s.ready),
            })
        })
        .collect();
    let latest_remote = match &listing {
        SourceListing::Latest(latest) => latest.as_ref(),
        _ => None,
    };
    let available = if !plan::needs_availability(&spec, &existing, latest_remote, &in_use) {
        Available::Unknown
    } else {
        let at_source = match listed {
            Some(releases) => Ok(releases),
            None => source
                .list_tags()
                .await
                .map(|tags| releases_of(&tags, &spec.stack, spec.channel)),
        };
        match at_source {
            Ok(mut releases) => {
                releases.extend(releases_of(
                    &ctx.releases.cached_tags(),
                    &spec.stack,
                    spec.channel,
                ));
                Available::Only(releases.into_iter().collect())
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot tell which releases the source has; creating those Clusters use");
                Available::Unknown
            }
        }
    };
    let observed = Observed {
        spec,
        releases: owned,
        source: listing,
        in_use,
        users,
        available,
    };
    Ok((observed, clusters))
}

/// Makes the writes; every failure is recorded, none stops the others.
async fn act(stack: &ClusterStack, actions: &Actions, ctx: &Context) -> Done {
    let namespace = stack.namespace().unwrap_or_default();
    let releases: Api<ClusterStackRelease> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut done = Done::default();
    for name in &actions.delete {
        match releases.delete(name, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(release = %name, "deleting a ClusterStackRelease nobody needs any more");
                done.deleted.push(name.clone());
            }
            Err(kube::Error::Api(s)) if s.code == 404 => done.deleted.push(name.clone()),
            Err(e) => done.not_deleted.push((name.clone(), e.to_string())),
        }
    }

    let owner = owner_reference(stack);
    let labels = propagated_labels(&ctx.settings);
    for ensure in &actions.ensure {
        let name = &ensure.name;
        let provider_ref = if actions.provider_objects {
            match sync_provider_object(ctx, stack, name).await {
                Ok((reference, change)) => {
                    match change {
                        ProviderChange::Create(_) => done.provider_created.push(name.clone()),
                        ProviderChange::Update(_) => done.provider_updated.push(name.clone()),
                        ProviderChange::Unchanged => {}
                    }
                    Some(reference)
                }
                Err(e) => {
                    done.provider_failed
                        .push((matches!(e, ProviderError::TemplateNotFound(_)), e.to_string()));
                    continue;
                }
            }
        } else {
            None
        };
        let wanted = cso_api::ClusterStackReleaseSpec {
            provider_ref,
            digest: ensure.pin.clone(),
        };
        let result = match &ensure.existing {
            // A merge patch: `null` removes a pin that was dropped.
            Some(current) if *current != wanted => releases
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"spec": {"providerRef": wanted.provider_ref, "digest": wanted.digest}}),
                    ),
                )
                .await
                .map(|updated| ctx.written.record(&updated)),
            Some(_) => Ok(()),
            None => create_release(&releases, name, &owner, &labels, wanted, stack, ctx).await,
        };
        if let Err(e) = result {
            done.not_ensured.push((name.clone(), e.to_string()));
        }
    }
    done
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
    spec: cso_api::ClusterStackReleaseSpec,
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
        spec,
        status: None,
    };
    match releases.create(&PostParams::default(), &release).await {
        Ok(created) => {
            tracing::info!(release = %name, "created a ClusterStackRelease");
            ctx.event(
                &created,
                crate::events::Kind::Normal,
                event::CLUSTER_STACK_RELEASE_CREATED,
                format!("created by ClusterStack {}", stack.name_any()),
            )
            .await;
            Ok(())
        }
        // Created meanwhile (an earlier pass whose list was stale): fine.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            tracing::debug!(release = %name, "the ClusterStackRelease exists already");
            Ok(())
        }
        Err(e) => {
            ctx.event(
                stack,
                crate::events::Kind::Warning,
                event::ERROR_CREATING_CLUSTER_STACK_RELEASE,
                format!("failed to create {name}: {e}"),
            )
            .await;
            Err(e)
        }
    }
}
