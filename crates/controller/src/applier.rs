//! The one way a reconciler changes objects in a cluster: apply a rendered set (server-side, labelled as
//! ours, with the inventory and prune of the apply engine) or delete a recorded set. Every apply is
//! recorded in the metrics; objects someone had changed or deleted are reported by a `DriftCorrected` event
//! on the object the work is for, deletions the API server refuses by a `PruneRefused` event. What happened
//! comes back as the engine's [`ApplyReport`]; the reconcilers derive their status from it.

use std::collections::BTreeMap;

use cso_api::common::Resource;
use cso_apply::{ApplyEngine, ApplyReport, WorkloadCluster};
use cso_render::Manifest;

use crate::{Context, context::Subject, metrics::TargetCluster, rendering};

/// The cluster objects go to.
#[derive(Clone, Copy)]
pub(crate) enum Target<'a> {
    /// The management cluster, objects without a namespace into the given one.
    Management { namespace: &'a str },
    /// A workload cluster, objects without a namespace into [`rendering::ADDON_NAMESPACE`].
    Workload(&'a WorkloadCluster),
}

impl Target<'_> {
    fn engine<'e>(&'e self, ctx: &'e Context) -> &'e ApplyEngine {
        match self {
            Target::Management { .. } => &ctx.engine,
            Target::Workload(workload) => &workload.engine,
        }
    }

    fn default_namespace(&self) -> &str {
        match self {
            Target::Management { namespace } => namespace,
            Target::Workload(_) => rendering::ADDON_NAMESPACE,
        }
    }

    fn metrics_label(&self) -> TargetCluster {
        match self {
            Target::Management { .. } => TargetCluster::Management,
            Target::Workload(_) => TargetCluster::Workload,
        }
    }
}

/// What one [`Work::run`] does.
enum Job<'a> {
    /// Apply a render, pruning what the inventory `previous` has and it does not; `checking`: reading every
    /// object first ([`ApplyEngine::apply_checking`]).
    Apply {
        manifests: &'a [Manifest],
        previous: &'a [Resource],
        checking: bool,
    },
    /// Apply a render for an owner nothing was ever applied for.
    ApplyFirst { manifests: &'a [Manifest] },
    /// Delete the objects named.
    Delete { objects: &'a [Resource] },
}

/// What a set of objects is applied for: the object events go to, and the owner its objects' release
/// label names (the ClusterStackRelease for cluster-class objects, the release tag for addons).
pub(crate) struct Work<'a, K> {
    pub(crate) about: &'a K,
    pub(crate) owner: String,
    pub(crate) target: Target<'a>,
}

impl<K: Subject> Work<'_, K> {
    /// Applies `manifests` and prunes what `previous` has and they do not; `checking`: a pass that only looks
    /// for drift nobody told of, which reads every object first and writes only what differs
    /// ([`ApplyEngine::apply_checking`]).
    pub(crate) async fn apply(
        &self,
        ctx: &Context,
        manifests: &[Manifest],
        previous: &[Resource],
        checking: bool,
    ) -> ApplyReport {
        let job = Job::Apply {
            manifests,
            previous,
            checking,
        };
        self.run(ctx, job).await
    }

    /// Applies `manifests` for an owner that nothing was ever applied for, by this operator or the one it
    /// replaces (`ApplyEngine::apply_first`: no take-over reads).
    pub(crate) async fn apply_first(&self, ctx: &Context, manifests: &[Manifest]) -> ApplyReport {
        self.run(ctx, Job::ApplyFirst { manifests }).await
    }

    /// Deletes `objects` (those that carry the operator's label; others are left alone and dropped): the
    /// owner is being deleted, a delete stage names them, or the release no longer has their chart.
    pub(crate) async fn delete(&self, ctx: &Context, objects: &[Resource]) -> ApplyReport {
        self.run(ctx, Job::Delete { objects }).await
    }

    async fn run(&self, ctx: &Context, job: Job<'_>) -> ApplyReport {
        let labels: BTreeMap<String, String> = rendering::release_labels(self.owner.clone());
        let engine = self.target.engine(ctx);
        let namespace = self.target.default_namespace();
        let report = match job {
            Job::Apply {
                manifests,
                previous,
                checking: false,
            } => engine.apply(manifests, namespace, &labels, previous).await,
            Job::Apply {
                manifests,
                previous,
                checking: true,
            } => {
                engine
                    .apply_checking(manifests, namespace, &labels, previous)
                    .await
            }
            Job::ApplyFirst { manifests } => engine.apply_first(manifests, namespace, &labels).await,
            Job::Delete { objects } => engine.delete(objects, namespace).await,
        };
        let target = self.target.metrics_label();
        ctx.metrics.applied(target, &report);
        ctx.report_drift(self.about, target, &report).await;
        if !report.refused.is_empty() {
            let refused: Vec<String> = report
                .refused
                .iter()
                .map(|f| format!("{}: {}", f.key, f.error))
                .collect();
            ctx.event(
                self.about,
                crate::events::Kind::Warning,
                cso_api::names::event::PRUNE_REFUSED,
                format!(
                    "the API server refused to delete {}; left in place and no longer recorded",
                    refused.join("; ")
                ),
            )
            .await;
        }
        report
    }
}
