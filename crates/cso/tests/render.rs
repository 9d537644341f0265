//! `cso render` on the bundled releases: offline from a directory or fetched by tag (the objects of the cluster class, of the addons and of each
//! addon stage, values templated over a Cluster file), and with `--diff` against live clusters, where a
//! Cluster running ferrol v1 previews its upgrade to v2: the addon objects that change (with the changed
//! label in the diff), `web` pruned, the v2 cluster class unchanged, and nothing touched; a delete stage is
//! checked object by object (deleted, left alone when not the operator's, or already absent).
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

mod support;

use std::{process::Command, time::Duration};

use cso_api::{ClusterAddon, capi::Cluster};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, api::PostParams};
use serde_json::json;
use support::*;

/// Runs `cso render ARGS`; returns stdout, failing the test (with stderr) when it fails.
fn cso_render(args: &[&str]) -> String {
    cso_render_with_env(args, &[])
}

/// [`cso_render`] with these environment variables set.
fn cso_render_with_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_cso"))
        .arg("render")
        .args(args)
        .env("CSO_HELM", cso_testenv::Tools::discover().unwrap().helm.unwrap())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cso render {args:?} failed: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

fn release(tag: &str) -> String {
    fixtures().join(tag).display().to_string()
}

/// The section of `output` whose heading starts with `== title`, up to the next heading.
fn section<'a>(output: &'a str, title: &str) -> &'a str {
    let start = output
        .find(&format!("== {title}"))
        .unwrap_or_else(|| panic!("no section {title:?} in:\n{output}"));
    let rest = &output[start + 3..];
    let end = rest.find("\n== ").map_or(rest.len(), |e| e + 1);
    &rest[..end]
}

