//! The ClusterAddonCreate controller: a `ClusterAddon` named `cluster-addon-<cluster>` (owned by the Cluster)
//! for every Cluster whose class is a ClusterClass of a cluster stack (a ClusterStackRelease of that name
//! exists), and only for those, so existing Cluster API clusters can be adopted without one; recreated when
//! deleted.
//!
//! Shape: the Cluster is read fresh from the API server (the watch cache's copy can be of a Cluster deleted
//! since: a ClusterAddon made for it would outlive it until garbage collection), then [`next_step`] (pure)
//! says what to read or write next, and the driver here does it. A Cluster whose ClusterAddon cannot be
//! made (its name is too long) is told so by a Warning event, once.
//!
//! Shards ([`cso_api::shard`]): a replica handles only the Clusters of its shard. The ClusterAddon carries its
//! Cluster's shard label (set when it is made; when the Cluster's label moves, the old shard hands it over, or
//! the new one takes it over from a shard no replica runs: `crate::shard`), so that a named shard's
//! ClusterAddon watch selects its own.

use std::{collections::BTreeSet, sync::Arc};

use cso_api::{
    ClusterAddon, ClusterAddonSpec,
    capi::BLOCK_MOVE_ANNOTATION,
    capi::Cluster,
    cluster_addon::cluster_addon_name,
    common::ObjectReference,
    shard::{SHARD_LABEL, Shard},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{
    Api, Resource, ResourceExt,
    api::{ObjectMeta, PostParams},
    runtime::{controller::Action, reflector::ObjectRef},
};

use crate::{
    Context, Error, context::ControllerContext, context::object_key, events::Announced,
    filter::propagated_labels,
};

/// How long a shard taking over a moved Cluster waits before looking again whether the old shard handed its
/// ClusterAddon over (or stopped running).
const HANDOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest object name the API server accepts (a DNS subdomain).
pub(crate) const MAX_NAME_LENGTH: usize = 253;

/// The ClusterAddonCreate controller's context: the shared one, and which Clusters were told about a problem
/// already.
pub type CreateContext = ControllerContext<Announced>;

/// Reconciles one Cluster (recorded in the reconcile metrics as `clusteraddoncreate`, bounded by
/// the reconcile timeout).
pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<CreateContext>) -> Result<Action, Error> {
    // Another shard's Cluster (in the default shard's whole-fleet watch): not counted as a reconcile here.
    if !ctx.settings.shard.owns(cluster.meta().labels.as_ref()) {
        return Ok(Action::await_change());
    }
    ctx.bounded("clusteraddoncreate", cluster, reconcile_object).await
}

/// What the reconcile has read so far (`None`: not read yet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Whether the ClusterStackRelease the Cluster's class names exists.
    pub(crate) release_exists: Option<bool>,
    /// Whether the Cluster's ClusterAddon exists, and the shard its label names.
    pub(crate) addon: Option<Option<Shard>>,
}

/// Why there is nothing (more) to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Idle {
    /// The Cluster is gone.
    Gone,
    /// The Cluster is being deleted.
    Deleting,
    Paused,
    /// Its class is not a cluster stack's name.
    NotAStackClass,
    /// No ClusterStackRelease of that name (yet): the release watch brings the Cluster back if one appears.
    NoRelease,
    /// The ClusterAddon exists.
    Exists,
    /// The Cluster is another shard's.
    OtherShard,
}

/// The next thing to do for a Cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Idle(Idle),
    /// Read whether ClusterStackRelease `name` exists in `namespace`.
    ReadRelease {
        name: String,
        namespace: String,
    },
    /// Read whether ClusterAddon `name` exists.
    ReadAddon {
        name: String,
    },
    Create {
        name: String,
    },
    /// The ClusterAddon exists labelled for shard `from`: the Cluster moved to this shard. Taken over when no
    /// replica of `from` runs; otherwise `from` hands it over itself (after any reconcile of it in flight).
    TakeOver {
        name: String,
        from: Shard,
    },
    /// No ClusterAddon can be made for this Cluster: tell it (a Warning event with this reason and note).
    Refuse {
        reason: &'static str,
        note: String,
    },
}

