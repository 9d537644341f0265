//! The Helm chart `charts/cluster-stack-operator` against a real API server (with the Cluster API and
//! cert-manager CRDs): both certificate modes render and every object is accepted by a server-side dry run;
//! the chart installs and upgrades with the real `helm`, keeping its self-signed certificates; its webhooks
//! are the operator's; its Deployment's arguments are ones `cso run` accepts; its CRDs are the generated ones;
//! and its RBAC is enough: `cso run` with the chart's ServiceAccount token elects itself, applies a stack's
//! ClusterClass and installs a Cluster's addons, with no request forbidden.

#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

mod support;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use k8s_openapi::api::{
    admissionregistration::v1::ValidatingWebhookConfiguration,
    apps::v1::Deployment,
    core::v1::{Secret, ServiceAccount},
};
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};
use serde_json::json;

fn chart() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../charts/cluster-stack-operator")
}

fn helm(args: &[&str]) -> String {
    let tools = cso_testenv::Tools::discover().unwrap();
    let output = Command::new(tools.helm.expect("helm: run `make tools`"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "helm {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn render(namespace: &str, extra: &[&str]) -> Vec<DynamicObject> {
    let chart = chart();
    let mut args = vec![
        "template",
        "cso",
        chart.to_str().unwrap(),
        "--namespace",
        namespace,
        "--include-crds",
    ];
    args.extend_from_slice(extra);
    let text = helm(&args);
    serde_saphyr::from_multiple::<Option<DynamicObject>>(&text)
        .unwrap()
        .into_iter()
        .flatten()
        .collect()
}

/// Server-side dry run of every object; returns the refusals.
async fn dry_run(client: &Client, objects: &[DynamicObject]) -> Vec<String> {
    let mut refused = Vec::new();
    for object in objects {
        let types = object.types.clone().unwrap();
        let (group, version) = types
            .api_version
            .split_once('/')
            .unwrap_or(("", &types.api_version));
        let gvk = GroupVersionKind::gvk(group, version, &types.kind);
        let name = object.metadata.name.clone().unwrap();
        let (resource, capabilities) = match kube::discovery::pinned_kind(client, &gvk).await {
            Ok(found) => found,
            Err(e) => {
                refused.push(format!("{} {name}: {e}", types.kind));
                continue;
            }
        };
        let api: Api<DynamicObject> = match (capabilities.scope, &object.metadata.namespace) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            _ => Api::all_with(client.clone(), &resource),
        };
        let params = PatchParams::apply("chart-test").force().dry_run();
        if let Err(e) = api.patch(&name, &params, &Patch::Apply(object)).await {
            refused.push(format!("{} {name}: {e}", types.kind));
        }
    }
    refused
}

fn of_kind<'a>(objects: &'a [DynamicObject], kind: &str) -> Vec<&'a DynamicObject> {
    objects
        .iter()
        .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == kind))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_is_accepted_by_the_api_server_and_installs() {
    // A control plane of its own: the installed webhook configuration would hold up other tests' objects.
    let tools = cso_testenv::Tools::discover().unwrap();
    let plane = cso_testenv::start_management(&tools, None).await.unwrap();
    let client = plane.client().await.unwrap();
    let cert_manager = tools
        .cert_manager_crd_dir
        .as_ref()
        .expect("cert-manager CRDs: run `make tools`");
    cso_testenv::crds::install(
        &client,
        &cso_testenv::crds::read_helm_templated(cert_manager).unwrap(),
    )
    .await
    .unwrap();

    for (mode, extra) in [
        ("self-signed", vec![]),
        ("cert-manager", vec!["--set", "certManager.enabled=true"]),
    ] {
        let ns = cso_testenv::namespace(&client, "chart").await.unwrap();
        let objects = render(&ns, &extra);
        let refused = dry_run(&client, &objects).await;
        assert!(
            refused.is_empty(),
            "{mode}: refused by the API server: {refused:#?}"
        );
        assert_eq!(of_kind(&objects, "ExtensionConfig").len(), 1, "{mode}");
        assert_eq!(
            of_kind(&objects, "Certificate").len(),
            if mode == "cert-manager" { 2 } else { 0 }
        );
    }

    // Optional settings: pod metadata, priority, and a ServiceMonitor (its CRD is the Prometheus Operator's, not
    // installed here: the rest is dry-run).
    let ns = cso_testenv::namespace(&client, "chart").await.unwrap();
    let options = [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "podAnnotations.prometheus\\.io/scrape=true",
        "--set",
        "priorityClassName=system-cluster-critical",
    ];
    let key = Path::new(env!("CARGO_MANIFEST_DIR")).join("../release/tests/fixtures/cosign/key1.pub");
    let key_option = format!("verifyKeys[0]={}", key.display());
    let options: Vec<&str> = options
        .into_iter()
        .chain(["--set-file", key_option.as_str()])
        .collect();
    let objects = render(&ns, &options);
    // A verification key: in a ConfigMap, mounted, and named by --verify-key.
    let keys = of_kind(&objects, "ConfigMap")
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some("cso-verify-keys"))
        .expect("the ConfigMap of the verification keys");
    assert_eq!(
        keys.data["data"]["key-0.pub"].as_str(),
        Some(std::fs::read_to_string(&key).unwrap().as_str())
    );
    let deployment = serde_json::to_value(of_kind(&objects, "Deployment")[0]).unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert!(
        container["args"]
            .as_array()
            .unwrap()
            .contains(&"--verify-key=/etc/cso/verify-keys/key-0.pub".into()),
        "{container}"
    );
    assert!(
        container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"] == "/etc/cso/verify-keys")
    );
    let (monitors, rest): (Vec<DynamicObject>, Vec<DynamicObject>) = objects
        .into_iter()
        .partition(|o| o.types.as_ref().is_some_and(|t| t.kind == "ServiceMonitor"));
    assert_eq!(monitors.len(), 1);
    assert_eq!(
        monitors[0].data["spec"]["endpoints"][0]["port"], "metrics",
        "the ServiceMonitor scrapes the metrics port"
    );
    let refused = dry_run(&client, &rest).await;
    assert!(
        refused.is_empty(),
        "options: refused by the API server: {refused:#?}"
    );

    // Shards: one Deployment more per shard, selectors apart, each pod of each shard behind every Service.
    let ns = cso_testenv::namespace(&client, "chart").await.unwrap();
    let objects = render(&ns, &["--set", "shards={a,b}"]);
    let refused = dry_run(&client, &objects).await;
    assert!(
        refused.is_empty(),
        "shards: refused by the API server: {refused:#?}"
    );
    let deployments: Vec<Deployment> = of_kind(&objects, "Deployment")
        .into_iter()
        .map(|d| serde_json::from_value(serde_json::to_value(d).unwrap()).unwrap())
        .collect();
    let names: Vec<String> = deployments
        .iter()
        .map(|d| d.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "cso-controller-manager",
            "cso-controller-manager-a",
            "cso-controller-manager-b"
        ]
    );
    let pods: Vec<std::collections::BTreeMap<String, String>> = deployments
        .iter()
        .map(|d| {
            d.spec
                .as_ref()
                .unwrap()
                .template
                .metadata
                .as_ref()
                .unwrap()
                .labels
                .clone()
                .unwrap()
        })
        .collect();
    let selects = |selector: &std::collections::BTreeMap<String, String>,
                   pod: &std::collections::BTreeMap<String, String>| {
        selector.iter().all(|(k, v)| pod.get(k) == Some(v))
    };
    for (i, deployment) in deployments.iter().enumerate() {
        let selector = deployment
            .spec
            .as_ref()
            .unwrap()
            .selector
            .match_labels
            .clone()
            .unwrap();
        for (j, pod) in pods.iter().enumerate() {
            assert_eq!(
                selects(&selector, pod),
                i == j,
                "the selector of {} and the pods of {}",
                names[i],
                names[j]
            );
        }
        let args = deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .args
            .clone()
            .unwrap();
        let shard_args: Vec<&String> = args.iter().filter(|a| a.starts_with("--shard")).collect();
        let expected: Vec<String> = ["", "a", "b"][i..=i]
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| format!("--shard={s}"))
            .collect();
        assert_eq!(shard_args, expected.iter().collect::<Vec<_>>(), "{}", names[i]);
    }
    for service in of_kind(&objects, "Service") {
        let selector: std::collections::BTreeMap<String, String> =
            serde_json::from_value(service.data["spec"]["selector"].clone()).unwrap();
        assert!(
            pods.iter().all(|pod| selects(&selector, pod)),
            "Service {:?} reaches the pods of every shard",
            service.metadata.name
        );
    }
    let invalid = Command::new(cso_testenv::Tools::discover().unwrap().helm.unwrap())
        .args(["template", "cso"])
        .arg(chart())
        .args(["--set", "shards={EU_1}"])
        .output()
        .unwrap();
    assert!(!invalid.status.success());
    assert!(String::from_utf8_lossy(&invalid.stderr).contains("DNS-1123"));

    // What the chart deploys is what the operator serves and accepts.
    let objects = render("cso-system", &[]);
    let configuration: ValidatingWebhookConfiguration = serde_json::from_value(
        serde_json::to_value(of_kind(&objects, "ValidatingWebhookConfiguration")[0]).unwrap(),
    )
    .unwrap();
    let mut paths: Vec<String> = configuration
        .webhooks
        .unwrap()
        .into_iter()
        .map(|w| w.client_config.service.unwrap().path.unwrap())
        .collect();
    paths.sort();
    let mut served = vec![
        cso_webhook::admission::CLUSTER_PATH,
        cso_webhook::admission::CLUSTER_ADDON_PATH,
        cso_webhook::admission::CLUSTER_STACK_PATH,
        cso_webhook::admission::CLUSTER_STACK_RELEASE_PATH,
    ];
    served.sort();
    assert_eq!(paths, served);
    let deployment: Deployment =
        serde_json::from_value(serde_json::to_value(of_kind(&objects, "Deployment")[0]).unwrap()).unwrap();
    let args = deployment.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_cso"))
        .args(&args)
        .arg("--kubeconfig=/nonexistent/kubeconfig")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("failed to read the kubeconfig /nonexistent/kubeconfig"),
        "`cso {}` should parse and get as far as the kubeconfig: {stderr}",
        args.join(" ")
    );
    let crds: Vec<&DynamicObject> = of_kind(&objects, "CustomResourceDefinition");
    let generated = cso_api::crd::all();
    assert_eq!(
        crds.len(),
        generated.len(),
        "the chart's CRDs are the generated ones"
    );
    for crd in generated {
        let in_chart = crds
            .iter()
            .find(|c| c.metadata.name == crd.metadata.name)
            .unwrap_or_else(|| panic!("{:?} missing from the chart", crd.metadata.name));
        assert_eq!(in_chart.data["spec"], serde_json::to_value(&crd).unwrap()["spec"]);
    }

    // A real install and upgrade: the self-signed certificates are kept across upgrades.
    let kubeconfig = plane.kubeconfig_path().to_str().unwrap().to_owned();
    let chart = chart();
    let install = |verb: &'static str| {
        helm(&[
            verb,
            "cso",
            chart.to_str().unwrap(),
            "--namespace",
            "cso-system",
            "--create-namespace",
            "--kubeconfig",
            &kubeconfig,
        ])
    };
    install("install");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "cso-system");
    let first = secrets
        .get("cso-webhook-server-cert")
        .await
        .unwrap()
        .data
        .unwrap();
    install("upgrade");
    let second = secrets
        .get("cso-webhook-server-cert")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(
        first.get("tls.crt"),
        second.get("tls.crt"),
        "the certificate survives an upgrade"
    );
    let installed: Api<Deployment> = Api::namespaced(client.clone(), "cso-system");
    assert!(
        installed
            .get_opt("cso-controller-manager")
            .await
            .unwrap()
            .is_some()
    );
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let live = configurations
        .get("cso-validating-webhook-configuration")
        .await
        .unwrap();
    let ca_bundle = live.webhooks.unwrap()[0].client_config.ca_bundle.clone().unwrap();
    assert_eq!(
        Some(&ca_bundle),
        second.get("ca.crt"),
        "the webhooks trust the serving certificate's CA"
    );

    // The operator, as the chart's ServiceAccount. The webhook Service has no endpoints here (no pods run),
    // so its configuration goes first.
    configurations
        .delete("cso-validating-webhook-configuration", &Default::default())
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "cso-system");
    let token = accounts
        .create_token_request(
            "cso-controller-manager",
            &PostParams::default(),
            &serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}})).unwrap(),
        )
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let mut kubeconfig: serde_json::Value = serde_saphyr::from_str(plane.kubeconfig_yaml()).unwrap();
    kubeconfig["users"][0]["user"] = json!({ "token": token });
    let scratch = tempfile::tempdir().unwrap();
    let service_account_kubeconfig = scratch.path().join("sa.kubeconfig");
    std::fs::write(&service_account_kubeconfig, kubeconfig.to_string()).unwrap();
    let fake = support::github_with_ferrol().await;
    let log = scratch.path().join("operator.log");
    let mut operator = support::start_operator(
        &service_account_kubeconfig,
        scratch.path(),
        "cso-system",
        fake.api_url(),
        &log,
        &support::Instance::new(scratch.path(), true),
    );
    Api::<cso_api::ClusterStack>::namespaced(client.clone(), "cso-system")
        .create(
            &PostParams::default(),
            &support::ferrol_stack("cso-system", &["v1"]),
        )
        .await
        .unwrap();
    let workload = cso_testenv::shared_workload();
    let cluster: cso_api::capi::Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": "cso-system"},
        "spec": {"topology": {"class": "docker-ferrol-1-27-v1", "version": "v1.27.3"},
                 "controlPlaneEndpoint": {"host": "c1.example.test", "port": 6443}},
    }))
    .unwrap();
    Api::<cso_api::capi::Cluster>::namespaced_with(
        client.clone(),
        "cso-system",
        &cso_api::capi::Cluster::v1beta1_resource(),
    )
    .create(&PostParams::default(), &cluster)
    .await
    .unwrap();
    cso_testenv::kubeconfig_secret(&client, "cso-system", "c1", workload.kubeconfig_yaml())
        .await
        .unwrap();
    let addons: Api<cso_api::ClusterAddon> = Api::namespaced(client.clone(), "cso-system");
    support::wait_for(
        "the addons installed by the chart's ServiceAccount",
        Duration::from_secs(120),
        || async {
            let addon = addons.get_opt("cluster-addon-c1").await.unwrap()?;
            addon.status?.ready.then_some(())
        },
    )
    .await;
    assert_eq!(
        support::ready(&client, "cso-system").await,
        ["docker-ferrol-1-27-v1"]
    );
    assert!(support::terminate(&mut operator).success());
    let log = std::fs::read_to_string(&log).unwrap();
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
        .collect();
    assert!(
        forbidden.is_empty(),
        "requests the chart's RBAC does not allow: {forbidden:#?}"
    );
    plane.stop();
}
