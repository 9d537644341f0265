//! The long-lived renderer on Helm's engine (`cso_render::Engine`, hack/renderer) against `helm template`: every
//! chart of every fixture release (tests/fixtures/releases and releases-2026: the cluster-class charts, the
//! addon archives, every stage chart), each stored by the release cache first (dependencies resolved from a
//! loopback chart repository serving tests/fixtures/charts, as `--chart-mirror`), rendered both ways as the
//! controllers render them (templated values, the release's Kubernetes version, CRDs) and with helm's defaults
//! plus extra API versions; the parsed objects must be the same. Every values file is templated both ways over
//! a realistic Cluster, and must give the same text. And `lookup` through the engine sees a Secret in a real
//! kube-apiserver.
//!
//! Helm 3 (`CSO_HELM` as `make tools` writes it): the output is also the same byte for byte. Helm 4 (the
//! Makefile's second pass points `CSO_HELM` at it): the engine stays Helm 3's and the objects are compared.
//! Helm 4 differs in one way on these fixtures, documented in docs/decisions.md: without `--kube-version` its
//! `.Capabilities.KubeVersion` is its own default (v1.37.0 for Helm 4.3) where Helm 3's is v1.20.0, so a chart
//! that picks API versions by Kubernetes version (metrics-server's PodDisruptionBudget: `policy/v1` from 1.21)
//! renders other objects. Such a render must then agree with the engine given Helm 4's default version; the
//! controllers always pass the version for addon charts, and the cluster-class charts do not ask for it.
//! And Helm 4 leaves out map keys whose value is null where Helm 3 prints `key: null` (bitnami nginx's
//! `seLinuxOptions: null` in the ferrol `ngnix` stage): an API server stores neither, so with Helm 4 null-valued
//! keys are left out of both sides. Its values lose such keys too, so a template asking `hasKey` of one answers
//! otherwise: Cilium's `cilium-config` has `debug-verbose: ""` and `nodeport-addresses: ""` under Helm 3 and
//! neither under Helm 4 (Cilium reads an empty value as unset); and a parent chart's null no longer deletes a
//! subchart's default (the OpenStack stack's CCM keeps its control-plane `nodeSelector` under Helm 4): these
//! are named in [`HELM4_DIFFERENCES`] and compared without. (`.Capabilities.HelmVersion` differs too; no
//! fixture reads it.) Charts that mint random data (Cilium's Hubble certificates through `genCA`) differ between
//! two helm runs too: a leaf that differs between two `helm template` runs of the same input is random, and is
//! only required to be there in the engine's output as well.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use cso_api::ReleaseId;
use cso_release::{
    ChartMirrors, DependencyResolver, ReleaseCache,
    archive::UnpackLimits,
    release::Release,
    source::github::{GithubConfig, GithubSource},
};
use cso_render::{ChartRenderer, Engine, Helm, RenderError, RenderRequest, ValuesTemplater, parse_manifests};
use cso_testenv::{chart_repo::ChartRepo, github::FakeGithub};
use serde_json::{Value, json};

/// Where Helm 4 renders other objects than Helm 3 from the same inputs beyond null fields (see the module's
/// doc), compared without: (kind, name, JSON pointer of a map, key in it).
/// - Cilium's `cilium-config`: templates ask `hasKey` of keys whose default is `~` (`debug.verbose`,
///   `nodePort.addresses`): Helm 3 keeps the null key and prints `""`, Helm 4 dropped it and prints nothing;
/// - OpenStack's CCM DaemonSet: the stack's `values.yaml` sets `nodeSelector:` (null) to delete the subchart's
///   default (`node-role.kubernetes.io/control-plane: ""`); Helm 3 deletes it, Helm 4 keeps the default.
const HELM4_DIFFERENCES: &[(&str, &str, &str, &str)] = &[
    ("ConfigMap", "cilium-config", "/data", "debug-verbose"),
    ("ConfigMap", "cilium-config", "/data", "nodeport-addresses"),
    (
        "DaemonSet",
        "openstack-cloud-controller-manager",
        "/spec/template/spec",
        "nodeSelector",
    ),
];

