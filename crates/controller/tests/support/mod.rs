//! What the controller tests share: an operator running in this process against the shared test API
//! server (scoped to the test's namespace, so tests in parallel never see each other's objects), fixture
//! releases, and waiting for a condition with a bound.

#![allow(dead_code, reason = "each test binary uses a different part")]

use std::{
    collections::BTreeMap,
    future::Future,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use cso_api::{ClusterStack, ClusterStackRelease, conditions::ConditionsExt};
use cso_controller::{Operator, Settings};
use cso_release::{ReleaseCache, ReleaseSource, archive::UnpackLimits, source::local::LocalSource};
use cso_render::{CachingRenderer, Helm, ValuesTemplater, cache::DEFAULT_CAPACITY_BYTES};
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams, PostParams},
    core::GroupVersionKind,
    discovery::ApiResource,
};
use serde_json::{Value, json};
use tokio::{sync::oneshot, task::JoinHandle};

pub const FERROL: &str = "docker-ferrol-1-27";

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases")
}

/// Copies fixture releases into `<release_dir>/cluster-stacks/`, as `--local` expects them.
pub fn local_releases(release_dir: &Path, tags: &[&str]) {
    for tag in tags {
        let to = release_dir.join("cluster-stacks").join(tag);
        std::fs::create_dir_all(&to).unwrap();
        for entry in std::fs::read_dir(fixtures().join(tag)).unwrap().flatten() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// The bundled ferrol v1 release in `release_dir` (as [`local_releases`]) with `values` as its
/// `cluster-addon-values.yaml`.
pub fn ferrol_v1_with_values(release_dir: &Path, values: &str) {
    local_releases(release_dir, &["docker-ferrol-1-27-v1"]);
    std::fs::write(
        release_dir.join("cluster-stacks/docker-ferrol-1-27-v1/cluster-addon-values.yaml"),
        values,
    )
    .unwrap();
}

/// The operator's parts for the test's namespace, with local `helm` and the given source; also its chart
/// renderer, for counting helm runs.
pub fn operator(
    client: &Client,
    namespace: &str,
    release_dir: &Path,
    source: Arc<dyn ReleaseSource>,
    adjust: impl FnOnce(&mut Settings),
) -> (Operator, Arc<CachingRenderer<Helm>>) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let helm = cso_testenv::Tools::discover()
        .unwrap()
        .helm
        .expect("helm (make tools)");
    let releases = Arc::new(ReleaseCache::new(release_dir, source, UnpackLimits::default()).unwrap());
    let renderer: Arc<CachingRenderer<Helm>> = Arc::new(CachingRenderer::new(
        Helm::new(&helm, Duration::from_secs(60)).unwrap(),
        DEFAULT_CAPACITY_BYTES,
    ));
    let mut settings = Settings {
        namespace: Some(namespace.to_owned()),
        poll_interval: Duration::from_secs(2),
        // The workload clusters here are bare API servers: no controller ever makes an object run. Tests on
        // workload clusters that run workloads (`cso_testenv::workloads`) turn the health gates on.
        addon_health_checks: false,
        // Simulated pods start once and never exit: waiting for their containers to have been up a while
        // would only slow the tests down. The settle time is tested on real nodes (`real_addons.rs`).
        addon_settle_time: Duration::ZERO,
        ..Settings::default()
    };
    adjust(&mut settings);
    let operator = Operator {
        client: client.clone(),
        releases,
        renderer: renderer.clone(),
        values: Arc::new(ValuesTemplater::new(Helm::new(&helm, Duration::from_secs(60)).unwrap()).unwrap()),
        metrics: Default::default(),
        take_over_from: Vec::new(),
        settings,
        // The version the test API server's Cluster API CRDs serve; `RunningOperator` asks it as `cso run` does.
        cluster_resource: cso_api::capi::Cluster::v1beta1_resource(),
    };
    (operator, renderer)
}

/// An operator running in this process until stopped (gracefully) or killed (its task aborted mid-work).
pub struct RunningOperator {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// The chart renderer, for counting helm runs.
    pub renderer: Arc<CachingRenderer<Helm>>,
}

impl RunningOperator {
    pub async fn local(client: &Client, namespace: &str, release_dir: &Path) -> Self {
        Self::local_with(client, namespace, release_dir, |_| {}).await
    }

    /// [`RunningOperator::local`] with settings changed by `adjust`.
    pub async fn local_with(
        client: &Client,
        namespace: &str,
        release_dir: &Path,
        adjust: impl FnOnce(&mut Settings),
    ) -> Self {
        let source = Arc::new(LocalSource::new(release_dir.join("cluster-stacks")));
        Self::start(client, namespace, release_dir, source, adjust).await
    }

    pub async fn start(
        client: &Client,
        namespace: &str,
        release_dir: &Path,
        source: Arc<dyn ReleaseSource>,
        adjust: impl FnOnce(&mut Settings),
    ) -> Self {
        let (mut operator, renderer) = operator(client, namespace, release_dir, source, adjust);
        operator.cluster_resource = cso_controller::cluster_resource(client).await;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(cso_controller::run(operator, async move {
            let _ = stopped.await;
        }));
        RunningOperator {
            stop: Some(stop),
            task,
            renderer,
        }
    }

    /// Runs `operator` (made by [`operator`] and changed by the test, e.g. its release cache).
    pub async fn run(mut operator: Operator, renderer: Arc<CachingRenderer<Helm>>) -> Self {
        operator.cluster_resource = cso_controller::cluster_resource(&operator.client).await;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(cso_controller::run(operator, async move {
            let _ = stopped.await;
        }));
        RunningOperator {
            stop: Some(stop),
            task,
            renderer,
        }
    }

    /// Stops as on SIGTERM and waits until the controllers have finished.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(60), &mut self.task)
            .await
            .expect("the operator stops within a minute of being told to")
            .unwrap();
    }

    /// Ends the operator wherever it is, like a killed process.
    pub async fn kill(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for RunningOperator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls `check` every 250 ms until it returns `Some`, for at most `limit`; panics with `what` otherwise.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The limit for anything that involves rendering and applying on the shared API server.
pub const CONVERGE: Duration = Duration::from_secs(90);

pub async fn create_stack(client: &Client, namespace: &str, name: &str, spec: Value) -> ClusterStack {
    let stack: ClusterStack = serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1",
        "kind": "ClusterStack",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }))
    .unwrap();
    Api::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &stack)
        .await
        .unwrap()
}