#[test]
fn offline_it_prints_the_cluster_class_and_addons_templated_over_the_cluster() {
    let scratch = tempfile::tempdir().unwrap();
    let cluster_file = scratch.path().join("cluster.yaml");
    std::fs::write(
        &cluster_file,
        "apiVersion: cluster.x-k8s.io/v1beta1\nkind: Cluster\nmetadata: {name: c1, namespace: team-a}\n\
         spec:\n  topology: {class: docker-ferrol-1-27-v1, version: v1.27.3}\n  \
         controlPlaneEndpoint: {host: c1.example.test, port: 6443}\n",
    )
    .unwrap();
    let output = cso_render(&[
        &release("docker-ferrol-1-27-v1"),
        "--cluster",
        cluster_file.to_str().unwrap(),
    ]);
    let class = section(&output, "cluster class -> management cluster, namespace team-a");
    assert!(
        class.contains("kind: ClusterClass") && class.contains("name: docker-ferrol-1-27-v1"),
        "{class}"
    );
    assert!(class.contains(": 5 objects"), "{class}");
    let addons = section(&output, "addons -> workload cluster of team-a/c1");
    assert!(
        addons.contains("domain: c1.example.test"),
        "values templated over the Cluster: {addons}"
    );
    assert!(addons.contains("clusterAddonVersion: v1") || addons.contains("clusterAddonVersion: \"v1\""));
    assert!(addons.contains("name: web"), "v1 still has the web Deployment");

    // A multi-stage release: every stage of every hook, with its action; its directory is left as it was
    // (charts are unpacked into a private copy).
    let hash = fixtures().join("docker-ferrol-1-27-v0-sha-hipstsw");
    let entries = || {
        let mut names: Vec<_> = std::fs::read_dir(&hash)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = entries();
    let output = cso_render(&[&release("docker-ferrol-1-27-v0-sha-hipstsw")]);
    assert_eq!(
        entries(),
        before,
        "a preview writes nothing into the release directory"
    );
    assert!(
        output.contains("== AfterControlPlaneInitialized: metrics-server (apply)"),
        "{output}"
    );
    assert!(output.contains("== BeforeClusterUpgrade: "), "{output}");
    assert!(
        output.contains("for Cluster default/example"),
        "an example Cluster stands in: {output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_tag_is_fetched_from_its_source() {
    let fake = github_with_ferrol().await;
    let cache = tempfile::tempdir().unwrap();
    let stdout = cso_render_with_env(
        &[
            "docker-ferrol-1-27-v2",
            "--source=github",
            &format!("--github-api-url={}", fake.api_url()),
            &format!("--release-dir={}", cache.path().display()),
        ],
        &[
            ("GIT_PROVIDER", "github"),
            ("GIT_ORG_NAME", "SovereignCloudStack"),
            ("GIT_REPOSITORY_NAME", "cluster-stacks"),
        ],
    );
    assert!(
        stdout.contains("name: docker-ferrol-1-27-v2") && stdout.contains("clusterAddonVersion"),
        "{stdout}"
    );
    assert!(
        cache
            .path()
            .join("cluster-stacks/docker-ferrol-1-27-v2/metadata.yaml")
            .is_file()
    );
}

#[test]
fn a_broken_release_is_a_clear_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_cso"))
        .args(["render", "not-a-release-tag"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("neither a release directory nor a release tag"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_previews_the_ferrol_v1_to_v2_upgrade_of_a_running_cluster() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let workload = cso_testenv::shared_workload();
    let ns = cso_testenv::namespace(&client, "render").await.unwrap();
    let fake = github_with_ferrol().await;
    let scratch = tempfile::tempdir().unwrap();
    let instance = Instance::new(scratch.path(), false);
    let mut operator = start_operator(
        plane.kubeconfig_path(),
        scratch.path(),
        &ns,
        fake.api_url(),
        &scratch.path().join("operator.log"),
        &instance,
    );

    // A Cluster on ferrol v1 with its addons applied; v2 released beside it.
    Api::<cso_api::ClusterStack>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &ferrol_stack(&ns, &["v1", "v2"]))
        .await
        .unwrap();
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": ns},
        "spec": {"topology": {"class": "docker-ferrol-1-27-v1", "version": "v1.27.3"},
                 "controlPlaneEndpoint": {"host": "c1.example.test", "port": 6443}},
    }))
    .unwrap();
    Api::<Cluster>::namespaced_with(client.clone(), &ns, &Cluster::v1beta1_resource())
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    cso_testenv::kubeconfig_secret(&client, &ns, "c1", workload.kubeconfig_yaml())
        .await
        .unwrap();
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    wait_for("v1 addons applied", Duration::from_secs(120), || async {
        let addon = addons.get_opt("cluster-addon-c1").await.unwrap()?;
        (addon.status?.ready && addon.spec.cluster_stack == "docker-ferrol-1-27-v1").then_some(())
    })
    .await;
    wait_for("both releases ready", Duration::from_secs(60), || async {
        (ready(&client, &ns).await.len() == 2).then_some(())
    })
    .await;
    assert!(terminate(&mut operator).success());
    let deployments: Api<Deployment> = Api::namespaced(workload.client().await.unwrap(), "kube-system");
    let before = deployments.get("metrics-server").await.unwrap();

    let cluster_ref = format!("{ns}/c1");
    let diff_for_c1 = |release: &str| {
        cso_render(&[
            release,
            "--cluster",
            &cluster_ref,
            "--kubeconfig",
            plane.kubeconfig_path().to_str().unwrap(),
            "--diff",
        ])
    };
    let output = diff_for_c1(&release("docker-ferrol-1-27-v2"));
    let class = section(
        &output,
        &format!("cluster class -> management cluster, namespace {ns}"),
    );
    assert!(
        class.contains(&format!(
            "unchanged  ClusterClass.cluster.x-k8s.io {ns}/docker-ferrol-1-27-v2"
        )),
        "the v2 class is applied already: {class}"
    );
    assert!(!class.contains("create") && !class.contains("change "), "{class}");
    let addons = section(&output, &format!("addons -> workload cluster of {ns}/c1"));
    let metrics_server = addons
        .split("   change     Deployment.apps kube-system/metrics-server\n")
        .nth(1)
        .unwrap_or_else(|| panic!("metrics-server changes: {addons}"));
    let metrics_server_diff: Vec<&str> = metrics_server
        .lines()
        .take_while(|l| l.starts_with("      "))
        .map(str::trim_start)
        .collect();
    let changed = |sign: &str, version: &str| {
        metrics_server_diff
            .iter()
            .any(|l| l.starts_with(sign) && l.contains("clusterAddonVersion") && l.contains(version))
    };
    assert!(
        changed("-", "v1") && changed("+", "v2"),
        "{metrics_server_diff:#?}"
    );
    assert!(
        !addons.contains("create "),
        "every v2 addon object exists already: {addons}"
    );
    let pruned = section(
        &output,
        &format!("no longer in the release -> workload cluster of {ns}/c1"),
    );
    assert!(
        pruned.contains("prune      Deployment.apps kube-system/web"),
        "{pruned}"
    );
    assert!(
        output.contains(" 0 to create, ")
            && output.contains(" 1 to prune, ")
            && output.contains(" 0 refused"),
        "{output}"
    );

    // The preflight of the move to v2's class: a dry run the API server accepts (no Cluster API webhooks run
    // here; crates/controller/tests/preflight.rs has them refuse), and what the move runs.
    let preflight = section(&output, "preflight: move Cluster");
    assert!(
        preflight.starts_with(&format!(
            "preflight: move Cluster {ns}/c1 from class docker-ferrol-1-27-v1 to docker-ferrol-1-27-v2: accepted \
             (server-side dry run"
        )) && preflight.contains("the release's addon chart is applied when the class changes"),
        "{output}"
    );
    let clusters = Api::<Cluster>::namespaced_with(client.clone(), &ns, &Cluster::v1beta1_resource());
    assert_eq!(
        clusters.get("c1").await.unwrap().class().unwrap().name,
        "docker-ferrol-1-27-v1",
        "the dry run moved nothing"
    );

    // A preview touches nothing.
    let after = deployments.get("metrics-server").await.unwrap();
    assert_eq!(before.metadata.resource_version, after.metadata.resource_version);
    assert!(deployments.get_opt("web").await.unwrap().is_some());

    // A delete stage is checked against the live cluster as the delete would be.
    let staged = scratch
        .path()
        .join("staged")
        .join("docker-ferrol-1-27-v0-sha-hipstsw");
    std::fs::create_dir_all(&staged).unwrap();
    for entry in std::fs::read_dir(fixtures().join("docker-ferrol-1-27-v0-sha-hipstsw")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), staged.join(entry.file_name())).unwrap();
    }
    let config = staged.join("clusteraddon.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text + "  AfterClusterUpgrade:\n    - name: metrics-server\n      action: delete\n",
    )
    .unwrap();
    // One object of the stage is not the operator's any more, one is gone already.
    let workload_client = workload.client().await.unwrap();
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(workload_client.clone(), "kube-system")
        .patch(
            "metrics-server",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"labels": {"clusterstack.x-k8s.io/instance": null}}}),
            ),
        )
        .await
        .unwrap();
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(workload_client, "kube-system")
        .delete("metrics-server", &Default::default())
        .await
        .unwrap();
    let output = diff_for_c1(staged.to_str().unwrap());
    let deleted = section(
        &output,
        &format!("AfterClusterUpgrade: metrics-server (delete) -> workload cluster of {ns}/c1"),
    );
    assert!(
        deleted.contains("   delete     Deployment.apps kube-system/metrics-server\n")
            && deleted.contains(
                "   keep       ServiceAccount kube-system/metrics-server (not labelled by the operator)\n"
            )
            && deleted.contains("   absent     PodDisruptionBudget.policy kube-system/metrics-server\n"),
        "{deleted}"
    );
    assert_eq!(deleted.matches("   delete     ").count(), 8, "{deleted}");
    assert!(
        output.contains(" 8 to delete, ") && output.contains(" 1 left alone, "),
        "{output}"
    );
    assert!(
        deployments.get_opt("metrics-server").await.unwrap().is_some(),
        "a preview deletes nothing"
    );
    // A release whose class is not applied: no dry run, said so; its stages named.
    assert!(
        output.contains(&format!(
            "   dry run not made: ClusterClass {ns}/docker-ferrol-1-27-v0-sha.hipstsw is not in the management \
             cluster"
        )) && output.contains("   hook       AfterClusterUpgrade: stages metrics-server\n"),
        "{output}"
    );
}

