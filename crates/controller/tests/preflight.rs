//! The preflight of a class move (issue 30) against the real Cluster API v1.14 of the test environment.
//!
//! `docker-scs-1-35-v1` (a `v1beta2` ClusterClass with variables) and a copy of it released as
//! `docker-scs-1-35-v2` whose `oidcConfig` schema no longer has the property `groupsPrefix` (as
//! openstack-scs-1-34 dropped `identityRef.type`) are applied to a management cluster with Cluster API. A
//! Cluster of v1 that sets `oidcConfig` reaches `TopologyReconciled=True`; the preflight of its move to v2 is
//! refused by Cluster API's webhook in a dry run, explained as the variable `oidcConfig` and its field
//! `groupsPrefix`, and the Cluster stays on v1. A Cluster without `oidcConfig` may move. With the API server
//! unreachable the preflight says the dry run could not be made, and the classes decide.
//!
//! A ClusterStackRollout to v2 (the operator running in this process, the releases local) skips the Cluster
//! the preflight refuses, reports it with the variable named and never retries it while it is unchanged,
//! and moves the other. Turned to `spec.variables.followClassDefaults`, it moves the Cluster whose refused
//! value is the old class's default and never rewrites one its owner chose; with declared `set` and `remove`
//! it moves the rest, a MachineDeployment's override included, each in one patch (no stored version of the
//! Cluster has the new class with the old values or the reverse).
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use cso_api::{
    ReleaseId,
    capi::Cluster,
    rules::{
        class_move::{DryRun, Reason, Verdict},
        move_variables::VariableRules,
    },
};
use cso_controller::preflight;
use cso_release::Release;
use cso_testenv::capi::{TopologyCluster, shared_management_with_cluster_api};
use kube::{
    Api,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};
use serde_json::{Value, json};

mod support;

const TIMEOUT: Duration = Duration::from_secs(90);
const V1: &str = "docker-scs-1-35-v1";
const V2: &str = "docker-scs-1-35-v2";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases-2026/docker-scs-1-35-v1")
}

/// `docker-scs-1-35-v2` in `dir`: the v1 release with its class chart at version v2 and `groupsPrefix` gone
/// from the `oidcConfig` variable's schema.
fn narrowed_release(dir: &Path) -> PathBuf {
    let release = dir.join(V2);
    std::fs::create_dir_all(&release).unwrap();
    for file in [
        "clusteraddon.yaml",
        "docker-scs-1-35-cluster-addon-v1.tgz",
        "csctl.yaml",
    ] {
        std::fs::copy(fixture().join(file), release.join(file)).unwrap();
    }
    let metadata = std::fs::read_to_string(fixture().join("metadata.yaml")).unwrap();
    assert!(metadata.contains("clusterStack: v1"));
    std::fs::write(
        release.join("metadata.yaml"),
        metadata.replace("clusterStack: v1", "clusterStack: v2"),
    )
    .unwrap();

    let unpacked = dir.join("chart");
    let archive = std::fs::File::open(fixture().join("docker-scs-1-35-cluster-class-v1.tgz")).unwrap();
    tar::Archive::new(flate2::read::GzDecoder::new(archive))
        .unpack(&unpacked)
        .unwrap();
    let chart = unpacked.join("docker-scs-1-35-cluster-class");
    let chart_yaml = std::fs::read_to_string(chart.join("Chart.yaml")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        chart_yaml.replace("version: v1", "version: v2"),
    )
    .unwrap();
    let class_file = chart.join("templates/cluster-class.yaml");
    let class = std::fs::read_to_string(&class_file).unwrap();
    // The property `groupsPrefix` of oidcConfig: its name line and the lines indented under it.
    let mut narrowed = Vec::new();
    let mut skipping = false;
    for line in class.lines() {
        if line == "          groupsPrefix:" {
            skipping = true;
            continue;
        }
        if skipping && line.starts_with("            ") {
            continue;
        }
        skipping = false;
        narrowed.push(line);
    }
    assert_eq!(
        narrowed.len() + 5,
        class.lines().count(),
        "groupsPrefix and its 4 lines are gone"
    );
    // imageRepository: only the default ("", kubeadm's) or one registry.
    let narrowed = narrowed.join("\n") + "\n";
    let image_example = "        example: \"registry.k8s.io\"\n";
    assert_eq!(narrowed.matches(image_example).count(), 1);
    let narrowed = narrowed.replace(
        image_example,
        "        example: \"registry.scs.community\"\n        enum: [\"\", \"registry.scs.community\"]\n",
    );
    // certSANs: no wildcards, by a CEL rule on the items (which the preflight does not evaluate itself).
    let sans_items = "        items:\n          type: string\n";
    assert_eq!(narrowed.matches(sans_items).count(), 1);
    let narrowed = narrowed.replace(
        sans_items,
        &format!(
            "{sans_items}          x-kubernetes-validations:\n          - rule: \"!self.startsWith('*')\"\n          \
             \x20 message: \"no wildcard SANs\"\n"
        ),
    );
    std::fs::write(&class_file, narrowed).unwrap();

    let tgz = std::fs::File::create(release.join("docker-scs-1-35-cluster-class-v2.tgz")).unwrap();
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(tgz, flate2::Compression::default()));
    builder
        .append_dir_all("docker-scs-1-35-cluster-class", &chart)
        .unwrap();
    builder.into_inner().unwrap().finish().unwrap();
    release
}

