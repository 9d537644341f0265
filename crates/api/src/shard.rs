//! Shards of Clusters across operator replicas: a Cluster's shard is its label [`SHARD_LABEL`]; a replica
//! started with `--shard=NAME` handles the Clusters labelled `NAME`, a replica without it the *default* shard
//! (Clusters without the label, or with it empty). Each shard elects its own leader with a Lease of its own
//! ([`Shard::lease_name`]); the default shard keeps the Go operator's Lease name.

use std::collections::BTreeMap;

/// The label that assigns a Cluster (and its ClusterAddon) to a shard.
pub const SHARD_LABEL: &str = "clusterstack.x-k8s.io/shard";
/// The leader-election Lease of the default shard: the Go operator's.
pub const DEFAULT_LEASE_NAME: &str = "clusterstack.x-k8s.io";
/// The longest shard name: its Lease name (`clusterstack.x-k8s.io-shard-NAME`) stays well inside a label value.
const MAX_NAME: usize = 40;

/// Which Clusters a replica handles.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Shard {
    /// Clusters without [`SHARD_LABEL`] (or with it empty); also the ClusterStacks and ClusterStackReleases.
    #[default]
    Default,
    /// Clusters labelled with this name.
    Named(String),
}

impl Shard {
    /// `--shard`: empty means the default shard; a name must be a DNS-1123 label of at most 40 characters.
    pub fn parse(text: &str) -> Result<Shard, String> {
        if text.is_empty() {
            return Ok(Shard::Default);
        }
        let valid = text.len() <= MAX_NAME
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !text.starts_with('-')
            && !text.ends_with('-');
        if valid {
            Ok(Shard::Named(text.to_owned()))
        } else {
            Err(format!(
                "shard name {text:?} is not a DNS-1123 label of at most {MAX_NAME} characters (lower case letters, \
                 digits and '-', starting and ending with a letter or digit)"
            ))
        }
    }

    /// The shard an object's labels assign it to.
    pub fn of(labels: Option<&BTreeMap<String, String>>) -> Shard {
        match labels.and_then(|l| l.get(SHARD_LABEL)) {
            Some(name) if !name.is_empty() => Shard::Named(name.clone()),
            _ => Shard::Default,
        }
    }

    /// The name of this shard's leader-election Lease.
    pub fn lease_name(&self) -> String {
        match self {
            Shard::Default => DEFAULT_LEASE_NAME.to_owned(),
            Shard::Named(name) => format!("{DEFAULT_LEASE_NAME}-shard-{name}"),
        }
    }

    /// The label selector of the objects of this shard, for a named shard (its watches use it, so that the API
    /// server neither lists nor sends it other shards' objects). `None` for the default shard: it watches
    /// every Cluster (the fleet's counts and the releases in use need all of them) and reconciles its own.
    pub fn selector(&self) -> Option<String> {
        match self {
            Shard::Default => None,
            Shard::Named(name) => Some(format!("{SHARD_LABEL}={name}")),
        }
    }

    /// Whether an object with these labels is this shard's.
    pub fn owns(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        Shard::of(labels) == *self
    }

    /// The name in logs and metrics: `default` or the shard's name.
    pub fn name(&self) -> &str {
        match self {
            Shard::Default => "default",
            Shard::Named(name) => name,
        }
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(value: Option<&str>) -> BTreeMap<String, String> {
        value
            .map(|v| BTreeMap::from([(SHARD_LABEL.to_owned(), v.to_owned())]))
            .unwrap_or_default()
    }

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(Shard::parse(""), Ok(Shard::Default));
        assert_eq!(Shard::parse("eu-1"), Ok(Shard::Named("eu-1".into())));
        for bad in ["A", "a_b", "-a", "a-", "a.b", &"a".repeat(41)] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
        assert!(Shard::parse(&"a".repeat(40)).is_ok());
    }

    #[test]
    fn labels_assign_shards_and_leases_follow() {
        assert_eq!(Shard::of(None), Shard::Default);
        assert_eq!(Shard::of(Some(&labels(None))), Shard::Default);
        assert_eq!(
            Shard::of(Some(&labels(Some("")))),
            Shard::Default,
            "empty is the default"
        );
        let a = Shard::Named("a".into());
        assert_eq!(Shard::of(Some(&labels(Some("a")))), a);
        assert!(a.owns(Some(&labels(Some("a")))));
        assert!(!a.owns(Some(&labels(Some("b")))));
        assert!(!Shard::Default.owns(Some(&labels(Some("a")))));
        assert!(Shard::Default.owns(None));
        assert_eq!(
            Shard::Default.lease_name(),
            "clusterstack.x-k8s.io",
            "the Go operator's"
        );
        assert_eq!(a.lease_name(), "clusterstack.x-k8s.io-shard-a");
        assert_eq!(a.selector().as_deref(), Some("clusterstack.x-k8s.io/shard=a"));
        assert_eq!(Shard::Default.selector(), None);
        assert_eq!(
            (Shard::Default.to_string(), a.to_string()),
            ("default".into(), "a".into())
        );
    }
}
