//! Values templating: `cluster-addon-values.yaml` and a stage's `overwrite.yaml` are Go templates over
//! `{Cluster, ControlPlane, InfraCluster}` (the objects as JSON maps, e.g. `.Cluster.spec.controlPlaneEndpoint.host`).
//!
//! The engine is Helm's own (`tpl` inside a one-file helper chart): Go `text/template` with sprig, exactly
//! as stacks are written for. Helm does not define `env` or `expandenv` and answers `getHostByName` with
//! nothing, so a stack cannot read the operator's environment (its credentials) or probe the network.
//! Differences from the Go operator, which used plain `text/template`: a missing key renders as an empty
//! string instead of the text `<no value>`, and Helm's extra functions (`toYaml`, `required`, ...) exist.
//!
//! The result: when the rendered YAML is a map whose `values` key is a string, that string is the Helm
//! values; otherwise the whole rendered text is. Anything but a map is an error.

use std::path::Path;

use base64::Engine;
use serde_json::Value;

use crate::{ChartRenderer, Helm, RenderError, RenderRequest};

const HELPER_CHART: &str = "apiVersion: v2\nname: cluster-addon-values\nversion: 0.1.0\n";
/// Helm reads every template's output as YAML; the result travels base64-encoded in a map so that any
/// output (a list, plain text) reaches our own checks byte for byte.
const HELPER_TEMPLATE: &str = "rendered: {{ tpl .Values.template .Values.data | b64enc | quote }}\n";

/// Why a values file could not be turned into Helm values.
#[derive(Debug, thiserror::Error)]
pub enum ValuesError {
    #[error("{file}: {message}")]
    Template { file: String, message: String },
    #[error("{file}: the rendered values are {what}, not a map of Helm values")]
    NotAMap { file: String, what: String },
    #[error("{file}: the rendered values are not valid YAML: {error}")]
    Yaml { file: String, error: String },
    #[error("failed to set up the values templater: {0}")]
    Setup(std::io::Error),
}

/// Renders values templates with Helm.
#[derive(Debug)]
pub struct ValuesTemplater {
    helm: Helm,
    chart: tempfile::TempDir,
}

impl ValuesTemplater {
    pub fn new(helm: Helm) -> Result<Self, ValuesError> {
        let chart = tempfile::Builder::new()
            .prefix("cso-values-chart-")
            .tempdir()
            .map_err(ValuesError::Setup)?;
        std::fs::create_dir(chart.path().join("templates")).map_err(ValuesError::Setup)?;
        std::fs::write(chart.path().join("Chart.yaml"), HELPER_CHART).map_err(ValuesError::Setup)?;
        std::fs::write(chart.path().join("templates/values.yaml"), HELPER_TEMPLATE)
            .map_err(ValuesError::Setup)?;
        Ok(ValuesTemplater { helm, chart })
    }

    /// Renders `template` (the text of `file`, named in errors) over `data` and returns the Helm values.
    pub async fn render(&self, file: &Path, template: &str, data: &Value) -> Result<String, ValuesError> {
        let file_name = file.display().to_string();
        let input = serde_json::json!({ "template": template, "data": data });
        let rendered = self
            .helm
            .render(RenderRequest {
                chart: self.chart.path().to_path_buf(),
                release_name: "values".into(),
                namespace: "default".into(),
                values: Some(input.to_string()),
                ..Default::default()
            })
            .await
            .map_err(|e| ValuesError::Template {
                file: file_name.clone(),
                message: template_message(e),
            })?;
        let encoded = rendered
            .lines()
            .find_map(|l| l.strip_prefix("rendered: "))
            .map(|v| v.trim().trim_matches('"'))
            .unwrap_or_default();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| ValuesError::Template {
                file: file_name.clone(),
                message: format!("unexpected helm output: {e}"),
            })?;
        let text = String::from_utf8(bytes).map_err(|_| ValuesError::Template {
            file: file_name.clone(),
            message: "the rendered values are not UTF-8".into(),
        })?;
        // Helm's own output replaces `<no value>`; the encoded text escaped that, so do it here.
        extract_values(&file_name, &text.replace("<no value>", ""))
    }
}

/// The `values:` string of a rendered map, or the whole text.
pub fn extract_values(file: &str, rendered: &str) -> Result<String, ValuesError> {
    let parsed: Option<Value> = serde_saphyr::from_str(rendered).map_err(|e| ValuesError::Yaml {
        file: file.to_owned(),
        error: e.to_string(),
    })?;
    match parsed {
        Some(Value::Object(map)) => match map.get("values") {
            Some(Value::String(values)) => Ok(values.clone()),
            _ => Ok(rendered.to_owned()),
        },
        None | Some(Value::Null) => Err(ValuesError::NotAMap {
            file: file.to_owned(),
            what: "empty".into(),
        }),
        Some(other) => Err(ValuesError::NotAMap {
            file: file.to_owned(),
            what: format!("{other}"),
        }),
    }
}

/// Helm's message without the helper chart's own frames.
fn template_message(error: RenderError) -> String {
    let text = error.to_string();
    let text = text
        .split_once("error calling tpl: ")
        .map_or(text.as_str(), |(_, rest)| rest);
    let text = text.split("\n\nUse --debug").next().unwrap_or(text);
    text.replace("cluster-addon-values/templates/values.yaml", "values template")
        .trim()
        .to_owned()
}