/// `helm template RELEASE CHART --namespace NS`, as the operator renders a cluster-class chart.
fn render(chart: &Path, namespace: &str) -> Vec<Value> {
    let tools = cso_testenv::Tools::discover().unwrap();
    let helm = tools.helm.expect("helm: run `make tools`");
    let output = std::process::Command::new(helm)
        .args(["template", "docker-scs-1-35"])
        .arg(chart)
        .args(["--namespace", namespace])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let docs: Vec<Option<Value>> =
        serde_saphyr::from_multiple(&String::from_utf8(output.stdout).unwrap()).unwrap();
    docs.into_iter().flatten().collect()
}

async fn api_for(client: &kube::Client, api_version: &str, kind: &str, ns: &str) -> Api<DynamicObject> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let (resource, _) = kube::discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, kind))
        .await
        .unwrap();
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// Applies the class chart's objects into `ns` and waits until Cluster API has reconciled the class.
async fn install_class(client: &kube::Client, ns: &str, chart: &Path, class: &str) -> Value {
    let params = PatchParams::apply("cso-test").force();
    for mut doc in render(chart, ns) {
        doc["metadata"]["namespace"] = json!(ns);
        let api = api_for(
            client,
            doc["apiVersion"].as_str().unwrap(),
            doc["kind"].as_str().unwrap(),
            ns,
        )
        .await;
        let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
        api.patch(&name, &params, &Patch::Apply(&doc))
            .await
            .unwrap_or_else(|e| panic!("Cluster API refused {name}: {e}"));
    }
    let classes = api_for(client, "cluster.x-k8s.io/v1beta2", "ClusterClass", ns).await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let object = serde_json::to_value(classes.get(class).await.unwrap()).unwrap();
        if class_reconciled(&object) {
            return object;
        }
        assert!(
            Instant::now() < deadline,
            "ClusterClass {class} not reconciled: {object}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether Cluster API has reconciled the ClusterClass `object` (its variables are what its webhook checks a
/// Cluster against).
fn class_reconciled(object: &Value) -> bool {
    object.pointer("/status/observedGeneration") == object.pointer("/metadata/generation")
        && condition_true(object, "VariablesReady")
}

fn condition_true(object: &Value, type_: &str) -> bool {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == type_ && c["status"] == "True")
}

/// Creates the Cluster `name` of class v1 with `variables` and, if `reconciled`, waits for
/// `TopologyReconciled=True`; returns it as the operator reads it.
async fn cluster_of_v1(
    client: &kube::Client,
    ns: &str,
    name: &str,
    variables: Value,
    reconciled: bool,
) -> Cluster {
    cluster_of_v1_with_overrides(client, ns, name, variables, None, reconciled).await
}

/// [`cluster_of_v1`] with `overrides` as the variable overrides of its MachineDeployment md-0.
async fn cluster_of_v1_with_overrides(
    client: &kube::Client,
    ns: &str,
    name: &str,
    variables: Value,
    overrides: Option<Value>,
    reconciled: bool,
) -> Cluster {
    let mut object = TopologyCluster {
        namespace: ns,
        name,
        api_version: "cluster.x-k8s.io/v1beta2",
        class: V1,
        class_namespace: None,
        version: "v1.35.1",
        worker_class: "default-worker",
        worker_replicas: 0,
        image_repository: None,
    }
    .to_json();
    object["spec"]["topology"]["variables"] = variables;
    if let Some(overrides) = overrides {
        object["spec"]["topology"]["workers"]["machineDeployments"][0]["variables"] =
            json!({ "overrides": overrides });
    }
    let dynamic = api_for(client, "cluster.x-k8s.io/v1beta2", "Cluster", ns).await;
    dynamic
        .create(&PostParams::default(), &serde_json::from_value(object).unwrap())
        .await
        .unwrap();
    let clusters: Api<Cluster> = Api::namespaced_with(client.clone(), ns, &Cluster::resource("v1beta2"));
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let cluster = clusters.get(name).await.unwrap();
        if !reconciled || condition_true(&cluster.object.as_ref().unwrap().value(), "TopologyReconciled") {
            return cluster;
        }
        assert!(
            Instant::now() < deadline,
            "Cluster {ns}/{name}: no TopologyReconciled=True: {:?}",
            cluster.object
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The Cluster `c1` of v1 with an `imageRepository` the narrowed v2's enum refuses, reconciled.
async fn refused_by_v2(client: &kube::Client, ns: &str) -> Cluster {
    let refused = json!([{"name": "imageRepository", "value": "registry.k8s.io"}]);
    cluster_of_v1(client, ns, "c1", refused, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_that_refuses_a_variable_is_reported_before_the_move_with_the_variable_named() {
    let env = shared_management_with_cluster_api();
    let client = env.control_plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "preflight").await.unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let v2_dir = narrowed_release(scratch.path());
    let v2 = Release::load(&v2_dir, &ReleaseId::parse_tag(V2).unwrap()).unwrap();
    let v1_chart = scratch.path().join("v1-chart");
    let v2_chart = scratch.path().join("chart/docker-scs-1-35-cluster-class");
    std::fs::copy(fixture().join("docker-scs-1-35-cluster-class-v1.tgz"), &v1_chart).unwrap();

    install_class(&client, &ns, &v1_chart, V1).await;
    let v2_class = install_class(&client, &ns, &v2_chart, V2).await;
    let oidc = v2_class
        .pointer("/spec/variables")
        .and_then(Value::as_array)
        .unwrap()
        .iter()
        .find(|v| v["name"] == "oidcConfig")
        .unwrap();
    assert!(
        oidc.pointer("/schema/openAPIV3Schema/properties/groupsPrefix")
            .is_none()
            && oidc
                .pointer("/schema/openAPIV3Schema/properties/usernamePrefix")
                .is_some(),
        "the v2 class is the narrowed one: {oidc}"
    );

    // A Cluster of v1 with a value v2's narrowed enum refuses, built and reconciled by Cluster API.
    let resource = Cluster::resource("v1beta2");
    let clusters: Api<Cluster> = Api::namespaced_with(client.clone(), &ns, &resource);
    let c1 = refused_by_v2(&client, &ns).await;
    let answer = preflight::preflight(&client, &resource, &c1, &v2, None).await;
    let report = preflight::describe(&answer, &format!("{ns}/c1"));
    eprintln!("{report}");
    assert_eq!(answer.verdict, Verdict::Refused, "{report}");
    assert_eq!(answer.dry_run_failed, None, "the dry run was made: {report}");
    assert_eq!((answer.from_class.as_str(), answer.to_class.as_str()), (V1, V2));
    assert_eq!(
        answer.reasons,
        [Reason::VariableRefused {
            variable: "imageRepository".into(),
            path: String::new(),
            why: "\"registry.k8s.io\" is not one of [\"\", \"registry.scs.community\"]".into(),
        }],
        "the variable is named, and the classes explain all Cluster API said: {report}"
    );
    let dry_run = preflight::dry_run(&client, &resource, &c1, V2, None, None).await;
    eprintln!("Cluster API's answer: {dry_run:?}");
    let DryRun::Refused { causes, .. } = &dry_run else {
        panic!("Cluster API did not refuse the move: {dry_run:?}");
    };
    assert!(
        causes
            .iter()
            .any(|c| c.field.contains("variables[imageRepository]")),
        "{causes:?}"
    );
    // The stages the move runs (same Kubernetes version: no upgrade hooks from Cluster API).
    assert_eq!(answer.version_change, None);
    assert_eq!(answer.hooks.len(), 1);
    assert_eq!(answer.hooks[0].stages, ["cni", "metrics-server"]);
    // Nothing moved.
    let after = clusters.get("c1").await.unwrap();
    assert_eq!(after.class().unwrap().name, V1);
    assert_eq!(after.metadata.generation, c1.metadata.generation);

    // Refused by v2's CEL rule on certSANs: said as refused by that rule, with Cluster API's words.
    let sans = json!([{"name": "certSANs", "value": ["api.example", "*.example"]}]);
    let c6 = cluster_of_v1(&client, &ns, "c6", sans, false).await;
    let answer = preflight::preflight(&client, &resource, &c6, &v2, None).await;
    let report = preflight::describe(&answer, &format!("{ns}/c6"));
    eprintln!("{report}");
    assert_eq!(answer.verdict, Verdict::Refused, "{report}");
    assert!(
        answer.reasons.iter().any(
            |r| matches!(r, Reason::VariableRule { variable, rules, message, .. }
            if variable == "certSANs"
                && rules == &["CEL \"!self.startsWith('*')\" (\"no wildcard SANs\") at []"]
                && message.contains("no wildcard SANs"))
        ),
        "the rule is named with Cluster API's words: {report}"
    );

    // The case: a field the old class defaulted (oidcConfig.groupsPrefix), unknown to the new schema.
    // (This Cluster's topology does not reconcile: the fixture's oidcConfig patch adds to an extraArgs list
    // its v1beta2 template does not have; the move is checked all the same.)
    let c3 = cluster_of_v1(
        &client,
        &ns,
        "c3",
        json!([{"name": "oidcConfig", "value": {"clientID": "kubectl", "issuerURL": "https://dex.example"}}]),
        false,
    )
    .await;
    let stored = c3
        .object
        .as_ref()
        .unwrap()
        .value()
        .pointer("/spec/topology/variables")
        .cloned();
    assert!(
        stored
            .as_ref()
            .is_some_and(|v| v.to_string().contains("\"groupsPrefix\":\"oidc:\"")),
        "Cluster API defaulted groupsPrefix: {stored:?}"
    );
    let answer = preflight::preflight(&client, &resource, &c3, &v2, None).await;
    let report = preflight::describe(&answer, &format!("{ns}/c3"));
    eprintln!("{report}");
    assert_eq!(answer.verdict, Verdict::Refused, "{report}");
    assert_eq!(answer.dry_run_failed, None, "{report}");
    assert!(
        answer
            .reasons
            .iter()
            .any(|r| matches!(r, Reason::VariableRefused { variable, why, .. }
            if variable == "oidcConfig" && why.contains("\"groupsPrefix\" field(s) are not specified")
                && why.contains("defaulted by the old class docker-scs-1-35-v1"))),
        "the variable and its field are named, and that the old class defaulted it: {report}"
    );
    assert!(
        !answer
            .reasons
            .iter()
            .any(|r| matches!(r, Reason::ClusterApi { .. })),
        "the classes explain everything Cluster API said: {report}"
    );
    // As `cso render --diff` asks it: the move with the old class's defaults followed is proposed, with the
    // dry run that passes with it.
    let follow = VariableRules {
        follow_class_defaults: true,
        declared: Vec::new(),
    };
    let proposal = preflight::preflight_with(&client, &resource, &c3, &v2, None, None, &follow).await;
    let report = preflight::describe(&proposal, &format!("{ns}/c3"));
    eprintln!("{report}");
    assert_eq!(proposal.verdict, Verdict::Accepted, "{report}");
    assert!(
        report.contains(
            "REFUSED as it is; accepted with the old class's defaults followed (server-side dry run)"
        ) && report.contains("follows    oidcConfig.groupsPrefix: the old class's default")
            && report.contains("refused    variable oidcConfig"),
        "{report}"
    );
    let followed = proposal.variables.unwrap();
    assert!(followed.dropped.contains(&"oidcConfig.groupsPrefix".to_owned()));

    // A Cluster without those values may move.
    let c2 = cluster_of_v1(&client, &ns, "c2", json!([]), true).await;
    let answer = preflight::preflight(&client, &resource, &c2, &v2, None).await;
    let report = preflight::describe(&answer, &format!("{ns}/c2"));
    eprintln!("{report}");
    assert_eq!(answer.verdict, Verdict::Accepted, "{report}");
    assert!(answer.reasons.is_empty(), "{report}");

    // A class that is not in the management cluster: no dry run, said so, explained from what was rendered.
    let elsewhere = cso_testenv::namespace(&client, "preflight-no-class")
        .await
        .unwrap();
    let mut moved = c3.clone();
    moved.metadata.namespace = Some(elsewhere.clone());
    let answer = preflight::preflight(&client, &resource, &moved, &v2, Some(&v2_class)).await;
    let report = preflight::describe(&answer, &format!("{elsewhere}/c3"));
    eprintln!("{report}");
    assert!(
        answer
            .dry_run_failed
            .as_deref()
            .is_some_and(|why| why.contains("is not in the management cluster")),
        "{report}"
    );
    assert_eq!(
        answer.verdict,
        Verdict::Refused,
        "the rendered class refuses groupsPrefix: {report}"
    );

    // The API server unreachable: a clear message, never a panic.
    let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
    let unreachable = kube::Client::try_from(config).unwrap();
    let answer = preflight::preflight(&unreachable, &resource, &c3, &v2, Some(&v2_class)).await;
    let report = preflight::describe(&answer, &format!("{ns}/c3"));
    eprintln!("{report}");
    assert!(
        answer
            .dry_run_failed
            .as_deref()
            .is_some_and(|why| why.contains("cannot reach the API server")),
        "{report}"
    );
}

/// `<release_dir>/cluster-stacks/` with `docker-scs-1-35-v1` (the fixture) and the narrowed `-v2`, as
/// `--local` reads them.
fn local_scs_releases(release_dir: &Path, scratch: &Path) {
    let stacks = release_dir.join("cluster-stacks");
    let v1 = stacks.join(V1);
    std::fs::create_dir_all(&v1).unwrap();
    for entry in std::fs::read_dir(fixture()).unwrap().flatten() {
        std::fs::copy(entry.path(), v1.join(entry.file_name())).unwrap();
    }
    let narrowed = narrowed_release(scratch);
    let v2 = stacks.join(V2);
    std::fs::create_dir_all(&v2).unwrap();
    for entry in std::fs::read_dir(narrowed).unwrap().flatten() {
        if entry.path().is_file() {
            std::fs::copy(entry.path(), v2.join(entry.file_name())).unwrap();
        }
    }
}

/// Creates the rollout `name` of ClusterStack scs to v2, `spec` adding to that.
async fn create_rollout(rollouts: &Api<cso_api::ClusterStackRollout>, ns: &str, name: &str, spec: Value) {
    let mut object = json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStackRollout",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterStack": "scs", "version": "v2"}
    });
    for (key, value) in spec.as_object().unwrap() {
        object["spec"][key] = value.clone();
    }
    rollouts
        .create(&PostParams::default(), &serde_json::from_value(object).unwrap())
        .await
        .unwrap();
}

/// Merges `variables` into rollout `name`'s `spec.variables`; its status once it records each Cluster of
/// `expected` with its outcome.
async fn with_variables(
    rollouts: &Api<cso_api::ClusterStackRollout>,
    ns: &str,
    name: &str,
    variables: Value,
    expected: &[(&str, &str)],
) -> cso_api::ClusterStackRolloutStatus {
    rollouts
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": variables}})),
        )
        .await
        .unwrap();
    rollout_outcomes(rollouts, ns, name, expected).await
}