pub fn ferrol_spec(versions: &[&str]) -> Value {
    json!({
        "provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27",
        "channel": "stable", "autoSubscribe": false, "noProvider": true, "versions": versions,
    })
}

/// Waits until ClusterStackRelease `name` is ready and returns it.
pub async fn ready_release(client: &Client, namespace: &str, name: &str) -> ClusterStackRelease {
    let api: Api<ClusterStackRelease> = Api::namespaced(client.clone(), namespace);
    eventually(&format!("ClusterStackRelease {name} ready"), CONVERGE, || async {
        api.get_opt(name)
            .await
            .unwrap()
            .filter(|r| r.status.as_ref().is_some_and(|s| s.ready))
    })
    .await
}

/// Waits until object `name` of kind `K` has condition `type_` with `reason`; returns the condition's message.
pub async fn wait_condition<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    type_: &str,
    reason: &str,
) -> String
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + cso_api::conditions::HasConditions
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let what = format!("{} {name}: {type_} with reason {reason}", K::kind(&()));
    eventually(&what, CONVERGE, || async {
        let object = api.get_opt(name).await.unwrap()?;
        let condition = object.get_condition(type_)?;
        (condition.reason.as_deref() == Some(reason)).then(|| condition.message.clone().unwrap_or_default())
    })
    .await
}

