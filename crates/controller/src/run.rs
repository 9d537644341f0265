//! Builds the controllers of the management flow on one [`Context`] and runs them until shutdown: what
//! each watches, and how a change of one object finds the objects to reconcile.

use std::{future::Future, sync::Arc};

use cso_api::{
    ClusterAddon, ClusterStack, ClusterStackRelease, ClusterStackRollout, GROUP, ReleaseId,
    capi::{CAPI_GROUP, Cluster},
    cluster_addon::cluster_addon_name,
    names::RELEASE_LABEL,
};
use cso_apply::workload::{CAPI_SECRET_SELECTOR, cluster_of_kubeconfig_secret};
use cso_release::ReleaseCache;
use cso_render::{ChartRenderer, ValuesTemplater};
use futures::{FutureExt, StreamExt};
use k8s_openapi::{
    api::core::v1::Secret, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::DynamicObject,
    core::GroupVersionKind,
    core::PartialObjectMeta,
    discovery::ApiResource,
    runtime::{WatchStreamExt, controller::Config, reflector::ObjectRef, watcher},
};

use crate::{
    Context, Settings,
    cluster_addon::{self, AddonContext},
    cluster_addon_create, cluster_stack,
    cluster_stack_release::{self, ReleaseContext},
    filter::{sharded_config, watcher_config},
    fleet_status,
    provider_watch::ProviderWatches,
    rollout,
    stores::Stores,
    watch::changes_of,
    watch::{self, SharedWatch},
};

/// What the operator is made of.
pub struct Operator {
    pub client: Client,
    pub releases: Arc<ReleaseCache>,
    pub renderer: Arc<dyn ChartRenderer>,
    /// Renders values templates (`cluster-addon-values.yaml`) over the Cluster.
    pub values: Arc<ValuesTemplater>,
    /// Where the controllers record what they do (served by the binary on `/metrics`).
    pub metrics: Arc<crate::Metrics>,
    /// Field managers whose server-side-applied fields we take over (`kubectl` for the Go operator's).
    pub take_over_from: Vec<String>,
    pub settings: Settings,
    /// The version Clusters are read, listed and watched in: [`cso_apply::cluster_resource`], asked of the
    /// management cluster at start-up.
    pub cluster_resource: ApiResource,
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("releases", &self.releases)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn scoped<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The Clusters whose class or life changed: created, moved to another class, paused or unpaused, being
/// deleted, gone. Status
/// writes are left out: Cluster API rewrites a Cluster's conditions all the time (with messages that change
/// at every reconcile), and a release reconcile on each would re-apply its ClusterClass, which moves a
/// `v1beta1` class's generation and makes Cluster API write the Cluster again: a loop. Which releases are in
/// use depends on nothing else.
fn class_or_life_changes(
    events: impl futures::Stream<Item = watcher::Event<Arc<Cluster>>> + Send + 'static,
) -> impl futures::Stream<Item = Arc<Cluster>> + Send + 'static {
    changes_of(events, |cluster: &Cluster| {
        (
            cluster.uid(),
            cluster.class().map(|c| format!("{c:?}")),
            cluster.meta().deletion_timestamp.is_some(),
            // A Cluster unpaused (after `clusterctl move`, on the target) may need its ClusterAddon.
            cluster.is_paused(),
        )
    })
}

/// The Clusters whose spec, labels, annotations or life changed: what a ClusterAddon's values can see of
/// its Cluster apart from the status, which Cluster API rewrites all the time (a values template reading the
/// status sees it at the next resync).
fn spec_or_metadata_changes(
    events: impl futures::Stream<Item = watcher::Event<Arc<Cluster>>> + Send + 'static,
) -> impl futures::Stream<Item = Arc<Cluster>> + Send + 'static {
    changes_of(events, |cluster: &Cluster| {
        let meta = cluster.meta();
        (
            meta.uid.clone(),
            meta.generation,
            meta.labels.clone(),
            meta.annotations.clone(),
            meta.deletion_timestamp.is_some(),
        )
    })
}

