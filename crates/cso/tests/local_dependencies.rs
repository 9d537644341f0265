//! Issue 32, "Done when": a stack author's freshly built release with unvendored stage charts
//! (`docker-scs-1-35-v1` as the stacks' 2026 build leaves it: `Chart.yaml` `dependencies`, no `charts/`) in a
//! release directory, run by `cso run --local=true --chart-mirror=URL` with a loopback chart repository that
//! holds the exact dependencies, on the real Cluster API v1.14 management plane with [`StandIn`] playing the
//! providers and a workload kube-apiserver of the Cluster's own. Cilium and metrics-server land in the workload
//! cluster; the release directory keeps every file and byte (its dependencies were resolved into a copy in
//! `--local-cache-dir`). Then the author rebuilds the release in place (a value in the metrics-server stage's
//! values template changed): it is resolved again, into a copy of its own that replaces the first, and the
//! change reaches the workload cluster at the next periodic reconcile. Before installing, `cso render DIR --chart-mirror=URL` of the same
//! directory prints Cilium's objects, leaving the directory as built.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use cso_api::{ClusterAddon, ClusterStack};
use cso_testenv::{
    ControlPlane,
    capi::{TopologyCluster, shared_management_with_cluster_api},
    chart_repo::ChartRepo,
    stand_in::{StandIn, Workload},
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::{
    Api,
    api::{DynamicObject, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::json;

mod support;

use support::*;

const TAG: &str = "docker-scs-1-35-v1";
const ADDON_ARCHIVE: &str = "docker-scs-1-35-cluster-addon-v1.tgz";
const CLUSTER: &str = "local35";
const PHASE: Duration = Duration::from_secs(180);
/// The pod annotation the rebuilt release gives metrics-server.
const REBUILT: (&str, &str) = ("cso.test/build", "rebuilt");

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture() -> PathBuf {
    repo_root().join("tests/fixtures/releases-2026").join(TAG)
}

/// Every file and directory below `dir` with its bytes: equal trees have the same files with the same bytes.
fn tree(dir: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    fn walk(dir: &Path, root: &Path, into: &mut BTreeMap<String, Option<Vec<u8>>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(root).unwrap().display().to_string();
            if path.is_dir() {
                into.insert(name, None);
                walk(&path, root, into);
            } else {
                into.insert(name, Some(std::fs::read(&path).unwrap()));
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(dir, dir, &mut files);
    files
}

/// The resolved copies of the release in the local cache.
fn copies(local_cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(local_cache)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|name| name.starts_with(&format!("{TAG}@")))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// How many times the operator's log says it resolved chart dependencies.
fn resolutions(log: &Path) -> usize {
    log_lines(log)
        .iter()
        .filter(|line| line["message"] == "chart dependencies resolved")
        .count()
}

/// Rebuilds the release's addon archive in place with a pod annotation added to the values template of the
/// metrics-server stage (`overwrite.yaml`), as the author's build does after an edit. (What makes the
/// ClusterAddon render again is a change of the templated values; see the report of issue 32.)
fn rebuild_addons(release: &Path) {
    let archive = release.join(ADDON_ARCHIVE);
    let files: Vec<(String, Vec<u8>)> = cso_testenv::archive::files_of(&archive)
        .unwrap()
        .into_iter()
        .map(|(path, content)| {
            if path != "metrics-server/overwrite.yaml" {
                return (path, content);
            }
            let template = String::from_utf8(content).unwrap();
            let domain = "      domain: \"{{ .Cluster.spec.controlPlaneEndpoint.host }}\"";
            assert!(template.contains(domain), "{template}");
            let template = template.replace(
                domain,
                &format!(
                    "{domain}\n    podAnnotations:\n      {}: {}",
                    REBUILT.0, REBUILT.1
                ),
            );
            (path, template.into_bytes())
        })
        .collect();
    std::fs::write(&archive, cso_testenv::archive::tgz(&files)).unwrap();
}

/// `cso render DIR --chart-mirror=MIRROR`: its output, failing the test (with stderr) when it fails.
async fn cso_render(dir: &Path, mirror: &str) -> String {
    let args = [
        "render".to_owned(),
        dir.display().to_string(),
        format!("--chart-mirror={mirror}"),
    ];
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_cso"))
            .args(&args)
            .env("CSO_HELM", cso_testenv::Tools::discover().unwrap().helm.unwrap())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "cso render failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn stack(namespace: &str) -> ClusterStack {
    serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": "docker-scs-1-35", "namespace": namespace},
        "spec": {"provider": "docker", "name": "scs", "kubernetesVersion": "1.35",
                 "channel": "stable", "autoSubscribe": false, "noProvider": true, "versions": ["v1"]},
    }))
    .unwrap()
}

/// The operator's log, the lines that are its own, for failure messages.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            !["\"logger\":\"hyper", "\"logger\":\"tower", "\"logger\":\"log\""]
                .iter()
                .any(|n| l.contains(n))
        })
        .collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_release_with_unvendored_charts_installs_from_a_chart_mirror_and_is_resolved_again_when_rebuilt()
 {
    let started = Instant::now();
    let env = shared_management_with_cluster_api();
    let client = env.control_plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "local-deps").await.unwrap();
    let tools = cso_testenv::Tools::discover().unwrap();
    let mirror = ChartRepo::start(&repo_root().join("tests/fixtures/charts"))
        .await
        .unwrap();

    let work_dir = tempfile::Builder::new()
        .prefix("cso-local-deps")
        .tempdir()
        .unwrap();
    let (work, _cleanup) = if std::env::var_os("CSO_KEEP_TEST_DIRS").is_some() {
        (work_dir.keep(), None)
    } else {
        (work_dir.path().to_path_buf(), Some(work_dir))
    };
    let certs = work.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    cso_testenv::pki::write_serving_certificate(&certs).unwrap();
    let log = work.join("operator.log");
    eprintln!("operator log: {}", log.display());
    // `--release-dir`: the releases are in `cluster-stacks/<tag>/`, as the author's build put them.
    let release_dir = work.join("releases");
    let releases = release_dir.join("cluster-stacks");
    let release = releases.join(TAG);
    cso_release::release::copy_release_dir(&fixture(), &release).unwrap();
    let local_cache = work.join("local-cache");
    let as_built = tree(&releases);

    // Before installing, the author looks at what the release would do.
    let rendered = cso_render(&release, &mirror.url()).await;
    for object in [
        "kind: DaemonSet",
        "name: cilium\n",
        "name: cilium-operator",
        "name: metrics-server",
    ] {
        assert!(
            rendered.contains(object),
            "cso render: {object:?} not rendered:\n{rendered}"
        );
    }
    assert!(
        tree(&releases) == as_built,
        "cso render leaves the release directory as built"
    );

    let flags = [
        "--local=true".to_owned(),
        format!("--chart-mirror={}", mirror.url()),
        format!("--local-cache-dir={}", local_cache.display()),
        // Nothing announces a rebuilt release: the next periodic reconcile of the ClusterAddon finds it.
        "--resync-interval=5s".to_owned(),
    ];
    let instance = Instance::new(&certs, false);
    // Local mode: the GitHub settings are never used.
    let _operator = start_operator_with(
        env.control_plane.kubeconfig_path(),
        &release_dir,
        Some(&ns),
        &Source::Github("http://127.0.0.1:1"),
        &log,
        &instance,
        &flags.iter().map(String::as_str).collect::<Vec<_>>(),
    );

    Api::<ClusterStack>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &stack(&ns))
        .await
        .unwrap();
    let classes: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "ClusterClass"),
            "clusterclasses",
        ),
    );
    wait_for("the ClusterClass applied", PHASE, || async {
        classes.get_opt(TAG).await.ok().flatten().map(drop)
    })
    .await;

    // The Cluster, made by Cluster API from the class; the stand-in plays its providers.
    let plane = ControlPlane::start(&tools, "local-deps", None).await.unwrap();
    let workload = Workload {
        kubeconfig: plane.kubeconfig_yaml().to_owned(),
        server_url: plane.server_url().to_owned(),
    };
    let stand_in = StandIn::start(client.clone(), workload.clone());
    stand_in.assign(&ns, CLUSTER, workload);
    let cluster = TopologyCluster {
        namespace: &ns,
        name: CLUSTER,
        api_version: "cluster.x-k8s.io/v1beta2",
        class: TAG,
        class_namespace: None,
        version: "v1.35.1",
        worker_class: "default-worker",
        worker_replicas: 0,
        image_repository: Some("registry.k8s.io"),
    }
    .to_json();
    Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"),
            "clusters",
        ),
    )
    .create(&PostParams::default(), &serde_json::from_value(cluster).unwrap())
    .await
    .unwrap();

    let workload_client = plane.client().await.unwrap();
    let daemonsets: Api<DaemonSet> = Api::namespaced(workload_client.clone(), "kube-system");
    let deployments: Api<Deployment> = Api::namespaced(workload_client, "kube-system");
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let addon_name = format!("cluster-addon-{CLUSTER}");
    let deadline = Instant::now() + PHASE;
    loop {
        let ready = addons
            .get_opt(&addon_name)
            .await
            .ok()
            .flatten()
            .is_some_and(|a| a.spec.cluster_stack == TAG && a.status.as_ref().is_some_and(|s| s.ready));
        let cilium = daemonsets.get_opt("cilium").await.ok().flatten().is_some();
        let operator = deployments
            .get_opt("cilium-operator")
            .await
            .ok()
            .flatten()
            .is_some();
        let metrics_server = deployments
            .get_opt("metrics-server")
            .await
            .ok()
            .flatten()
            .is_some();
        if ready && cilium && operator && metrics_server {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the addons did not land (ready {ready}, cilium {cilium}, cilium-operator {operator}, metrics-server \
             {metrics_server}); stand-in: {:?} (last error {:?}); operator log:\n{}",
            stand_in.log(),
            stand_in.last_error(),
            log_tail(&log)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!("installed from the local release in {:?}", started.elapsed());
    assert!(
        tree(&releases) == as_built,
        "the release directory keeps every file and byte"
    );
    let first = copies(&local_cache);
    assert_eq!(first.len(), 1, "one resolved copy: {first:?}");
    assert_eq!(resolutions(&log), 1, "resolved once, for both controllers");

    // The author rebuilds the release in place: resolved again, and the change reaches the workload cluster.
    rebuild_addons(&release);
    let as_rebuilt = tree(&releases);
    let rebuilt_at = Instant::now();
    let annotated = |deployment: &Deployment| {
        deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(REBUILT.0))
            .is_some_and(|v| v == REBUILT.1)
    };
    let deadline = Instant::now() + PHASE;
    loop {
        let deployment = deployments.get_opt("metrics-server").await.ok().flatten();
        if deployment.as_ref().is_some_and(annotated) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rebuilt metrics-server did not reach the workload cluster: {:?}; operator log:\n{}",
            deployment.map(|d| d
                .spec
                .and_then(|s| s.template.metadata)
                .unwrap_or_default()
                .annotations),
            log_tail(&log)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!(
        "the rebuild reached the workload cluster in {:?}",
        rebuilt_at.elapsed()
    );
    assert_eq!(resolutions(&log), 2, "the rebuilt release was resolved again");
    let second = copies(&local_cache);
    assert!(
        second.len() == 1 && second != first,
        "the rebuilt release's copy replaced the first: {first:?} → {second:?}"
    );
    assert!(
        tree(&releases) == as_rebuilt,
        "the rebuilt release directory keeps every file and byte"
    );
    let addon = addons.get(&addon_name).await.unwrap();
    assert!(
        addon.status.as_ref().is_some_and(|s| s.ready),
        "{:?}",
        addon.status
    );
    assert!(
        !std::fs::read_to_string(&log)
            .unwrap()
            .contains("\"level\":\"ERROR\""),
        "no errors in the operator's log"
    );
    drop(stand_in);
    plane.stop();
    eprintln!("took {:?}", started.elapsed());
}
