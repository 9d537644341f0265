//! The chart's alert rules and Grafana dashboard against what the operator exports: `promtool check rules` and
//! `promtool test rules` (each alert fires from synthetic series and stays silent on healthy ones); `cso run`
//! (addon health checks on, a 20 s stage timeout) through an install and an upgrade of a ClusterStack with a
//! Cluster whose addons go into a workload cluster that runs workloads, first without nodes (the addons cannot
//! run) and then with one, moved to v2 with `BeforeClusterUpgrade` called over HTTPS. Its /metrics must describe
//! every metric name a rule expression or a dashboard panel uses from the start, and have the labels they use
//! (label matchers, `by`, `on`, ...) on the samples of the run; a real Prometheus (Debian's package) scraping
//! that `cso run` every second, with a copy of the rules whose `for:` is 0 s, finds CsoAddonsNotRunning's
//! expression and alert on the Cluster's release while its addons cannot run and gone once they run, and
//! evaluates every alert expression through its HTTP API. promtool and prometheus come from hack/tools.sh
//! (`CSO_PROMTOOL`, `CSO_PROMETHEUS`); a missing one fails the test.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use cso_api::{ClusterAddon, ClusterStack, capi::Cluster};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use support::*;

mod support;

fn chart_files() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/cluster-stack-operator/files")
}

fn tools() -> cso_testenv::Tools {
    cso_testenv::Tools::discover().unwrap()
}

fn promtool() -> PathBuf {
    tools()
        .promtool
        .expect("promtool not found: run `make tools` (hack/tools.sh installs Debian's prometheus package)")
}

/// The alert rules: (alert name, expression), read from the rules file line by line (its layout is ours: each
/// rule starts with `- alert:`, its expression is a `|` block); each has a severity, a summary, a description and
/// a runbook_url whose anchor is a section of docs/runbooks.md.
fn alerts() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(chart_files().join("prometheus-rules.yaml")).unwrap();
    let runbooks =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/runbooks.md"))
            .unwrap();
    let mut rules: Vec<(String, String, Vec<String>)> = Vec::new();
    let mut in_expr: Option<usize> = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        if let Some(expr_indent) = in_expr {
            if indent > expr_indent && !trimmed.is_empty() {
                let rule = rules.last_mut().unwrap();
                rule.1.push_str(trimmed);
                rule.1.push('\n');
                continue;
            }
            in_expr = None;
        }
        if let Some(name) = trimmed.strip_prefix("- alert: ") {
            rules.push((name.to_owned(), String::new(), Vec::new()));
        } else if trimmed == "expr: |" {
            in_expr = Some(indent);
        } else if let Some(rule) = rules.last_mut()
            && let Some((key, _)) = trimmed.split_once(": ")
        {
            rule.2.push(key.to_owned());
        }
        if let Some(url) = trimmed.strip_prefix("runbook_url: ") {
            let name = &rules.last().unwrap().0;
            assert_eq!(url, format!("docs/runbooks.md#{}", name.to_lowercase()));
            assert!(
                runbooks.contains(&format!("\n## {name}\n")),
                "docs/runbooks.md has a section {name}"
            );
        }
    }
    for (name, expr, keys) in &rules {
        assert!(!expr.is_empty(), "{name} has an expression");
        for key in ["for", "severity", "summary", "description", "runbook_url"] {
            assert!(keys.iter().any(|k| k == key), "{name} has {key}: {keys:?}");
        }
    }
    rules.into_iter().map(|(name, expr, _)| (name, expr)).collect()
}

