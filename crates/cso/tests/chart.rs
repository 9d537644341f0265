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

/// The real `helm` (`make tools`) with `args`.
fn run_helm(args: &[&str]) -> std::process::Output {
    let tools = cso_testenv::Tools::discover().unwrap();
    Command::new(tools.helm.expect("helm: run `make tools`"))
        .args(args)
        .output()
        .unwrap()
}

fn helm(args: &[&str]) -> String {
    let output = run_helm(args);
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

/// A management control plane of its own (installed webhook configurations would hold up other tests' objects)
/// with the Cluster API and cert-manager CRDs and without ours: the chart installs them, as templates it owns.
async fn plane_for_the_chart() -> cso_testenv::ControlPlane {
    let tools = cso_testenv::Tools::discover().unwrap();
    let plane = cso_testenv::start_management_without_our_crds(&tools, None)
        .await
        .unwrap();
    let cert_manager = tools
        .cert_manager_crd_dir
        .as_ref()
        .expect("cert-manager CRDs: run `make tools`");
    cso_testenv::crds::install(
        &plane.client().await.unwrap(),
        &cso_testenv::crds::read_helm_templated(cert_manager).unwrap(),
    )
    .await
    .unwrap();
    plane
}

/// A kubeconfig of `plane` for the chart's ServiceAccount `cso-system/cso-controller-manager` (a token from
/// the TokenRequest API), written into `dir`.
async fn service_account_kubeconfig(plane: &cso_testenv::ControlPlane, dir: &Path) -> PathBuf {
    let token = Api::<ServiceAccount>::namespaced(plane.client().await.unwrap(), "cso-system")
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
    let path = dir.join("sa.kubeconfig");
    std::fs::write(&path, kubeconfig.to_string()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_is_accepted_by_the_api_server_and_installs() {
    let plane = plane_for_the_chart().await;
    let client = plane.client().await.unwrap();

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
    let invalid = run_helm(&[
        "template",
        "cso",
        chart().to_str().unwrap(),
        "--set",
        "shards={EU_1}",
    ]);
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
        cso_webhook::admission::CLUSTER_STACK_ROLLOUT_PATH,
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
    let scratch = tempfile::tempdir().unwrap();
    let service_account_kubeconfig = service_account_kubeconfig(&plane, scratch.path()).await;
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
    // The ClusterAddon fetches the release on its own: the ClusterStackRelease may say ready a moment later.
    support::wait_for(
        "the ClusterStackRelease ready",
        Duration::from_secs(60),
        || async { (support::ready(&client, "cso-system").await == ["docker-ferrol-1-27-v1"]).then_some(()) },
    )
    .await;
    support::stop_and_assert_nothing_forbidden(&mut operator, &log, "the chart's RBAC");
    plane.stop();
}

/// `helm` with the given kubeconfig; returns (success, stdout + stderr).
fn helm_on(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let kubeconfig = kubeconfig.to_str().unwrap();
    let output = run_helm(&[args, &["--kubeconfig", kubeconfig]].concat());
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

fn go_operator_fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/go-operator")
}

/// No pod runs on these control planes, so no webhook Service has an endpoint: the webhooks of whichever chart
/// is installed are set to `Ignore` so that objects can be created.
async fn webhooks_ignore_unreachable_service(client: &Client) {
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    for configuration in configurations.list(&Default::default()).await.unwrap() {
        let webhooks: Vec<serde_json::Value> = configuration
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| json!({"name": w.name, "failurePolicy": "Ignore"}))
            .collect();
        configurations
            .patch(
                configuration.metadata.name.as_deref().unwrap(),
                &PatchParams::default(),
                &Patch::Strategic(json!({ "webhooks": webhooks })),
            )
            .await
            .unwrap();
    }
}

/// uid of every object the swap must keep: the three CRDs, the ClusterStack, its ClusterStackReleases and a
/// ClusterAddon, and the cert-manager objects and Secrets of the Go release.
async fn kept_uids(client: &Client) -> std::collections::BTreeMap<String, String> {
    let mut uids = std::collections::BTreeMap::new();
    let crds: Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = Api::all(client.clone());
    for name in ["clusterstacks", "clusterstackreleases", "clusteraddons"] {
        let name = format!("{name}.clusterstack.x-k8s.io");
        let crd = crds
            .get(&name)
            .await
            .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
        uids.insert(format!("CRD {name}"), crd.metadata.uid.unwrap());
    }
    let stacks: Api<cso_api::ClusterStack> = Api::namespaced(client.clone(), "team-a");
    for stack in stacks.list(&Default::default()).await.unwrap() {
        uids.insert(
            format!("ClusterStack {}", stack.metadata.name.unwrap()),
            stack.metadata.uid.unwrap(),
        );
    }
    let releases: Api<cso_api::ClusterStackRelease> = Api::namespaced(client.clone(), "team-a");
    for release in releases.list(&Default::default()).await.unwrap() {
        uids.insert(
            format!("ClusterStackRelease {}", release.metadata.name.unwrap()),
            release.metadata.uid.unwrap(),
        );
    }
    let addons: Api<cso_api::ClusterAddon> = Api::namespaced(client.clone(), "team-a");
    for addon in addons.list(&Default::default()).await.unwrap() {
        uids.insert(
            format!("ClusterAddon {}", addon.metadata.name.unwrap()),
            addon.metadata.uid.unwrap(),
        );
    }
    for (kind, name) in [
        ("Issuer", "cso-selfsigned-issuer"),
        ("Certificate", "cso-serving-cert"),
        ("Certificate", "cso-hook-server-server-cert"),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            "cso-system",
            &kube::core::ApiResource::from_gvk(&GroupVersionKind::gvk("cert-manager.io", "v1", kind)),
        );
        let object = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
        uids.insert(format!("{kind} {name}"), object.metadata.uid.unwrap());
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "cso-system");
    for name in ["cso-webhook-server-cert", "cso-hook-server-server-cert"] {
        let secret = secrets
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("Secret {name}: {e}"));
        uids.insert(format!("Secret {name}"), secret.metadata.uid.unwrap());
    }
    uids
}

