//! Values templating: `cluster-addon-values.yaml` and a stage's `overwrite.yaml` are Go templates over
//! `{Cluster, ControlPlane, InfraCluster}` (the objects as JSON maps, e.g. `.Cluster.spec.controlPlaneEndpoint.host`).
//!
//! The engine is Helm's own (`tpl` inside a one-file helper chart): Go `text/template` with sprig, exactly
//! as stacks are written for; the chart is rendered by a `helm` process or by the long-lived renderer
//! ([`crate::Engine`], which carries the same chart), and read by one rule for both. Helm does not define `env` or `expandenv` and answers `getHostByName` with
//! nothing, so a stack cannot read the operator's environment (its credentials) or probe the network.
//! Differences from the Go operator, which used plain `text/template`: a missing key renders as an empty
//! string instead of the text `<no value>`, and Helm's extra functions (`toYaml`, `required`, ...) exist.
//!
//! The result: when the rendered YAML is a map whose `values` key is a string, that string is the Helm
//! values; otherwise the whole rendered text is. Anything but a map is an error.
//!
//! One values input may cost only so much: a values file over [`MAX_VALUES_FILE_BYTES`] is not read, and
//! rendered values over [`MAX_RENDERED_VALUES_BYTES`] are refused (a 50 MB values file made the operator
//! peak at 440 MB and its helm at 1 GB; the operator's Helm chart allows the container 256 MiB).

use std::path::Path;

use base64::Engine as _;
use serde_json::Value;

use crate::{ChartRenderer, Engine, Helm, RenderError, RenderRequest, helm::human_bytes};

/// The largest values file (`cluster-addon-values.yaml`, a stage's `overwrite.yaml`) that is read: 1 MiB.
/// Real stacks' values files have a few kilobytes.
pub const MAX_VALUES_FILE_BYTES: usize = 1 << 20;
/// The largest rendered values handed to helm: 4 MiB (a template may grow, within reason, as it loops).
pub const MAX_RENDERED_VALUES_BYTES: usize = 4 << 20;

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
    #[error("failed to read {file}: {error}")]
    Read { file: String, error: std::io::Error },
    #[error("{file}: {}", too_large(.what, *.size, *.limit))]
    TooLarge {
        file: String,
        /// `the values file` or `the rendered values`.
        what: &'static str,
        /// The size, when known (helm output over its own limit was not read to the end).
        size: Option<u64>,
        limit: usize,
    },
}

fn too_large(what: &str, size: Option<u64>, limit: usize) -> String {
    let size = match size {
        Some(size) => format!("has {size} bytes"),
        None => "has more".into(),
    };
    format!(
        "{what} {size}, over the limit of {limit} bytes ({}) for one values input; it is refused",
        human_bytes(limit)
    )
}

/// Reads a values file, refusing one over [`MAX_VALUES_FILE_BYTES`] without reading it.
pub async fn read_values_file(file: &Path) -> Result<String, ValuesError> {
    read_bounded(file, MAX_VALUES_FILE_BYTES).await
}

async fn read_bounded(file: &Path, limit: usize) -> Result<String, ValuesError> {
    use tokio::io::AsyncReadExt;
    let name = file.display().to_string();
    let read_error = |error| ValuesError::Read {
        file: name.clone(),
        error,
    };
    let too_large = |size| ValuesError::TooLarge {
        file: name.clone(),
        what: "the values file",
        size: Some(size),
        limit,
    };
    let opened = tokio::fs::File::open(file).await.map_err(read_error)?;
    let size = opened.metadata().await.map_err(read_error)?.len();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX);
    if size > cap {
        return Err(too_large(size));
    }
    let mut bytes = Vec::new();
    // The file may grow after the size was read: never more than the limit (and one byte to tell).
    opened
        .take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .await
        .map_err(read_error)?;
    if bytes.len() > limit {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| {
        read_error(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            e.utf8_error(),
        ))
    })
}

/// Renders values templates with Helm's engine: a `helm` process per file, or the long-lived [`Engine`].
#[derive(Debug)]
pub struct ValuesTemplater {
    backend: Backend,
}

/// Where the helper chart is rendered. Both answer what `helm template` prints for it; everything after
/// that (decoding, limits, errors, the values rule) is [`ValuesTemplater::render`]'s, for both.
#[derive(Debug)]
enum Backend {
    /// `helm template` of the helper chart, written to a private directory.
    Helm { helm: Helm, chart: tempfile::TempDir },
    /// The same chart inside the long-lived renderer.
    Engine(Engine),
}

/// The most `helm template` of the helper chart may print: the rendered values come back base64-encoded (a
/// third more), with a little for the map around them.
const ENCODED_LIMIT: usize = MAX_RENDERED_VALUES_BYTES.div_ceil(3) * 4 + 1024;

impl ValuesTemplater {
    /// Values templating through `helm` processes.
    pub fn new(helm: Helm) -> Result<Self, ValuesError> {
        let chart = tempfile::Builder::new()
            .prefix("cso-values-chart-")
            .tempdir()
            .map_err(ValuesError::Setup)?;
        std::fs::create_dir(chart.path().join("templates")).map_err(ValuesError::Setup)?;
        std::fs::write(chart.path().join("Chart.yaml"), HELPER_CHART).map_err(ValuesError::Setup)?;
        std::fs::write(chart.path().join("templates/values.yaml"), HELPER_TEMPLATE)
            .map_err(ValuesError::Setup)?;
        let limit = ENCODED_LIMIT.min(helm.output_limit());
        let helm = helm.with_output_limit(limit);
        Ok(ValuesTemplater {
            backend: Backend::Helm { helm, chart },
        })
    }

