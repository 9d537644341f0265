//! The preflight of a class move (issue 30): would Cluster API accept moving a Cluster to a release's class?
//!
//! Observe: the Cluster's class and the release's class (live in the management cluster, else as rendered
//! from the release), the release's stages. Act: one server-side dry run of the change (`spec.topology.class`,
//! or `classRef.name` in `v1beta2`, and `spec.topology.version` when the release's Kubernetes version differs),
//! which Cluster API's webhooks answer; nothing is written. Decide: [`cso_api::rules::class_move::explain`]
//! turns the answer into reasons in terms of the two classes. `cso render --diff` prints it ([`describe`]);
//! a rollout calls [`preflight`] before it moves a Cluster, and the fleet's counts call `explain` alone, from
//! the caches, with [`DryRun::NotAsked`].
//!
//! A dry run that cannot be made (the API server unreachable, the release's class not applied yet) is
//! reported as such ([`Preflight::dry_run_failed`]); the classes then decide alone.

use std::{collections::BTreeMap, fmt::Write as _};

use cso_api::{
    capi::{CAPI_GROUP, Cluster},
    rules::{
        class_move::{self, Cause, ClassView, DryRun, Move, Preflight, ReleaseStages, Verdict},
        move_variables::{MoveVariables, VariableRules, move_variables},
    },
};
use cso_release::{AddonStyle, Release, addon_config::Hook};
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams},
    core::ApiResource,
};
use serde_json::{Map, Value, json};

/// The field manager of the dry run (nothing is written with it).
pub const FIELD_MANAGER: &str = "cso-preflight";

/// The ClusterClass resource in the version Clusters are read in (`cluster_resource`).
fn class_resource(cluster_resource: &ApiResource) -> ApiResource {
    ApiResource {
        group: CAPI_GROUP.to_owned(),
        version: cluster_resource.version.clone(),
        api_version: cluster_resource.api_version.clone(),
        kind: "ClusterClass".to_owned(),
        plural: "clusterclasses".to_owned(),
    }
}

/// The stages of `release` per hook; `None` for a single addon chart.
pub fn release_stages(release: &Release) -> ReleaseStages {
    match &release.addons {
        AddonStyle::Single { .. } => None,
        AddonStyle::Staged { config } => Some(
            Hook::ALL
                .into_iter()
                .map(|hook| {
                    let stages = config.stages(hook).iter().map(|s| s.name.clone()).collect();
                    (hook, stages)
                })
                .filter(|(_, stages): &(Hook, Vec<String>)| !stages.is_empty())
                .collect::<BTreeMap<_, _>>(),
        ),
    }
}

/// The change the move makes to the Cluster, as a merge patch: its class, its version when `version`
/// differs, and the fields of `spec.topology` that carry its changed variables (`variables`, from
/// [`MoveVariables::merge_patch`]).
pub fn move_patch(
    cluster_resource: &ApiResource,
    class: &str,
    version: Option<&str>,
    variables: Option<&Map<String, Value>>,
) -> Value {
    let mut topology = if cluster_resource.version == "v1beta1" {
        json!({ "class": class })
    } else {
        json!({ "classRef": { "name": class } })
    };
    if let Some(version) = version {
        topology["version"] = json!(version);
    }
    for (key, value) in variables.into_iter().flatten() {
        topology[key] = value.clone();
    }
    json!({ "spec": { "topology": topology } })
}

