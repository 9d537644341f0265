//! `clusteraddon.yaml` of new-style releases: the addon stages to run for each lifecycle hook.

use std::{collections::BTreeMap, path::Path};

use cso_api::cluster_addon::StageAction;
pub use cso_api::wait::{WaitCondition, WaitObject};
use serde::Deserialize;

use crate::ReleaseError;

/// The file name inside a release; its presence makes a release new-style.
pub const ADDON_CONFIG_FILE: &str = "clusteraddon.yaml";

/// The lifecycle hooks, named once for the whole operator; stages belong to [`Hook::ADDON_STAGES`].
pub use cso_api::rules::Hook;

/// The stages of each hook, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AddonConfig {
    pub stages: BTreeMap<Hook, Vec<Stage>>,
    /// Keys under `addonStages` that are not hooks with addon stages (ignored, as the Go operator does;
    /// reported for warnings). Cluster API hooks the operator does not run stages for are among them.
    pub ignored_keys: Vec<String>,
}

/// One stage: a chart directory of the addon archive, applied or deleted, with optional waits.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stage {
    pub name: String,
    pub action: StageAction,
    #[serde(default)]
    pub wait_for_pre_condition: Option<WaitCondition>,
    #[serde(default)]
    pub wait_for_post_condition: Option<WaitCondition>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConfig {
    #[serde(default)]
    addon_stages: BTreeMap<String, Vec<Stage>>,
}

impl AddonConfig {
    /// Parses and checks `clusteraddon.yaml` (`path` is named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ReleaseError> {
        let invalid = |what: String| ReleaseError::Invalid {
            path: path.to_path_buf(),
            what,
        };
        let raw: RawConfig =
            serde_saphyr::from_str(text).map_err(|e| invalid(format!("not a valid addon config: {e}")))?;
        let mut config = AddonConfig::default();
        for (key, stages) in raw.addon_stages {
            // Stages under a hook nothing runs them for would silently never run: reported instead.
            let Some(hook) = Hook::parse(&key).filter(|h| h.has_addon_stages()) else {
                config.ignored_keys.push(key);
                continue;
            };
            let mut seen = std::collections::HashSet::new();
            for stage in &stages {
                if stage.name.is_empty() || stage.name.contains(['/', '\\']) || stage.name == ".." {
                    return Err(invalid(format!(
                        "{hook}: stage name {:?} is not a chart directory name",
                        stage.name
                    )));
                }
                if !seen.insert((stage.name.as_str(), stage.action as u8)) {
                    return Err(invalid(format!(
                        "{hook}: stage {:?} with action {:?} appears twice; their progress could not be told apart",
                        stage.name, stage.action
                    )));
                }
                for (which, wait) in [
                    ("waitForPreCondition", &stage.wait_for_pre_condition),
                    ("waitForPostCondition", &stage.wait_for_post_condition),
                ] {
                    if let Some(wait) = wait {
                        check_wait(wait)
                            .map_err(|e| invalid(format!("{hook}: stage {:?}: {which}: {e}", stage.name)))?;
                    }
                }
            }
            config.stages.insert(hook, stages);
        }
        Ok(config)
    }

    pub fn stages(&self, hook: Hook) -> &[Stage] {
        self.stages.get(&hook).map_or(&[], Vec::as_slice)
    }

    /// Every chart directory any stage names.
    pub fn chart_names(&self) -> std::collections::BTreeSet<&str> {
        self.stages.values().flatten().map(|s| s.name.as_str()).collect()
    }
}