/// What to do next for `cluster` (as the API server has it now; `None`: gone) in `shard`, given what was read.
pub(crate) fn next_step(cluster: Option<&Cluster>, progress: &Progress, shard: &Shard) -> Step {
    let Some(cluster) = cluster else {
        return Step::Idle(Idle::Gone);
    };
    if cluster.meta().deletion_timestamp.is_some() {
        return Step::Idle(Idle::Deleting);
    }
    if cluster.is_paused() {
        return Step::Idle(Idle::Paused);
    }
    if !shard.owns(cluster.meta().labels.as_ref()) {
        return Step::Idle(Idle::OtherShard);
    }
    let Some((id, class_namespace)) = cluster.stack_release() else {
        return Step::Idle(Idle::NotAStackClass);
    };
    match progress.release_exists {
        None => {
            return Step::ReadRelease {
                name: id.tag(),
                namespace: class_namespace,
            };
        }
        Some(false) => return Step::Idle(Idle::NoRelease),
        Some(true) => {}
    }
    let name = cluster_addon_name(&cluster.name_any());
    if name.len() > MAX_NAME_LENGTH {
        return Step::Refuse {
            reason: cso_api::names::event::CLUSTER_ADDON_NOT_CREATED,
            note: format!(
                "its ClusterAddon would be named {name:?} ({} characters), longer than the {MAX_NAME_LENGTH} \
                 an object name may have: the Cluster gets no addons; a Cluster name of at most {} characters \
                 leaves room",
                name.len(),
                MAX_NAME_LENGTH - (name.len() - cluster.name_any().len()),
            ),
        };
    }
    match &progress.addon {
        None => Step::ReadAddon { name },
        Some(Some(labelled)) if labelled == shard => Step::Idle(Idle::Exists),
        Some(Some(labelled)) => Step::TakeOver {
            name,
            from: labelled.clone(),
        },
        Some(None) => Step::Create { name },
    }
}

async fn reconcile_object(queued: Arc<Cluster>, ctx: Arc<CreateContext>) -> Result<Action, Error> {
    let namespace = queued.namespace().unwrap_or_default();
    let key = object_key(queued.as_ref());
    // Nothing of ours writes Clusters: the store's copy is as new as any we know.
    let cluster = match ctx.stores() {
        Some(_) => Some(queued.as_ref().clone()),
        None => ctx
            .clusters(Some(&namespace))
            .get_opt(&queued.name_any())
            .await
            .map_err(|e| Error::kube(format!("read Cluster {}", queued.name_any()), e))?,
    };
    let mut progress = Progress::default();
    let shard = &ctx.settings.shard;
    loop {
        match next_step(cluster.as_ref(), &progress, shard) {
            Step::Idle(why) => {
                tracing::trace!(cluster = %queued.name_any(), ?why, "no ClusterAddon to create");
                ctx.own.news(&key, BTreeSet::new());
                return Ok(Action::await_change());
            }
            // From the stores when they run: a release that appears triggers its Clusters again, and a
            // ClusterAddon the store does not show yet is created once more and found to exist (409).
            Step::ReadRelease { name, namespace } => {
                progress.release_exists = Some(ctx.cluster_stack_release(&namespace, &name).await?.is_some());
            }
            // A named shard's store holds its own ClusterAddons only: one it does not show may be another
            // shard's (its Cluster moved here), which a read tells.
            Step::ReadAddon { name } => {
                let stored = ctx
                    .stores()
                    .and_then(|s| s.addons())
                    .map(|store| store.get(&ObjectRef::new(&name).within(&namespace)));
                let found = match stored {
                    Some(Some(addon)) => Some(Shard::of(addon.meta().labels.as_ref())),
                    Some(None) if *shard == Shard::Default => None,
                    _ => Api::<ClusterAddon>::namespaced(ctx.client.clone(), &namespace)
                        .get_opt(&name)
                        .await
                        .map_err(|e| Error::kube(format!("read ClusterAddon {name}"), e))?
                        .map(|addon| Shard::of(addon.meta().labels.as_ref())),
                };
                progress.addon = Some(found);
            }
            Step::TakeOver { name, from } => {
                if !crate::shard::may_take_over(&ctx, &namespace, &name, &from).await? {
                    tracing::debug!(cluster_addon = %name, %from, "waiting for the shard to hand the ClusterAddon over");
                    return Ok(Action::requeue(HANDOVER_WAIT));
                }
                crate::shard::label(&ctx, &namespace, &name, shard).await?;
                return Ok(Action::await_change());
            }
            Step::Create { name } => {
                let Some(cluster) = &cluster else {
                    return Ok(Action::await_change());
                };
                create(&ctx, cluster, &name).await?;
                ctx.own.news(&key, BTreeSet::new());
                return Ok(Action::await_change());
            }
            Step::Refuse { reason, note } => {
                let Some(cluster) = &cluster else {
                    return Ok(Action::await_change());
                };
                tracing::warn!(cluster = %cluster.name_any(), %namespace, %note, "no ClusterAddon for a Cluster");
                // Only a new Cluster can change it (names are for good): no retry, one event per problem.
                if !ctx.own.news(&key, [reason.to_owned()].into()).is_empty() {
                    ctx.event(cluster, crate::events::Kind::Warning, reason, note)
                        .await;
                }
                return Ok(Action::await_change());
            }
        }
    }
}