/// The dashboard panels' expressions.
fn panel_expressions() -> Vec<String> {
    let text = std::fs::read_to_string(chart_files().join("grafana-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(dashboard["templating"]["list"][0]["name"], "datasource");
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().replace("$__rate_interval", "1m"))
        .collect()
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    assert_eq!(alerts().len(), 11);
    for args in [
        &["check", "rules", "prometheus-rules.yaml"][..],
        &["test", "rules", "prometheus-rules.test.yaml"],
    ] {
        let output = Command::new(promtool())
            .args(args)
            .current_dir(chart_files())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(output.status.success(), "promtool {args:?}:\n{text}");
        assert!(text.contains("SUCCESS"), "promtool {args:?}:\n{text}");
    }
}

/// What a PromQL expression uses: metric names, and the labels of its matchers and of its `by`, `without`,
/// `on`, `ignoring`, `group_left`, `group_right` lists.
#[derive(Debug, Default, PartialEq)]
struct Uses {
    /// Metric name -> labels of its matchers.
    metrics: BTreeMap<String, BTreeSet<String>>,
    /// Labels of the grouping and matching lists.
    grouping: BTreeSet<String>,
}

const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
];
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];
const LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// A small PromQL tokenizer: skips strings, durations in brackets, numbers, functions (a name before `(`),
/// aggregations and keywords; a name before `{` or anywhere else is a metric.
fn promql_uses(expr: &str) -> Uses {
    let chars: Vec<char> = expr.chars().collect();
    let mut uses = Uses::default();
    let mut i = 0;
    let mut last_metric: Option<String> = None;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_space = |mut j: usize| {
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        j
    };
    let read_list = |mut j: usize, out: &mut BTreeSet<String>| -> usize {
        // `(a, b)` after a grouping keyword.
        j += 1;
        let mut name = String::new();
        while j < chars.len() && chars[j] != ')' {
            if ident(chars[j]) {
                name.push(chars[j]);
            } else if !name.is_empty() {
                out.insert(std::mem::take(&mut name));
            }
            j += 1;
        }
        if !name.is_empty() {
            out.insert(name);
        }
        j + 1
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            // Matchers: label op "value", ...
            let mut labels = BTreeSet::new();
            i += 1;
            while i < chars.len() && chars[i] != '}' {
                let j = skip_space(i);
                let start = j;
                let mut k = j;
                while k < chars.len() && ident(chars[k]) {
                    k += 1;
                }
                if k > start {
                    labels.insert(chars[start..k].iter().collect::<String>());
                }
                // Skip to the value's string, then past it.
                while k < chars.len() && chars[k] != '"' && chars[k] != '\'' && chars[k] != '}' {
                    k += 1;
                }
                if k < chars.len() && chars[k] != '}' {
                    let quote = chars[k];
                    k += 1;
                    while k < chars.len() && chars[k] != quote {
                        k += if chars[k] == '\\' { 2 } else { 1 };
                    }
                    k += 1;
                }
                let k = skip_space(k);
                i = if k < chars.len() && chars[k] == ',' {
                    k + 1
                } else {
                    k
                };
            }
            i += 1;
            let metric = last_metric.take().expect("a selector without a metric name");
            uses.metrics.entry(metric).or_default().extend(labels);
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if ident(c) {
            let start = i;
            while i < chars.len() && ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = skip_space(i);
            let before_paren = next < chars.len() && chars[next] == '(';
            if LISTS.contains(&word.as_str()) {
                if before_paren {
                    i = read_list(next, &mut uses.grouping);
                }
            } else if KEYWORDS.contains(&word.as_str())
                || AGGREGATIONS.contains(&word.as_str())
                || before_paren
            {
                // a keyword, an aggregation or a function
            } else {
                uses.metrics.entry(word.clone()).or_default();
                last_metric = Some(word);
            }
        } else {
            i += 1;
        }
    }
    uses
}

#[test]
fn the_tokenizer_finds_metrics_and_labels_and_nothing_else() {
    let uses = promql_uses(
        r#"sum by (hook, le) (rate(cso_hook_duration_seconds_bucket{result="a,b}", x!~'y'}[5m] offset 1h))
           / on (pod) group_left (shard) max without (name) (up) > 0.5 unless absent(foo_total) * 2e3"#,
    );
    assert_eq!(
        uses.metrics,
        BTreeMap::from([
            (
                "cso_hook_duration_seconds_bucket".to_owned(),
                BTreeSet::from(["result".to_owned(), "x".to_owned()])
            ),
            ("foo_total".to_owned(), BTreeSet::new()),
            ("up".to_owned(), BTreeSet::new()),
        ])
    );
    assert_eq!(
        uses.grouping,
        ["hook", "le", "name", "pod", "shard"].map(str::to_owned).into()
    );
}

/// Labels Prometheus adds to every scraped series (a ServiceMonitor's target labels).
const TARGET_LABELS: &[&str] = &[
    "namespace",
    "pod",
    "instance",
    "job",
    "container",
    "service",
    "endpoint",
];

/// Metrics from elsewhere that the rules use, with their labels: kube-state-metrics'.
const EXTERNAL: &[(&str, &[&str])] = &[(
    "kube_pod_container_resource_limits",
    &["namespace", "pod", "container", "resource", "unit", "node"],
)];