/// Values over fields of the Cluster that the operator's typed view does not keep: its labels, networks and
/// topology variables, put into the metrics-server Deployment's annotations.
const WHOLE_CLUSTER_VALUES: &str = r#"values: |
  metrics-server:
    commonLabels:
      clusterAddonVersion: "v1"
    deploymentAnnotations:
      cso.test/name: '{{ .Cluster.metadata.name }}'
      cso.test/team: '{{ .Cluster.metadata.labels.team }}'
      cso.test/first-pod-cidr: '{{ index .Cluster.spec.clusterNetwork.pods.cidrBlocks 0 }}'
      cso.test/pod-cidrs: '{{ join "," .Cluster.spec.clusterNetwork.pods.cidrBlocks }}'
      cso.test/variables: '{{ toJson .Cluster.spec.topology.variables }}'
"#;

/// A copy of ferrol v1 in `dir` (named by its tag, as `cso render` requires) whose cluster-addon values are
/// `values`.
fn ferrol_v1_with_values(dir: &std::path::Path, values: &str) -> String {
    let copy = dir.join("docker-ferrol-1-27-v1");
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(fixtures().join("docker-ferrol-1-27-v1")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    std::fs::write(copy.join("cluster-addon-values.yaml"), values).unwrap();
    copy.display().to_string()
}

/// The annotations of the Deployment `name` among the objects `cso render` printed in `section`.
fn deployment_annotations(section: &str, name: &str) -> serde_json::Map<String, serde_json::Value> {
    section
        .split("\n---\n")
        .skip(1)
        .map(|doc| serde_saphyr::from_str::<serde_json::Value>(doc).unwrap())
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no Deployment {name} in:\n{section}"))["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_else(|| panic!("Deployment {name} has no annotations:\n{section}"))
}

#[test]
fn values_templates_see_the_whole_cluster_from_a_file_or_the_example() {
    let scratch = tempfile::tempdir().unwrap();
    let release = ferrol_v1_with_values(scratch.path(), WHOLE_CLUSTER_VALUES);
    let cluster_file = scratch.path().join("cluster.yaml");
    std::fs::write(
        &cluster_file,
        r#"apiVersion: cluster.x-k8s.io/v1beta1
kind: Cluster
metadata:
  name: c7
  namespace: team-a
  labels: {team: blue}
spec:
  clusterNetwork:
    pods: {cidrBlocks: [10.244.0.0/16, "fd10:244::/104"]}
  topology:
    class: docker-ferrol-1-27-v1
    version: v1.27.3
    variables:
      - {name: region, value: eu-north}
  controlPlaneEndpoint: {host: c7.example.test, port: 6443}
"#,
    )
    .unwrap();
    let output = cso_render(&[&release, "--cluster", cluster_file.to_str().unwrap()]);
    let annotations = deployment_annotations(
        section(&output, "addons -> workload cluster of team-a/c7"),
        "metrics-server",
    );
    let annotation = |key: &str| annotations.get(key).and_then(|v| v.as_str()).unwrap_or_default();
    assert_eq!(annotation("cso.test/name"), "c7", "{annotations:?}");
    assert_eq!(annotation("cso.test/team"), "blue", "{annotations:?}");
    assert_eq!(annotation("cso.test/first-pod-cidr"), "10.244.0.0/16");
    assert_eq!(annotation("cso.test/pod-cidrs"), "10.244.0.0/16,fd10:244::/104");
    assert_eq!(
        annotation("cso.test/variables"),
        r#"[{"name":"region","value":"eu-north"}]"#
    );

    // Without a Cluster, the example stands in with the fields stacks commonly template.
    let output = cso_render(&[&release]);
    let annotations = deployment_annotations(
        section(&output, "addons -> workload cluster of default/example"),
        "metrics-server",
    );
    let annotation = |key: &str| annotations.get(key).and_then(|v| v.as_str()).unwrap_or_default();
    assert_eq!(annotation("cso.test/name"), "example", "{annotations:?}");
    assert_eq!(annotation("cso.test/first-pod-cidr"), "192.168.0.0/16");
    assert_eq!(annotation("cso.test/variables"), "[]");
}

/// A release as the stacks publish it in 2026 (stage charts with `dependencies`, nothing vendored) renders
/// offline from a `--chart-mirror`, as `cso run` caches it; the release directory itself is left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_release_renders_from_a_chart_mirror() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut mirror = cso_testenv::chart_repo::ChartRepo::start(&root.join("tests/fixtures/charts"))
        .await
        .unwrap();
    let dir = root.join("tests/fixtures/releases-2026/docker-scs-1-35-v1");
    let archive = dir.join("docker-scs-1-35-cluster-addon-v1.tgz");
    let before = std::fs::read(&archive).unwrap();
    let args = [
        dir.display().to_string(),
        format!("--chart-mirror={}", mirror.url()),
    ];
    let output =
        tokio::task::spawn_blocking(move || cso_render(&args.iter().map(String::as_str).collect::<Vec<_>>()))
            .await
            .unwrap();
    for object in [
        "kind: DaemonSet",
        "name: cilium-operator",
        "name: metrics-server",
        "kind: APIService",
    ] {
        assert!(output.contains(object), "{object} not rendered:\n{output}");
    }
    let requests = mirror.requests();
    for path in ["/index.yaml", "/cilium-1.19.1.tgz", "/metrics-server-3.13.0.tgz"] {
        assert!(
            requests.iter().any(|r| r == path),
            "{path} not asked: {requests:?}"
        );
    }
    assert_eq!(
        std::fs::read(&archive).unwrap(),
        before,
        "the release directory is not rewritten"
    );
    mirror.stop().await;
}