async fn create(ctx: &Context, cluster: &Cluster, name: &str) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let mut labels = propagated_labels(&ctx.settings);
    if let Shard::Named(shard) = &ctx.settings.shard {
        labels.insert(SHARD_LABEL.to_owned(), shard.clone());
    }
    let addon = ClusterAddon {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.clone()),
            labels: (!labels.is_empty()).then_some(labels),
            // Blocks `clusterctl move` until its reconcile has seen the Cluster paused (`cluster_addon::moving`).
            annotations: Some([(BLOCK_MOVE_ANNOTATION.to_owned(), String::new())].into()),
            // Named in the version Clusters are read in, a served one: the garbage collector must resolve
            // the owner's apiVersion, and one no longer served (v1beta1, once Cluster API drops it) would
            // leave the ClusterAddon behind when its Cluster goes.
            owner_references: Some(vec![OwnerReference {
                api_version: Cluster::api_version(&ctx.cluster_resource).into_owned(),
                kind: Cluster::kind(&ctx.cluster_resource).into_owned(),
                name: cluster.name_any(),
                uid: cluster.uid().unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: ClusterAddonSpec {
            cluster_ref: ObjectReference {
                api_version: Some(Cluster::api_version(&ctx.cluster_resource).into_owned()),
                kind: Some(Cluster::kind(&ctx.cluster_resource).into_owned()),
                name: Some(cluster.name_any()),
                namespace: Some(namespace.clone()),
                uid: cluster.uid(),
                ..Default::default()
            },
            ..Default::default()
        },
        status: None,
    };
    let addons: Api<ClusterAddon> = Api::namespaced(ctx.client.clone(), &namespace);
    match addons.create(&PostParams::default(), &addon).await {
        Ok(_) => tracing::info!(cluster_addon = %name, "created a ClusterAddon"),
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(Error::kube(format!("create ClusterAddon {name}"), e)),
    }
    Ok(())
}

pub fn error_policy(cluster: Arc<Cluster>, error: &Error, ctx: Arc<CreateContext>) -> Action {
    let delay = ctx.retry_delay(&object_key(cluster.as_ref()));
    tracing::warn!(cluster = %cluster.name_any(), namespace = ?cluster.namespace(), %error, retry_in = ?delay, "creating the ClusterAddon failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;
    use rstest::rstest;
    use serde_json::json;

    use super::*;

    fn cluster(name: &str, class: &str) -> Cluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": name, "namespace": "ns", "uid": "u1"},
            "spec": {"topology": {"class": class, "version": "v1.27.3"}},
        }))
        .unwrap()
    }

    fn deleting(mut cluster: Cluster) -> Cluster {
        cluster.metadata = ObjectMeta {
            deletion_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::now(),
            )),
            finalizers: Some(vec!["cluster.cluster.x-k8s.io".into()]),
            ..cluster.metadata
        };
        cluster
    }

    fn paused(mut cluster: Cluster) -> Cluster {
        cluster.metadata.annotations = Some([("cluster.x-k8s.io/paused".to_owned(), String::new())].into());
        cluster
    }

    /// Paused as `clusterctl move` pauses it: by `spec.paused`.
    fn paused_for_a_move(mut cluster: Cluster) -> Cluster {
        cluster.spec.paused = Some(true);
        cluster
    }

    const CLASS: &str = "docker-ferrol-1-27-v1";

    fn read(release: Option<bool>, addon: Option<bool>) -> Progress {
        Progress {
            release_exists: release,
            addon: addon.map(|exists| exists.then_some(Shard::Default)),
        }
    }

    fn create(name: &str) -> Step {
        Step::Create {
            name: format!("cluster-addon-{name}"),
        }
    }

    #[rstest]
    // The start-up race: the watch cache still had it, the API server no longer does.
    #[case::gone(None, read(Some(true), Some(false)), Step::Idle(Idle::Gone))]
    // Deleted with a finalizer holding it: no ClusterAddon for a Cluster on its way out.
    #[case::deleting(
        Some(deleting(cluster("c1", CLASS))),
        read(Some(true), Some(false)),
        Step::Idle(Idle::Deleting)
    )]
    #[case::paused(
        Some(paused(cluster("c1", CLASS))),
        read(None, None),
        Step::Idle(Idle::Paused)
    )]
    // `clusterctl move` pauses the Cluster and copies its ClusterAddon: none is made on either side meanwhile.
    #[case::paused_for_a_move(
        Some(paused_for_a_move(cluster("c1", CLASS))),
        read(None, None),
        Step::Idle(Idle::Paused)
    )]
    #[case::not_a_stack(
        Some(cluster("c1", "my-own-class")),
        read(None, None),
        Step::Idle(Idle::NotAStackClass)
    )]
    #[case::read_release(
        Some(cluster("c1", CLASS)),
        read(None, None),
        Step::ReadRelease { name: CLASS.into(), namespace: "ns".into() }
    )]
    #[case::no_release(
        Some(cluster("c1", CLASS)),
        read(Some(false), None),
        Step::Idle(Idle::NoRelease)
    )]
    #[case::read_addon(
        Some(cluster("c1", CLASS)),
        read(Some(true), None),
        Step::ReadAddon { name: "cluster-addon-c1".into() }
    )]
    #[case::exists(
        Some(cluster("c1", CLASS)),
        read(Some(true), Some(true)),
        Step::Idle(Idle::Exists)
    )]
    #[case::create(Some(cluster("c1", CLASS)), read(Some(true), Some(false)), create("c1"))]
    // 239 characters: `cluster-addon-` makes 253, the most a name may have.
    #[case::longest(Some(cluster(&"a".repeat(239), CLASS)), read(Some(true), Some(false)), create(&"a".repeat(239)))]
    fn next_steps(#[case] cluster: Option<Cluster>, #[case] progress: Progress, #[case] expected: Step) {
        assert_eq!(next_step(cluster.as_ref(), &progress, &Shard::Default), expected);
    }

    /// A replica handles the Clusters of its shard only; a ClusterAddon labelled for another shard (its
    /// Cluster moved) is given the Cluster's shard by the shard that owns the Cluster now.
    #[test]
    fn shards_create_and_take_over_their_own() {
        let labelled = |shard: &str| {
            let mut c = cluster("c1", CLASS);
            c.metadata.labels = Some([(SHARD_LABEL.to_owned(), shard.to_owned())].into());
            c
        };
        let a = Shard::Named("a".into());
        let existing = |label: Shard| Progress {
            release_exists: Some(true),
            addon: Some(Some(label)),
        };
        let take_over = |from: &Shard| Step::TakeOver {
            name: "cluster-addon-c1".into(),
            from: from.clone(),
        };
        let cases = [
            (
                labelled("a"),
                &Shard::Default,
                read(None, None),
                Step::Idle(Idle::OtherShard),
            ),
            (
                cluster("c1", CLASS),
                &a,
                read(None, None),
                Step::Idle(Idle::OtherShard),
            ),
            (labelled("b"), &a, read(None, None), Step::Idle(Idle::OtherShard)),
            (
                labelled(""),
                &Shard::Default,
                read(Some(true), Some(false)),
                create("c1"),
            ),
            (labelled("a"), &a, read(Some(true), Some(false)), create("c1")),
            (labelled("a"), &a, existing(a.clone()), Step::Idle(Idle::Exists)),
            (
                labelled("a"),
                &a,
                existing(Shard::Default),
                take_over(&Shard::Default),
            ),
            (
                cluster("c1", CLASS),
                &Shard::Default,
                existing(a.clone()),
                take_over(&a),
            ),
        ];
        for (cluster, shard, progress, expected) in cases {
            assert_eq!(
                next_step(Some(&cluster), &progress, shard),
                expected,
                "{:?} in shard {shard}",
                cluster.metadata.labels
            );
        }
    }

    #[test]
    fn a_name_too_long_is_refused_with_the_reason_before_anything_is_read_of_the_addon() {
        let long = cluster(&"a".repeat(240), CLASS);
        let Step::Refuse { reason, note } = next_step(Some(&long), &read(Some(true), None), &Shard::Default)
        else {
            panic!("refused")
        };
        assert_eq!(reason, cso_api::names::event::CLUSTER_ADDON_NOT_CREATED);
        assert!(note.contains("(254 characters)"), "{note}");
        assert!(note.contains("at most 239 characters"), "{note}");
        assert_eq!(
            next_step(Some(&long), &read(Some(false), None), &Shard::Default),
            Step::Idle(Idle::NoRelease),
            "only Clusters of a cluster stack are told"
        );
    }

    #[test]
    fn a_problem_is_news_once_while_it_lasts() {
        let announced = Announced::default();
        let problem = |p: &str| BTreeSet::from([p.to_owned()]);
        assert_eq!(announced.news("c1", problem("too long")), problem("too long"));
        assert!(
            announced.news("c1", problem("too long")).is_empty(),
            "said already"
        );
        assert_eq!(
            announced.news("c2", problem("too long")),
            problem("too long"),
            "per object"
        );
        assert!(announced.news("c1", BTreeSet::new()).is_empty());
        assert_eq!(
            announced.news("c1", problem("too long")),
            problem("too long"),
            "back after going away: news again"
        );
    }
}