/// `.Capabilities.KubeVersion.Version` of `helm template` without `--kube-version`.
async fn default_kube_version(helm: &Helm) -> String {
    let chart = tempfile::tempdir().unwrap();
    std::fs::create_dir(chart.path().join("templates")).unwrap();
    std::fs::write(
        chart.path().join("Chart.yaml"),
        "apiVersion: v2\nname: caps\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        chart.path().join("templates/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: caps\ndata:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n",
    )
    .unwrap();
    let rendered = helm
        .render(RenderRequest {
            chart: chart.path().to_path_buf(),
            release_name: "caps".into(),
            namespace: "default".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let objects = parse_manifests(&rendered).unwrap();
    objects[0].object["data"]["kube"].as_str().unwrap().to_owned()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tools() -> cso_testenv::Tools {
    cso_testenv::Tools::discover().unwrap()
}

fn helm() -> Helm {
    Helm::new(
        tools().helm.expect("helm: run `make tools`"),
        Duration::from_secs(300),
    )
    .unwrap()
}

fn engine() -> Engine {
    Engine::new(
        tools()
            .renderer
            .expect("cso-renderer: run `make tools` (hack/tools.sh builds hack/renderer)"),
        Duration::from_secs(300),
    )
}

/// The major version of the helm `CSO_HELM` names.
fn helm_major() -> u32 {
    let output = std::process::Command::new(tools().helm.unwrap())
        .args(["version", "--template", "{{.Version}}"])
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&output.stdout).into_owned();
    version
        .trim()
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("helm version {version:?}"))
}

/// Every fixture release, stored by a release cache (the GitHub stand-in as its source, the fixture charts as
/// the mirror of every chart repository).
async fn cached_releases(dir: &Path) -> (Vec<Arc<Release>>, FakeGithub, ChartRepo) {
    let fake = FakeGithub::start(100).await.unwrap();
    let mut tags = Vec::new();
    for set in ["tests/fixtures/releases", "tests/fixtures/releases-2026"] {
        for entry in std::fs::read_dir(repo_root().join(set)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                let tag = path.file_name().unwrap().to_str().unwrap().to_owned();
                fake.publish_dir(&tag, &path).unwrap();
                tags.push(tag);
            }
        }
    }
    tags.sort();
    let repo = ChartRepo::start(&repo_root().join("tests/fixtures/charts"))
        .await
        .unwrap();
    let source = GithubSource::new(GithubConfig {
        api_url: fake.api_url().parse().unwrap(),
        org: "SovereignCloudStack".into(),
        repo: "cluster-stacks".into(),
        token: None,
    })
    .unwrap();
    let cache = ReleaseCache::new(dir, Arc::new(source), UnpackLimits::default())
        .unwrap()
        .with_dependencies(DependencyResolver::new(
            ChartMirrors::parse(&[repo.url()]).unwrap(),
        ));
    let mut releases = Vec::new();
    for tag in &tags {
        let id = ReleaseId::parse_tag(tag).unwrap();
        releases.push(cache.get(&id).await.unwrap());
    }
    (releases, fake, repo)
}

/// The template data of a Cluster built from `release`'s class: `{Cluster, ControlPlane, InfraCluster}`.
fn cluster_data(release: &Release) -> Value {
    let class = release.id.tag().to_owned();
    json!({
        "Cluster": {
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "team-a", "uid": "3f1c0c1e-7d0b-4c43-9a57-2d1b8f0c9e11",
                         "labels": {"env": "prod", "cluster.x-k8s.io/cluster-name": "c1"},
                         "annotations": {"note": "<&> \"quoted\""}},
            "spec": {
                "clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]},
                                   "services": {"cidrBlocks": ["10.128.0.0/12"]},
                                   "serviceDomain": "cluster.local"},
                "controlPlaneEndpoint": {"host": "10.1.2.3", "port": 6443},
                "topology": {"classRef": {"name": class}, "version": format!("v{}.3", release.metadata.kubernetes.trim_start_matches('v')),
                             "controlPlane": {"replicas": 3},
                             "variables": [{"name": "imageRepository", "value": ""},
                                           {"name": "workerCount", "value": 1000000}]}
            },
            "status": {"phase": "Provisioned", "initialization": {"infrastructureProvisioned": true}}
        },
        "ControlPlane": {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
                         "metadata": {"name": "c1-cp", "namespace": "team-a"},
                         "spec": {"replicas": 3, "version": "v1.35.1"}},
        "InfraCluster": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerCluster",
                         "metadata": {"name": "c1-infra", "namespace": "team-a"},
                         "spec": {"controlPlaneEndpoint": {"host": "infra.example", "port": 6443}}}
    })
}