pub fn capi(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", kind))
}

pub fn docker_infra(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1beta1",
        kind,
    ))
}

pub fn dynamic(client: &Client, namespace: &str, resource: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, resource)
}

/// The names of ClusterClasses in the namespace, sorted.
pub async fn cluster_classes(client: &Client, namespace: &str) -> Vec<String> {
    let mut names: Vec<String> = dynamic(client, namespace, &capi("ClusterClass"))
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|c| c.metadata.name)
        .collect();
    names.sort();
    names
}

/// Creates a Cluster (v1beta1) of `class`, its API server at `<name>.example.test:6443`.
pub async fn create_cluster(client: &Client, namespace: &str, name: &str, class: &str) {
    create_labelled_cluster(client, namespace, name, class, json!({})).await;
}

/// [`create_cluster`] with `labels` (a JSON object).
pub async fn create_labelled_cluster(
    client: &Client,
    namespace: &str,
    name: &str,
    class: &str,
    labels: Value,
) {
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "topology": {"class": class, "version": "v1.27.3"},
            "controlPlaneEndpoint": {"host": format!("{name}.example.test"), "port": 6443},
        },
    }))
    .unwrap();
    dynamic(client, namespace, &capi("Cluster"))
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
}

/// Moves Cluster `cluster` to the ClusterClass `class` (an upgrade when it brings other addons).
pub async fn move_cluster(client: &Client, namespace: &str, cluster: &str, class: &str) {
    dynamic(client, namespace, &capi("Cluster"))
        .patch(
            cluster,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"topology": {"class": class}}})),
        )
        .await
        .unwrap();
}

/// The ClusterAddon of Cluster `cluster` once `check` holds for it, waited for up to `limit`.
pub async fn addon_where(
    addons: &Api<cso_api::ClusterAddon>,
    cluster: &str,
    what: &str,
    limit: Duration,
    check: impl Fn(&cso_api::ClusterAddon) -> bool,
) -> cso_api::ClusterAddon {
    let name = cso_api::cluster_addon::cluster_addon_name(cluster);
    // What it said last, for the failure's message.
    let last = std::sync::Mutex::new(String::from("no ClusterAddon"));
    let found = tokio::time::timeout(
        limit,
        eventually(what, limit + Duration::from_secs(1), || async {
            let addon = addons.get_opt(&name).await.unwrap()?;
            if let Some((status, reason, message)) = health_of(&addon) {
                *last.lock().unwrap() = format!(
                    "on {}, AddonsHealthy {status:?} {reason}: {message}",
                    addon.spec.cluster_stack
                );
            }
            check(&addon).then_some(addon)
        }),
    )
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "timed out after {limit:?} waiting for: {what}; last seen {}",
            last.lock().unwrap()
        )
    })
}

/// Whether the object of an inventory entry exists (and is not being deleted).
pub async fn inventory_object_exists(client: &Client, entry: &cso_api::common::Resource) -> bool {
    let gvk = GroupVersionKind::gvk(&entry.group, &entry.version, &entry.kind);
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    dynamic(client, &entry.namespace, &resource)
        .get_opt(&entry.name)
        .await
        .unwrap()
        .is_some_and(|o| o.metadata.deletion_timestamp.is_none())
}

/// Whether the ClusterAddon says it is ready.
pub fn ready(addon: &cso_api::ClusterAddon) -> bool {
    addon.status.as_ref().is_some_and(|s| s.ready)
}

