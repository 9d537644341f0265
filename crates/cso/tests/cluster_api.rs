//! Cluster API itself calling cso (issue 13, "Done when" (b) to (f)): the real Cluster API v1.14 core
//! manager (with the kubeadm and Docker providers' webhooks and conversions) on a management control plane,
//! `cso run` as a process with its hook server registered by an `ExtensionConfig`
//! (`runtime.cluster.x-k8s.io/v1beta2`), and a real workload kube-apiserver that the addons go to.
//!
//! Where a provider would need machines, [`cso_testenv::stand_in::StandIn`] plays its part of the contract
//! (control plane initialised and at its `spec.version`, the kubeconfig Secret, the infrastructure
//! provisioned) and nothing else: every hook call, its order and what it carries are Cluster API's own.
//!
//! One Cluster goes through its life, each phase checking one promise:
//! 1. (b, f) The stacks are installed in namespace `stacks-*`, the Cluster lives in `tenant-*` with a
//!    cross-namespace `classRef` (v1beta2). Cluster API calls `AfterControlPlaneInitialized`; the addons
//!    land in the workload cluster; the ClusterAddon lives beside the Cluster.
//! 2. (c) An upgrade of class and version (`docker-capi-1-33-v1` at v1.33.4 → `-v2` at v1.33.5) is held by
//!    `BeforeClusterUpgrade` until v2's addons are applied, then goes through the control-plane and worker
//!    hooks, and `AfterClusterUpgrade` runs its stage before Cluster API finishes the upgrade.
//! 3. (d, e) A chained upgrade over two minors (`docker-capi-1-35-v1`, whose class lists
//!    `kubernetesVersions`) calls the per-step hooks in order, each step's stage renders for that step's
//!    version, and an `AfterClusterUpgrade` stage that never finishes is given up after `--stage-timeout`
//!    with a Warning, so the upgrade completes.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{collections::BTreeSet, path::Path, process::Command, time::Duration};

use cso_api::{ClusterAddon, ClusterStack, conditions::ConditionsExt, names};
use cso_testenv::{
    capi::shared_management_with_cluster_api,
    stand_in::{StandIn, Workload},
};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Event},
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

mod support;

use support::{capi_stack::*, *};

/// How long Cluster API and the operator get for one phase.
const PHASE: Duration = Duration::from_secs(180);
/// `--stage-timeout` of the operator in this test.
const STAGE_TIMEOUT_SECONDS: u64 = 15;

fn releases() -> Vec<Release> {
    vec![
        Release {
            minor: 33,
            version: "v1",
            kubernetes: "v1.33.4",
            kubernetes_versions: &[],
            clusteraddon_yaml: (format!(
                "{HEADER}  AfterControlPlaneInitialized:\n    - name: metrics-server\n      action: apply\n  \
                     BeforeClusterUpgrade:\n    - name: metrics-server\n      action: apply\n"
            )),
        },
        // v2: the upgrade applies metrics-server before the control plane moves, and that stage is done only
        // once the test opens a gate (a ConfigMap in the workload cluster), so the hold can be seen;
        // AfterClusterUpgrade brings ngnix, so its Deployment shows that stage ran.
        Release {
            minor: 33,
            version: "v2",
            kubernetes: "v1.33.5",
            kubernetes_versions: &[],
            clusteraddon_yaml: (format!(
                "{HEADER}  AfterControlPlaneInitialized:\n    - name: metrics-server\n      action: apply\n  \
                     BeforeClusterUpgrade:\n    - name: metrics-server\n      action: apply\n      \
                     waitForPostCondition:\n        objects:\n          - key: gate\n            apiVersion: v1\n            \
                     kind: ConfigMap\n            name: upgrade-gate\n            namespace: kube-system\n        \
                     conditions: gate.data.open == \"true\"\n  \
                     AfterClusterUpgrade:\n    - name: ngnix\n      action: apply\n"
            )),
        },
        // 1.35: reached from 1.33 in two steps; a probe at every control-plane step, and an
        // AfterClusterUpgrade stage whose post-condition never holds (3 replicas are never 42).
        Release {
            minor: 35,
            version: "v1",
            kubernetes: "v1.35.1",
            kubernetes_versions: &["v1.33.5", "v1.34.2", "v1.35.1"],
            clusteraddon_yaml: (format!(
                "{HEADER}  AfterControlPlaneInitialized:\n    - name: metrics-server\n      action: apply\n  \
                     BeforeClusterUpgrade:\n    - name: metrics-server\n      action: apply\n  \
                     AfterControlPlaneUpgrade:\n    - name: probe\n      action: apply\n  \
                     AfterClusterUpgrade:\n    - name: ngnix\n      action: apply\n      waitForPostCondition:\n        \
                     objects:\n          - key: ngnix\n            apiVersion: apps/v1\n            kind: Deployment\n            \
                     name: cluster-addon-ngnix\n            namespace: kube-system\n        \
                     conditions: ngnix.spec.replicas == 42\n"
            )),
        },
    ]
}

