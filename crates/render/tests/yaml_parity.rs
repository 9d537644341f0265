//! The manifest parser reads YAML exactly as Helm, kubectl and the Go operator read it: every chart (and
//! stage chart) of every fixture release, rendered by `helm template`, and a corpus of YAML corners, parsed by
//! `parse_manifests` give the same objects as go-yaml itself gives for the same text: hack/tools.sh's
//! `yaml2json` (k8s.io/apimachinery's YAMLReader splits the stream as kubectl does, sigs.k8s.io/yaml
//! converts each document as `YAMLToJSON` does, on Helm 3's go-yaml v2). And the stacks' column-0 quoted
//! scalar that a YAML 1.2 parser refuses renders and applies into a real API server.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use cso_apply::{ApplyEngine, ClusterDiscovery, DEFAULT_FIELD_MANAGER};
use cso_render::{ChartRenderer, Helm, RenderRequest, ValuesTemplater, parse_manifests};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{Value, json};

/// The minimal reproduction of the OpenStack `scs` 1.32 stack's template.
const COLUMN_ZERO_QUOTED: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: yamlq\ndata:\n  k: \"first line\nsecond line\"\n";

fn tools() -> cso_testenv::Tools {
    cso_testenv::Tools::discover().unwrap()
}

fn helm() -> Helm {
    let binary = tools().helm.expect("helm: run `make tools`");
    Helm::new(binary, Duration::from_secs(120)).unwrap()
}

fn releases() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases")
}

/// What go-yaml makes of a stream: the objects kubectl and Helm would send (empty documents left out), or
/// go-yaml's error.
fn go_yaml(text: &str) -> Result<Vec<Value>, String> {
    let documents: Vec<Value> = serde_json::from_str(&go_yaml_json(text)?).unwrap();
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

/// yaml2json's answer: a JSON array of the documents, or the error.
fn go_yaml_json(text: &str) -> Result<String, String> {
    let binary = tools()
        .yaml2json
        .expect("yaml2json: run `make tools` (hack/tools.sh builds it)");
    let mut child = Command::new(&binary)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = text.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    Ok(String::from_utf8(output.stdout).unwrap())
}

/// What cso makes of it.
fn cso(text: &str) -> Result<Vec<Value>, String> {
    parse_manifests(text)
        .map(|manifests| manifests.into_iter().map(|m| m.object).collect())
        .map_err(|e| e.to_string())
}

/// The first place two values differ, for a readable failure.
fn first_difference(ours: &Value, theirs: &Value, path: &str) -> Option<String> {
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys()) {
                let here = format!("{path}.{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => {
                        if let Some(d) = first_difference(x, y, &here) {
                            return Some(d);
                        }
                    }
                    (x, y) => return Some(format!("{here}: cso {x:?}, go-yaml {y:?}")),
                }
            }
            None
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, &format!("{path}[{i}]"))),
        _ => (ours != theirs).then(|| format!("{path}: cso {ours}, go-yaml {theirs}")),
    }
}

/// Both read `text` to the same objects, or both refuse it: how many objects, or what differs.
fn compare(what: &str, text: &str) -> Result<usize, String> {
    match (cso(text), go_yaml(text)) {
        (Ok(ours), Ok(theirs)) => {
            if ours.len() != theirs.len() {
                return Err(format!(
                    "{what}: cso read {} objects, go-yaml {}",
                    ours.len(),
                    theirs.len()
                ));
            }
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                if let Some(difference) = first_difference(a, b, "") {
                    return Err(format!("{what}: object {} differs at {difference}", i + 1));
                }
            }
            Ok(ours.len())
        }
        (Err(_), Err(_)) => Ok(0),
        (ours, theirs) => Err(format!("{what}: cso {ours:?}, go-yaml {theirs:?}")),
    }
}

fn assert_same(what: &str, text: &str) -> usize {
    compare(what, text).unwrap_or_else(|e| panic!("{e}"))
}

fn unpack(archive: &Path, into: &Path) {
    let file = std::fs::File::open(archive).unwrap();
    tar::Archive::new(flate2::read::GzDecoder::new(file))
        .unpack(into)
        .unwrap();
}