fn check_wait(wait: &WaitCondition) -> Result<(), String> {
    if wait.conditions.trim().is_empty() && !wait.objects.is_empty() {
        return Err("objects are listed but `conditions` is empty".into());
    }
    let mut keys = std::collections::HashSet::new();
    for object in &wait.objects {
        let identifier = !object.key.is_empty()
            && object.key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !object.key.as_bytes()[0].is_ascii_digit();
        if !identifier {
            return Err(format!("key {:?} is not a CEL identifier", object.key));
        }
        if !keys.insert(object.key.as_str()) {
            return Err(format!("key {:?} is bound twice", object.key));
        }
        if object.api_version.is_empty() || object.kind.is_empty() || object.name.is_empty() {
            return Err(format!("object {:?} needs apiVersion, kind and name", object.key));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AddonConfig, ReleaseError> {
        AddonConfig::parse(text, Path::new("/r/clusteraddon.yaml"))
    }

    #[test]
    fn parses_the_fixture_config() {
        let text = include_str!(
            "../../../tests/fixtures/releases/docker-ferrol-1-27-v0-sha-hipstsw/clusteraddon.yaml"
        );
        let config = parse(text).unwrap();
        assert_eq!(
            config.stages(Hook::AfterControlPlaneInitialized)[0].name,
            "metrics-server"
        );
        let ngnix = &config.stages(Hook::BeforeClusterUpgrade)[0];
        assert_eq!(ngnix.action, StageAction::Apply);
        let post = ngnix.wait_for_post_condition.as_ref().unwrap();
        assert_eq!(post.objects.len(), 2);
        assert_eq!(
            post.conditions,
            "msdeployment.spec.replicas == ngnix.spec.replicas"
        );
        assert!(config.stages(Hook::AfterClusterUpgrade).is_empty());
    }

    #[test]
    fn reads_after_cluster_upgrade_and_ignores_unknown_keys() {
        let config = parse(
            "addonStages:\n  AfterClusterUpgrade:\n  - {name: cleanup, action: delete}\n  name:\n  - {name: x, action: apply}\n",
        )
        .unwrap();
        assert_eq!(
            config.stages(Hook::AfterClusterUpgrade)[0].action,
            StageAction::Delete
        );
        assert_eq!(config.ignored_keys, ["name"]);
    }

    #[test]
    fn stages_of_every_hook_with_a_workload_cluster_are_read_and_before_cluster_create_is_ignored() {
        let config = parse(
            "addonStages:\n  BeforeClusterDelete:\n  - {name: x, action: delete}\n  BeforeWorkersUpgrade:\n  - {name: y, action: apply}\n  AfterControlPlaneUpgrade:\n  - {name: z, action: apply}\n  BeforeClusterCreate:\n  - {name: w, action: apply}\n",
        )
        .unwrap();
        assert_eq!(config.stages(Hook::BeforeClusterDelete)[0].name, "x");
        assert_eq!(config.stages(Hook::BeforeWorkersUpgrade)[0].name, "y");
        assert_eq!(config.stages(Hook::AfterControlPlaneUpgrade)[0].name, "z");
        // Before the Cluster is created there is no workload cluster to apply anything to.
        assert!(config.stages(Hook::BeforeClusterCreate).is_empty());
        assert_eq!(config.ignored_keys, ["BeforeClusterCreate"]);
    }

    #[test]
    fn refuses_broken_configs_with_the_file_and_reason() {
        for (text, expected) in [
            (
                "addonStages:\n  BeforeClusterUpgrade:\n  - {name: a, action: upgrade}\n",
                "not a valid addon config",
            ),
            (
                "addonStages:\n  BeforeClusterUpgrade:\n  - {name: a, action: apply}\n  - {name: a, action: apply}\n",
                "appears twice",
            ),
            (
                "addonStages:\n  BeforeClusterUpgrade:\n  - {name: ../x, action: apply}\n",
                "not a chart directory name",
            ),
            (
                "addonStages:\n  BeforeClusterUpgrade:\n  - name: a\n    action: apply\n    waitForPostCondition:\n      objects: [{key: 1x, apiVersion: v1, kind: Pod, name: p}]\n      conditions: 'true'\n",
                "not a CEL identifier",
            ),
            (
                "addonStages:\n  BeforeClusterUpgrade:\n  - name: a\n    action: apply\n    waitForPreCondition:\n      objects: [{key: x, apiVersion: v1, kind: Pod, name: p}]\n",
                "`conditions` is empty",
            ),
            ("addonStages: [", "not a valid addon config"),
        ] {
            let message = parse(text).unwrap_err().to_string();
            assert!(
                message.contains("/r/clusteraddon.yaml") && message.contains(expected),
                "{text}: {message}"
            );
        }
    }
}