/// The ClusterAddon's `AddonsHealthy` condition: status, reason and message.
pub fn health_of(
    addon: &cso_api::ClusterAddon,
) -> Option<(cso_api::conditions::ConditionStatus, String, String)> {
    addon
        .get_condition(cso_api::names::condition::ADDONS_HEALTHY)
        .map(|c| {
            (
                c.status,
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// A chart `name`'s `Chart.yaml`: `(path in an addon archive, content)`.
pub fn chart(name: &str) -> (String, String) {
    (
        format!("{name}/Chart.yaml"),
        format!("apiVersion: v2\nname: {name}\nversion: 0.1.0\n"),
    )
}

/// A gzipped tar of the files `(path, content)`.
pub fn tgz(files: &[(&str, &str)]) -> Vec<u8> {
    cso_testenv::archive::tgz(files)
}

/// A multi-stage release `docker-staged-1-27-<version>` in `<release_dir>/cluster-stacks/`: the stage charts
/// of the hash fixture (metrics-server, ngnix), the given `clusteraddon.yaml`, and a cluster-class chart with
/// one ConfigMap.
pub fn staged_release(release_dir: &Path, version: &str, addon_config: &str) {
    staged_release_with_empty(release_dir, version, addon_config, None);
}

/// A multi-stage release `docker-staged-1-27-<version>` as [`staged_release`] makes it, its stage charts made
/// of `files` (`(path in the addon archive, content)`, e.g. `("web/Chart.yaml", ...)`).
pub fn staged_release_of(release_dir: &Path, version: &str, addon_config: &str, files: &[(&str, &str)]) {
    let dir = staged_release_base(release_dir, version, addon_config);
    std::fs::write(
        dir.join(format!("docker-staged-1-27-cluster-addon-{version}.tgz")),
        tgz(files),
    )
    .unwrap();
}

/// [`staged_release`] whose stage chart `empty` (if any) has no templates: it renders no objects.
pub fn staged_release_with_empty(release_dir: &Path, version: &str, addon_config: &str, empty: Option<&str>) {
    let dir = staged_release_base(release_dir, version, addon_config);
    let charts = tempfile::tempdir().unwrap();
    let unpacked = charts.path().join("charts");
    cso_release::archive::unpack(
        &fixtures()
            .join("docker-ferrol-1-27-v0-sha-hipstsw/docker-ferrol-1-27-cluster-addon-v0-sha.hipstsw.tgz"),
        &unpacked,
        Default::default(),
    )
    .unwrap();
    let file =
        std::fs::File::create(dir.join(format!("docker-staged-1-27-cluster-addon-{version}.tgz"))).unwrap();
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(file, flate2::Compression::fast()));
    for stage in ["metrics-server", "ngnix"] {
        if Some(stage) == empty {
            let chart = format!("apiVersion: v2\nname: {stage}\nversion: 0.1.0\n");
            let mut header = tar::Header::new_gnu();
            header.set_size(chart.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder
                .append_data(&mut header, format!("{stage}/Chart.yaml"), chart.as_bytes())
                .unwrap();
        } else {
            builder.append_dir_all(stage, unpacked.join(stage)).unwrap();
        }
    }
    builder.into_inner().unwrap().finish().unwrap();
}

/// What every `docker-staged-1-27-<version>` release has but its addon archive: its metadata, `addon_config`
/// as `clusteraddon.yaml` and a cluster-class chart with one ConfigMap. Returns its directory.
fn staged_release_base(release_dir: &Path, version: &str, addon_config: &str) -> PathBuf {
    let tag = format!("docker-staged-1-27-{version}");
    let dir = release_dir.join("cluster-stacks").join(&tag);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("metadata.yaml"),
        format!(
            "apiVersion: metadata.clusterstack.x-k8s.io/v1alpha1\nversions:\n  clusterStack: {version}\n  kubernetes: v1.27.7\n  components:\n    clusterAddon: {version}\n"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("clusteraddon.yaml"), addon_config).unwrap();
    let class = tgz(&[
        ("class/Chart.yaml", "apiVersion: v2\nname: class\nversion: v1\n"),
        (
            "class/templates/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-class\ndata: {}\n",
        ),
    ]);
    std::fs::write(
        dir.join(format!("docker-staged-1-27-cluster-class-{version}.tgz")),
        class,
    )
    .unwrap();
    dir
}

/// A workload cluster of the test's own (addons of different tests must not meet in one cluster).
pub async fn workload_plane(name: &str) -> cso_testenv::ControlPlane {
    let tools = cso_testenv::Tools::discover().unwrap();
    cso_testenv::ControlPlane::start(&tools, name, None)
        .await
        .unwrap()
}

/// A workload cluster of the test's own that runs workloads (kube-controller-manager, kube-scheduler, kwok)
/// on `nodes` simulated nodes (`<name>-node-0`, ...).
pub async fn running_workload_plane(name: &str, nodes: usize) -> cso_testenv::WorkloadCluster {
    let tools = cso_testenv::Tools::discover().unwrap();
    let nodes = cso_testenv::NodeSpec::numbered(&format!("{name}-node"), nodes);
    cso_testenv::ControlPlane::start_with_workloads(&tools, name, None, &nodes)
        .await
        .unwrap()
}

/// The Deployments of `kube-system` in a workload cluster, where addons go.
pub async fn kube_system(plane: &cso_testenv::ControlPlane) -> Api<k8s_openapi::api::apps::v1::Deployment> {
    Api::namespaced(plane.client().await.unwrap(), "kube-system")
}

impl RunningOperator {
    /// [`RunningOperator::local`] as `cso run` starts by default: taking over what the field managers
    /// `managers` applied (`--take-over-field-managers`, default `kubectl`: the Go operator's).
    pub async fn local_taking_over(
        client: &Client,
        namespace: &str,
        release_dir: &Path,
        managers: &[&str],
    ) -> Self {
        let source = Arc::new(LocalSource::new(release_dir.join("cluster-stacks")));
        let (mut operator, renderer) = operator(client, namespace, release_dir, source, |_| {});
        operator.take_over_from = managers.iter().map(|m| (*m).to_owned()).collect();
        operator.cluster_resource = cso_controller::cluster_resource(client).await;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(cso_controller::run(operator, async move {
            let _ = stopped.await;
        }));
        RunningOperator {
            stop: Some(stop),
            task,
            renderer,
        }
    }
}

/// Applies `object` as the Go operator does (see `cso_testenv::go_operator`).
pub async fn go_operator_apply(client: &Client, namespace: &str, object: Value) -> DynamicObject {
    cso_testenv::go_operator::apply(client, namespace, object)
        .await
        .unwrap()
}

/// Sum of the samples of counter `name` in Prometheus text `text` whose labels contain each of `labels`.
pub fn counter(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The metrics of the API server of `workload`.
pub async fn workload_metrics(workload: &Client) -> String {
    cso_testenv::control_plane::api_server_metrics(workload)
        .await
        .unwrap()
}

/// The write requests the operator's kinds of write make, by verb and resource
/// ([`cso_testenv::control_plane::api_server_writes`]).
pub async fn workload_writes(workload: &Client) -> BTreeMap<String, f64> {
    cso_testenv::control_plane::api_server_writes(workload)
        .await
        .unwrap()
}

/// The events with `reason` in `namespace`.
pub async fn events_with(
    client: &Client,
    namespace: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), namespace);
    events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Every version of the object `name` the API server stored after `before` up to `after` (both as read), from a
/// watch: nothing written in between goes unseen.
pub async fn versions_between<K>(api: &Api<K>, name: &str, before: &K, after: &K) -> Vec<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use futures::StreamExt as _;
    use kube::ResourceExt as _;

    let last = after.resource_version().unwrap();
    if before.resource_version().as_ref() == Some(&last) {
        return Vec::new();
    }
    let params = kube::api::WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut events = api
        .watch(&params, &before.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    let mut written = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .expect("the watch delivers every version up to the last one")
            .expect("the watch goes on")
            .unwrap();
        let kube::api::WatchEvent::Modified(version) = event else {
            panic!("only changes are expected: {event:?}");
        };
        let done = version.resource_version().as_ref() == Some(&last);
        written.push(version);
        if done {
            return written;
        }
    }
}