fn kubernetes_version(release: &Path) -> Option<String> {
    let metadata = std::fs::read_to_string(release.join("metadata.yaml")).ok()?;
    metadata
        .lines()
        .find_map(|l| l.trim().strip_prefix("kubernetes:"))
        .map(|v| v.trim().to_owned())
}

/// The values a controller would give the addon chart of a single-chart release.
async fn addon_values(release: &Path) -> Option<String> {
    let template = std::fs::read_to_string(release.join("cluster-addon-values.yaml")).ok()?;
    let cluster = json!({
        "Cluster": {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
                    "metadata": {"name": "c1", "namespace": "team"},
                    "spec": {"controlPlaneEndpoint": {"host": "10.1.2.3", "port": 6443}}}
    });
    Some(
        ValuesTemplater::new(helm())
            .unwrap()
            .render(Path::new("cluster-addon-values.yaml"), &template, &cluster)
            .await
            .unwrap(),
    )
}

#[tokio::test]
async fn every_fixture_chart_reads_as_helm_and_kubectl_read_it() {
    let helm = helm();
    let mut checked = BTreeMap::new();
    let mut releases: Vec<_> = std::fs::read_dir(releases())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    releases.sort();
    for release in releases {
        let values = addon_values(&release).await;
        let mut archives: Vec<_> = std::fs::read_dir(&release)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "tgz"))
            .collect();
        archives.sort();
        for archive in archives {
            let dir = tempfile::tempdir().unwrap();
            unpack(&archive, dir.path());
            // Each top-level directory with a Chart.yaml: the archive's chart, or one stage's.
            let mut charts: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.join("Chart.yaml").is_file())
                .collect();
            charts.sort();
            for chart in charts {
                let is_addon = archive.to_string_lossy().contains("cluster-addon");
                let mut variants = vec![None];
                if is_addon && values.is_some() {
                    variants.push(values.clone());
                }
                for values in variants {
                    let with_values = values.is_some();
                    let rendered = helm
                        .render(RenderRequest {
                            chart: chart.clone(),
                            release_name: "parity".into(),
                            namespace: "kube-system".into(),
                            values,
                            kube_version: kubernetes_version(&release),
                            include_crds: true,
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                    let name = format!(
                        "{}/{}/{}{}",
                        release.file_name().unwrap().to_string_lossy(),
                        archive.file_name().unwrap().to_string_lossy(),
                        chart.file_name().unwrap().to_string_lossy(),
                        if with_values { " (release values)" } else { "" }
                    );
                    let objects = assert_same(&name, &rendered);
                    assert!(objects > 0, "{name}: rendered nothing");
                    checked.insert(name, objects);
                }
            }
        }
    }
    println!("{checked:#?}");
    // 5 releases: 5 cluster-class charts, the ferrol addon (3 releases, each with and without its values),
    // ngnix and metrics-server of the hash release, and the scs stages cni (Cilium) and metrics-server.
    assert!(checked.len() >= 15, "{checked:#?}");
    assert!(
        checked.keys().any(|k| k.ends_with("/cni")),
        "the Cilium stage chart: {checked:#?}"
    );
}

