//! Values templating and chart rendering with the real `helm` binary.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{path::Path, time::Duration};

use cso_render::{ChartRenderer, Helm, RenderError, RenderRequest, ValuesError, ValuesTemplater};
use serde_json::json;

fn helm() -> Helm {
    let binary = cso_testenv::Tools::discover()
        .unwrap()
        .helm
        .expect("helm: run `make tools`");
    Helm::new(binary, Duration::from_secs(60)).unwrap()
}

fn fixture(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/releases")
        .join(path)
}

fn cluster() -> serde_json::Value {
    json!({
        "Cluster": {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
                    "metadata": {"name": "c1", "namespace": "team", "labels": {"env": "prod"}},
                    "spec": {"controlPlaneEndpoint": {"host": "10.1.2.3", "port": 6443}}},
        "InfraCluster": {"spec": {"controlPlaneEndpoint": {"host": "infra.example"}}}
    })
}

async fn render(template: &str) -> Result<String, ValuesError> {
    ValuesTemplater::new(helm())
        .unwrap()
        .render(Path::new("cluster-addon-values.yaml"), template, &cluster())
        .await
}

#[tokio::test]
async fn the_fixture_values_take_the_domain_from_the_cluster() {
    let template =
        std::fs::read_to_string(fixture("docker-ferrol-1-27-v1/cluster-addon-values.yaml")).unwrap();
    let values = render(&template).await.unwrap();
    assert_eq!(
        values,
        "metrics-server:\n  commonLabels:\n    domain: \"10.1.2.3\"\n    clusterAddonVersion: \"v1\"\n"
    );
}

#[tokio::test]
async fn edge_cases_behave_as_go_templates_with_sprig() {
    let cases = [
        ("a: {{ .Cluster.metadata.name }}", "a: c1"),
        (
            "a: {{ .InfraCluster.spec.controlPlaneEndpoint.host }}",
            "a: infra.example",
        ),
        ("a: '{{ .Cluster.missing }}'", "a: ''"),
        (
            "a: {{ .Cluster.metadata.labels | toYaml | nindent 2 }}",
            "a: \n  env: prod",
        ),
        (
            "a: {{ .Cluster.nope | default \"fallback\" | quote }}",
            "a: \"fallback\"",
        ),
        (
            "a: {{ .Cluster.spec.controlPlaneEndpoint.port | add 1 }}",
            "a: 6444",
        ),
        ("a: {{ .Cluster.metadata.name | upper | trunc 1 }}", "a: C"),
        ("values: |\n  x: {{ .Cluster.metadata.namespace }}\n", "x: team\n"),
    ];
    for (template, expected) in cases {
        assert_eq!(render(template).await.unwrap(), expected, "{template}");
    }
}

#[tokio::test]
async fn template_errors_are_clear_and_credentials_stay_out_of_reach() {
    for (template, expected) in [
        (
            "a: {{ .Cluster.missing.deeper }}",
            "nil pointer evaluating interface {}.deeper",
        ),
        (
            "a: {{ required \"the stack needs a region\" .Cluster.region }}",
            "the stack needs a region",
        ),
        ("a: {{ env \"HOME\" }}", "function \"env\" not defined"),
        (
            "a: {{ expandenv \"$HOME\" }}",
            "function \"expandenv\" not defined",
        ),
        ("a: {{ .Cluster.metadata.name", "unclosed action"),
    ] {
        let err = render(template).await.unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(err, ValuesError::Template { .. }),
            "{template}: {message}"
        );
        assert!(
            message.starts_with("cluster-addon-values.yaml: ") && message.contains(expected),
            "{template}: {message}"
        );
    }
    assert_eq!(
        render("a: '{{ getHostByName \"localhost\" }}'").await.unwrap(),
        "a: ''",
        "no DNS from a stack"
    );
}

#[tokio::test]
async fn values_that_are_not_a_map_are_refused() {
    for (template, expected) in [
        ("", "empty"),
        ("{{/* nothing */}}", "empty"),
        ("- a\n- b\n", "not a map"),
        ("just text", "not a map"),
    ] {
        let err = render(template).await.unwrap_err();
        assert!(matches!(err, ValuesError::NotAMap { .. }), "{template:?}: {err}");
        assert!(err.to_string().contains(expected), "{template:?}: {err}");
    }
}

#[tokio::test]
async fn charts_render_offline_and_helm_errors_are_reported() {
    let helm = helm();
    let addons = tempfile::tempdir().unwrap();
    cso_release_unpack(
        &fixture("docker-scs-1-30-v1/docker-scs-1-30-cluster-addon-v1.tgz"),
        addons.path(),
    );
    let rendered = helm
        .render(RenderRequest {
            chart: addons.path().join("cni"),
            release_name: "cluster-addon".into(),
            namespace: "kube-system".into(),
            kube_version: Some("v1.30.10".into()),
            include_crds: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        rendered.contains("kind: DaemonSet") && rendered.contains("name: cilium"),
        "Cilium renders from its vendored chart"
    );

    // A dependency that is not vendored is an error, not a download.
    let chart = tempfile::tempdir().unwrap();
    std::fs::write(
        chart.path().join("Chart.yaml"),
        "apiVersion: v2\nname: needs-dep\nversion: 0.1.0\ndependencies:\n- name: nginx\n  version: 15.10.1\n  repository: https://charts.bitnami.com/bitnami\n",
    )
    .unwrap();
    let err = helm
        .render(RenderRequest {
            chart: chart.path().to_path_buf(),
            release_name: "x".into(),
            namespace: "default".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, RenderError::Failed { .. }), "{err}");
    assert!(
        err.to_string().contains("missing in charts/ directory"),
        "helm's stderr is in the error: {err}"
    );

    let slow = Helm::new(
        cso_testenv::Tools::discover().unwrap().helm.unwrap(),
        Duration::from_millis(1),
    )
    .unwrap();
    let err = slow
        .render(RenderRequest {
            chart: addons.path().join("cni"),
            release_name: "x".into(),
            namespace: "default".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, RenderError::Timeout { .. }), "{err}");
}

/// Unpacks with tar (the release crate's safe unpacker is tested on its own).
fn cso_release_unpack(archive: &Path, into: &Path) {
    let status = std::process::Command::new("tar")
        .arg("xzf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .status()
        .unwrap();
    assert!(status.success());
}
