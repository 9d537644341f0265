//! [`Inventory`]: the objects a ClusterAddon or a ClusterStackRelease applied (`status.resources`), kept once
//! per process for all the objects that list the same. A thousand Clusters on one stack list the same fifteen
//! objects, all synced; each ClusterAddon in the operator's store held a list of its own (about 1.7 KiB).

use std::{
    borrow::Cow,
    fmt,
    ops::Deref,
    sync::{Arc, LazyLock},
};

use serde::{Deserialize, Serialize};

use crate::{common::Resource, interner::Interner};

/// An immutable list of applied objects, shared with every other holder of the same list. Dereferences to a
/// slice; made from a `Vec` or an iterator of [`Resource`]s; reads, writes and has the schema of a JSON array.
#[derive(Clone, PartialEq, Eq)]
pub struct Inventory(Arc<[Resource]>);

/// The lists in use.
static LISTS: LazyLock<Interner<[Resource]>> = LazyLock::new(Interner::new);

impl Inventory {
    /// The one shared copy of `resources`.
    pub fn new(resources: Vec<Resource>) -> Self {
        Inventory::of(&resources)
    }

    /// The one shared copy of `resources` (copied only if no one holds that list yet).
    pub fn of(resources: &[Resource]) -> Self {
        if resources.is_empty() {
            return Inventory::default();
        }
        Inventory(LISTS.get(resources, |list| Arc::from(list)))
    }
}

impl Default for Inventory {
    fn default() -> Self {
        static EMPTY: LazyLock<Arc<[Resource]>> = LazyLock::new(|| Arc::from(Vec::new()));
        Inventory(Arc::clone(&EMPTY))
    }
}

impl Deref for Inventory {
    type Target = [Resource];
    fn deref(&self) -> &[Resource] {
        &self.0
    }
}

impl From<Vec<Resource>> for Inventory {
    fn from(resources: Vec<Resource>) -> Self {
        Inventory::new(resources)
    }
}

impl FromIterator<Resource> for Inventory {
    fn from_iter<I: IntoIterator<Item = Resource>>(resources: I) -> Self {
        Inventory::new(resources.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a Inventory {
    type Item = &'a Resource;
    type IntoIter = std::slice::Iter<'a, Resource>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Debug for Inventory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for Inventory {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Inventory {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Resource>::deserialize(deserializer).map(Inventory::new)
    }
}

/// In a schema an `Inventory` is an array of [`Resource`]s.
impl schemars::JsonSchema for Inventory {
    fn schema_name() -> Cow<'static, str> {
        Vec::<Resource>::schema_name()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        Vec::<Resource>::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::ResourceStatus;

    fn entry(name: &str, status: Option<ResourceStatus>) -> Resource {
        Resource {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespace: "kube-system".into(),
            name: name.into(),
            status,
            error: String::new(),
        }
    }

    #[test]
    fn equal_lists_are_one_allocation_and_unequal_ones_are_not() {
        let a = Inventory::new(vec![entry("inventory-test-a", Some(ResourceStatus::Synced))]);
        let b: Inventory = [entry("inventory-test-a", Some(ResourceStatus::Synced))]
            .into_iter()
            .collect();
        assert!(Arc::ptr_eq(&a.0, &b.0));
        let not_synced = Inventory::new(vec![entry("inventory-test-a", Some(ResourceStatus::NotSynced))]);
        assert!(!Arc::ptr_eq(&a.0, &not_synced.0));
        assert_ne!(a, not_synced);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].name, "inventory-test-a");
    }

    #[test]
    fn reads_and_writes_as_a_json_array_with_an_array_schema() {
        let text = r#"[{"group":"apps","version":"v1","kind":"Deployment","namespace":"kube-system","name":"x","status":"synced"}]"#;
        let inventory: Inventory = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::to_string(&inventory).unwrap(), text);
        assert_eq!(
            inventory,
            Inventory::new(vec![entry("x", Some(ResourceStatus::Synced))])
        );
        let empty: Inventory = serde_json::from_str("[]").unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty, Inventory::default());
        assert_eq!(
            schemars::schema_for!(Inventory).as_value()["type"],
            serde_json::json!("array")
        );
    }
}