/// Corners of YAML that charts produce or could, each a document kubectl would apply.
#[test]
fn yaml_corners_read_as_go_yaml_reads_them() {
    let head = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n";
    let bodies = [
        // Quoted scalars: column-0 continuations, folding, escapes, blank lines.
        "data:\n  k: \"first line\nsecond line\"\n",
        "data:\n  k: 'first line\nsecond line'\n",
        "data:\n  k: \"a\n\n  b\\\n  c \\x41\\u00e9\\U0001F600 \\t\\\\\\\" \\N\\_\\L\\P\\0\\e\"\n",
        "data:\n  k: \"trailing   \n   spaces\"\n",
        "data:\n  k: 'it''s'\n",
        // Plain multi-line scalars and comments.
        "data:\n  k: first\n    second\n\n    third # comment\n",
        // Block scalars with every chomping and an indentation indicator.
        "data:\n  a: |\n    x\n      y\n\n  b: |-\n    x\n\n  c: |+\n    x\n\n  d: >\n    folded\n    text\n\n    para\n  e: >-\n     indented\n    x\n  f: |2\n     two\n",
        // YAML 1.1 scalars (go-yaml v2) and Go's number syntax.
        "v: [yes, No, on, OFF, y, n, true, ~, null, '', 0755, 0o17, 0x1F, 0b101, -0b11, +12, 1_000, 09, 1.0, 1e3, .5, -.5e1, 5., 1e400, 12:30:00, 2001-12-14, 2001-12-14T21:59:43Z, .inf2, 0x, -, +, .]\n",
        "v: [9223372036854775807, 9223372036854775808, 18446744073709551615, 18446744073709551616, -9223372036854775808, -9223372036854775809, 1e19, 1e20, 1e21, 0.000001, 0.0000001, -0.0, 0.1, 123456789012345678]\n",
        // Tags.
        "v: [!!str 12, !!int '7', !!float 3, !!bool yes, !!null '', !!binary aGVsbG8=, !custom 5, ! 5, !!timestamp 2001-12-14, !<tag:yaml.org,2002:int> 8]\n",
        "%TAG !e! tag:yaml.org,2002:\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\nv: !e!int 12\n",
        // Keys of every type go-yaml allows.
        "v: {1: a, -2: b, 1.5: c, 1e6: d, 0.00001: e, true: f, no: g, 0x10: h, .inf: i, 2001-12-14: j, 3.0: k, 16777217.0: l}\n",
        // Anchors, aliases, merge keys.
        "base: &b {a: 1, b: [1, 2]}\nv: {<<: *b, c: 3}\nw: {c: 3, <<: [*b, {a: 9, d: 4}]}\nx: [*b, *b]\ny: &s str\nz: *s\n",
        "v: {a: 1, !!merge <<: {a: 2, b: 2}}\nw: {'<<': {a: 1}}\n",
        // Repeated keys: the last wins.
        "v: {a: 1, a: 2}\nv: 3\n",
        // Flow collections, empty values, complex keys.
        "v: {a: [1, {b: c}], d: , e: {}, f: []}\nw: [a, [b, [c]], {x: y}]\nx:\n? k\n: v\n",
        "v:\n- a\n-\n- - b\n  - c\n- d: e\n  f: g\n",
        // Documents: markers, comments, directive, end marker, CRLF.
        "v: 1\n...\n",
        "v: 1\r\nw: \"a\r\n b\"\r\n",
        "# only a comment\nv: x # trailing\n",
        "v: \"unicode: é ü 日本\"\nw: ☃\n",
        "v: a:b\nw: 'a: b'\nx: a #b\ny: http://x/y?z=1#frag\n",
        "v: [a:b, {c:d}]\n",
        "v: {\"json\": \"style\", \"n\": [1, 2.5, true, null]}\n",
        "v: \ttabbed\n",
        "v: !!binary |\n  aGVs\n  bG8=\n",
        "v: 'multi\n\n  line'\nw: >\n\n  folded after a blank\nx: \"\\\n  escaped break\"\n",
        "v: !!set {a, b}\nw: !!omap [a: 1, b: 2]\nx: !!seq [1]\ny: !!map {}\n",
        "v: &k key\n*k : aliased key\n&v w: anchored key\n",
        "v:\tx\nw: -a\nx: - a\n",
        "v:\n  - - - a\n    - b\n  -   c: d\n      e: f\n",
        "v: \"\\x00\\u0000 nul\"\n",
        // Refused by both.
        "v: [\n",
        "v: *missing\n",
        "v: &a [*a]\n",
        "? [a]\n: b\n",
        "v: {~: b}\n",
        "v: .nan\n",
        "v: !!int x\n",
        "v: {<<: 1}\n",
        "v: \"bad \\q escape\"\n",
        "v: x\n  - y\n",
        "v: @reserved\n",
        "v: !!binary '@@@'\n",
        "v: 'a'b\n",
        "v: {a: 1\n",
        "v: [a, b]]\n",
        "  v: 1\n w: 2\n",
        "v: |\n  a\n b\n",
        "v: {<<: [*x]}\n",
        "v: &x 1\nw: {<<: *x}\n",
        "v: {<<: [{a: 1}, 2]}\n",
    ];
    let mut texts: Vec<String> = bodies
        .iter()
        .map(|body| {
            if body.starts_with('%') {
                (*body).to_owned()
            } else {
                format!("{head}{body}")
            }
        })
        .collect();
    // Streams: separators as kubectl splits them, Helm's comment headers, empty documents.
    texts.push(format!("{head}{}: long key\n", "k".repeat(1100)));
    texts.push(format!("\u{feff}{head}v: bom\n"));
    texts.extend([
        format!(
            "---\n# Source: a.yaml\n{head}---\n# Source: empty.yaml\n---   \n{head}--- # comment\n{head}"
        ),
        format!("{head}---\n---\n\n---\n{head}"),
        format!("{head}--- x\n{head}"),
        format!("---\n{COLUMN_ZERO_QUOTED}---\n{COLUMN_ZERO_QUOTED}"),
    ]);
    let differences: Vec<String> = texts
        .iter()
        .filter_map(|text| compare(&format!("{text:?}"), text).err())
        .collect();
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    let repro = cso(COLUMN_ZERO_QUOTED).unwrap();
    assert_eq!(repro[0]["data"]["k"], "first line second line");
}

