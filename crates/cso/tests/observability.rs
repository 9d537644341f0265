//! The chart's alert rules and Grafana dashboard against what the operator exports: `promtool check rules` and
//! `promtool test rules` (each alert fires from synthetic series and stays silent on healthy ones); `cso run`
//! through an install and an upgrade of a ClusterStack on a real API server, whose /metrics must have every
//! metric name a rule expression or a dashboard panel uses, with the labels they use (label matchers, `by`,
//! `on`, ...); and a real Prometheus (Debian's package) scraping that `cso run` every second and evaluating every
//! alert expression through its HTTP API. promtool and prometheus come from hack/tools.sh (`CSO_PROMTOOL`,
//! `CSO_PROMETHEUS`); a missing one fails the test.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use cso_api::ClusterStack;
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
    assert_eq!(alerts().len(), 10);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_dashboard_use_what_the_operator_exports_and_prometheus_evaluates_them() {
    let prometheus_binary = tools().prometheus.expect(
        "prometheus not found: run `make tools` (hack/tools.sh installs Debian's prometheus package)",
    );
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "observability").await.unwrap();
    let fake = github_with_ferrol().await;
    let release_dir = tempfile::tempdir().unwrap();
    let log = release_dir.path().join("operator.log");
    let certs = tempfile::tempdir().unwrap();
    cso_testenv::pki::write_serving_certificate(certs.path()).unwrap();
    let endpoints = Instance::new(certs.path(), true);
    let _operator = start_operator(
        plane.kubeconfig_path(),
        release_dir.path(),
        &ns,
        fake.api_url(),
        &log,
        &endpoints,
    );

    // A real Prometheus scraping it every second, with its own storage.
    let prometheus_dir = tempfile::tempdir().unwrap();
    let prometheus_port = free_port();
    std::fs::write(
        prometheus_dir.path().join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
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

    // Install v1, then upgrade the stack to v2.
    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), &ns);
    stacks
        .create(&PostParams::default(), &ferrol_stack(&ns, &["v1"]))
        .await
        .unwrap();
    wait_for("v1 ready", Duration::from_secs(90), || async {
        (ready(&client, &ns).await == ["docker-ferrol-1-27-v1"]).then_some(())
    })
    .await;
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

    let text = metrics_text(endpoints.metrics_port).await;
    let mut expressions: Vec<String> = alerts().into_iter().map(|(_, expr)| expr).collect();
    expressions.extend(panel_expressions());
    let problems = missing(&expressions, &text);
    assert!(problems.is_empty(), "{problems:#?}\n{text}");

    // Prometheus has scraped the operator, and every alert expression evaluates; on this healthy run only
    // CsoMemoryNearLimit's kube-state-metrics side is missing, so nothing returns a series.
    wait_for("Prometheus scrapes cso run", Duration::from_secs(30), || async {
        (!query(&prometheus, "cso_releases_cached")
            .await
            .as_array()
            .unwrap()
            .is_empty())
        .then_some(())
    })
    .await;
    for (alert, expr) in alerts() {
        let result = query(&prometheus, &expr).await;
        assert_eq!(result, json!([]), "{alert} on a healthy operator: {result}");
    }
    for expr in panel_expressions() {
        query(&prometheus, &expr).await;
    }
}
