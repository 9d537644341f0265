//! What a release renders to, without a running operator (`cso render`): the cluster-class objects for
//! the management cluster and the addon objects for a workload cluster (the single addon chart, or each
//! stage of each hook), rendered through [`crate::rendering`] exactly as the controllers render them.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use cso_api::{capi::Cluster, cluster_addon::StageAction};
use cso_release::{AddonStyle, Release, addon_config::Hook, archive::UnpackLimits};
use cso_render::{ChartRenderer, Manifest, ValuesTemplater};
use serde_json::{Value, json};

use crate::rendering::{self, ADDON_NAMESPACE};

/// Where a part's objects go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The management cluster, into this namespace.
    Management { namespace: String },
    /// The workload cluster of a Cluster; objects without a namespace go to `kube-system`.
    Workload,
}

impl Target {
    /// The namespace of objects that name none.
    pub fn default_namespace(&self) -> &str {
        match self {
            Target::Management { namespace } => namespace,
            Target::Workload => ADDON_NAMESPACE,
        }
    }
}

/// One chart's worth of objects.
#[derive(Clone, Debug)]
pub struct Part {
    /// `cluster class`, `addons`, or `AfterControlPlaneInitialized: ngnix (apply)`.
    pub title: String,
    pub target: Target,
    /// A `delete` stage: these objects would be deleted, not applied.
    pub action: StageAction,
    pub manifests: Vec<Manifest>,
    /// The labels the operator applies them with.
    pub labels: BTreeMap<String, String>,
}

/// The addons are rendered for this Cluster, with this template data (`{Cluster, ControlPlane, InfraCluster}`).
#[derive(Clone, Debug)]
pub struct ForCluster {
    pub cluster: Cluster,
    pub template_data: Value,
    /// Render against this workload cluster (Helm `lookup` and capabilities), as the controller does.
    pub workload_kubeconfig: Option<PathBuf>,
}

impl ForCluster {
    /// A Cluster known from a file only (`object`, as written): templates see the whole object, as they
    /// would see the live Cluster (without `metadata.managedFields`, which template data leaves out); there
    /// is no ControlPlane or InfraCluster without a management cluster to read them from.
    pub fn offline(mut object: Value) -> Result<Self, String> {
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.remove("managedFields");
        }
        let cluster: Cluster =
            serde_json::from_value(object.clone()).map_err(|e| format!("not a Cluster: {e}"))?;
        Ok(ForCluster {
            cluster,
            template_data: json!({ "Cluster": object }),
            workload_kubeconfig: None,
        })
    }

    /// A stand-in Cluster of `release` in `namespace`, for a preview without a Cluster: the class, version
    /// and endpoint, plus the fields stacks commonly template, so that e.g. `{{ index
    /// .Cluster.spec.clusterNetwork.pods.cidrBlocks 0 }}` renders instead of failing on a field the example
    /// lacks. The networks are kubeadm's defaults (services, DNS domain) and Cluster API's quick-start pod
    /// network.
    pub fn example(release: &Release, namespace: &str) -> Self {
        let object = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "Cluster",
            "metadata": {"name": "example", "namespace": namespace, "labels": {}},
            "spec": {
                "clusterNetwork": {
                    "pods": {"cidrBlocks": ["192.168.0.0/16"]},
                    "services": {"cidrBlocks": ["10.96.0.0/12"]},
                    "serviceDomain": "cluster.local",
                },
                "controlPlaneEndpoint": {"host": "example.cluster.invalid", "port": 6443},
                "topology": {
                    "class": release.id.cluster_class_name(),
                    "version": release.metadata.kubernetes,
                    "variables": [],
                },
            },
        });
        Self::offline(object).expect("the example is a Cluster")
    }
}

/// Renders every part of `release`: the cluster class for `namespace`, then the addons for `target`.
pub async fn render(
    renderer: &dyn ChartRenderer,
    templater: &ValuesTemplater,
    release: &Release,
    namespace: &str,
    target: &ForCluster,
) -> Result<Vec<Part>, String> {
    let mut parts = vec![Part {
        title: "cluster class".into(),
        target: Target::Management {
            namespace: namespace.to_owned(),
        },
        action: StageAction::Apply,
        manifests: rendering::render(renderer, rendering::cluster_class_request(release, namespace)).await?,
        labels: rendering::release_labels(release.id.tag()),
    }];
    let addon = |title: String, action: StageAction, manifests: Vec<Manifest>| Part {
        title,
        target: Target::Workload,
        action,
        manifests,
        labels: rendering::release_labels(release.id.tag()),
    };
    match &release.addons {
        AddonStyle::Single { values_file } => {
            let objects = addon_manifests(
                renderer,
                templater,
                release,
                &release.cluster_addon_archive,
                Some(values_file),
                target,
            )
            .await?;
            parts.push(addon("addons".into(), StageAction::Apply, objects));
        }
        AddonStyle::Staged { config } => {
            let archive = release.clone();
            let charts = tokio::task::spawn_blocking(move || archive.addon_charts(UnpackLimits::default()))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            for hook in Hook::ALL {
                for stage in config.stages(hook) {
                    let (chart, values) = rendering::stage_chart(&charts, stage);
                    if !chart.is_dir() {
                        return Err(format!(
                            "stage {}: the addon archive has no chart {:?}",
                            hook.as_str(),
                            stage.name
                        ));
                    }
                    let objects =
                        addon_manifests(renderer, templater, release, &chart, values.as_deref(), target)
                            .await
                            .map_err(|e| format!("stage {}/{}: {e}", hook.as_str(), stage.name))?;
                    let verb = match stage.action {
                        StageAction::Apply => "apply",
                        StageAction::Delete => "delete",
                    };
                    parts.push(addon(
                        format!("{}: {} ({verb})", hook.as_str(), stage.name),
                        stage.action,
                        objects,
                    ));
                }
            }
        }
    }
    Ok(parts)
}

async fn addon_manifests(
    renderer: &dyn ChartRenderer,
    templater: &ValuesTemplater,
    release: &Release,
    chart: &Path,
    values_file: Option<&Path>,
    target: &ForCluster,
) -> Result<Vec<Manifest>, String> {
    let values = values_file.map(|file| (file, &target.template_data));
    rendering::render_addon_chart(
        renderer,
        templater,
        release,
        chart,
        values,
        target.workload_kubeconfig.clone(),
        None,
    )
    .await
    .map_err(|e| e.to_string())
}