impl Operator {
    /// The context the reconcilers share, for calling a reconciler directly (the watches of provider
    /// objects it starts trigger nothing). [`run`] builds its own.
    pub fn context(self) -> std::io::Result<Arc<Context>> {
        Context::assemble(self).map(Arc::new)
    }
}

/// Runs the five controllers (ClusterStack, ClusterStackRelease, ClusterAddonCreate, ClusterAddon and, in the
/// default shard, ClusterStackRollout) and the fleet status writer until `shutdown` completes; reconciles in flight are given [`STOP_GRACE`] to finish.
pub async fn run(operator: Operator, shutdown: impl Future<Output = ()> + Send + 'static) {
    let ctx = match Context::assemble(operator) {
        Ok(ctx) => Arc::new(ctx),
        Err(e) => {
            tracing::error!(error = %e, "cannot create a private directory for workload kubeconfigs");
            return;
        }
    };
    let client = ctx.client.clone();
    let settings = ctx.settings.clone();
    let (provider_watches, provider_triggers) =
        ProviderWatches::new(client.clone(), settings.namespace.clone());
    let release_ctx = ReleaseContext::with(ctx.clone(), provider_watches);
    let addon_ctx = AddonContext::new(ctx.clone());
    let shutdown = shutdown.boxed().shared();
    let config = watcher_config(&settings);
    let sharded = sharded_config(&settings);
    let namespace = &settings.namespace;
    let management = settings.shard == cso_api::shard::Shard::Default;

    // Each kind once: one watch, one store (what the reconcilers read), every controller subscribed.
    let mut stack_watch = SharedWatch::new(scoped::<ClusterStack>(&client, namespace), config.clone(), ());
    let mut release_watch = SharedWatch::new(
        scoped::<ClusterStackRelease>(&client, namespace),
        config.clone(),
        (),
    );
    let mut addon_watch = SharedWatch::new(scoped::<ClusterAddon>(&client, namespace), sharded.clone(), ());
    if management {
        // The fleet's gauges, from every ClusterAddon: counted by the default shard only.
        ctx.metrics.watch_addons(addon_watch.store());
        ctx.metrics.watch_releases(release_watch.store());
    }
    let mut cluster_watch = SharedWatch::new(
        ctx.clusters(namespace.as_deref()),
        sharded,
        ctx.cluster_resource.clone(),
    );
    // Only Cluster API's Secrets, and only their metadata: a kubeconfig that appeared or changed.
    let mut secret_watch = SharedWatch::new(
        scoped::<PartialObjectMeta<Secret>>(&client, namespace),
        watcher::Config::default().fields(CAPI_SECRET_SELECTOR),
        (),
    );
    ctx.metrics
        .watch_shard_clusters(cluster_watch.store(), settings.shard.clone());
    if management && settings.watch_filter.is_none() {
        ctx.metrics.watch_fleet_clusters(cluster_watch.cache());
    }
    ctx.use_stores(Stores {
        releases: release_watch.cache(),
        addons: addon_watch.cache(),
        clusters: cluster_watch.cache(),
        cluster_resource: ctx.cluster_resource.clone(),
        capi_secrets: secret_watch.cache(),
        all_clusters: settings.watch_filter.is_none() && management,
    });

    // The ClusterStacks and their releases are the default shard's alone.
    let stacks = management.then(|| {
        let stack_store = stack_watch.store();
        stack_watch
            .controller(())
            // A release changed or went away: its ClusterStack decides again. Not for its Cluster counts alone
            // (the fleet status writer's): the ClusterStack's reconcile asks the release source.
            .watches_shared_stream(
                changes_of(release_watch.subscribe(), fleet_status::apart_from_counts),
                |release| {
                    let namespace = release.namespace().unwrap_or_default();
                    release
                        .owner_references()
                        .iter()
                        .filter(|o| {
                            o.kind == "ClusterStack" && o.api_version.split('/').next() == Some(GROUP)
                        })
                        .map(|o| ObjectRef::new(&o.name).within(&namespace))
                        .collect::<Vec<_>>()
                },
            )
            // A Cluster moved to another class or went away: what is in use changed.
            .watches_shared_stream_with(
                class_or_life_changes(cluster_watch.subscribe()),
                move |cluster| {
                    let Some((id, class_namespace)) = cluster.stack_release() else {
                        return Vec::new();
                    };
                    stack_store
                        .state()
                        .iter()
                        .filter(|s| s.namespace().as_deref() == Some(class_namespace.as_str()))
                        .filter(|s| cso_api::rules::StackSpec::parse(s).is_ok_and(|spec| spec.owns(&id)))
                        .map(|s| ObjectRef::from_obj(s.as_ref()))
                        .collect::<Vec<_>>()
                },
                ctx.cluster_resource.clone(),
            )
            .with_config(Config::default().concurrency(settings.cluster_stack_concurrency))
            .graceful_shutdown_on(shutdown.clone())
            .run(
                cluster_stack::reconcile,
                cluster_stack::error_policy,
                cluster_stack::StackContext::new(ctx.clone()),
            )
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "ClusterStack controller");
                }
            })
    });

    // ClusterClasses in the version Clusters are read in: Cluster API serves its kinds in the same versions.
    // The release controller's watch of our ClusterClasses also fills a cache for the fleet status writer.
    let class_resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        CAPI_GROUP,
        &ctx.cluster_resource.version,
        "ClusterClass",
    ));
    let class_writer = kube::runtime::reflector::store::Writer::<DynamicObject>::new(class_resource.clone());
    let class_cache = fleet_status::ClassCache {
        store: class_writer.as_reader(),
        resource: class_resource.clone(),
        changed: Arc::new(tokio::sync::Notify::new()),
    };
    let class_changed = class_cache.changed.clone();
    let releases = management.then(|| {
        let owned_classes = watcher::Config::default()
            .any_semantic()
            .labels(&cso_api::owned_selector());
        let class_api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &class_resource),
            None => Api::all_with(client.clone(), &class_resource),
        };
        let release_store = release_watch.store();
        let deleting_releases = release_watch.store();
        let crd_triggers = crd_triggers(client.clone(), release_watch.store());
        // A ClusterClass of ours was changed or deleted: put it back now, not at the next resync. Each time the
        // watch (re)lists, every release checks its objects: a change made while the watch was down (or before
        // it first listed) has no event of its own.
        let engine = ctx.engine.clone();
        let class_triggers = watcher(class_api, owned_classes)
            .backoff(watch::backoff())
            .reflect(class_writer)
            .flat_map(move |event| {
                if !matches!(
                    event,
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) | Err(_)
                ) {
                    class_changed.notify_one();
                }
                let triggered: Vec<ObjectRef<ClusterStackRelease>> = match event {
                    // Cluster API writes the status of every ClusterClass, and applying a v1beta1 class to Cluster
                    // API 1.11+ moves its generation: events that show a class as our last apply left it are no
                    // drift, and reacting to them would apply again and again.
                    Ok(watcher::Event::Apply(class)) if class_left_as_applied(&engine, &class) => Vec::new(),
                    Ok(
                        watcher::Event::Apply(class)
                        | watcher::Event::Delete(class)
                        | watcher::Event::InitApply(class),
                    ) => release_of_class(&class).into_iter().collect(),
                    Ok(watcher::Event::InitDone) => release_store
                        .state()
                        .iter()
                        .map(|r| ObjectRef::from_obj(r.as_ref()))
                        .collect(),
                    Ok(watcher::Event::Init) => Vec::new(),
                    Err(e) => {
                        tracing::debug!(error = %e, "ClusterClass watch interrupted");
                        Vec::new()
                    }
                };
                futures::stream::iter(triggered)
            });
        release_watch
            .controller(())
            // A Cluster moved on or went away: a release waiting to be deleted may go now. Only such a release
            // cares (re-applying a ClusterClass for every Cluster created of it would be work for nothing).
            .watches_shared_stream_with(
                class_or_life_changes(cluster_watch.subscribe()),
                move |cluster| {
                    let (id, class_namespace) = cluster.stack_release()?;
                    let release = ObjectRef::new(&id.tag()).within(&class_namespace);
                    deleting_releases
                        .get(&release)
                        .is_some_and(|r| r.meta().deletion_timestamp.is_some())
                        .then_some(release)
                },
                ctx.cluster_resource.clone(),
            )
            .reconcile_on(class_triggers)
            // A CustomResourceDefinition appeared or changed (Established): releases that are not ready may
            // have been waiting for its kind.
            .reconcile_on(crd_triggers)
            // A provider object changed (its status.ready).
            .reconcile_on(provider_triggers)
            .with_config(Config::default().concurrency(settings.cluster_stack_release_concurrency))
            .graceful_shutdown_on(shutdown.clone())
            .run(
                cluster_stack_release::reconcile,
                cluster_stack_release::error_policy,
                release_ctx,
            )
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "ClusterStackRelease controller");
                }
            })
    });

    let cluster_store = cluster_watch.store();
    let cluster_resource = ctx.cluster_resource.clone();
    let owner_resource = ctx.cluster_resource.clone();
    let addon_create = cluster_watch
        .controller(ctx.cluster_resource.clone())
        // A ClusterAddon was deleted: make it again.
        .watches_shared_stream(addon_watch.touched(), move |addon| {
            let namespace = addon.namespace().unwrap_or_default();
            addon
                .owner_references()
                .iter()
                .filter(|o| o.kind == "Cluster")
                .map(|o| ObjectRef::new_with(&o.name, owner_resource.clone()).within(&namespace))
                .collect::<Vec<_>>()
        })
        // A release appeared: Clusters of its class get their ClusterAddon (its status changes are no news
        // to them: each would look at every Cluster of the class).
        .watches_shared_stream(
            changes_of(release_watch.subscribe(), |release: &ClusterStackRelease| {
                release.uid()
            }),
            move |release| {
                let release_namespace = release.namespace().unwrap_or_default();
                let Ok(id) = ReleaseId::parse_tag(&release.name_any()) else {
                    return Vec::new();
                };
                cluster_store
                    .state()
                    .iter()
                    .filter(|c| {
                        c.stack_release()
                            .is_some_and(|(c_id, ns)| c_id == id && ns == release_namespace)
                    })
                    .map(|c| ObjectRef::from_obj_with(c.as_ref(), cluster_resource.clone()))
                    .collect::<Vec<_>>()
            },
        )
        // As many at once as ClusterAddons (the Go operator: one). Unbounded, a thousand Clusters arriving
        // together held a thousand reconciles in memory at once (4.5 MB at the install's peak), each waiting
        // on the same management API server.
        .with_config(Config::default().concurrency(settings.cluster_addon_concurrency))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            cluster_addon_create::reconcile,
            cluster_addon_create::error_policy,
            cluster_addon_create::CreateContext::new(ctx.clone()),
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "ClusterAddonCreate controller");
            }
        });

    let addons = addon_watch
        .controller(())
        // A change of the Cluster's spec or metadata (its class, its endpoint used by values templates).
        .watches_shared_stream_with(
            spec_or_metadata_changes(cluster_watch.subscribe()),
            |cluster| {
                Some(
                    ObjectRef::new(&cluster_addon_name(&cluster.name_any()))
                        .within(&cluster.namespace().unwrap_or_default()),
                )
            },
            ctx.cluster_resource.clone(),
        )
        // A kubeconfig Secret appeared or changed: its Cluster's addons go ahead without waiting for the
        // next poll.
        .watches_shared_stream(secret_watch.touched(), |secret| {
            let name = secret.name_any();
            let cluster = cluster_of_kubeconfig_secret(&name)?;
            Some(ObjectRef::new(&cluster_addon_name(cluster)).within(&secret.namespace().unwrap_or_default()))
        })
        // An object applied to a workload cluster was deleted or changed: put it back now, or when its
        // back-off ends (`cluster_addon::AddonMemory::drift_wakes`).
        .reconcile_on(addon_ctx.own.drift_wakes(drift_told(&ctx)))
        .with_config(Config::default().concurrency(settings.cluster_addon_concurrency))
        .graceful_shutdown_on(shutdown.clone())
        .run(cluster_addon::reconcile, cluster_addon::error_policy, addon_ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "ClusterAddon controller");
            }
        });

    // The rollouts are the default shard's alone; they look at the Clusters of every shard (its watches see
    // them all). Any change of a Cluster (Cluster API's status too: TopologyReconciled), a ClusterAddon or a
    // release may move a rollout on: each wakes every rollout (there are few), at most once a second however
    // busy the fleet (throttled, never starved).
    let mut rollout_watch = management.then(|| {
        SharedWatch::new(
            scoped::<ClusterStackRollout>(&client, namespace),
            config.clone(),
            (),
        )
    });
    let rollouts = rollout_watch.as_mut().map(|watch| {
        ctx.metrics.watch_rollouts(watch.store());
        let changes = futures::stream::select_all([
            cluster_watch.touched().map(|_| ()).boxed(),
            addon_watch.touched().map(|_| ()).boxed(),
            release_watch.touched().map(|_| ()).boxed(),
        ]);
        watch
            .controller(())
            .reconcile_all_on(watch::throttled(changes, ROLLOUT_LOOK_EVERY))
            .with_config(Config::default().concurrency(1))
            .graceful_shutdown_on(shutdown.clone())
            .run(
                rollout::reconcile,
                rollout::error_policy,
                rollout::context(ctx.clone(), class_cache.clone(), stack_watch.cache()),
            )
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "ClusterStackRollout controller");
                }
            })
            .boxed()
    });

    // The Cluster counts in the statuses of ClusterStacks and ClusterStackReleases, from the same watches.
    // Boxed: as a fifth unboxed future of the join below, rustc could not prove the join `Send` (a
    // "not general enough" error about the ClusterAddon controller's futures).
    // Shards without a replica, told by the default shard, which watches every Cluster.
    let unattended = management.then(|| {
        crate::unattended::report(
            ctx.clone(),
            cluster_watch.store(),
            addon_watch.store(),
            shutdown.clone(),
        )
    });
    let fleet = management.then(|| {
        fleet_status::writer(
            ctx.clone(),
            &mut stack_watch,
            &mut release_watch,
            &mut addon_watch,
            &mut cluster_watch,
            class_cache,
            shutdown.clone(),
        )
        .boxed()
    });

    // The watches run as long as the controllers do.
    let watches = async {
        futures::join!(
            stack_watch.run(),
            release_watch.run(),
            addon_watch.run(),
            cluster_watch.run(),
            secret_watch.run(),
            optional(rollout_watch.map(SharedWatch::run))
        );
    };
    tracing::info!(namespace = ?settings.namespace, "controllers started");
    let controllers = async {
        tokio::select! {
            _ = async {
                // A controller this shard does not run counts as done at once.
                futures::join!(
                    optional(stacks),
                    optional(releases),
                    addon_create,
                    addons,
                    optional(fleet),
                    optional(unattended),
                    optional(rollouts)
                )
            } => {}
            () = watches => {}
        }
    };
    let grace_over = async {
        shutdown.await;
        tokio::time::sleep(STOP_GRACE).await;
    };
    tokio::select! {
        () = controllers => tracing::info!("controllers stopped"),
        () = grace_over => tracing::error!(grace = ?STOP_GRACE, reconciling = ?ctx.reconciling(),
            "reconciles still in flight after the stop's grace period are dropped; the next start redoes them"),
    }
}

