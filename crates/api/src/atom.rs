//! Interned strings for the names that every workload cluster's state repeats: the group, version, kind,
//! namespace and name of each object an addon applies (`status.resources` of a ClusterAddon, the apply
//! engine's records). A thousand Clusters on one stack name the same fifteen objects; as [`Atom`]s each name
//! is kept once and every Cluster holds a pointer to it (16 bytes, where a `String` is 24 bytes and an
//! allocation of its own). The names live in an [`Interner`], which lets go of a name once no [`Atom`] holds it.

use std::{
    borrow::{Borrow, Cow},
    fmt,
    hash::{Hash, Hasher},
    ops::Deref,
    sync::{Arc, LazyLock},
};

use serde::{Deserialize, Serialize};

use crate::interner::Interner;

/// An immutable string kept once per process while any holder has it. Compares, hashes and orders as its
/// text; dereferences to `str`.
#[derive(Clone)]
pub struct Atom(Arc<str>);

/// The names in use.
static NAMES: LazyLock<Interner<str>> = LazyLock::new(Interner::new);

impl Atom {
    /// The one `Atom` of `text`.
    pub fn new(text: &str) -> Self {
        Atom(NAMES.get(text, |text| Arc::from(text)))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the text is empty (for `skip_serializing_if`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Default for Atom {
    fn default() -> Self {
        Atom::new("")
    }
}

impl Deref for Atom {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Atom {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Atom {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq for Atom {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for Atom {}

impl PartialEq<str> for Atom {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Atom {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Atom {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl Hash for Atom {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl PartialOrd for Atom {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Atom {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

impl fmt::Debug for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Atom {
    fn from(text: &str) -> Self {
        Atom::new(text)
    }
}

impl From<&String> for Atom {
    fn from(text: &String) -> Self {
        Atom::new(text)
    }
}

impl From<String> for Atom {
    fn from(text: String) -> Self {
        Atom::new(&text)
    }
}

impl Serialize for Atom {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Atom {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Atom;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Atom, E> {
                Ok(Atom::new(text))
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

/// In a schema an `Atom` is a string.
impl schemars::JsonSchema for Atom {
    fn schema_name() -> Cow<'static, str> {
        String::schema_name()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        String::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_are_one_allocation() {
        let a = Atom::new("metrics-server-equal-texts");
        let b = Atom::from(String::from("metrics-server-equal-texts"));
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(a, b);
        assert_eq!(a, "metrics-server-equal-texts");
    }

    #[test]
    fn a_name_no_one_holds_is_let_go_at_a_sweep() {
        let kept = Atom::new("kept-across-the-sweep");
        drop(Atom::new("let-go-at-the-sweep"));
        // Enough new names to make the table sweep at least once.
        let fillers: Vec<Atom> = (0..2 * crate::interner::SWEEP_FLOOR + 1)
            .map(|i| Atom::new(&format!("filler-{i}")))
            .collect();
        assert!(NAMES.keeps("kept-across-the-sweep"));
        assert!(!NAMES.keeps("let-go-at-the-sweep"));
        drop((kept, fillers));
    }

    #[test]
    fn reads_and_writes_as_a_json_string_and_orders_as_its_text() {
        let atom: Atom = serde_json::from_str("\"kube-system\"").unwrap();
        assert_eq!(serde_json::to_string(&atom).unwrap(), "\"kube-system\"");
        let mut atoms = [Atom::new("b"), Atom::new("a"), Atom::new("")];
        atoms.sort();
        assert_eq!(atoms.map(|a| a.to_string()), ["", "a", "b"]);
        assert_eq!(
            schemars::schema_for!(Atom).as_value()["type"],
            serde_json::json!("string")
        );
    }
}
