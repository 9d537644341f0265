//! Wait conditions of addon stages (`waitForPreCondition`, `waitForPostCondition` in `clusteraddon.yaml`):
//! a CEL expression over objects of the workload cluster. A release reads them (`cso_release`), the apply
//! engine evaluates them (`cso_apply::cel`); the type lives here so that neither depends on the other.

use serde::Deserialize;

/// A CEL expression over objects fetched from the workload cluster.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct WaitCondition {
    #[serde(default)]
    pub objects: Vec<WaitObject>,
    #[serde(default)]
    pub conditions: String,
}

/// An object bound to a CEL variable.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitObject {
    pub key: String,
    pub api_version: String,
    pub kind: String,
    pub name: String,
    #[serde(default)]
    pub namespace: String,
}
