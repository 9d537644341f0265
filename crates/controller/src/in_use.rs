//! Which releases Clusters use: a Cluster uses the release whose ClusterClass its topology names (in the
//! class's namespace, which `v1beta2` Clusters may set to another namespace than their own).

use std::collections::{BTreeMap, BTreeSet};

use cso_api::{ReleaseId, capi::Cluster};
use kube::{Api, ResourceExt, api::ListParams};

use crate::{Context, Error};

/// The releases used by `clusters` whose class lives in `namespace`, each with the Clusters (`ns/name`).
pub(crate) fn releases_in_use(
    clusters: &[Cluster],
    namespace: &str,
) -> BTreeMap<ReleaseId, BTreeSet<String>> {
    let mut used: BTreeMap<ReleaseId, BTreeSet<String>> = BTreeMap::new();
    for cluster in clusters {
        // Classes that are not named like a cluster stack's are not ours.
        let Some((id, class_namespace)) = cluster.stack_release() else {
            continue;
        };
        if class_namespace == namespace {
            used.entry(id).or_default().insert(format!(
                "{}/{}",
                cluster.namespace().unwrap_or_default(),
                cluster.name_any()
            ));
        }
    }
    used
}

/// Every Cluster the operator may see. Without Cluster API installed there are none.
pub(crate) async fn list_clusters(ctx: &Context) -> Result<Vec<Cluster>, Error> {
    let api: Api<Cluster> = match &ctx.settings.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(source) => Err(Error::kube("list Clusters", source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(ns: &str, name: &str, topology: serde_json::Value) -> Cluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"topology": topology},
        }))
        .unwrap()
    }

    #[test]
    fn dot_and_dash_classes_and_other_namespaces() {
        let clusters = [
            cluster("a", "c1", serde_json::json!({"class": "docker-ferrol-1-27-v1"})),
            cluster(
                "a",
                "c2",
                serde_json::json!({"class": "docker-ferrol-1-27-v0-sha.hipstsw"}),
            ),
            cluster(
                "b",
                "c3",
                serde_json::json!({"classRef": {"name": "docker-ferrol-1-27-v1", "namespace": "a"}}),
            ),
            cluster("b", "c4", serde_json::json!({"class": "docker-ferrol-1-27-v2"})),
            cluster("a", "c5", serde_json::json!({"class": "my-own-class"})),
        ];
        let used = releases_in_use(&clusters, "a");
        let v1 = ReleaseId::parse_tag("docker-ferrol-1-27-v1").unwrap();
        let custom = ReleaseId::parse_tag("docker-ferrol-1-27-v0-sha-hipstsw").unwrap();
        assert_eq!(used.len(), 2, "{used:?}");
        assert_eq!(used[&v1], BTreeSet::from(["a/c1".to_owned(), "b/c3".to_owned()]));
        assert_eq!(used[&custom], BTreeSet::from(["a/c2".to_owned()]));
    }
}