/// A controller, or nothing to wait for when this shard does not run it.
async fn optional(controller: Option<impl Future<Output = ()>>) {
    if let Some(controller) = controller {
        controller.await;
    }
}

/// How often at most a change of the fleet wakes the rollouts.
const ROLLOUT_LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a stop waits for reconciles in flight. Reconciles are level-based, so one cut short is redone by
/// the next start (or the next leader); a stop never waits on a stuck request.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// How long after a CRD event the releases that are not ready are tried once more: discovery may serve a
/// new kind a little after its CRD is Established.
const CRD_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// The ClusterStackReleases to reconcile because a CustomResourceDefinition was added or changed (its
/// metadata is watched, so an Established condition arrives as a change too): every release of `store`
/// that is not ready, at once and again [`CRD_SETTLE`] later. A release waiting for a provider's kinds goes
/// on as soon as they are served, not at its next backoff. A relist of the watch triggers them too: CRDs may
/// have come while it was down. Without permission to watch CRDs the watch keeps retrying with backoff and
/// nothing else changes.
fn crd_triggers(
    client: Client,
    store: kube::runtime::reflector::Store<ClusterStackRelease>,
) -> impl futures::Stream<Item = ObjectRef<ClusterStackRelease>> + Send + 'static {
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel::<()>();
    let crds: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client);
    let changes = watcher(crds, watcher::Config::default().any_semantic())
        .backoff(watch::backoff())
        .filter_map(move |event| {
            let news = match event {
                // The first list is no news (everything is reconciled at the start anyway); a relist is.
                Ok(watcher::Event::Apply(_) | watcher::Event::InitDone) => true,
                Ok(watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::Delete(_)) => false,
                Err(e) => {
                    tracing::debug!(error = %e, "CustomResourceDefinition watch interrupted");
                    false
                }
            };
            if news {
                let sender = sender.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(CRD_SETTLE).await;
                    let _ = sender.send(());
                });
            }
            std::future::ready(news.then_some(()))
        });
    let settled = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|()| ((), receiver))
    });
    futures::stream::select(changes, settled)
        .flat_map(move |()| futures::stream::iter(not_ready(&store.state())))
}