/// Where cso and go-yaml are known to differ (docs/decisions.md), each kept as it is so that a change shows.
#[test]
fn known_differences_from_go_yaml() {
    let head = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n";
    // `\/` is an escape of YAML 1.2 and libyaml 0.2 that go-yaml v2 does not know: cso reads more.
    let escaped_slash = format!("{head}v: \"a\\/b\"\n");
    assert_eq!(cso(&escaped_slash).unwrap()[0]["v"], "a/b");
    assert!(go_yaml(&escaped_slash).unwrap_err().contains("unknown escape"));
    // A tag directly followed by `,` in a flow collection: go-yaml puts the tag on the next entry,
    // libyaml-safer panics (caught): cso refuses the document.
    let tag_comma = format!("{head}v: [!!str, a]\n");
    assert_eq!(go_yaml(&tag_comma).unwrap()[0]["v"], json!(["a"]));
    assert!(cso(&tag_comma).unwrap_err().contains("YAML parser failed"));
    // Nesting: cso stops at 500 levels (its stack), go-yaml at 10000.
    let deep = format!("{head}v: {}1{}\n", "[".repeat(600), "]".repeat(600));
    assert!(go_yaml_json(&deep).is_ok());
    assert!(cso(&deep).unwrap_err().contains("max depth"));
}

/// The reproduction as a chart template: `helm template` renders it, cso parses it, the apply engine puts it
/// into a real API server, and the ConfigMap holds what kubectl would have written.
#[tokio::test]
async fn a_column_zero_quoted_scalar_renders_and_applies() {
    let chart = tempfile::tempdir().unwrap();
    std::fs::write(
        chart.path().join("Chart.yaml"),
        "apiVersion: v2\nname: yamlq\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::create_dir(chart.path().join("templates")).unwrap();
    std::fs::write(chart.path().join("templates/cm.yaml"), COLUMN_ZERO_QUOTED).unwrap();

    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "yamlq").await.unwrap();
    let rendered = helm()
        .render(RenderRequest {
            chart: chart.path().to_path_buf(),
            release_name: "yamlq".into(),
            namespace: ns.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_same("the rendered reproduction", &rendered);
    let manifests = parse_manifests(&rendered).unwrap();
    let engine = ApplyEngine::new(
        Arc::new(ClusterDiscovery::new(client.clone())),
        DEFAULT_FIELD_MANAGER,
    );
    let labels = [(cso_api::names::RELEASE_LABEL.to_owned(), "yamlq-v1".to_owned())].into();
    let report = engine.apply(&manifests, &ns, &labels, &[]).await;
    assert!(report.is_complete(), "{}", report.failure_summary());

    let config_map = kube::Api::<ConfigMap>::namespaced(client, &ns)
        .get("yamlq")
        .await
        .unwrap();
    assert_eq!(
        config_map.data.unwrap().get("k").map(String::as_str),
        Some("first line second line")
    );
}