    /// Values templating in the long-lived renderer (which carries the same helper chart); `engine` may be a
    /// clone of the chart renderer's, sharing its process.
    pub fn with_engine(engine: Engine) -> Self {
        ValuesTemplater {
            backend: Backend::Engine(engine),
        }
    }

    /// What `helm template` prints for the helper chart with these values.
    async fn render_helper(
        &self,
        input: &Value,
        template: &str,
        data: &Value,
    ) -> Result<String, RenderError> {
        match &self.backend {
            Backend::Helm { helm, chart } => {
                helm.render(RenderRequest {
                    chart: chart.path().to_path_buf(),
                    release_name: "values".into(),
                    namespace: "default".into(),
                    values: Some(input.to_string()),
                    ..Default::default()
                })
                .await
            }
            Backend::Engine(engine) => {
                let limit = ENCODED_LIMIT.min(engine.output_limit());
                engine.template_values(template, data, limit).await
            }
        }
    }

    /// Renders `template` (the text of `file`, named in errors) over `data` and returns the Helm values.
    pub async fn render(&self, file: &Path, template: &str, data: &Value) -> Result<String, ValuesError> {
        let file_name = file.display().to_string();
        if template.len() > MAX_VALUES_FILE_BYTES {
            return Err(ValuesError::TooLarge {
                file: file_name,
                what: "the values file",
                size: Some(template.len() as u64),
                limit: MAX_VALUES_FILE_BYTES,
            });
        }
        let rendered_too_large = |size| ValuesError::TooLarge {
            file: file_name.clone(),
            what: "the rendered values",
            size,
            limit: MAX_RENDERED_VALUES_BYTES,
        };
        let input = serde_json::json!({ "template": template, "data": data });
        let rendered = self
            .render_helper(&input, template, data)
            .await
            .map_err(|e| match e {
                RenderError::OutputTooLarge { .. } => rendered_too_large(None),
                e => ValuesError::Template {
                    file: file_name.clone(),
                    message: template_message(e),
                },
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
        if bytes.len() > MAX_RENDERED_VALUES_BYTES {
            return Err(rendered_too_large(Some(bytes.len() as u64)));
        }
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

/// Helm's message without the helper chart's own frames (nor where the chart lies: a private directory for
/// `helm`, inside the process for the engine).
fn template_message(error: RenderError) -> String {
    let text = match error {
        RenderError::Failed { stderr, .. } => stderr,
        error => error.to_string(),
    };
    let text = text
        .split_once("error calling tpl: ")
        .map_or(text.as_str(), |(_, rest)| rest);
    let text = text.split("\n\nUse --debug").next().unwrap_or(text);
    text.replace("cluster-addon-values/templates/values.yaml", "values template")
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::time::Duration;

    use super::*;

    fn templater() -> ValuesTemplater {
        let helm = cso_testenv::Tools::discover()
            .unwrap()
            .helm
            .expect("helm (make tools)");
        ValuesTemplater::new(Helm::new(helm, Duration::from_secs(60)).unwrap()).unwrap()
    }

    #[tokio::test]
    async fn a_values_file_over_the_limit_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cluster-addon-values.yaml");
        let line = format!("# {}\n", "x".repeat(97));
        std::fs::write(&file, line.repeat(MAX_VALUES_FILE_BYTES / line.len())).unwrap();
        assert!(read_values_file(&file).await.is_ok(), "under the limit");

        std::fs::write(&file, line.repeat(MAX_VALUES_FILE_BYTES / line.len() + 1)).unwrap();
        let error = read_values_file(&file).await.unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(
                error,
                ValuesError::TooLarge {
                    size: Some(1_048_600),
                    limit: MAX_VALUES_FILE_BYTES,
                    ..
                }
            ),
            "{message}"
        );
        assert!(
            message.contains("cluster-addon-values.yaml"),
            "names the file: {message}"
        );
        assert!(
            message.contains("1048576 bytes (1 MiB)"),
            "names the limit: {message}"
        );

        let missing = read_values_file(&dir.path().join("overwrite.yaml"))
            .await
            .unwrap_err();
        assert!(matches!(missing, ValuesError::Read { .. }), "{missing}");
    }

    #[tokio::test]
    async fn rendered_values_over_the_limit_are_refused() {
        let templater = templater();
        let file = Path::new("cluster-addon-values.yaml");
        // 5 MiB from a one-line template.
        let error = templater
            .render(file, "big: {{ repeat 5242880 \"x\" }}\n", &serde_json::json!({}))
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                ValuesError::TooLarge {
                    what: "the rendered values",
                    limit: MAX_RENDERED_VALUES_BYTES,
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("(4 MiB)"), "{error}");

        // Far more than helm's output may carry: stopped at helm's limit, reported the same way.
        let error = templater
            .render(file, "big: {{ repeat 50000000 \"x\" }}\n", &serde_json::json!({}))
            .await
            .unwrap_err();
        assert!(
            matches!(error, ValuesError::TooLarge { size: None, .. }),
            "{error}"
        );

        let template = "#".repeat(MAX_VALUES_FILE_BYTES + 1);
        let error = templater
            .render(file, &template, &serde_json::json!({}))
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                ValuesError::TooLarge {
                    what: "the values file",
                    ..
                }
            ),
            "{error}"
        );

        let fine = templater
            .render(file, "values: |\n  k: {{ .x }}\n", &serde_json::json!({"x": "v"}))
            .await
            .unwrap();
        assert_eq!(fine, "k: v\n");
    }
}
