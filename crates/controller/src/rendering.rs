//! How a release's charts are rendered, in one place for the controllers and for `cso render`: the
//! cluster-class chart for the management cluster, and the addon charts (values templated over the Cluster)
//! for a workload cluster, with the labels their objects are applied with.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use cso_api::names::RELEASE_LABEL;
use cso_release::{Release, addon_config::Stage};
use cso_render::{ChartRenderer, Manifest, RenderRequest, ValuesTemplater, parse_manifests};
use serde_json::Value;

/// The namespace of addon objects that have none (as the Go operator renders them).
pub const ADDON_NAMESPACE: &str = "kube-system";
/// The Helm release name of addon charts.
const ADDON_RELEASE_NAME: &str = "cluster-addon";

/// Renders `request` and parses the objects: the one render-and-parse path of the controllers and
/// `cso render`. The error is the renderer's or the parser's message.
pub async fn render(renderer: &dyn ChartRenderer, request: RenderRequest) -> Result<Vec<Manifest>, String> {
    let text = renderer.render(request).await.map_err(|e| e.to_string())?;
    parse_manifests(&text).map_err(|e| e.to_string())
}

/// The cluster-class chart of `release`, for the ClusterStackRelease's namespace.
pub fn cluster_class_request(release: &Release, namespace: &str) -> RenderRequest {
    RenderRequest {
        chart: release.cluster_class_chart.clone(),
        release_name: release.id.stack_prefix(),
        namespace: namespace.to_owned(),
        ..Default::default()
    }
}

/// An addon chart (the whole addon archive, or one stage's chart directory) with its templated values,
/// rendered against the workload cluster of `target_kubeconfig` when given, for Kubernetes `kube_version`
/// (`--kube-version`; the release's own version when `None`: a stage of an upgrade step renders for that
/// step's version).
pub fn addon_request(
    release: &Release,
    chart: &Path,
    values: Option<String>,
    target_kubeconfig: Option<PathBuf>,
    kube_version: Option<&str>,
) -> RenderRequest {
    RenderRequest {
        chart: chart.to_path_buf(),
        release_name: ADDON_RELEASE_NAME.into(),
        namespace: ADDON_NAMESPACE.into(),
        values,
        kube_version: Some(kube_version.unwrap_or(&release.metadata.kubernetes).to_owned()),
        include_crds: true,
        target_kubeconfig,
        ..Default::default()
    }
}

/// Why an addon chart did not render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddonRenderError {
    /// Its values file could not be templated.
    Values(String),
    /// The chart could not be rendered or its output parsed.
    Chart(String),
}

impl std::fmt::Display for AddonRenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AddonRenderError::Values(message) | AddonRenderError::Chart(message) => f.write_str(message),
        }
    }
}

/// Renders the addon chart `chart` of `release` (the whole addon archive, or one stage's chart directory):
/// with `values`, the values file templated over the data (`{Cluster, ControlPlane, InfraCluster}`); against
/// the workload cluster of `target_kubeconfig` when given; for `kube_version` (see [`addon_request`]). `cso
/// render` renders addons through here; the controllers template first (they keep the values' digest) and
/// render through [`render_templated_addon_chart`], as this does.
pub async fn render_addon_chart(
    renderer: &dyn ChartRenderer,
    templater: &ValuesTemplater,
    release: &Release,
    chart: &Path,
    values: Option<(&Path, &Value)>,
    target_kubeconfig: Option<PathBuf>,
    kube_version: Option<&str>,
) -> Result<Vec<Manifest>, AddonRenderError> {
    let values = match values {
        Some((file, data)) => Some(
            addon_values(templater, file, data)
                .await
                .map_err(AddonRenderError::Values)?,
        ),
        None => None,
    };
    render_templated_addon_chart(renderer, release, chart, values, target_kubeconfig, kube_version)
        .await
        .map_err(AddonRenderError::Chart)
}

/// Renders the addon chart `chart` of `release` with values already templated (see [`render_addon_chart`]);
/// the error is the renderer's or the parser's message.
pub async fn render_templated_addon_chart(
    renderer: &dyn ChartRenderer,
    release: &Release,
    chart: &Path,
    values: Option<String>,
    target_kubeconfig: Option<PathBuf>,
    kube_version: Option<&str>,
) -> Result<Vec<Manifest>, String> {
    let request = addon_request(release, chart, values, target_kubeconfig, kube_version);
    render(renderer, request).await
}

/// Reads a values file and templates it over `data` (`{Cluster, ControlPlane, InfraCluster}`). A file over
/// [`cso_render::values::MAX_VALUES_FILE_BYTES`] is not read, rendered values over
/// [`cso_render::values::MAX_RENDERED_VALUES_BYTES`] are refused; the message names the file and the limit.
pub async fn addon_values(templater: &ValuesTemplater, file: &Path, data: &Value) -> Result<String, String> {
    let text = cso_render::values::read_values_file(file)
        .await
        .map_err(|e| e.to_string())?;
    templater
        .render(file, &text, data)
        .await
        .map_err(|e| e.to_string())
}

/// A stage's chart directory in the unpacked addon archive, and its `overwrite.yaml` if it has one.
pub fn stage_chart(charts: &Path, stage: &Stage) -> (PathBuf, Option<PathBuf>) {
    let chart = charts.join(&stage.name);
    let values = stage_values_file(charts, &stage.name);
    (chart, values)
}

/// The values file (`overwrite.yaml`) of the stage chart `name` in the unpacked addon archive, if it has one.
pub fn stage_values_file(charts: &Path, name: &str) -> Option<PathBuf> {
    let overwrite = charts.join(name).join("overwrite.yaml");
    overwrite.is_file().then_some(overwrite)
}

/// The labels objects are applied with: the operator's release label naming `owner` (the
/// ClusterStackRelease for cluster-class objects, the release tag for addons).
pub fn release_labels(owner: String) -> BTreeMap<String, String> {
    BTreeMap::from([(RELEASE_LABEL.to_owned(), owner)])
}