/// Metric name -> the labels its samples carry, from the text format; families without samples have
/// `None` (their `# TYPE` line names them; counters get `_total`, histograms `_bucket`, `_sum`, `_count`).
fn exported(text: &str) -> BTreeMap<String, Option<BTreeSet<String>>> {
    let mut names: BTreeMap<String, Option<BTreeSet<String>>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            let derived: Vec<String> = match kind {
                "counter" => vec![format!("{name}_total")],
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .collect(),
                _ => vec![name.to_owned()],
            };
            for name in derived {
                names.entry(name).or_insert(None);
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let name_end = line.find(['{', ' ']).unwrap();
            let name = &line[..name_end];
            let mut labels = BTreeSet::new();
            if line[name_end..].starts_with('{') {
                let body = &line[name_end + 1..line.rfind('}').unwrap()];
                for pair in body.split("\",") {
                    if let Some((label, _)) = pair.split_once('=') {
                        labels.insert(label.trim().to_owned());
                    }
                }
            }
            names
                .entry(name.to_owned())
                .or_insert(None)
                .get_or_insert_with(BTreeSet::new)
                .extend(labels);
        }
    }
    names
}

/// What the expressions use that `text` (the operator's /metrics) does not export.
fn missing(expressions: &[String], text: &str) -> Vec<String> {
    let exported = exported(text);
    let mut problems = Vec::new();
    for expr in expressions {
        let uses = promql_uses(expr);
        let mut known_labels: BTreeSet<String> = TARGET_LABELS.iter().map(|s| (*s).to_owned()).collect();
        for (metric, labels) in &uses.metrics {
            let available: Option<BTreeSet<String>> = match EXTERNAL.iter().find(|(name, _)| name == metric) {
                Some((_, labels)) => Some(labels.iter().map(|s| (*s).to_owned()).collect()),
                None => match exported.get(metric) {
                    Some(labels) => labels.clone(),
                    None => {
                        problems.push(format!("{metric} is not exported (in {expr})"));
                        continue;
                    }
                },
            };
            let Some(available) = available else {
                // A family without samples in this run: its name is checked, its labels cannot be.
                continue;
            };
            for label in labels {
                if !available.contains(label) && !TARGET_LABELS.contains(&label.as_str()) {
                    problems.push(format!("{metric} has no label {label} (in {expr})"));
                }
            }
            known_labels.extend(available);
            if metric.ends_with("_bucket") {
                known_labels.insert("le".to_owned());
            }
        }
        let any_unsampled = uses.metrics.keys().any(|m| matches!(exported.get(m), Some(None)));
        for label in &uses.grouping {
            if !known_labels.contains(label) && !any_unsampled {
                problems.push(format!("no metric of ({expr}) has the label {label}"));
            }
        }
    }
    problems
}

async fn query(prometheus: &str, expr: &str) -> serde_json::Value {
    let response = reqwest::Client::new()
        .get(format!("{prometheus}/api/v1/query"))
        .query(&[("query", expr)])
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["status"], "success", "{expr}: {body}");
    body["data"]["result"].clone()
}

/// Ferrol v1 and v2 as released, except that metrics-server's APIService is not judged (the chart's own
/// `apiService.annotations` set `clusterstack.x-k8s.io/skip-health-check`): the simulated pods have no network,
/// so the API server can never reach it (its dial fails on this machine) and the addons would never count as
/// running (as in crates/controller/tests/health_gates.rs).
async fn github_with_runnable_ferrol(dir: &Path) -> cso_testenv::github::FakeGithub {
    let fake = cso_testenv::github::FakeGithub::start(30).await.unwrap();
    for version in ["v1", "v2"] {
        let tag = format!("docker-ferrol-1-27-{version}");
        let release = dir.join(&tag);
        std::fs::create_dir_all(&release).unwrap();
        for entry in std::fs::read_dir(fixtures().join(&tag)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), release.join(entry.file_name())).unwrap();
        }
        std::fs::write(
            release.join("cluster-addon-values.yaml"),
            format!(
                "values: |\n  metrics-server:\n    apiService:\n      annotations:\n        \
                 clusterstack.x-k8s.io/skip-health-check: \"true\"\n    commonLabels:\n      \
                 domain: \"{{{{ .Cluster.spec.controlPlaneEndpoint.host }}}}\"\n      \
                 clusterAddonVersion: \"{version}\"\n"
            ),
        )
        .unwrap();
        fake.publish_dir(&tag, &release).unwrap();
    }
    fake
}