async fn selector_of(client: &Client) -> std::collections::BTreeMap<String, String> {
    Api::<Deployment>::namespaced(client.clone(), "cso-system")
        .get("cso-controller-manager")
        .await
        .unwrap()
        .spec
        .unwrap()
        .selector
        .match_labels
        .unwrap()
}

/// A TLS client that trusts `ca_pem` only and reaches `server_name` at `127.0.0.1:port`.
fn tls_client(ca_pem: &[u8], server_name: &str, port: u16) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem).unwrap())
        .resolve(server_name, std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Issue 29: a site that runs the Go operator's chart (as the stacks' README installs it) swaps to this chart
/// with `helm upgrade` and its values file, and can go back with `helm rollback`: the CRDs and every
/// ClusterStack and ClusterAddon survive each step with the same uid, the ORC rule of the values file is kept,
/// cert-manager's Issuer, Certificates and Secrets are taken over, and the operator runs as the chart's
/// ServiceAccount with the certificates the webhook and hook Services are called with. `helm uninstall` keeps
/// the CRDs and objects too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_operators_release_is_swapped_with_helm_upgrade_and_back_losing_nothing() {
    let plane = plane_for_the_chart().await;
    let client = plane.client().await.unwrap();
    let kubeconfig = plane.kubeconfig_path();
    let fixtures = go_operator_fixtures();
    let (go_chart, site_values) = (fixtures.join("chart"), fixtures.join("site-values.yaml"));
    let (go_chart, site_values) = (go_chart.to_str().unwrap(), site_values.to_str().unwrap());
    let our_chart = chart();
    let our_chart = our_chart.to_str().unwrap();
    let upgrade_to = |chart: &str, extra: &[&str]| {
        let mut args = vec![
            "upgrade",
            "--install",
            "cso",
            chart,
            "--namespace",
            "cso-system",
            "--create-namespace",
            "--values",
            site_values,
            "--wait=false",
        ];
        args.extend_from_slice(extra);
        helm_on(kubeconfig, &args)
    };

    // The Go operator as a site runs it: its chart, its values; cert-manager issues its certificates.
    let (ok, out) = upgrade_to(go_chart, &[]);
    assert!(ok, "installing the Go chart: {out}");
    let issued = cso_testenv::cert_manager::issue_self_signed(&client, "cso-system")
        .await
        .unwrap();
    assert_eq!(
        issued.len(),
        2,
        "cert-manager issues the Go chart's two certificates: {issued:?}"
    );
    cso_testenv::cert_manager::inject_ca(&client).await.unwrap();
    webhooks_ignore_unreachable_service(&client).await;
    let go_selector = selector_of(&client).await;
    assert_eq!(
        go_selector.get("app.kubernetes.io/name").map(String::as_str),
        Some("cso")
    );

    // Its objects: a ClusterStack, a Cluster of its class and the ClusterAddon the Go operator made for it.
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "team-a"}})).unwrap();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    Api::<cso_api::ClusterStack>::namespaced(client.clone(), "team-a")
        .create(&PostParams::default(), &support::ferrol_stack("team-a", &["v1"]))
        .await
        .unwrap();
    let cluster: cso_api::capi::Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": "team-a"},
        "spec": {"topology": {"class": "docker-ferrol-1-27-v1", "version": "v1.27.3"},
                 "controlPlaneEndpoint": {"host": "c1.example.test", "port": 6443}},
    }))
    .unwrap();
    let cluster = Api::<cso_api::capi::Cluster>::namespaced_with(
        client.clone(),
        "team-a",
        &cso_api::capi::Cluster::v1beta1_resource(),
    )
    .create(&PostParams::default(), &cluster)
    .await
    .unwrap();
    let workload = cso_testenv::shared_workload();
    cso_testenv::kubeconfig_secret(&client, "team-a", "c1", workload.kubeconfig_yaml())
        .await
        .unwrap();
    let cluster_uid = cluster.metadata.uid.clone().unwrap();
    let addon: cso_api::ClusterAddon = serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterAddon",
        "metadata": {"name": "cluster-addon-c1", "namespace": "team-a",
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "name": "c1",
                                 "uid": cluster_uid}]},
        "spec": {"clusterRef": {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "name": "c1",
                                "namespace": "team-a", "uid": cluster_uid}},
    }))
    .unwrap();
    Api::<cso_api::ClusterAddon>::namespaced(client.clone(), "team-a")
        .create(&PostParams::default(), &addon)
        .await
        .unwrap();
    let before = kept_uids(&client).await;

    // Refused before anything changes: the Go image under its key, and dropping the CRDs the Go release owns.
    let (ok, out) = upgrade_to(
        our_chart,
        &[
            "--set",
            "controllerManager.manager.image.repository=ghcr.io/sovereigncloudstack/cso",
            "--dry-run=server",
        ],
    );
    assert!(
        !ok && out.contains("set image.repository"),
        "the Go operator's image is refused, naming the key to use: {out}"
    );
    let (ok, out) = upgrade_to(our_chart, &["--set", "crds.install=false", "--dry-run=server"]);
    assert!(
        !ok && out.contains("crds.install=false would delete CRD"),
        "{out}"
    );
    let (ok, out) = upgrade_to(
        our_chart,
        &["--set", "certManager.enabled=false", "--dry-run=server"],
    );
    assert!(!ok && out.contains("cert-manager issued it"), "{out}");

    // The swap.
    let (ok, out) = upgrade_to(our_chart, &[]);
    assert!(ok, "helm upgrade from the Go chart to ours: {out}");
    assert_eq!(
        kept_uids(&client).await,
        before,
        "the swap keeps the CRDs, objects and certificates"
    );
    assert_eq!(
        selector_of(&client).await,
        go_selector,
        "the Deployment keeps its (immutable) selector"
    );
    let crds: Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = Api::all(client.clone());
    let crd = crds.get("clusterstacks.clusterstack.x-k8s.io").await.unwrap();
    assert_eq!(
        crd.metadata
            .annotations
            .unwrap()
            .get("helm.sh/resource-policy")
            .map(String::as_str),
        Some("keep")
    );
    assert!(
        crd.spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .any(|c| c.name == "Clusters"),
        "the CRDs are ours now (updated by the upgrade)"
    );
    let role = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
        .get("cso-manager-role")
        .await
        .unwrap();
    assert!(
        role.rules.unwrap().iter().any(|r| r
            .api_groups
            .as_ref()
            .is_some_and(|g| g.contains(&"openstack.k-orc.cloud".to_owned()))
            && r.resources
                .as_ref()
                .is_some_and(|res| res.contains(&"images".to_owned()))),
        "the values file's ORC rule is honoured"
    );
    let deployment = Api::<Deployment>::namespaced(client.clone(), "cso-system")
        .get("cso-controller-manager")
        .await
        .unwrap();
    let container = deployment.spec.unwrap().template.spec.unwrap().containers[0].clone();
    assert!(
        container.image.as_deref().unwrap().contains("cso-rs"),
        "{:?}",
        container.image
    );
    let args = container.args.unwrap();
    assert!(
        args.contains(&"--source=oci".to_owned()),
        "the Go chart's default source: {args:?}"
    );
    webhooks_ignore_unreachable_service(&client).await;

    // The operator, as the chart's ServiceAccount, with the Secrets the Deployment mounts as its certificates.
    let scratch = tempfile::tempdir().unwrap();
    let service_account_kubeconfig = service_account_kubeconfig(&plane, scratch.path()).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "cso-system");
    let mut cas = std::collections::BTreeMap::new();
    for (secret, dir) in [
        ("cso-webhook-server-cert", "webhook-certs"),
        ("cso-hook-server-server-cert", "hook-certs"),
    ] {
        let data = secrets.get(secret).await.unwrap().data.unwrap();
        let dir = scratch.path().join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        for key in ["tls.crt", "tls.key"] {
            std::fs::write(dir.join(key), &data[key].0).unwrap();
        }
        cas.insert(secret, data["ca.crt"].0.clone());
    }
    let fake = support::github_with_ferrol().await;
    let log = scratch.path().join("operator.log");
    let hook_certs = scratch.path().join("hook-certs");
    let instance = support::Instance::new(&hook_certs, true);
    let webhook_certs = format!(
        "--webhook-cert-dir={}",
        scratch.path().join("webhook-certs").display()
    );
    let mut operator = support::start_operator_with(
        &service_account_kubeconfig,
        scratch.path(),
        None,
        &support::Source::Github(fake.api_url()),
        &log,
        &instance,
        &["--leader-elect-namespace=cso-system", &webhook_certs],
    );
    let addons: Api<cso_api::ClusterAddon> = Api::namespaced(client.clone(), "team-a");
    support::wait_for(
        "the ClusterAddon made by the Go operator, installed by ours as the chart's ServiceAccount",
        Duration::from_secs(120),
        || async {
            addons
                .get("cluster-addon-c1")
                .await
                .ok()?
                .status?
                .ready
                .then_some(())
        },
    )
    .await;
    support::wait_for(
        "the ClusterStackRelease ready",
        Duration::from_secs(60),
        || async { (support::ready(&client, "team-a").await == ["docker-ferrol-1-27-v1"]).then_some(()) },
    )
    .await;
    // The admission webhook answers over TLS as the API server calls it: for the webhook Service's name, with the
    // caBundle cert-manager's cainjector put into the configuration.
    let live = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get("cso-validating-webhook-configuration")
        .await
        .unwrap();
    let webhook = live
        .webhooks
        .unwrap()
        .into_iter()
        .find(|w| w.name == "validation.clusterstack.clusterstack.x-k8s.io")
        .unwrap();
    let service = webhook.client_config.service.unwrap();
    let webhook_host = format!("{}.{}.svc", service.name, service.namespace);
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "swap-1", "operation": "CREATE",
            "kind": {"group": "clusterstack.x-k8s.io", "version": "v1alpha1", "kind": "ClusterStack"},
            "resource": {"group": "clusterstack.x-k8s.io", "version": "v1alpha1", "resource": "clusterstacks"},
            "namespace": "team-a", "name": "ferrol", "userInfo": {},
            "object": serde_json::to_value(support::ferrol_stack("team-a", &["v1"])).unwrap()},
    });
    let answer: serde_json::Value = tls_client(
        &webhook.client_config.ca_bundle.unwrap().0,
        &webhook_host,
        instance.webhook_port,
    )
    .post(format!(
        "https://{webhook_host}:{}{}",
        instance.webhook_port,
        service.path.unwrap()
    ))
    .json(&review)
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(answer["response"]["uid"], "swap-1", "{answer}");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    // The hook server answers Cluster API's discovery for the hook Service's name, trusting the Secret's CA (what
    // Cluster API injects from the ExtensionConfig's annotation).
    let hook_host = "cso-hook-server-svc.cso-system.svc";
    let discovery: serde_json::Value =
        tls_client(&cas["cso-hook-server-server-cert"], hook_host, instance.hook_port)
            .post(format!(
                "https://{hook_host}:{}/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery",
                instance.hook_port
            ))
            .json(
                &json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(discovery["status"], "Success", "{discovery}");
    support::stop_and_assert_nothing_forbidden(&mut operator, &log, "the swapped chart's RBAC");
    let before = kept_uids(&client).await;

    // Back to the Go chart.
    let (ok, out) = helm_on(
        kubeconfig,
        &[
            "rollback",
            "cso",
            "1",
            "--namespace",
            "cso-system",
            "--wait=false",
        ],
    );
    assert!(ok, "helm rollback to the Go chart: {out}");
    assert_eq!(
        kept_uids(&client).await,
        before,
        "the rollback keeps the CRDs, objects and certificates"
    );
    let image = Api::<Deployment>::namespaced(client.clone(), "cso-system")
        .get("cso-controller-manager")
        .await
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers[0]
        .image
        .clone()
        .unwrap();
    assert!(
        image.starts_with("ghcr.io/sovereigncloudstack/cso:"),
        "the Go operator runs again: {image}"
    );

    // Forward again, and uninstall: the CRDs and the objects stay.
    let (ok, out) = upgrade_to(our_chart, &[]);
    assert!(ok, "helm upgrade to ours after the rollback: {out}");
    assert_eq!(kept_uids(&client).await, before);
    let (ok, out) = helm_on(kubeconfig, &["uninstall", "cso", "--namespace", "cso-system"]);
    assert!(ok, "helm uninstall: {out}");
    let crds_left: Vec<String> = crds
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n.ends_with(".clusterstack.x-k8s.io"))
        .collect();
    assert_eq!(
        crds_left.len(),
        cso_api::crd::all().len(),
        "helm uninstall keeps the CRDs, ClusterStackRollout's too: {crds_left:?}"
    );
    let stacks = Api::<cso_api::ClusterStack>::namespaced(client.clone(), "team-a");
    assert_eq!(
        stacks.get("ferrol").await.unwrap().metadata.uid,
        before.get("ClusterStack ferrol").cloned()
    );
    let addon = Api::<cso_api::ClusterAddon>::namespaced(client.clone(), "team-a");
    assert_eq!(
        addon.get("cluster-addon-c1").await.unwrap().metadata.uid,
        before.get("ClusterAddon cluster-addon-c1").cloned()
    );
    plane.stop();
}