/// What the controllers render for a release: (label, chart, values file).
fn charts_of(release: &Release) -> Vec<(String, PathBuf, Option<PathBuf>)> {
    let tag = release.id.tag();
    let mut charts = vec![(
        format!("{tag} cluster-class"),
        release.cluster_class_chart.clone(),
        None,
    )];
    if release.is_staged() {
        let stages = release.addon_charts(UnpackLimits::default()).unwrap();
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&stages)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("Chart.yaml").is_file())
            .collect();
        dirs.sort();
        for dir in dirs {
            let overwrite = dir.join("overwrite.yaml");
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            charts.push((
                format!("{tag} stage {name}"),
                dir,
                overwrite.is_file().then_some(overwrite),
            ));
        }
    } else {
        let values = release.dir.join("cluster-addon-values.yaml");
        charts.push((
            format!("{tag} addon"),
            release.cluster_addon_archive.clone(),
            values.is_file().then_some(values),
        ));
    }
    charts
}

/// `engine` against `helm`: the same objects (a leaf that differs between two helm runs is random: only its
/// presence counts). With Helm 3, also the same bytes.
async fn same_objects(label: &str, request: RenderRequest, helm: &Helm, engine: &Engine, helm3: bool) {
    let by_helm = helm.render(request.clone()).await;
    match differences(label, request.clone(), by_helm, helm, engine, helm3).await {
        Ok(random) => eprintln!("{label}: the same objects ({random} random leaves)"),
        // Helm 4 without a Kubernetes version: its default version against Helm 3's (see the module's doc).
        Err(first) if !helm3 && request.kube_version.is_none() => {
            let version = default_kube_version(helm).await;
            let pinned = RenderRequest {
                kube_version: Some(version.clone()),
                ..request.clone()
            };
            let by_helm = helm.render(request).await;
            match differences(label, pinned, by_helm, helm, engine, false).await {
                Ok(_) => eprintln!(
                    "{label}: Helm 4 differs by its default Kubernetes version alone: the engine given {version} renders its objects ({first})"
                ),
                Err(again) => panic!("{label}: the engine's objects differ from Helm 4's:\n{again}"),
            }
        }
        Err(differences) => panic!("{label}: the engine's objects differ from helm's:\n{differences}"),
    }
}

/// The engine's objects for `request` against helm's (`by_helm`): `Ok(random leaves)` when they agree, else
/// what differs. Failing renders agree when both fail (with the same message, from Helm 3).
async fn differences(
    label: &str,
    request: RenderRequest,
    by_helm: Result<String, RenderError>,
    helm: &Helm,
    engine: &Engine,
    helm3: bool,
) -> Result<usize, String> {
    let by_engine = engine.render(request.clone()).await;
    let (by_helm, by_engine) = match (by_helm, by_engine) {
        (Ok(h), Ok(e)) => (h, e),
        (Err(RenderError::Failed { stderr: h, .. }), Err(RenderError::Failed { stderr: e, .. })) => {
            // Both refuse: with the same message from the same Helm.
            if helm3 {
                assert_eq!(e, h, "{label}: the errors differ");
            }
            return Ok(0);
        }
        (h, e) => panic!("{label}: helm {:?}\nengine {:?}", h.map(|_| ()), e.map(|_| ())),
    };
    let mut parsed_helm = parse_manifests(&by_helm).unwrap();
    let mut parsed_engine = parse_manifests(&by_engine).unwrap();
    assert!(!parsed_helm.is_empty(), "{label}: no objects");
    if !helm3 {
        // Helm 4 leaves out map keys whose value is null, where Helm 3 prints `key: null` (see the module's doc).
        let nulls: usize = parsed_engine.iter_mut().map(|m| strip_nulls(&mut m.object)).sum();
        parsed_helm.iter_mut().for_each(|m| {
            strip_nulls(&mut m.object);
        });
        if nulls > 0 {
            eprintln!("{label}: {nulls} null-valued keys of Helm 3's left out, as Helm 4 leaves them out");
        }
        for object in parsed_engine.iter_mut().chain(parsed_helm.iter_mut()) {
            for (kind, name, at, key) in HELM4_DIFFERENCES {
                if object.kind() == *kind && object.name() == *name {
                    let removed = object
                        .object
                        .pointer_mut(at)
                        .and_then(Value::as_object_mut)
                        .and_then(|map| map.remove(*key));
                    if let Some(value) = removed {
                        eprintln!(
                            "{label}: {kind}/{name} {at}/{key} left out of both sides (Helm 4 differs here): {value}"
                        );
                    }
                }
            }
        }
    }
    if parsed_helm == parsed_engine {
        if helm3 {
            assert_eq!(by_engine, by_helm, "{label}: same objects, other bytes");
        }
        return Ok(0);
    }
    // Random data? A second helm run tells which leaves are random.
    let mut again = parse_manifests(&helm.render(request).await.unwrap()).unwrap();
    if !helm3 {
        again.iter_mut().for_each(|m| {
            strip_nulls(&mut m.object);
        });
    }
    let mut random = 0;
    let mut differences = Vec::new();
    if parsed_helm.len() != parsed_engine.len() || parsed_helm.len() != again.len() {
        differences.push(format!(
            "{} objects from helm ({} in its second run), {} from the engine",
            parsed_helm.len(),
            again.len(),
            parsed_engine.len()
        ));
    } else {
        for ((h, a), e) in parsed_helm.iter().zip(&again).zip(&parsed_engine) {
            let at = format!("{}/{} ({:?})", h.kind(), h.name(), h.source);
            compare(
                &at,
                &h.object,
                &a.object,
                &e.object,
                &mut random,
                &mut differences,
            );
            if h.source != e.source {
                differences.push(format!("{at}: source {:?} against {:?}", h.source, e.source));
            }
        }
    }
    if differences.is_empty() {
        Ok(random)
    } else {
        Err(differences.join("\n"))
    }
}