/// The answer of the hook server on `port` to `BeforeClusterUpgrade` for Cluster `c1` in `namespace`, moving
/// to `class`, as Cluster API calls it.
async fn before_cluster_upgrade(
    https: &reqwest::Client,
    port: u16,
    namespace: &str,
    class: &str,
) -> serde_json::Value {
    https
        .post(format!(
            "https://127.0.0.1:{port}/hooks.runtime.cluster.x-k8s.io/v1alpha1/beforeclusterupgrade/before-cluster-upgrade"
        ))
        .json(&json!({
            "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "BeforeClusterUpgradeRequest",
            "cluster": {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
                        "metadata": {"name": "c1", "namespace": namespace},
                        "spec": {"topology": {"class": class, "version": "v1.27.3"}}},
            "fromKubernetesVersion": "v1.27.3", "toKubernetesVersion": "v1.27.3",
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The releases (label `release`) for which Prometheus returns a series of `expr` now.
async fn releases_returned(prometheus: &str, expr: &str) -> Vec<String> {
    query(prometheus, expr)
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|series| {
            series["metric"]["release"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// `cso run` with addon health checks and a 20 s stage timeout, a ClusterStack installed at v1 and upgraded to
/// v2, a Cluster with its addons in a workload cluster that runs workloads (first without nodes: the addons
/// cannot run and are given up on; then with one: they run), moved to v2 with `BeforeClusterUpgrade` called
/// over HTTPS. Its /metrics, scraped along the way, has every metric and label the rules and the dashboard use;
/// a real Prometheus scraping it (with a copy of the rules whose `for:` is 0 s) evaluates CsoAddonsNotRunning's
/// expression to the Cluster's release while its addons cannot run, fires the alert, and returns nothing once
/// they run; at the end every alert expression returns nothing and no alert fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_dashboard_use_what_the_operator_exports_and_prometheus_evaluates_them() {
    let prometheus_binary = tools().prometheus.expect(
        "prometheus not found: run `make tools` (hack/tools.sh installs Debian's prometheus package)",
    );
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "observability").await.unwrap();
    let published = tempfile::tempdir().unwrap();
    let fake = github_with_runnable_ferrol(published.path()).await;
    // A workload cluster that runs workloads, without nodes for now: nothing the addons apply can run.
    let workload = cso_testenv::ControlPlane::start_with_workloads(&tools(), "observability", None, &[])
        .await
        .unwrap();
    let release_dir = tempfile::tempdir().unwrap();
    let log = release_dir.path().join("operator.log");
    let certs = tempfile::tempdir().unwrap();
    let ca = cso_testenv::pki::write_serving_certificate(certs.path()).unwrap();
    let endpoints = Instance::new(certs.path(), true);
    let _operator = start_operator_with(
        plane.kubeconfig_path(),
        release_dir.path(),
        Some(&ns),
        &Source::Github(fake.api_url()),
        &log,
        &endpoints,
        // The last of a repeated flag wins: health checks on, given up on after 20 s, looked at again every 5 s.
        &[
            "--addon-health-checks=true",
            "--stage-timeout=20s",
            "--resync-interval=5s",
        ],
    );

    // A real Prometheus scraping it every second, with its own storage.
    // The alert rules load as they are, but for a test copy whose `for:` is 0 s (theirs are for production).
    let prometheus_dir = tempfile::tempdir().unwrap();
    let prometheus_port = free_port();
    let rules = std::fs::read_to_string(chart_files().join("prometheus-rules.yaml")).unwrap();
    let rules: String = rules
        .lines()
        .map(|line| match line.split_once("for: ") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}for: 0s\n"),
            _ => format!("{line}\n"),
        })
        .collect();
    std::fs::write(prometheus_dir.path().join("rules.yaml"), rules).unwrap();
    std::fs::write(
        prometheus_dir.path().join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [rules.yaml]\n\
             scrape_configs:\n  - job_name: cso\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n\
             \x20       labels: {{namespace: {ns}, pod: cso-0}}\n",
            endpoints.metrics_port
        ),
    )
    .unwrap();
    let _prometheus = KillOnDrop(
        Command::new(prometheus_binary)
            .arg(format!(
                "--config.file={}",
                prometheus_dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                prometheus_dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
            .stdout(std::fs::File::create(prometheus_dir.path().join("log")).unwrap())
            .stderr(std::fs::File::create(prometheus_dir.path().join("err")).unwrap())
            .spawn()
            .unwrap(),
    );
    let prometheus = format!("http://127.0.0.1:{prometheus_port}");

    // Every family is described from the start, samples or not.
    let mut expressions: Vec<String> = alerts().into_iter().map(|(_, expr)| expr).collect();
    expressions.extend(panel_expressions());
    let started = wait_for("cso run serves /metrics", Duration::from_secs(60), || async {
        let text = reqwest::get(format!("http://127.0.0.1:{}/metrics", endpoints.metrics_port))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.contains("# TYPE cso_clusters gauge").then_some(text)
    })
    .await;
    let problems = missing(&expressions, &started);
    assert!(problems.is_empty(), "at start-up: {problems:#?}\n{started}");

    // Install v1, and a Cluster on it whose addons go into the node-less workload cluster.
    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), &ns);
    stacks
        .create(&PostParams::default(), &ferrol_stack(&ns, &["v1"]))
        .await
        .unwrap();
    wait_for("v1 ready", Duration::from_secs(90), || async {
        (ready(&client, &ns).await == ["docker-ferrol-1-27-v1"]).then_some(())
    })
    .await;
    let clusters: Api<Cluster> = Api::namespaced_with(client.clone(), &ns, &Cluster::v1beta1_resource());
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": ns},
        "spec": {"topology": {"class": "docker-ferrol-1-27-v1", "version": "v1.27.3"},
                 "controlPlaneEndpoint": {"host": "c1.example.test", "port": 6443}},
    }))
    .unwrap();
    clusters.create(&PostParams::default(), &cluster).await.unwrap();
    cso_testenv::kubeconfig_secret(&client, &ns, "c1", workload.control_plane.kubeconfig_yaml())
        .await
        .unwrap();

    // The addons cannot run: given up on after the stage timeout, and CsoAddonsNotRunning's expression (its
    // `for:` is for production) returns the Cluster's release.
    let (_, not_running) = alerts()
        .into_iter()
        .find(|(name, _)| name == "CsoAddonsNotRunning")
        .unwrap();
    wait_for(
        "CsoAddonsNotRunning's expression returns docker-ferrol-1-27-v1 (addons given up on after 20 s)",
        Duration::from_secs(120),
        || async {
            (releases_returned(&prometheus, &not_running).await == ["docker-ferrol-1-27-v1"]).then_some(())
        },
    )
    .await;
    // ... and the alert itself fires (the test copy, `for: 0s`) with the release and its severity.
    let firing = r#"ALERTS{alertname="CsoAddonsNotRunning", alertstate="firing"}"#;
    let alert = wait_for("CsoAddonsNotRunning fires", Duration::from_secs(30), || async {
        let result = query(&prometheus, firing).await;
        result.as_array().unwrap().first().cloned()
    })
    .await;
    assert_eq!(
        (
            &alert["metric"]["release"],
            &alert["metric"]["reason"],
            &alert["metric"]["severity"]
        ),
        (
            &json!("docker-ferrol-1-27-v1"),
            &json!("NotHealthyInTime"),
            &json!("warning")
        ),
        "{alert}"
    );
    let mut scrapes = metrics_text(endpoints.metrics_port).await;
    assert!(
        scrapes.contains(r#"reason="NotHealthyInTime""#),
        "cso_addons_not_running and cso_condition_false say why: {scrapes}"
    );

    // A node comes: the addons run, are found running at the next resync, and the expression returns nothing.
    let workload_client = workload.control_plane.client().await.unwrap();
    workload
        .runtime
        .add_nodes(
            &workload_client,
            &cso_testenv::NodeSpec::numbered("observability-node", 1),
        )
        .await
        .unwrap();
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    wait_for("the v1 addons run", Duration::from_secs(120), || async {
        let addon = addons.get_opt("cluster-addon-c1").await.unwrap()?;
        (addon.status?.ready && addon.spec.cluster_stack == "docker-ferrol-1-27-v1").then_some(())
    })
    .await;
    wait_for(
        "CsoAddonsNotRunning's expression returns nothing once the addons run",
        Duration::from_secs(30),
        || async {
            releases_returned(&prometheus, &not_running)
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    wait_for(
        "CsoAddonsNotRunning no longer fires once the addons run",
        Duration::from_secs(30),
        || async {
            releases_returned(&prometheus, firing)
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;

    // Upgrade the stack to v2 and move the Cluster to it; Cluster API's topology controller would then call
    // BeforeClusterUpgrade until it lets the upgrade go on: so does this test, over HTTPS.
    stacks
        .patch(
            "ferrol",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"versions": ["v1", "v2"]}})),
        )
        .await
        .unwrap();
    wait_for("v2 ready", Duration::from_secs(90), || async {
        ready(&client, &ns)
            .await
            .contains(&"docker-ferrol-1-27-v2".to_owned())
            .then_some(())
    })
    .await;
    clusters
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"topology": {"class": "docker-ferrol-1-27-v2"}}})),
        )
        .await
        .unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    let answers = std::sync::Mutex::new(Vec::new());
    wait_for(
        "BeforeClusterUpgrade to v2 answered with success",
        Duration::from_secs(90),
        || async {
            let answer =
                before_cluster_upgrade(&https, endpoints.hook_port, &ns, "docker-ferrol-1-27-v2").await;
            answers.lock().unwrap().push(answer["status"].clone());
            if answer["status"] == "Success" && answer["retryAfterSeconds"].as_i64().unwrap_or(0) == 0 {
                return Some(());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            None
        },
    )
    .await;
    wait_for("the v2 addons run", Duration::from_secs(120), || async {
        let addon = addons.get_opt("cluster-addon-c1").await.unwrap()?;
        (addon.status?.ready && addon.spec.cluster_stack == "docker-ferrol-1-27-v2").then_some(())
    })
    .await;

    // What the operator exported along the way: the families the important alerts use have samples, and
    // every name and label the rules and the dashboard use is there.
    let text = metrics_text(endpoints.metrics_port).await;
    for family in [
        "cso_clusters",
        "cso_addons_not_running",
        "cso_condition_false",
        "cso_hook_requests_total",
        "cso_hook_duration_seconds_bucket",
    ] {
        assert!(
            exported(&format!("{scrapes}\n{text}"))
                .get(family)
                .is_some_and(Option::is_some),
            "{family} has samples in this run: {scrapes}\n{text}"
        );
    }
    assert!(
        text.contains(
            r#"cso_clusters{stack="docker-ferrol-1-27",release="docker-ferrol-1-27-v2",state="ready"} 1"#
        ),
        "{text}"
    );
    scrapes.push('\n');
    scrapes.push_str(&text);
    let problems = missing(&expressions, &scrapes);
    assert!(
        problems.is_empty(),
        "{problems:#?}\nhook answers: {:?}\n{scrapes}",
        answers.lock().unwrap()
    );

    // Prometheus has scraped the operator, and every alert expression evaluates; with the addons running
    // and CsoMemoryNearLimit's kube-state-metrics side missing, none returns a series.
    // Its scrapes must include the run's end: the hook's Success answer (a scrape from before it sees the hook in
    // progress with no Success yet, which is what CsoHookHeld looks for) and the Cluster ready on v2.
    wait_for(
        "Prometheus scrapes cso run to its end",
        Duration::from_secs(30),
        || async {
            let scraped = |expr: &'static str| {
                let prometheus = &prometheus;
                async move { !query(prometheus, expr).await.as_array().unwrap().is_empty() }
            };
            (scraped(r#"cso_hook_requests_total{hook="BeforeClusterUpgrade",result="success"}"#).await
                && scraped(r#"cso_clusters{release="docker-ferrol-1-27-v2",state="ready"} == 1"#).await)
                .then_some(())
        },
    )
    .await;
    for (alert, expr) in alerts() {
        let result = query(&prometheus, &expr).await;
        assert_eq!(result, json!([]), "{alert} on a healthy operator: {result}");
    }
    // The test copy of the rules was loaded and evaluated, and nothing fires at the end.
    let groups = reqwest::get(format!("{prometheus}/api/v1/rules"))
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    let loaded = groups["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter(|r| r["health"] == "ok")
        .count();
    assert_eq!(
        loaded,
        alerts().len(),
        "every alert rule loaded and evaluated: {groups}"
    );
    wait_for("no alert fires at the end", Duration::from_secs(30), || async {
        let result = query(&prometheus, r#"ALERTS{alertstate="firing"}"#).await;
        result.as_array().unwrap().is_empty().then_some(())
    })
    .await;
    for expr in panel_expressions() {
        query(&prometheus, &expr).await;
    }
    workload.stop();
}