/// The chart's ExtensionConfig as `helm install` renders it for a Cluster API that serves
/// `runtime.cluster.x-k8s.io/v1beta2`.
fn chart_extension_config(namespace: &str) -> Value {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/cluster-stack-operator");
    let output = Command::new(cso_testenv::Tools::discover().unwrap().helm.unwrap())
        .args(["template", "cso"])
        .arg(&chart)
        .args([
            "--namespace",
            namespace,
            "--api-versions",
            "runtime.cluster.x-k8s.io/v1beta2/ExtensionConfig",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let docs: Vec<Option<Value>> =
        serde_saphyr::from_multiple(&String::from_utf8(output.stdout).unwrap()).unwrap();
    docs.into_iter()
        .flatten()
        .find(|d| d["kind"] == "ExtensionConfig")
        .expect("the chart renders an ExtensionConfig")
}

/// The ConfigMaps of `kube-system` in the workload cluster (the gate, the step probe).
fn probe_api(workload: &Client) -> Api<ConfigMap> {
    Api::namespaced(workload.clone(), "kube-system")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_api_calls_every_hook_and_the_addons_follow_the_upgrades() {
    let env = shared_management_with_cluster_api();
    let client = env.control_plane.client().await.unwrap();
    let stacks = cso_testenv::namespace(&client, "stacks").await.unwrap();
    let tenant = cso_testenv::namespace(&client, "tenant").await.unwrap();
    let tools = cso_testenv::Tools::discover().unwrap();
    let workload_plane = cso_testenv::ControlPlane::start(&tools, "capi-workload", None)
        .await
        .unwrap();
    let workload = workload_plane.client().await.unwrap();

    // The releases, on a GitHub stand-in.
    let published = tempfile::tempdir().unwrap();
    let github = cso_testenv::github::FakeGithub::start(30).await.unwrap();
    for release in releases() {
        let dir = release.write(published.path());
        github.publish_dir(&release.tag(), &dir).unwrap();
    }
    // A release as the stacks publish them since 2026: a v1beta2 ClusterClass whose objects have no namespace.
    let scs =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases-2026/docker-scs-1-35-v1");
    github.publish_dir("docker-scs-1-35-v1", &scs).unwrap();

    // The operator, its hook server registered with Cluster API.
    // CSO_KEEP_TEST_DIRS=1 keeps the operator's log and files for a look after a failure.
    let work_dir = tempfile::Builder::new().prefix("cso-capi-e2e").tempdir().unwrap();
    eprintln!("operator log: {}", work_dir.path().join("operator.log").display());
    let (work, _cleanup) = if std::env::var_os("CSO_KEEP_TEST_DIRS").is_some() {
        (work_dir.keep(), None)
    } else {
        (work_dir.path().to_path_buf(), Some(work_dir))
    };
    let certs = work.as_path().join("hook-certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = cso_testenv::pki::write_serving_certificate(&certs).unwrap();
    let instance = Instance::new(&certs, false);
    let log = work.as_path().join("operator.log");
    let release_dir = work.as_path().join("releases");
    std::fs::create_dir_all(&release_dir).unwrap();
    let stage_timeout = format!("--stage-timeout={STAGE_TIMEOUT_SECONDS}s");
    // The 2026 release's subcharts are not vendored: resolved from a loopback mirror when it is cached.
    let charts = cso_testenv::chart_repo::ChartRepo::start(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/charts"),
    )
    .await
    .unwrap();
    let chart_mirror = format!("--chart-mirror={}", charts.url());
    let _operator = start_operator_with(
        env.control_plane.kubeconfig_path(),
        &release_dir,
        None,
        &Source::Github(github.api_url()),
        &log,
        &instance,
        &[&stage_timeout, &chart_mirror],
    );
    let extension_name = format!("cso-{tenant}");
    cso_testenv::capi::register_extension(
        &client,
        &extension_name,
        &format!("https://127.0.0.1:{}", instance.hook_port),
        &ca,
        std::slice::from_ref(&tenant),
    )
    .await
    .unwrap();
    // Cluster API discovers our handlers (every lifecycle hook).
    let handlers: BTreeSet<String> =
        cso_testenv::capi::discovered_hooks(&client, &extension_name, Duration::from_secs(60))
            .await
            .unwrap()
            .into_iter()
            .collect();
    // The chart's ExtensionConfig, rendered for a Cluster API that serves v1beta2 (as `helm install` finds it
    // by discovery), is v1beta2 and accepted by this Cluster API.
    let chart_extension = chart_extension_config(&tenant);
    assert_eq!(chart_extension["apiVersion"], "runtime.cluster.x-k8s.io/v1beta2");
    let extension_configs = api(
        &client,
        "runtime.cluster.x-k8s.io",
        "v1beta2",
        "ExtensionConfig",
        "extensionconfigs",
        None,
    );
    extension_configs
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &serde_json::from_value(chart_extension).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("Cluster API refused the chart's ExtensionConfig: {e}"));
    let every_hook: BTreeSet<String> = cso_api::rules::Hook::ALL
        .iter()
        .map(|h| h.as_str().to_owned())
        .collect();
    assert_eq!(handlers, every_hook);

    // The stacks, in their own namespace.
    let stacks_api: Api<ClusterStack> = Api::namespaced(client.clone(), &stacks);
    stacks_api
        .create(&PostParams::default(), &cluster_stack(&stacks, 33, &["v1", "v2"]))
        .await
        .unwrap();
    stacks_api
        .create(&PostParams::default(), &cluster_stack(&stacks, 35, &["v1"]))
        .await
        .unwrap();
    let mut scs_stack = cluster_stack(&stacks, 35, &["v1"]);
    scs_stack.metadata.name = Some("scs-1-35".into());
    scs_stack.spec.name = "scs".into();
    stacks_api
        .create(&PostParams::default(), &scs_stack)
        .await
        .unwrap();
    // v1beta1 (the test stack, from ferrol's chart) and v1beta2 (scs) classes side by side, all in the
    // ClusterStackReleases' namespace (scs renders no namespace), all reconciled by Cluster API.
    let classes = api(
        &client,
        "cluster.x-k8s.io",
        "v1beta2",
        "ClusterClass",
        "clusterclasses",
        Some(&stacks),
    );
    let expected: BTreeSet<String> = [
        "docker-capi-1-33-v1",
        "docker-capi-1-33-v2",
        "docker-capi-1-35-v1",
        "docker-scs-1-35-v1",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    wait_for(
        "the four ClusterClasses are applied and reconciled",
        PHASE,
        || async {
            let reconciled: BTreeSet<String> = classes
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .iter()
                .filter(|c| {
                    let c = serde_json::to_value(c).unwrap();
                    c.pointer("/status/observedGeneration").is_some()
                        && c.pointer("/status/conditions")
                            .and_then(Value::as_array)
                            .is_some_and(|cs| {
                                cs.iter()
                                    .any(|x| x["type"] == "VariablesReady" && x["status"] == "True")
                            })
                })
                .map(|c| c.name_any())
                .collect();
            (reconciled == expected).then_some(())
        },
    )
    .await;
    let scs_class = serde_json::to_value(classes.get("docker-scs-1-35-v1").await.unwrap()).unwrap();
    assert!(
        scs_class
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .unwrap()
            .iter()
            .any(|f| f["apiVersion"] == "cluster.x-k8s.io/v1beta2" && f["operation"] == "Apply"),
        "the scs class was applied as it was rendered, in v1beta2: {scs_class}"
    );

    // Phase 1 (b, f): a Cluster in the tenant namespace, its class in the stacks namespace.
    let _stand_in = StandIn::start(
        client.clone(),
        Workload {
            kubeconfig: workload_plane.kubeconfig_yaml().to_owned(),
            server_url: workload_plane.server_url().to_owned(),
        },
    );
    let clusters = api(
        &client,
        "cluster.x-k8s.io",
        "v1beta2",
        "Cluster",
        "clusters",
        Some(&tenant),
    );
    let control_planes = api(
        &client,
        "controlplane.cluster.x-k8s.io",
        "v1beta2",
        "KubeadmControlPlane",
        "kubeadmcontrolplanes",
        Some(&tenant),
    );
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(cluster(&tenant, "c1", "docker-capi-1-33-v1", &stacks, "v1.33.4"))
                .unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("Cluster API refused the Cluster: {e}"));
    let key = format!("{tenant}/c1");
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &tenant);
    let workload_deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    wait_for("the addons of v1 land in the workload cluster", PHASE, || async {
        let addon = addons.get_opt("cluster-addon-c1").await.ok()??;
        let ready = addon.status.as_ref().is_some_and(|s| s.ready)
            && addon.spec.cluster_stack == "docker-capi-1-33-v1";
        (ready
            && workload_deployments
                .get_opt("metrics-server")
                .await
                .ok()?
                .is_some())
        .then_some(())
    })
    .await;
    // The operator installs as soon as the workload cluster answers (it does not depend on the call);
    // Cluster API calls AfterControlPlaneInitialized once it has seen the control plane initialised.
    let phase1 = wait_for(
        "Cluster API calls AfterControlPlaneInitialized",
        PHASE,
        || async {
            let answers = answers(&log, &key);
            answers
                .iter()
                .any(|a| a.hook == "AfterControlPlaneInitialized" && a.version == "v1.33.4")
                .then_some(answers)
        },
    )
    .await;
    assert_eq!(
        passed(&phase1),
        pairs(&[
            ("BeforeClusterCreate", "v1.33.4"),
            ("AfterControlPlaneInitialized", "v1.33.4")
        ]),
        "the hooks of a Cluster's creation, in order: {phase1:?}"
    );
    let metrics = reqwest::get(format!("http://127.0.0.1:{}/metrics", instance.metrics_port))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("cso_hook_requests_total{")
            && l.contains("hook=\"AfterControlPlaneInitialized\"")
            && !l.ends_with(" 0")),
        "cso_hook_requests_total counts Cluster API's calls:\n{metrics}"
    );
    assert!(metrics.contains("cso_hook_duration_seconds_bucket{"), "{metrics}");

    // Phase 2 (c): class v1 → v2 and v1.33.4 → v1.33.5.
    clusters
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"topology": {"classRef": {"name": "docker-capi-1-33-v2"}, "version": "v1.33.5"}}})),
        )
        .await
        .unwrap();
    // Held: BeforeClusterUpgrade asks Cluster API to come back while v2's stage waits for its gate, and the
    // control plane stays at the old version.
    wait_for("BeforeClusterUpgrade holds the upgrade", PHASE, || async {
        answers(&log, &key)[phase1.len()..]
            .iter()
            .any(|a| a.hook == "BeforeClusterUpgrade" && a.result == "retry")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kcp_name =
        serde_json::to_value(clusters.get("c1").await.unwrap()).unwrap()["spec"]["controlPlaneRef"]["name"]
            .as_str()
            .unwrap()
            .to_owned();
    let held = serde_json::to_value(control_planes.get(&kcp_name).await.unwrap()).unwrap();
    assert_eq!(
        held["spec"]["version"], "v1.33.4",
        "the control plane waits while the new addons are not applied"
    );
    let gate: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "upgrade-gate", "namespace": "kube-system"}, "data": {"open": "true"}}))
    .unwrap();
    probe_api(&workload)
        .create(&PostParams::default(), &gate)
        .await
        .unwrap();
    upgrade_finished(
        &clusters,
        &control_planes,
        &key,
        "v1.33.5",
        &log,
        "the upgrade to v2",
        &env.cluster_api,
    )
    .await;
    let phase2_calls = answers(&log, &key).split_off(phase1.len());
    let phase2 = after_creation(&phase2_calls);
    assert_eq!(
        passed(&phase2),
        pairs(&[
            ("BeforeClusterUpgrade", "v1.33.5"),
            ("BeforeControlPlaneUpgrade", "v1.33.5"),
            ("AfterControlPlaneUpgrade", "v1.33.5"),
            ("BeforeWorkersUpgrade", "v1.33.5"),
            ("AfterWorkersUpgrade", "v1.33.5"),
            ("AfterClusterUpgrade", "v1.33.5"),
        ]),
        "the hooks of a one-step upgrade, in order: {phase2:?}"
    );
    let first = |hook: &str, result: &str| phase2.iter().position(|a| a.hook == hook && a.result == result);
    assert!(
        first("BeforeClusterUpgrade", "retry").unwrap() < first("BeforeClusterUpgrade", "success").unwrap(),
        "BeforeClusterUpgrade held the upgrade while v2's addons were applied: {phase2:?}"
    );
    assert!(
        first("AfterClusterUpgrade", "retry").unwrap() < first("AfterClusterUpgrade", "success").unwrap(),
        "AfterClusterUpgrade (blocking) held Cluster API while its stage ran: {phase2:?}"
    );
    for hook in [
        "BeforeControlPlaneUpgrade",
        "AfterControlPlaneUpgrade",
        "BeforeWorkersUpgrade",
        "AfterWorkersUpgrade",
    ] {
        assert_eq!(
            first(hook, "retry"),
            None,
            "{hook}: v2 has no stages for it, so it is never held: {phase2:?}"
        );
    }
    let addon = addons.get("cluster-addon-c1").await.unwrap();
    assert_eq!(addon.spec.cluster_stack, "docker-capi-1-33-v2");
    assert!(
        workload_deployments
            .get_opt("cluster-addon-ngnix")
            .await
            .unwrap()
            .is_some(),
        "AfterClusterUpgrade's stage (ngnix) ran"
    );

    // Phase 3 (d, e): a chained upgrade over two minors, v1.33.5 → v1.34.2 → v1.35.1.
    let probe = probe_api(&workload);
    clusters
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"topology": {"classRef": {"name": "docker-capi-1-35-v1"}, "version": "v1.35.1"}}})),
        )
        .await
        .unwrap();
    let mut probed = BTreeSet::new();
    let deadline = std::time::Instant::now() + PHASE;
    while !probed.contains("v1.35.1") && std::time::Instant::now() < deadline {
        if let Some(cm) = probe.get_opt("step-version").await.unwrap() {
            probed.extend(cm.data.unwrap_or_default().remove("version"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    upgrade_finished(
        &clusters,
        &control_planes,
        &key,
        "v1.35.1",
        &log,
        "the chained upgrade",
        &env.cluster_api,
    )
    .await;
    let phase3 = after_creation(&answers(&log, &key)[phase1.len() + phase2_calls.len()..]);
    assert_eq!(
        passed(&phase3),
        pairs(&[
            ("BeforeClusterUpgrade", "v1.35.1"),
            ("BeforeControlPlaneUpgrade", "v1.34.2"),
            ("AfterControlPlaneUpgrade", "v1.34.2"),
            ("BeforeControlPlaneUpgrade", "v1.35.1"),
            ("AfterControlPlaneUpgrade", "v1.35.1"),
            ("BeforeWorkersUpgrade", "v1.35.1"),
            ("AfterWorkersUpgrade", "v1.35.1"),
            ("AfterClusterUpgrade", "v1.35.1"),
        ]),
        "the per-step hooks of a chained upgrade, in order: {phase3:?}"
    );
    assert_eq!(
        probed,
        BTreeSet::from(["v1.34.2".to_owned(), "v1.35.1".to_owned()]),
        "the AfterControlPlaneUpgrade stage rendered for each step's version"
    );
    // (e) The AfterClusterUpgrade stage never finished: given up after the timeout, with a Warning.
    let addon = addons.get("cluster-addon-c1").await.unwrap();
    let timed_out = addon
        .get_condition(names::condition::HOOK_STAGES_COMPLETED)
        .unwrap();
    assert_eq!(
        timed_out.reason.as_deref(),
        Some(names::reason::STAGE_TIMED_OUT),
        "{timed_out:?}"
    );
    assert_eq!(addon.spec.cluster_stack, "docker-capi-1-35-v1");
    assert!(
        addon.spec.hook.is_empty(),
        "the hook finished: {:?}",
        addon.spec.hook
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &tenant);
    let warnings: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(names::event::STAGE_TIMED_OUT))
        .filter_map(|e| e.message)
        .collect();
    assert!(
        warnings
            .iter()
            .any(|m| m.contains("stage \"ngnix\" of AfterClusterUpgrade did not finish within 15s")),
        "a StageTimedOut Warning: {warnings:?}"
    );
    let operator_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        !operator_log.contains("\"level\":\"ERROR\""),
        "no errors in the operator's log"
    );
    workload_plane.stop();
}