/// The releases that are not ready (a release without a status yet is not ready).
fn not_ready(releases: &[Arc<ClusterStackRelease>]) -> Vec<ObjectRef<ClusterStackRelease>> {
    releases
        .iter()
        .filter(|r| !r.status.as_ref().is_some_and(|s| s.ready))
        .filter(|r| r.meta().deletion_timestamp.is_none())
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}

/// The workload objects that drifted, as the drift watches tell (once: the receiver is taken).
fn drift_told(ctx: &Context) -> impl futures::Stream<Item = crate::context::DriftTold> + Send + 'static {
    let receiver = ctx.drifted.lock().unwrap_or_else(|p| p.into_inner()).take();
    futures::stream::unfold(receiver, |receiver| async move {
        let mut receiver = receiver?;
        let told = receiver.recv().await?;
        Some((told, Some(receiver)))
    })
}

/// Whether the ClusterClass event shows it as our last apply left it (see `ApplyEngine::left_as_applied`).
fn class_left_as_applied(engine: &cso_apply::ApplyEngine, class: &DynamicObject) -> bool {
    let key = cso_api::common::ObjectKey {
        group: CAPI_GROUP.into(),
        kind: "ClusterClass".into(),
        namespace: class.namespace().unwrap_or_default().into(),
        name: class.name_any().into(),
    };
    engine.left_as_applied(&key, &cso_apply::engine::LiveMeta::of(&class.metadata))
}

/// The release a ClusterClass of ours was applied for (its release label).
fn release_of_class(class: &DynamicObject) -> Option<ObjectRef<ClusterStackRelease>> {
    let tag = class.labels().get(RELEASE_LABEL)?;
    Some(ObjectRef::new(tag).within(&class.namespace().unwrap_or_default()))
}