/// Removes the map entries whose value is null, everywhere in `value`; how many.
fn strip_nulls(value: &mut Value) -> usize {
    match value {
        Value::Object(map) => {
            let before = map.len();
            map.retain(|_, v| !v.is_null());
            before - map.len() + map.values_mut().map(strip_nulls).sum::<usize>()
        }
        Value::Array(items) => items.iter_mut().map(strip_nulls).sum(),
        _ => 0,
    }
}

/// Walks helm's object `h`, helm's second run `a` and the engine's `e`: where `h` and `a` agree, `e` must agree;
/// where they differ (random data), `e` must have a leaf of the same type there.
fn compare(at: &str, h: &Value, a: &Value, e: &Value, random: &mut usize, out: &mut Vec<String>) {
    if h == e {
        return;
    }
    match (h, a, e) {
        (Value::Object(h), Value::Object(a), Value::Object(e)) => {
            let keys = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<Vec<_>>();
            if keys(h) != keys(e) {
                out.push(format!("{at}: keys {:?} against {:?}", keys(h), keys(e)));
                return;
            }
            for (key, hv) in h {
                let av = a.get(key).unwrap_or(&Value::Null);
                compare(&format!("{at}.{key}"), hv, av, &e[key], random, out);
            }
        }
        (Value::Array(h), Value::Array(a), Value::Array(e)) if h.len() == e.len() => {
            for (i, hv) in h.iter().enumerate() {
                let av = a.get(i).unwrap_or(&Value::Null);
                compare(&format!("{at}[{i}]"), hv, av, &e[i], random, out);
            }
        }
        (Value::String(_), Value::String(_), Value::String(_)) if h != a => *random += 1,
        _ => out.push(format!("{at}: {h} against {e}")),
    }
}