/// Cluster API's answer to the move of `cluster` to `class` (at `version`, with `variables` when the move
/// changes them: [`move_patch`]), by a server-side dry run.
pub async fn dry_run(
    client: &Client,
    cluster_resource: &ApiResource,
    cluster: &Cluster,
    class: &str,
    version: Option<&str>,
    variables: Option<&Map<String, Value>>,
) -> DryRun {
    let namespace = cluster.metadata.namespace.as_deref().unwrap_or("default");
    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, cluster_resource);
    let params = PatchParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let patch = move_patch(cluster_resource, class, version, variables);
    match api.patch(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => DryRun::Accepted,
        // Admission (a webhook or the schema) said no: 422 Invalid, 400 BadRequest, 403 from a webhook.
        Err(kube::Error::Api(status)) if is_refusal(&status) => {
            let causes = status
                .details
                .as_ref()
                .map(|d| {
                    d.causes
                        .iter()
                        .map(|c| Cause {
                            field: c.field.clone(),
                            message: c.message.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            DryRun::Refused {
                message: status.message.clone(),
                causes,
            }
        }
        Err(kube::Error::Api(status)) => DryRun::Failed(format!(
            "the dry run of Cluster {namespace}/{name} was not answered by Cluster API ({} {}): {}",
            status.code, status.reason, status.message
        )),
        Err(e) => DryRun::Failed(format!(
            "the dry run of Cluster {namespace}/{name} could not be made: {e}"
        )),
    }
}

/// Whether admission refused the change (422 Invalid and 400 BadRequest from Cluster API's webhooks or the
/// schema, any denial of an admission webhook), rather than the request failing (RBAC, not found, ...).
fn is_refusal(status: &kube::core::Status) -> bool {
    matches!(status.code, 400 | 422) || status.message.contains("admission webhook")
}

/// A watch cache of ClusterClasses: the class `(namespace, name)` as a whole object, if the cache has it.
pub type CachedClasses<'a> = &'a (dyn Fn(&str, &str) -> Option<Value> + Send + Sync);

/// Reads a ClusterClass, from `cached` when it has it: `Ok(None)` when it does not exist.
async fn read_class(
    client: &Client,
    cluster_resource: &ApiResource,
    cached: Option<CachedClasses<'_>>,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>, String> {
    if let Some(object) = cached.and_then(|lookup| lookup(namespace, name)) {
        return Ok(Some(object));
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &class_resource(cluster_resource));
    match api.get_opt(name).await {
        Ok(class) => Ok(class.map(|c| serde_json::to_value(c).unwrap_or_default())),
        Err(kube::Error::Api(status)) => Err(format!(
            "cannot read ClusterClass {namespace}/{name}: {} {}",
            status.code, status.message
        )),
        Err(e) => Err(format!(
            "cannot reach the API server to read ClusterClass {namespace}/{name}: {e}"
        )),
    }
}

/// Would Cluster API accept moving `cluster` to the class of `release`? `rendered_class` is the release's
/// ClusterClass as rendered (used when the release is not applied to the management cluster yet, in which
/// case no dry run can be made).
pub async fn preflight(
    client: &Client,
    cluster_resource: &ApiResource,
    cluster: &Cluster,
    release: &Release,
    rendered_class: Option<&Value>,
) -> Preflight {
    preflight_with(
        client,
        cluster_resource,
        cluster,
        release,
        rendered_class,
        None,
        &VariableRules::default(),
    )
    .await
}

/// [`preflight`] reading the two classes from `cached` where it has them (a rollout moving many Clusters reads
/// them from the release controller's ClusterClass watch, not once per Cluster); the dry run is always made.
/// The move makes the changes `rules` declares ([`Preflight::variables`]); with `rules.follow_class_defaults`,
/// a move the dry run refuses is asked again with the Cluster's variables following the old class's
/// defaults as well ([`move_variables`]), and when that passes, the preflight is of that move
/// ([`Preflight::refused_as_is`] says why the other was refused).
pub async fn preflight_with(
    client: &Client,
    cluster_resource: &ApiResource,
    cluster: &Cluster,
    release: &Release,
    rendered_class: Option<&Value>,
    cached: Option<CachedClasses<'_>>,
    rules: &VariableRules,
) -> Preflight {
    let whole = cluster.whole_value();
    let own_namespace = cluster.metadata.namespace.clone().unwrap_or_default();
    let from = cluster.class();
    let class_namespace = from
        .as_ref()
        .map_or(own_namespace.clone(), |c| c.namespace.clone());
    let to_name = release.id.cluster_class_name();
    let to_version = release.metadata.kubernetes.as_str();

    let mut failed: Vec<String> = Vec::new();
    let from_class = match &from {
        Some(class) => {
            match read_class(client, cluster_resource, cached, &class.namespace, &class.name).await {
                Ok(Some(object)) => ClassView::from_object(&object),
                Ok(None) => ClassView {
                    name: class.name.clone(),
                    ..ClassView::default()
                },
                Err(e) => {
                    failed.push(e);
                    ClassView {
                        name: class.name.clone(),
                        ..ClassView::default()
                    }
                }
            }
        }
        None => ClassView::default(),
    };
    let live_to = match read_class(client, cluster_resource, cached, &class_namespace, &to_name).await {
        Ok(live) => live,
        Err(e) => {
            failed.push(e);
            None
        }
    };
    let to_class = match (&live_to, rendered_class) {
        (Some(live), _) => ClassView::from_object(live),
        (None, Some(rendered)) => ClassView::from_object(rendered),
        (None, None) => ClassView {
            name: to_name.clone(),
            ..ClassView::default()
        },
    };
    let version = (cluster.topology_version() != Some(to_version)).then_some(to_version);
    let topology = whole.pointer("/spec/topology").cloned().unwrap_or(Value::Null);
    let stages = release_stages(release);
    // The move with what it changes in the variables, explained from the Cluster as the move leaves it.
    let explained = |variables: &MoveVariables, answer: &DryRun| {
        let mut moved = whole.clone();
        if let Some(slot) = moved.pointer_mut("/spec/topology") {
            *slot = variables.applied_to(&topology);
        }
        let mut preflight = class_move::explain(
            &Move::of_cluster(&moved, &from_class, &to_class, to_version, &stages),
            answer,
        );
        preflight.variables = (!variables.is_empty()).then(|| variables.clone());
        preflight
    };
    let ask = async |variables: &MoveVariables| {
        let merge = (!variables.is_empty()).then(|| variables.merge_patch(&topology));
        let answer = dry_run(
            client,
            cluster_resource,
            cluster,
            &to_name,
            version,
            merge.as_ref(),
        )
        .await;
        let preflight = explained(variables, &answer);
        (answer, preflight)
    };

    let declared = move_variables(&topology, None, &rules.declared);
    let (answer, preflight) = if !failed.is_empty() || live_to.is_none() {
        let why = if failed.is_empty() {
            format!(
                "ClusterClass {class_namespace}/{to_name} is not in the management cluster (the release is \
                 not applied there yet): explained from {}",
                if rendered_class.is_some() {
                    "the rendered class"
                } else {
                    "nothing: the release's class is unknown"
                }
            )
        } else {
            failed.join("; ")
        };
        let answer = DryRun::Failed(why);
        let preflight = explained(&declared, &answer);
        (answer, preflight)
    } else {
        ask(&declared).await
    };
    if !(rules.follow_class_defaults && matches!(answer, DryRun::Refused { .. })) {
        return preflight;
    }
    let followed = move_variables(&topology, Some(&from_class), &rules.declared);
    if !followed.follows_defaults() {
        return preflight;
    }
    let (answer, mut with_defaults) = ask(&followed).await;
    if answer != DryRun::Accepted {
        // Following the defaults is not enough: the refusal is the move's without.
        return preflight;
    }
    with_defaults.refused_as_is = preflight.reasons;
    with_defaults
}

/// The preflight as `cso render --diff` prints it.
pub fn describe(preflight: &Preflight, cluster_name: &str) -> String {
    let mut out = String::new();
    let verdict = match preflight.verdict {
        Verdict::Accepted if !preflight.refused_as_is.is_empty() => {
            "REFUSED as it is; accepted with the old class's defaults followed (server-side dry run)"
        }
        Verdict::Accepted => "accepted (server-side dry run: Cluster API's webhooks and the schema)",
        Verdict::Refused if preflight.dry_run_failed.is_none() => "REFUSED (server-side dry run)",
        Verdict::Refused => "would be REFUSED (from the two classes; no dry run)",
        Verdict::Likely => "likely accepted (nothing in the two classes against it; no dry run)",
    };
    let version = preflight
        .version_change
        .as_ref()
        .map(|(from, to)| format!(", Kubernetes {from} -> {to}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "== preflight: move Cluster {cluster_name} from class {} to {}{version}: {verdict}",
        if preflight.from_class.is_empty() {
            "(none)"
        } else {
            &preflight.from_class
        },
        preflight.to_class
    );
    if let Some(why) = &preflight.dry_run_failed {
        let _ = writeln!(out, "   dry run not made: {why}");
    }
    let (refused, noted) = if !preflight.refused_as_is.is_empty() {
        (&preflight.refused_as_is, &preflight.reasons)
    } else {
        (&preflight.reasons, &Vec::new())
    };
    for reason in refused {
        let _ = writeln!(out, "   refused    {reason}");
    }
    for reason in noted {
        let _ = writeln!(
            out,
            "   noted      {reason} (with the defaults followed; Cluster API accepted it)"
        );
    }
    if let Some(variables) = &preflight.variables {
        for dropped in &variables.dropped {
            let _ = writeln!(
                out,
                "   follows    {dropped}: the old class's default, left out for the new class to default"
            );
        }
        for changed in &variables.changed {
            let _ = writeln!(out, "   declared   {changed}");
        }
        for list in &variables.lists {
            let whose = list
                .at
                .owner()
                .map_or_else(|| "variables ".to_owned(), |of| format!("overrides of {of}:"));
            let _ = writeln!(out, "   {whose} {}", list.after);
        }
        let _ = writeln!(
            out,
            "   (the move sets these variables: a rollout with spec.variables{})",
            if variables.follows_defaults() {
                ".followClassDefaults"
            } else {
                ".set or .remove"
            }
        );
    }
    if preflight.single_chart {
        let _ = writeln!(
            out,
            "   hooks      the release's addon chart is applied when the class changes (no stages)"
        );
    }
    for run in &preflight.hooks {
        let step = run.step.as_ref().map(|s| format!(" ({s})")).unwrap_or_default();
        let stages = if run.stages.is_empty() {
            "no stages".to_owned()
        } else {
            format!("stages {}", run.stages.join(", "))
        };
        let _ = writeln!(out, "   hook       {}{step}: {stages}", run.hook.as_str());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_move_changes_the_class_as_each_version_spells_it_and_the_version_when_it_differs() {
        let v1beta2 = Cluster::resource("v1beta2");
        assert_eq!(
            move_patch(&v1beta2, "docker-scs-1-35-v2", None, None),
            json!({"spec": {"topology": {"classRef": {"name": "docker-scs-1-35-v2"}}}})
        );
        assert_eq!(
            move_patch(
                &Cluster::v1beta1_resource(),
                "docker-ferrol-1-27-v2",
                Some("v1.27.4"),
                None
            ),
            json!({"spec": {"topology": {"class": "docker-ferrol-1-27-v2", "version": "v1.27.4"}}})
        );
        assert_eq!(class_resource(&v1beta2).api_version, "cluster.x-k8s.io/v1beta2");
    }
}