/// The status of rollout `name` once it records each Cluster of `expected` with its outcome.
async fn rollout_outcomes(
    rollouts: &Api<cso_api::ClusterStackRollout>,
    ns: &str,
    name: &str,
    expected: &[(&str, &str)],
) -> cso_api::ClusterStackRolloutStatus {
    let status = support::eventually(&format!("rollout {name}: {expected:?}"), TIMEOUT, || async {
        let status = rollouts.get(name).await.ok()?.status?;
        expected
            .iter()
            .all(|(cluster, outcome)| {
                status
                    .moves
                    .iter()
                    .any(|m| m.cluster == format!("{ns}/{cluster}") && m.outcome == *outcome)
            })
            .then_some(status)
    })
    .await;
    eprintln!("{}", serde_json::to_string_pretty(&status).unwrap());
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_skips_the_cluster_the_preflight_refuses_and_reports_it_and_moves_the_others() {
    use cso_api::{
        ClusterStackRollout,
        cluster_stack_rollout::{outcome, phase},
        conditions::{ConditionStatus, ConditionsExt},
        names::{condition, reason},
    };

    let env = shared_management_with_cluster_api();
    let client = env.control_plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "rollout-refused").await.unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let release_dir = scratch.path().join("releases");
    local_scs_releases(&release_dir, &scratch.path().join("narrowed"));
    // The 2026 releases do not vendor their charts' dependencies: a loopback mirror has them.
    let mirror = cso_testenv::chart_repo::ChartRepo::start(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/charts"),
    )
    .await
    .unwrap();
    let source = std::sync::Arc::new(cso_release::source::local::LocalSource::new(
        release_dir.join("cluster-stacks"),
    ));
    let (mut operator, renderer) = support::operator(&client, &ns, &release_dir, source.clone(), |_| {});
    operator.releases = std::sync::Arc::new(
        cso_release::ReleaseCache::new(
            &release_dir,
            source,
            cso_release::archive::UnpackLimits::default(),
        )
        .unwrap()
        .with_dependencies(cso_release::DependencyResolver::new(
            cso_release::ChartMirrors::all(mirror.url()),
        ))
        .with_local_cache(scratch.path().join("local-cache")),
    );
    let _operator = support::RunningOperator::run(operator, renderer).await;
    support::create_stack(
        &client,
        &ns,
        "scs",
        json!({"provider": "docker", "name": "scs", "kubernetesVersion": "1.35", "channel": "stable",
               "autoSubscribe": false, "noProvider": true, "versions": ["v1", "v2"]}),
    )
    .await;
    support::ready_release(&client, &ns, V1).await;
    support::ready_release(&client, &ns, V2).await;
    // Cluster API has reconciled both classes.
    let classes = api_for(&client, "cluster.x-k8s.io/v1beta2", "ClusterClass", &ns).await;
    for class in [V1, V2] {
        support::eventually(&format!("ClusterClass {class} reconciled"), TIMEOUT, || async {
            let object = serde_json::to_value(classes.get(class).await.ok()?).unwrap();
            class_reconciled(&object).then_some(())
        })
        .await;
    }

    // c1 sets a value v2's narrowed enum refuses; c2 sets nothing v2 refuses. c3 sets oidcConfig, whose
    // groupsPrefix v1 defaults and v2 no longer defines; c4 sets that field to a value of its own.
    let c1 = refused_by_v2(&client, &ns).await;
    cluster_of_v1(&client, &ns, "c2", json!([]), true).await;
    let oidc = |prefix: Option<&str>| {
        let mut config = json!({"clientID": "kubectl", "issuerURL": "https://dex.example"});
        if let Some(prefix) = prefix {
            config["groupsPrefix"] = json!(prefix);
        }
        json!([{"name": "oidcConfig", "value": config}])
    };
    // Not waited for: the stack's oidcConfig patch does not apply to this class's kubeadm config (Cluster API
    // says so in TopologyReconciled), which is no concern of the move's admission.
    let c3 = cluster_of_v1(&client, &ns, "c3", oidc(None), false).await;
    let c4 = cluster_of_v1(&client, &ns, "c4", oidc(Some("corp:")), false).await;
    // c5 sets the refused imageRepository, and an oidcConfig with its owner's groupsPrefix, in md-0's
    // overrides only.
    let overrides = json!([
        {"name": "imageRepository", "value": "registry.k8s.io"},
        {"name": "oidcConfig", "value": {"clientID": "md", "issuerURL": "https://dex.example", "groupsPrefix": "md:"}},
    ]);
    cluster_of_v1_with_overrides(&client, &ns, "c5", json!([]), Some(overrides), false).await;
    let variables_of = |cluster: &Cluster| {
        cluster
            .object
            .as_ref()
            .and_then(|o| o.value().pointer("/spec/topology/variables").cloned())
            .unwrap()
    };
    assert_eq!(
        variables_of(&c3)
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "oidcConfig")
            .unwrap()
            .pointer("/value/groupsPrefix"),
        Some(&json!("oidc:")),
        "Cluster API defaulted it from v1's schema"
    );

    let rollouts: Api<ClusterStackRollout> = Api::namespaced(client.clone(), &ns);
    create_rollout(&rollouts, &ns, "scs-v2", json!({})).await;
    let status = rollout_outcomes(
        &rollouts,
        &ns,
        "scs-v2",
        &[
            ("c1", outcome::REFUSED),
            ("c2", outcome::MOVED),
            ("c3", outcome::REFUSED),
            ("c4", outcome::REFUSED),
            ("c5", outcome::REFUSED),
        ],
    )
    .await;
    let preflight = status.get_condition(condition::PREFLIGHT_PASSED).unwrap();
    assert_eq!(preflight.status, ConditionStatus::False);
    assert_eq!(preflight.reason.as_deref(), Some(reason::MOVE_REFUSED));
    let message = preflight.message.clone().unwrap_or_default();
    assert!(
        message.contains(&format!("{ns}/c1")) && message.contains("imageRepository"),
        "the Cluster and the variable are named: {message}"
    );
    assert_eq!(status.waves[0].skipped, 4);
    assert_eq!(status.skipped, 4, "the refused Clusters are counted as skipped");
    let c5_refusal = status.moves.iter().find(|m| m.cluster.ends_with("/c5")).unwrap();
    assert_eq!(
        c5_refusal.reasons[0],
        "variable imageRepository: \"registry.k8s.io\" is not one of [\"\", \"registry.scs.community\"] (in the \
         overrides of machineDeployment md-0)",
        "the override and its owner are named"
    );
    assert!(
        c5_refusal.reasons[1].starts_with("variable oidcConfig: \"groupsPrefix\" field(s) are not specified")
            && c5_refusal.reasons[1].ends_with("(in the overrides of machineDeployment md-0)"),
        "{:?}",
        c5_refusal.reasons
    );
    let c3_refusal = status.moves.iter().find(|m| m.cluster.ends_with("/c3")).unwrap();
    assert!(
        c3_refusal.reasons.join(" ").contains("groupsPrefix"),
        "{c3_refusal:?}"
    );
    assert_ne!(
        status.phase,
        phase::COMPLETED,
        "never Completed while a Cluster is left on the old class"
    );
    let refused_at = status
        .moves
        .iter()
        .find(|m| m.cluster.ends_with("/c1"))
        .unwrap()
        .at;

    // c1 stays on v1, unchanged; c2 is on v2, moved by the rollout's field manager.
    let clusters: Api<Cluster> = Api::namespaced_with(client.clone(), &ns, &Cluster::resource("v1beta2"));
    let after = clusters.get("c1").await.unwrap();
    assert_eq!(after.class().unwrap().name, V1);
    assert_eq!(after.metadata.generation, c1.metadata.generation);
    let c2 = api_for(&client, "cluster.x-k8s.io/v1beta2", "Cluster", &ns)
        .await
        .get("c2")
        .await
        .unwrap();
    assert_eq!(c2.data.pointer("/spec/topology/classRef/name"), Some(&json!(V2)));
    assert!(
        c2.metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|f| f.manager.as_deref() == Some(cso_controller::rollout::FIELD_MANAGER)),
        "moved with the rollout's field manager"
    );

    // Never retried in a loop: the refusal keeps its time while c1 is unchanged.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = rollouts.get("scs-v2").await.unwrap().status.unwrap();
    let again = status.moves.iter().find(|m| m.cluster.ends_with("/c1")).unwrap();
    assert_eq!((again.outcome.as_str(), again.at), (outcome::REFUSED, refused_at));
    assert_eq!(
        clusters.get("c1").await.unwrap().class().unwrap().name,
        V1,
        "the refused Cluster is never moved"
    );

    // The site turns on spec.variables.followClassDefaults: the refusals are asked again (the rollout's spec
    // changed). c3 moves, its groupsPrefix left to v2 (which has none), every other value as it was; c4's
    // prefix is its owner's: refused and never rewritten; c1 likewise.
    let status = with_variables(
        &rollouts,
        &ns,
        "scs-v2",
        json!({"followClassDefaults": true}),
        &[
            ("c1", outcome::REFUSED),
            ("c3", outcome::MOVED),
            ("c4", outcome::REFUSED),
            ("c5", outcome::REFUSED),
        ],
    )
    .await;
    let moved = status.moves.iter().find(|m| m.cluster.ends_with("/c3")).unwrap();
    assert!(
        moved
            .variables_dropped
            .contains(&"oidcConfig.groupsPrefix".to_owned()),
        "{moved:?}"
    );
    assert_eq!(status.skipped, 3);
    assert_ne!(status.phase, phase::COMPLETED);

    let after = clusters.get("c3").await.unwrap();
    assert_eq!(after.class().unwrap().name, V2);
    let mut expected = variables_of(&c3);
    for variable in expected.as_array_mut().unwrap() {
        if variable["name"] == "oidcConfig" {
            variable["value"].as_object_mut().unwrap().remove("groupsPrefix");
        }
    }
    assert_eq!(
        variables_of(&after),
        expected,
        "groupsPrefix gone, every other value as it was (v2 defaults the same values again)"
    );
    let c4_after = clusters.get("c4").await.unwrap();
    assert_eq!(c4_after.class().unwrap().name, V1);
    assert_eq!(c4_after.metadata.generation, c4.metadata.generation);
    assert_eq!(
        variables_of(&c4_after),
        variables_of(&c4),
        "the owner's value is never rewritten"
    );

    // The site declares what the rest need: imageRepository set to a registry v2 allows (wherever a Cluster
    // sets it: c5's is in md-0's overrides), c4's groupsPrefix removed. Each moves in one guarded patch.
    let dynamic = api_for(&client, "cluster.x-k8s.io/v1beta2", "Cluster", &ns).await;
    let c5_before = dynamic.get("c5").await.unwrap();
    let status = with_variables(
        &rollouts,
        &ns,
        "scs-v2",
        json!({"set": [{"name": "imageRepository", "value": "registry.scs.community"}],
               "remove": [{"name": "oidcConfig", "field": "groupsPrefix"}]}),
        &[
            ("c1", outcome::MOVED),
            ("c4", outcome::MOVED),
            ("c5", outcome::MOVED),
        ],
    )
    .await;
    assert_eq!(status.skipped, 0, "nothing is left on the old class");
    let changed = |cluster: &str| {
        status
            .moves
            .iter()
            .find(|m| m.cluster == format!("{ns}/{cluster}"))
            .unwrap()
            .variables_changed
            .clone()
    };
    assert_eq!(
        changed("c1"),
        ["set imageRepository to \"registry.scs.community\" (was \"registry.k8s.io\")"]
    );
    assert!(
        changed("c4").contains(&"removed oidcConfig.groupsPrefix (was \"corp:\")".to_owned()),
        "{:?}",
        changed("c4")
    );
    for change in [
        "set imageRepository to \"registry.scs.community\" (was \"registry.k8s.io\") in machineDeployment md-0",
        "removed oidcConfig.groupsPrefix (was \"md:\") in machineDeployment md-0",
    ] {
        assert!(
            changed("c5").contains(&change.to_owned()),
            "{change}: {:?}",
            changed("c5")
        );
    }
    let image = |object: &Value, list: &str| {
        object
            .pointer(list)
            .and_then(Value::as_array)
            .and_then(|l| l.iter().find(|v| v["name"] == "imageRepository"))
            .map(|v| v["value"].clone())
    };
    const OWN: &str = "/spec/topology/variables";
    const MD0: &str = "/spec/topology/workers/machineDeployments/0/variables/overrides";
    let oidc_of = |cluster: &Cluster| {
        variables_of(cluster)
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "oidcConfig")
            .unwrap()["value"]
            .clone()
    };
    let mut expected = oidc_of(&c4);
    expected.as_object_mut().unwrap().remove("groupsPrefix");
    assert_eq!(
        oidc_of(&clusters.get("c4").await.unwrap()),
        expected,
        "only the declared field is gone (v2 defaults the same values again)"
    );
    // Every version of c5 the API server stored: on v1 with the old values, or on v2 with the new ones.
    let c5_after = dynamic.get("c5").await.unwrap();
    assert_eq!(image(&c5_after.data, MD0), Some(json!("registry.scs.community")));
    assert_eq!(image(&c5_after.data, OWN), Some(json!("registry.scs.community")));
    let stored = support::versions_between(&dynamic, "c5", &c5_before, &c5_after).await;
    assert!(!stored.is_empty());
    for version in &stored {
        let class = version.data.pointer("/spec/topology/classRef/name").cloned();
        let values = (image(&version.data, OWN), image(&version.data, MD0));
        let md_prefix = version
            .data
            .pointer(MD0)
            .and_then(Value::as_array)
            .and_then(|l| l.iter().find(|v| v["name"] == "oidcConfig"))
            .and_then(|v| v.pointer("/value/groupsPrefix"))
            .cloned();
        if class == Some(json!(V1)) {
            assert_eq!(
                values,
                (image(&c5_before.data, OWN), Some(json!("registry.k8s.io"))),
                "on v1 with v1's values"
            );
            assert_eq!(md_prefix, Some(json!("md:")));
        } else {
            assert_eq!(class, Some(json!(V2)));
            assert_eq!(
                values,
                (
                    Some(json!("registry.scs.community")),
                    Some(json!("registry.scs.community"))
                ),
                "on v2 with the new values"
            );
            assert_eq!(md_prefix, None, "removed inside the override in the same patch");
        }
    }
}