#[tokio::test]
async fn every_fixture_chart_and_values_file_renders_the_same_on_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let (releases, _fake, _repo) = cached_releases(dir.path()).await;
    let helm3 = helm_major() == 3;
    let helm = helm();
    let engine = engine();
    let by_helm = ValuesTemplater::new(self::helm()).unwrap();
    let by_engine = ValuesTemplater::with_engine(engine.clone());
    let mut charts = 0;
    let mut values_files = 0;
    for release in &releases {
        let data = cluster_data(release);
        for (label, chart, values_file) in charts_of(release) {
            let values = match &values_file {
                Some(file) => {
                    let template = std::fs::read_to_string(file).unwrap();
                    let from_helm = by_helm.render(file, &template, &data).await.unwrap();
                    let from_engine = by_engine.render(file, &template, &data).await.unwrap();
                    assert_eq!(from_engine, from_helm, "{label}: values of {}", file.display());
                    values_files += 1;
                    Some(from_helm)
                }
                None => None,
            };
            let cluster_class = label.ends_with("cluster-class");
            // As the controllers render it.
            let as_controllers = RenderRequest {
                chart: chart.clone(),
                release_name: if cluster_class {
                    release.id.stack_prefix()
                } else {
                    "cluster-addon".into()
                },
                namespace: if cluster_class { "team-a" } else { "kube-system" }.into(),
                values,
                kube_version: (!cluster_class).then(|| release.metadata.kubernetes.clone()),
                include_crds: !cluster_class,
                ..Default::default()
            };
            same_objects(&label, as_controllers, &helm, &engine, helm3).await;
            // Helm's defaults, with API versions a chart may ask `.Capabilities` for.
            let defaults = RenderRequest {
                chart,
                release_name: "parity".into(),
                namespace: "default".into(),
                api_versions: vec![
                    "monitoring.coreos.com/v1".into(),
                    "monitoring.coreos.com/v1/ServiceMonitor".into(),
                    "cilium.io/v2".into(),
                ],
                ..Default::default()
            };
            same_objects(&format!("{label} (defaults)"), defaults, &helm, &engine, helm3).await;
            charts += 1;
        }
    }
    eprintln!(
        "{} releases, {charts} charts, {values_files} values files: the engine renders as helm {}",
        releases.len(),
        helm_major()
    );
    assert!(
        releases.len() >= 8 && charts >= 20,
        "{} releases, {charts} charts",
        releases.len()
    );
    assert!(values_files >= 3, "{values_files} values files");
}

#[tokio::test]
async fn values_templating_agrees_on_edge_cases_and_errors() {
    let helm = ValuesTemplater::new(helm()).unwrap();
    let engine = ValuesTemplater::with_engine(engine());
    let data = json!({"Cluster": {"metadata": {"name": "c1", "labels": {"a": "b"}},
                                  "spec": {"n": 1000000, "f": 1.5, "t": true, "list": [1, "x"]}}});
    let file = Path::new("cluster-addon-values.yaml");
    let cases = [
        "a: {{ .Cluster.metadata.name }}",
        "a: '{{ .Cluster.missing }}'",
        "a: {{ .Cluster.spec.n }} b: {{ .Cluster.spec.f }} c: {{ .Cluster.spec.t }}",
        "a: {{ .Cluster.spec.list | toJson }}",
        "a: {{ .Cluster.metadata.labels | toYaml | nindent 2 }}",
        "values: |\n  x: {{ .Cluster.metadata.name | upper }}\n",
        "- a\n- b\n",
        "",
        "a: {{ required \"need x\" .Cluster.x }}",
        "a: {{ .Cluster.metadata.name",
        "a: {{ env \"HOME\" }}",
        "a: {{ fail \"stop\" }}",
        "a: <no value> {{ index .Cluster.spec.list 5 }}",
    ];
    for template in cases {
        let from_helm = helm
            .render(file, template, &data)
            .await
            .map_err(|e| e.to_string());
        let from_engine = engine
            .render(file, template, &data)
            .await
            .map_err(|e| e.to_string());
        assert_eq!(from_engine, from_helm, "{template:?}");
    }
}

#[tokio::test]
async fn lookup_sees_an_existing_secret_in_the_target_cluster() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, PostParams};

    let plane = cso_testenv::shared_workload();
    let client = plane.client().await.unwrap();
    let name = format!("parity-{}", std::process::id());
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "stringData": {"token": "from-the-cluster"}
            }))
            .unwrap(),
        )
        .await
        .unwrap();

    let chart = tempfile::tempdir().unwrap();
    std::fs::create_dir(chart.path().join("templates")).unwrap();
    std::fs::write(
        chart.path().join("Chart.yaml"),
        "apiVersion: v2\nname: looks-up\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        chart.path().join("templates/cm.yaml"),
        "{{- $s := lookup \"v1\" \"Secret\" .Release.Namespace .Values.secret }}\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: seen\ndata:\n  \
         token: {{ if $s }}{{ index $s.data \"token\" | b64dec | quote }}{{ else }}\"none\"{{ end }}\n",
    )
    .unwrap();
    let request = |kubeconfig: Option<PathBuf>| RenderRequest {
        chart: chart.path().to_path_buf(),
        release_name: "r".into(),
        namespace: "default".into(),
        values: Some(format!("secret: {name}\n")),
        target_kubeconfig: kubeconfig,
        ..Default::default()
    };
    let engine = engine();
    let live = engine
        .render(request(Some(plane.kubeconfig_path().to_path_buf())))
        .await
        .unwrap();
    assert!(live.contains("token: \"from-the-cluster\""), "{live}");
    let offline = engine.render(request(None)).await.unwrap();
    assert!(offline.contains("token: \"none\""), "{offline}");
    // And as helm sees it.
    let by_helm = helm()
        .render(request(Some(plane.kubeconfig_path().to_path_buf())))
        .await
        .unwrap();
    assert_eq!(
        parse_manifests(&live).unwrap(),
        parse_manifests(&by_helm).unwrap()
    );
}

#[tokio::test]
async fn a_killed_renderer_fails_its_requests_and_the_next_request_restarts_it() {
    // A chart whose render takes long enough to be killed in the middle.
    let chart = tempfile::tempdir().unwrap();
    std::fs::create_dir(chart.path().join("templates")).unwrap();
    std::fs::write(
        chart.path().join("Chart.yaml"),
        "apiVersion: v2\nname: slow\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        chart.path().join("templates/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: slow\ndata:\n  \
         n: \"{{ range until 20000 }}{{ range until 20000 }}{{ end }}{{ end }}done\"\n",
    )
    .unwrap();
    let request = RenderRequest {
        chart: chart.path().to_path_buf(),
        release_name: "r".into(),
        namespace: "default".into(),
        ..Default::default()
    };
    let engine = engine();
    let pending = {
        let engine = engine.clone();
        let request = request.clone();
        tokio::spawn(async move { engine.render(request).await })
    };
    let pid = loop {
        if let Some(pid) = engine.process_id().await {
            break pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pending.is_finished(), "the render should still run");
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    let err = pending.await.unwrap().unwrap_err();
    let RenderError::Engine { message, .. } = &err else {
        panic!("{err}")
    };
    assert!(message.contains("stopped"), "{message}");

    // The next request starts a new process.
    let quick = tempfile::tempdir().unwrap();
    std::fs::create_dir(quick.path().join("templates")).unwrap();
    std::fs::write(
        quick.path().join("Chart.yaml"),
        "apiVersion: v2\nname: quick\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        quick.path().join("templates/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: quick\n",
    )
    .unwrap();
    let rendered = engine
        .render(RenderRequest {
            chart: quick.path().to_path_buf(),
            ..request
        })
        .await
        .unwrap();
    assert!(rendered.contains("name: quick"), "{rendered}");
    assert_ne!(engine.process_id().await, Some(pid), "a new process");
}

#[tokio::test]
async fn a_render_over_the_timeout_is_cut_off_and_others_go_to_a_new_process() {
    let chart = tempfile::tempdir().unwrap();
    std::fs::create_dir(chart.path().join("templates")).unwrap();
    std::fs::write(
        chart.path().join("Chart.yaml"),
        "apiVersion: v2\nname: endless\nversion: 0.1.0\n",
    )
    .unwrap();
    // Runs for minutes: Helm's engine cannot stop it, only the process's end can.
    std::fs::write(
        chart.path().join("templates/cm.yaml"),
        "{{ range until 100000 }}{{ range until 100000 }}{{ range until 100000 }}{{ end }}{{ end }}{{ end }}\n",
    )
    .unwrap();
    let engine = Engine::new(tools().renderer.unwrap(), Duration::from_secs(2));
    let request = RenderRequest {
        chart: chart.path().to_path_buf(),
        release_name: "r".into(),
        namespace: "default".into(),
        ..Default::default()
    };
    let pending = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.render(request).await })
    };
    let pid = loop {
        if let Some(pid) = engine.process_id().await {
            break pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let err = pending.await.unwrap().unwrap_err();
    assert!(matches!(err, RenderError::Timeout { .. }), "{err}");
    // The wedged process was retired and, holding no other request, killed.
    let proc = PathBuf::from(format!("/proc/{pid}/stat"));
    for _ in 0..500 {
        let zombie_or_gone = std::fs::read_to_string(&proc).map_or(true, |s| s.contains(") Z "));
        if zombie_or_gone {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let state = std::fs::read_to_string(&proc).unwrap_or_default();
    assert!(
        state.is_empty() || state.contains(") Z "),
        "still running: {state}"
    );
    // The next render runs on a new process.
    let values = ValuesTemplater::with_engine(engine.clone());
    let rendered = values
        .render(Path::new("v.yaml"), "a: {{ .x }}", &json!({"x": 1}))
        .await
        .unwrap();
    assert_eq!(rendered, "a: 1");
}
