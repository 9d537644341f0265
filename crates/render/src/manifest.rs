//! Rendered YAML (a multi-document stream) into objects, read as Helm, kubectl and the Go operator read it:
//! the stream is split at `---` lines as kubectl's `YAMLReader` (k8s.io/apimachinery) splits it, and each
//! document is read with go-yaml v2's rules and turned into JSON as `sigs.k8s.io/yaml.YAMLToJSON` does
//! (`goyaml` below). Empty documents are skipped; every other document must be an object with `apiVersion`,
//! `kind` and `metadata.name`, or the whole stream is refused with the document's number and Helm's
//! `# Source:` file named. [`Manifest`] itself lives in `cso_api`, where the apply engine takes it from without
//! depending on the renderer.
//!
//! Why not a YAML 1.2 parser: charts are written against go-yaml, which is lenient where the YAML 1.2 spec is
//! not (a double-quoted scalar whose continuation lines start in column 0, as the OpenStack `scs` stacks render)
//! and resolves plain scalars by YAML 1.1 (`on` is `true`, `0755` is 493, `1.0` is `1`). The events come from
//! `libyaml-safer`, libyaml ported to Rust, whose scanner go-yaml v2 is a Go port of; the values are
//! resolved here by go-yaml v2's `resolve.go` and `decode.go` and sigs.k8s.io/yaml's key conversion.
//! `crates/render/tests/yaml_parity.rs` checks every fixture chart against the Go libraries themselves; the
//! few known differences are listed in docs/decisions.md and kept in that test.

pub use cso_api::manifest::Manifest;
use serde_json::Value;

/// A rendered document that is not an object the operator can apply.
#[derive(Debug, thiserror::Error)]
#[error("rendered document {index}{}: {what}", template.as_ref().map(|s| format!(" ({s})")).unwrap_or_default())]
pub struct ManifestError {
    pub index: usize,
    /// The template the document came from.
    pub template: Option<String>,
    pub what: String,
}

/// Parses Helm's output.
pub fn parse_manifests(rendered: &str) -> Result<Vec<Manifest>, ManifestError> {
    let mut manifests = Vec::new();
    for (index, document) in split_documents(rendered)?.into_iter().enumerate() {
        let source = source_of(&document);
        let error = |what: String| ManifestError {
            index: index + 1,
            template: source.clone(),
            what,
        };
        // Repeated keys: the last one wins, as in go-yaml v2 (the ferrol addon's kindnet repeats `name`).
        let value = goyaml::to_json(&document).map_err(|e| error(format!("not valid YAML: {e}")))?;
        let object = match value {
            Value::Null => continue,
            object @ Value::Object(_) => object,
            other => return Err(error(format!("expected an object, found {other}"))),
        };
        let manifest = Manifest {
            object,
            source: source.clone(),
        };
        if manifest.api_version().is_empty() || manifest.kind().is_empty() || manifest.name().is_empty() {
            return Err(error("an object needs apiVersion, kind and metadata.name".into()));
        }
        manifests.push(manifest);
    }
    Ok(manifests)
}

/// Helm's `# Source:` comment of a document.
fn source_of(document: &str) -> Option<String> {
    document
        .lines()
        .find_map(|line| line.strip_prefix("# Source: "))
        .map(|s| s.trim().to_owned())
}

/// Splits a YAML stream into its documents as kubectl's `YAMLReader` does: a line starting with `---` separates
/// documents when the rest of it is blank or a comment, and is refused otherwise. Documents of blank lines and
/// comments only are left out (go-yaml reads them as null, which kubectl and Helm skip).
fn split_documents(stream: &str) -> Result<Vec<String>, ManifestError> {
    let mut documents = vec![String::new()];
    let kept = |documents: &[String]| documents.iter().filter(|d| has_content(d)).count();
    for line in stream.lines() {
        if let Some(rest) = line.strip_prefix("---") {
            let rest = rest.trim();
            if !rest.is_empty() && !rest.starts_with('#') {
                let current = documents.last().map(String::as_str).unwrap_or_default();
                return Err(ManifestError {
                    index: kept(&documents[..documents.len() - 1]) + 1,
                    template: source_of(current),
                    what: format!("invalid document separator: {rest}"),
                });
            }
            documents.push(String::new());
        } else if let Some(current) = documents.last_mut() {
            current.push_str(line);
            current.push('\n');
        }
    }
    documents.retain(|d| has_content(d));
    Ok(documents)
}

fn has_content(document: &str) -> bool {
    document
        .lines()
        .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
}

/// One YAML document into JSON the way `sigs.k8s.io/yaml.YAMLToJSON` (go-yaml v2 underneath) does it.
mod goyaml {
    use std::{collections::BTreeMap, collections::HashMap, io::BufRead};

    use base64::Engine;
    use libyaml_safer::{Event, EventData, Parser};
    use serde_json::Value;

    const STR: &str = "tag:yaml.org,2002:str";
    const BOOL: &str = "tag:yaml.org,2002:bool";
    const INT: &str = "tag:yaml.org,2002:int";
    const FLOAT: &str = "tag:yaml.org,2002:float";
    const NULL: &str = "tag:yaml.org,2002:null";
    const TIMESTAMP: &str = "tag:yaml.org,2002:timestamp";
    const BINARY: &str = "tag:yaml.org,2002:binary";
    const MERGE: &str = "tag:yaml.org,2002:merge";

    /// Deeper nesting (aliases expanded) is refused. go-yaml stops at 10000; this bound keeps the recursion
    /// within half a Tokio worker's stack even unoptimised (about 1.5 KiB a level), and no Kubernetes object
    /// comes near it (the deepest CRDs of Cluster API and cert-manager nest 38 levels).
    pub(super) const MAX_DEPTH: usize = 500;

    #[derive(Debug)]
    enum Node {
        /// `tag` is empty when the scalar has none; `implicit` is libyaml's `plain_implicit`.
        Scalar {
            value: String,
            tag: String,
            implicit: bool,
        },
        Sequence(Vec<usize>),
        /// Keys and values, alternating.
        Mapping(Vec<usize>),
        Alias {
            name: String,
            target: usize,
        },
    }

    /// A scalar as go-yaml decodes it into an `interface{}`.
    #[derive(Debug)]
    enum Scalar {
        Null,
        Bool(bool),
        Int(i64),
        Uint(u64),
        Float(f64),
        Str(String),
    }

    /// A decoded value and how many NaNs and infinities it holds: Go's JSON encoder refuses those, but only if
    /// they are still there at the end (a repeated key can replace one).
    type Decoded = (Value, usize);

    /// A mapping being decoded, with the NaNs and infinities under each key.
    #[derive(Default)]
    struct Object {
        map: serde_json::Map<String, Value>,
        non_finite: BTreeMap<String, usize>,
    }

    impl Object {
        fn insert(&mut self, key: String, (value, non_finite): Decoded) {
            if non_finite > 0 {
                self.non_finite.insert(key.clone(), non_finite);
            } else {
                self.non_finite.remove(&key);
            }
            self.map.insert(key, value);
        }
    }

    /// The first document of `text` as JSON (`Null` when there is none).
    pub(super) fn to_json(text: &str) -> Result<Value, String> {
        // libyaml-safer panics on a few inputs instead of answering (a tag directly followed by `,` in a flow
        // collection, which go-yaml reads): a document it cannot read is refused, never the operator's end.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode(text)))
            .unwrap_or_else(|_| Err("the YAML parser failed on this document".into()))
    }

    fn decode(text: &str) -> Result<Value, String> {
        let mut input = text.as_bytes();
        let mut parser = Parser::new();
        parser.set_input_string(&mut input);
        let mut composer = Composer {
            parser,
            nodes: Vec::new(),
            anchors: HashMap::new(),
        };
        let Some(root) = composer.document()? else {
            return Ok(Value::Null);
        };
        let nodes = composer.nodes;
        let mut decoder = Decoder {
            nodes: &nodes,
            expanding: vec![false; nodes.len()],
            decode_count: 0,
            alias_count: 0,
            alias_depth: 0,
        };
        match decoder.value(root, 0)? {
            (value, 0) => Ok(value),
            _ => Err("json: unsupported value: NaN or an infinity".into()),
        }
    }

    /// go-yaml's parser: events into nodes, anchors recorded when their node starts.
    struct Composer<R> {
        parser: Parser<R>,
        nodes: Vec<Node>,
        anchors: HashMap<String, usize>,
    }

    impl<R: BufRead> Composer<R> {
        fn next(&mut self) -> Result<Event, String> {
            self.parser.parse().map_err(|e| e.to_string())
        }

        fn document(&mut self) -> Result<Option<usize>, String> {
            if !matches!(self.next()?.data, EventData::StreamStart { .. }) {
                return Err("expected the start of the stream".into());
            }
            match self.next()?.data {
                EventData::StreamEnd => Ok(None),
                EventData::DocumentStart { .. } => {
                    let root = self.root()?;
                    match self.next()?.data {
                        EventData::DocumentEnd { .. } => Ok(Some(root)),
                        other => Err(format!("expected the end of the document, found {other:?}")),
                    }
                }
                other => Err(format!("expected a document, found {other:?}")),
            }
        }

        fn push(&mut self, node: Node, anchor: Option<String>) -> usize {
            self.nodes.push(node);
            let id = self.nodes.len() - 1;
            if let Some(anchor) = anchor {
                self.anchors.insert(anchor, id);
            }
            id
        }

        /// The document's node, its collections composed without recursion.
        fn root(&mut self) -> Result<usize, String> {
            let mut open: Vec<usize> = Vec::new();
            loop {
                let id = match self.next()?.data {
                    EventData::Scalar {
                        anchor,
                        tag,
                        value,
                        plain_implicit,
                        ..
                    } => self.push(
                        Node::Scalar {
                            value,
                            tag: tag.unwrap_or_default(),
                            implicit: plain_implicit,
                        },
                        anchor,
                    ),
                    EventData::Alias { anchor } => {
                        let target = *self
                            .anchors
                            .get(&anchor)
                            .ok_or_else(|| format!("unknown anchor '{anchor}' referenced"))?;
                        self.push(Node::Alias { name: anchor, target }, None)
                    }
                    EventData::SequenceStart { anchor, .. } | EventData::MappingStart { anchor, .. }
                        if open.len() >= MAX_DEPTH =>
                    {
                        let _ = anchor;
                        return Err(format!("exceeded max depth of {MAX_DEPTH}"));
                    }
                    EventData::SequenceStart { anchor, .. } => {
                        open.push(self.push(Node::Sequence(Vec::new()), anchor));
                        continue;
                    }
                    EventData::MappingStart { anchor, .. } => {
                        open.push(self.push(Node::Mapping(Vec::new()), anchor));
                        continue;
                    }
                    EventData::SequenceEnd | EventData::MappingEnd => match open.pop() {
                        Some(id) => id,
                        None => return Err("a collection ends that never started".into()),
                    },
                    other => return Err(format!("unexpected {other:?}")),
                };
                match open.last() {
                    None => return Ok(id),
                    Some(parent) => match &mut self.nodes[*parent] {
                        Node::Sequence(children) | Node::Mapping(children) => children.push(id),
                        Node::Scalar { .. } | Node::Alias { .. } => {}
                    },
                }
            }
        }
    }

    /// go-yaml v2's decoder into `interface{}` (decode.go), with its guard against alias bombs.
    struct Decoder<'n> {
        nodes: &'n [Node],
        /// Alias nodes being expanded: one met again contains itself.
        expanding: Vec<bool>,
        decode_count: usize,
        alias_count: usize,
        alias_depth: usize,
    }

    const WANT_MAP: &str = "map merge requires map or sequence of maps as the value";

    impl Decoder<'_> {
        /// go-yaml's `unmarshal` prologue: counts every node decoded and those decoded through an alias.
        fn count(&mut self, depth: usize) -> Result<(), String> {
            if depth > MAX_DEPTH {
                return Err(format!("exceeded max depth of {MAX_DEPTH}"));
            }
            self.decode_count += 1;
            if self.alias_depth > 0 {
                self.alias_count += 1;
            }
            let ratio = self.alias_count as f64 / self.decode_count as f64;
            if self.alias_count > 100
                && self.decode_count > 1000
                && ratio > allowed_alias_ratio(self.decode_count)
            {
                return Err("document contains excessive aliasing".into());
            }
            Ok(())
        }

        /// One node (frames kept small, one call per kind: the recursion is as deep as the document).
        fn value(&mut self, id: usize, depth: usize) -> Result<Decoded, String> {
            self.count(depth)?;
            match &self.nodes[id] {
                Node::Alias { .. } => self.alias(id, depth),
                Node::Scalar { .. } => scalar_value(&self.nodes[id]),
                Node::Sequence(_) => self.sequence(id, depth),
                Node::Mapping(_) => self.mapping(id, depth),
            }
        }

        #[inline(never)]
        fn alias(&mut self, id: usize, depth: usize) -> Result<Decoded, String> {
            let Node::Alias { name, target } = &self.nodes[id] else {
                return Err("not an alias".into());
            };
            self.through_alias(id, name, |d| d.value(*target, depth + 1))
        }

        #[inline(never)]
        fn sequence(&mut self, id: usize, depth: usize) -> Result<Decoded, String> {
            let Node::Sequence(children) = &self.nodes[id] else {
                return Err("not a sequence".into());
            };
            let mut items = Vec::with_capacity(children.len());
            let mut non_finite = 0;
            for child in children {
                let (item, n) = self.value(*child, depth + 1)?;
                items.push(item);
                non_finite += n;
            }
            Ok((Value::Array(items), non_finite))
        }

        #[inline(never)]
        fn mapping(&mut self, id: usize, depth: usize) -> Result<Decoded, String> {
            let mut object = Object::default();
            self.mapping_into(id, &mut object, depth)?;
            let non_finite = object.non_finite.values().sum();
            Ok((Value::Object(object.map), non_finite))
        }

        /// A map key: a scalar (perhaps through an alias) as sigs.k8s.io/yaml names it.
        fn key(&mut self, id: usize, depth: usize) -> Result<String, String> {
            self.count(depth)?;
            let nodes = self.nodes;
            match &nodes[id] {
                Node::Alias { name, target } => self.through_alias(id, name, |d| d.key(*target, depth + 1)),
                Node::Scalar { value, tag, implicit } => json_key(scalar(value, tag, *implicit)?),
                Node::Sequence(_) | Node::Mapping(_) => Err("invalid map key: a collection".into()),
            }
        }

        /// Decodes an alias's target, refusing one that contains itself.
        fn through_alias<T>(
            &mut self,
            id: usize,
            name: &str,
            decode: impl FnOnce(&mut Self) -> Result<T, String>,
        ) -> Result<T, String> {
            if self.expanding[id] {
                return Err(format!("anchor '{name}' value contains itself"));
            }
            self.expanding[id] = true;
            self.alias_depth += 1;
            let result = decode(self);
            self.alias_depth -= 1;
            self.expanding[id] = false;
            result
        }

        /// A mapping node's entries into `out` (a new map, or the map a merge key merges into).
        fn mapping_into(&mut self, id: usize, out: &mut Object, depth: usize) -> Result<(), String> {
            let nodes = self.nodes;
            let Node::Mapping(children) = &nodes[id] else {
                return Err(WANT_MAP.into());
            };
            for pair in children.chunks(2) {
                let [key, value] = pair else {
                    return Err("a mapping key without a value".into());
                };
                if is_merge(&nodes[*key]) {
                    self.merge(*value, out, depth + 1)?;
                    continue;
                }
                let key = self.key(*key, depth + 1)?;
                let value = self.value(*value, depth + 1)?;
                out.insert(key, value);
            }
            Ok(())
        }

        /// `<<: value`: a mapping, an alias of one, or a sequence of those (earlier ones win).
        fn merge(&mut self, id: usize, out: &mut Object, depth: usize) -> Result<(), String> {
            let nodes = self.nodes;
            let is_map = |id: usize| match &nodes[id] {
                Node::Mapping(_) => true,
                Node::Alias { target, .. } => matches!(nodes[*target], Node::Mapping(_)),
                _ => false,
            };
            match &nodes[id] {
                Node::Mapping(_) | Node::Alias { .. } if is_map(id) => self.merge_into(id, out, depth),
                Node::Sequence(children) => {
                    for child in children.iter().rev() {
                        if !is_map(*child) {
                            return Err(WANT_MAP.into());
                        }
                        self.merge_into(*child, out, depth)?;
                    }
                    Ok(())
                }
                _ => Err(WANT_MAP.into()),
            }
        }

        /// go-yaml's `unmarshal` of a mapping (or an alias of one) into an existing map.
        fn merge_into(&mut self, id: usize, out: &mut Object, depth: usize) -> Result<(), String> {
            self.count(depth)?;
            let nodes = self.nodes;
            match &nodes[id] {
                Node::Alias { name, target } => {
                    self.through_alias(id, name, |d| d.merge_into(*target, out, depth + 1))
                }
                _ => self.mapping_into(id, out, depth),
            }
        }
    }

    #[inline(never)]
    fn scalar_value(node: &Node) -> Result<Decoded, String> {
        let Node::Scalar { value, tag, implicit } = node else {
            return Err("not a scalar".into());
        };
        Ok(match scalar(value, tag, *implicit)? {
            Scalar::Float(f) if !f.is_finite() => (Value::Null, 1),
            scalar => (json(scalar), 0),
        })
    }

    fn is_merge(node: &Node) -> bool {
        matches!(node, Node::Scalar { value, tag, implicit } if value == "<<" && (*implicit || tag == MERGE))
    }

    fn allowed_alias_ratio(decode_count: usize) -> f64 {
        const LOW: usize = 400_000;
        const HIGH: usize = 4_000_000;
        match decode_count {
            n if n <= LOW => 0.99,
            n if n >= HIGH => 0.10,
            n => 0.99 - 0.89 * ((n - LOW) as f64 / (HIGH - LOW) as f64),
        }
    }

    /// go-yaml's `decoder.scalar` into an `interface{}`.
    fn scalar(value: &str, tag: &str, implicit: bool) -> Result<Scalar, String> {
        if tag.is_empty() && !implicit {
            return Ok(Scalar::Str(value.to_owned()));
        }
        match resolve(tag, value)? {
            Resolved::Other if tag == BINARY => {
                let text: String = value.chars().filter(|c| *c != '\r' && *c != '\n').collect();
                let bytes = BASE64
                    .decode(text)
                    .map_err(|_| "!!binary value contains invalid base64 data".to_owned())?;
                Ok(Scalar::Str(go_string(&bytes)))
            }
            Resolved::Null => Ok(Scalar::Null),
            Resolved::Bool(b) => Ok(Scalar::Bool(b)),
            Resolved::Int(i) => Ok(Scalar::Int(i)),
            Resolved::Uint(u) => Ok(Scalar::Uint(u)),
            Resolved::Float(f) => Ok(Scalar::Float(f)),
            // A timestamp stays the string it was (go-yaml v2, for `interface{}`), as does everything else.
            Resolved::Str | Resolved::Timestamp | Resolved::Merge | Resolved::Other => {
                Ok(Scalar::Str(value.to_owned()))
            }
        }
    }

    /// Go's base64.StdEncoding: padding required, stray bits after the last character allowed.
    const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );

    /// Bytes into a string as Go's JSON encoder writes them: each byte that does not start a valid UTF-8
    /// sequence becomes U+FFFD.
    fn go_string(mut bytes: &[u8]) -> String {
        let mut out = String::new();
        loop {
            match std::str::from_utf8(bytes) {
                Ok(valid) => {
                    out.push_str(valid);
                    return out;
                }
                Err(e) => {
                    let (valid, rest) = bytes.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    out.push('\u{FFFD}');
                    bytes = rest.get(1..).unwrap_or_default();
                }
            }
        }
    }

    #[derive(Debug)]
    enum Resolved {
        Null,
        Bool(bool),
        Int(i64),
        Uint(u64),
        Float(f64),
        Str,
        Timestamp,
        Merge,
        /// A tag go-yaml does not resolve (`!!binary`, `!custom`): the value stays a string.
        Other,
    }

    impl Resolved {
        fn tag(&self) -> &'static str {
            match self {
                Resolved::Null => NULL,
                Resolved::Bool(_) => BOOL,
                Resolved::Int(_) | Resolved::Uint(_) => INT,
                Resolved::Float(_) => FLOAT,
                Resolved::Str | Resolved::Other => STR,
                Resolved::Timestamp => TIMESTAMP,
                Resolved::Merge => MERGE,
            }
        }
    }

    /// go-yaml v2's `resolve` (resolve.go): YAML 1.1 booleans, Go's integer syntax (`0x`, `0o`, `0b`, a
    /// leading `0` for octal, `_` ignored), decimal floats, no base 60.
    fn resolve(tag: &str, value: &str) -> Result<Resolved, String> {
        if !matches!(tag, "" | STR | BOOL | INT | FLOAT | NULL | TIMESTAMP) {
            return Ok(Resolved::Other);
        }
        let resolved = resolve_plain(tag, value);
        if tag.is_empty() || tag == resolved.tag() || tag == STR {
            return Ok(resolved);
        }
        match resolved {
            Resolved::Int(i) if tag == FLOAT => Ok(Resolved::Float(i as f64)),
            _ => Err(format!(
                "cannot decode {} `{value}` as a {}",
                short_tag(resolved.tag()),
                short_tag(tag)
            )),
        }
    }

    fn short_tag(tag: &str) -> String {
        match tag.strip_prefix("tag:yaml.org,2002:") {
            Some(name) => format!("!!{name}"),
            None => tag.to_owned(),
        }
    }

    fn resolve_plain(tag: &str, value: &str) -> Resolved {
        let hint = match value.as_bytes().first() {
            None => b'N',
            Some(b'+' | b'-') => b'S',
            Some(b'0'..=b'9') => b'D',
            Some(b'y' | b'Y' | b'n' | b'N' | b't' | b'T' | b'f' | b'F' | b'o' | b'O' | b'~') => b'M',
            Some(b'.') => b'.',
            Some(_) => 0,
        };
        if hint == 0 || tag == STR {
            return Resolved::Str;
        }
        match value {
            "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
                return Resolved::Bool(true);
            }
            "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
                return Resolved::Bool(false);
            }
            "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
            ".nan" | ".NaN" | ".NAN" => return Resolved::Float(f64::NAN),
            ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return Resolved::Float(f64::INFINITY),
            "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float(f64::NEG_INFINITY),
            "<<" => return Resolved::Merge,
            _ => {}
        }
        match hint {
            b'.' => {
                if let Some(f) = go_decimal_float(value) {
                    return Resolved::Float(f);
                }
            }
            b'D' | b'S' => {
                // Only an explicit `!!timestamp` changes the outcome: an untagged timestamp stays its string.
                if tag == TIMESTAMP && is_timestamp(value) {
                    return Resolved::Timestamp;
                }
                let plain = value.replace('_', "");
                if let Some(i) = go_parse_int(&plain, 0) {
                    return Resolved::Int(i);
                }
                if let Some(u) = go_parse_uint(&plain, 0) {
                    return Resolved::Uint(u);
                }
                if let Some(f) = go_decimal_float(&plain) {
                    return Resolved::Float(f);
                }
                if let Some(digits) = plain.strip_prefix("0b") {
                    if let Some(i) = go_parse_int(digits, 2) {
                        return Resolved::Int(i);
                    }
                    if let Some(u) = go_parse_uint(digits, 2) {
                        return Resolved::Uint(u);
                    }
                } else if let Some(digits) = plain.strip_prefix("-0b")
                    && let Some(i) = go_parse_int(&format!("-{digits}"), 2)
                {
                    return Resolved::Int(i);
                }
            }
            _ => {}
        }
        Resolved::Str
    }

    /// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$` (go-yaml's `yamlStyleFloat`), then Go's
    /// `ParseFloat`, which refuses what overflows.
    fn go_decimal_float(s: &str) -> Option<f64> {
        let b = s.as_bytes();
        let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
        let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
        if b.get(i) == Some(&b'.') {
            let n = digits(i + 1);
            if n == 0 {
                return None;
            }
            i += 1 + n;
        } else {
            let n = digits(i);
            if n == 0 {
                return None;
            }
            i += n;
            if b.get(i) == Some(&b'.') {
                i += 1 + digits(i + 1);
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            let n = digits(i);
            if n == 0 {
                return None;
            }
            i += n;
        }
        if i != b.len() {
            return None;
        }
        s.parse::<f64>().ok().filter(|f| f.is_finite())
    }

    /// Go's `strconv.ParseUint(s, base, 64)` for base 0 (prefixes `0b`, `0o`, `0x`, a leading `0` for
    /// octal) or a given base; no sign.
    fn go_parse_uint(s: &str, base: u32) -> Option<u64> {
        let b = s.as_bytes();
        if b.is_empty() {
            return None;
        }
        let (digits, base) = match base {
            0 if b[0] == b'0' => match b.get(1).map(u8::to_ascii_lowercase) {
                Some(b'b') if b.len() >= 3 => (&b[2..], 2),
                Some(b'o') if b.len() >= 3 => (&b[2..], 8),
                Some(b'x') if b.len() >= 3 => (&b[2..], 16),
                _ => (&b[1..], 8),
            },
            0 => (b, 10),
            base => (b, base),
        };
        digits.iter().try_fold(0u64, |n, c| {
            let d = char::from(*c).to_digit(36)?;
            if d >= base {
                return None;
            }
            n.checked_mul(u64::from(base))?.checked_add(u64::from(d))
        })
    }

    /// Go's `strconv.ParseInt(s, base, 64)`: an optional sign, then [`go_parse_uint`].
    fn go_parse_int(s: &str, base: u32) -> Option<i64> {
        let (negative, rest) = match s.as_bytes().first() {
            Some(b'+') => (false, &s[1..]),
            Some(b'-') => (true, &s[1..]),
            _ => (false, s),
        };
        let n = go_parse_uint(rest, base)?;
        if negative {
            0i64.checked_sub_unsigned(n)
        } else {
            i64::try_from(n).ok()
        }
    }

    /// Whether Go's `time.Parse` reads `s` with one of go-yaml's timestamp layouts: `2006-1-2`, or that with
    /// `T`/`t` and `15:4:5.999999999Z07:00`, or with a space and `15:4:5.999999999`.
    fn is_timestamp(s: &str) -> bool {
        fn number(s: &str, min: usize, max: usize) -> Option<(u32, &str)> {
            let n = s.bytes().take(max).take_while(u8::is_ascii_digit).count();
            if n < min {
                return None;
            }
            Some((s[..n].parse().ok()?, &s[n..]))
        }
        fn date(s: &str) -> Option<&str> {
            let (year, rest) = number(s, 4, 4)?;
            let (month, rest) = number(rest.strip_prefix('-')?, 1, 2)?;
            let (day, rest) = number(rest.strip_prefix('-')?, 1, 2)?;
            let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
            let days = match month {
                1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
                4 | 6 | 9 | 11 => 30,
                2 if leap => 29,
                2 => 28,
                _ => return None,
            };
            (1..=days).contains(&day).then_some(rest)
        }
        /// `15:4:5` and an optional fraction; what follows.
        fn time(s: &str) -> Option<&str> {
            let (hour, rest) = number(s, 1, 2)?;
            let (minute, rest) = number(rest.strip_prefix(':')?, 1, 2)?;
            let (second, rest) = number(rest.strip_prefix(':')?, 1, 2)?;
            if hour > 23 || minute > 59 || second > 59 {
                return None;
            }
            match rest.strip_prefix(['.', ',']) {
                Some(fraction) if fraction.starts_with(|c: char| c.is_ascii_digit()) => {
                    Some(fraction.trim_start_matches(|c: char| c.is_ascii_digit()))
                }
                _ => Some(rest),
            }
        }
        fn zone(z: &str) -> bool {
            let b = z.as_bytes();
            z == "Z"
                || (b.len() == 6
                    && matches!(b[0], b'+' | b'-')
                    && b[3] == b':'
                    && [b[1], b[2], b[4], b[5]].iter().all(u8::is_ascii_digit))
        }
        match date(s) {
            None => false,
            Some("") => true,
            Some(rest) => match rest.strip_prefix(['T', 't']) {
                Some(rest) => time(rest).is_some_and(zone),
                None => rest.strip_prefix(' ').and_then(time) == Some(""),
            },
        }
    }

    /// sigs.k8s.io/yaml's map keys: strings, integers, floats (Go's `%g` of the float32) and booleans; null
    /// and large unsigned keys are refused.
    fn json_key(key: Scalar) -> Result<String, String> {
        match key {
            Scalar::Str(s) => Ok(s),
            Scalar::Int(i) => Ok(i.to_string()),
            Scalar::Bool(b) => Ok(b.to_string()),
            Scalar::Float(f) => Ok(go_format_float32(f)),
            Scalar::Null => Err("unsupported map key of type: <nil>".into()),
            Scalar::Uint(u) => Err(format!("unsupported map key of type: uint64, key: {u}")),
        }
    }

    /// `strconv.FormatFloat(f, 'g', -1, 32)`, with go-yaml's names for infinities and NaN.
    fn go_format_float32(f: f64) -> String {
        if f.is_nan() {
            return ".nan".into();
        }
        #[allow(
            clippy::cast_possible_truncation,
            reason = "Go formats the key as a float32 too"
        )]
        let single = f as f32;
        // Infinite as a float32 too when it overflows one (Go's "+Inf", which sigs.k8s.io/yaml renames).
        if single.is_infinite() {
            return if single > 0.0 {
                ".inf".into()
            } else {
                "-.inf".into()
            };
        }
        // Shortest digits that read back as the same float32, and the decimal exponent.
        let scientific = format!("{:e}", single.abs());
        let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
        let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
        let exponent: i32 = exponent.parse().unwrap_or_default();
        let sign = if single.is_sign_negative() { "-" } else { "" };
        if single == 0.0 {
            return format!("{sign}0");
        }
        if !(-4..6).contains(&exponent) {
            let (first, rest) = digits.split_at(1);
            let fraction = if rest.is_empty() {
                String::new()
            } else {
                format!(".{rest}")
            };
            let exponent_sign = if exponent < 0 { '-' } else { '+' };
            return format!("{sign}{first}{fraction}e{exponent_sign}{:02}", exponent.abs());
        }
        // Plain notation, the decimal point after `exponent + 1` digits.
        let point = exponent + 1;
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else {
            let point = point as usize;
            if digits.len() <= point {
                format!("{digits}{}", "0".repeat(point - digits.len()))
            } else {
                format!("{}.{}", &digits[..point], &digits[point..])
            }
        };
        format!("{sign}{text}")
    }

    /// A scalar as Go's JSON encoder writes it: integral floats are written without a fraction (so
    /// `replicas: 1.0` stays an integer).
    fn json(scalar: Scalar) -> Value {
        match scalar {
            Scalar::Null => Value::Null,
            Scalar::Bool(b) => Value::Bool(b),
            Scalar::Int(i) => Value::from(i),
            Scalar::Uint(u) => Value::from(u),
            Scalar::Float(f) => float_json(f),
            Scalar::Str(s) => Value::String(s),
        }
    }

    /// A float as the API server receives it from Go: Go writes the shortest digits without an exponent below
    /// 1e21 (`1`, `9223372036854776000`), and a JSON reader takes what fits an integer as one.
    fn float_json(f: f64) -> Value {
        let negative_zero = f == 0.0 && f.is_sign_negative();
        if f.is_finite() && f.abs() < 1e21 && !negative_zero {
            // Rust's `Display` of a float is the shortest round-trip digits, never an exponent: Go's 'f', -1.
            let text = f.to_string();
            if let Ok(i) = text.parse::<i64>() {
                return Value::from(i);
            }
            if let Ok(u) = text.parse::<u64>() {
                return Value::from(u);
            }
        }
        // Not finite: counted by the caller, never written.
        serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn go_number_syntax() {
            for (text, expected) in [
                ("0755", Some(493)),
                ("0o17", Some(15)),
                ("0x1F", Some(31)),
                ("-0b101", Some(-5)),
                ("+7", Some(7)),
                ("0", Some(0)),
                ("09", None),
                ("0x", None),
                ("-9223372036854775808", Some(i64::MIN)),
                ("9223372036854775808", None),
            ] {
                assert_eq!(go_parse_int(text, 0), expected, "{text}");
            }
            assert_eq!(go_parse_uint("18446744073709551615", 0), Some(u64::MAX));
            assert_eq!(go_decimal_float("1e400"), None);
            assert_eq!(go_decimal_float("5."), Some(5.0));
            assert_eq!(go_decimal_float("-.5e1"), Some(-5.0));
            assert_eq!(go_decimal_float("1.2.3"), None);
        }

        #[test]
        fn float_keys_as_go_formats_them() {
            for (f, expected) in [
                (1.5, "1.5"),
                (100.0, "100"),
                (1e6, "1e+06"),
                (123_456.0, "123456"),
                (0.0001, "0.0001"),
                (0.00001, "1e-05"),
                (0.1, "0.1"),
                (-2.5, "-2.5"),
                (1234.5678, "1234.5677"),
            ] {
                assert_eq!(go_format_float32(f), expected, "{f}");
            }
        }

        #[test]
        fn timestamps() {
            for (text, expected) in [
                ("2001-12-14", true),
                ("2001-2-30", false),
                ("2001-12-14T21:59:43.10Z", true),
                ("2001-12-14t21:59:43+05:00", true),
                ("2001-12-14 21:59:43.10", true),
                ("2001-12-14 21:59:43 +5", false),
                ("2001-12", false),
            ] {
                assert_eq!(is_timestamp(text), expected, "{text}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{goyaml::MAX_DEPTH, *};

    #[test]
    fn parses_helm_output_and_skips_empty_documents() {
        let rendered = "---\n# Source: chart/templates/empty.yaml\n---\n# Source: chart/templates/sa.yaml\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: metrics-server\n  namespace: kube-system\n---\n# Source: chart/templates/svc.yaml\napiVersion: v1\nkind: Service\nmetadata:\n  name: metrics-server\nspec:\n  ports: [{port: 443}]\n";
        let manifests = parse_manifests(rendered).unwrap();
        assert_eq!(manifests.len(), 2);
        assert_eq!(
            (manifests[0].kind(), manifests[0].namespace()),
            ("ServiceAccount", Some("kube-system"))
        );
        assert_eq!((manifests[1].kind(), manifests[1].namespace()), ("Service", None));
        assert_eq!(manifests[1].source.as_deref(), Some("chart/templates/svc.yaml"));
        assert_eq!(manifests[0].group_version(), ("", "v1"));
    }

    #[test]
    fn repeated_keys_keep_the_last_value() {
        let manifests =
            parse_manifests("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  name: b\n").unwrap();
        assert_eq!(manifests[0].name(), "b");
    }

    #[test]
    fn refuses_documents_that_are_not_objects() {
        for (text, expected) in [
            (
                "---\n# Source: c/t.yaml\nkind: Service\nmetadata: {name: x}\n",
                "document 1 (c/t.yaml): an object needs apiVersion",
            ),
            ("---\n- a\n- b\n", "expected an object"),
            ("---\napiVersion: v1\nkind: [\n", "not valid YAML"),
            (
                "---\n# Source: c/a.yaml\na: 1\n--- b\n",
                "document 1 (c/a.yaml): invalid document separator: b",
            ),
            ("a: &x [*x]\n", "anchor 'x' value contains itself"),
            ("a: *nope\n", "unknown anchor 'nope'"),
            ("? [a]\n: b\n", "invalid map key"),
            ("~: b\n", "unsupported map key"),
            ("a: .nan\n", "unsupported value"),
            ("a: !!int x\n", "cannot decode !!str `x` as a !!int"),
        ] {
            let message = parse_manifests(text).unwrap_err().to_string();
            assert!(message.contains(expected), "{text:?}: {message}");
        }
    }

    /// The column-0 continuation of a double-quoted scalar (as the OpenStack `scs` 1.32 stack renders), which
    /// YAML 1.2 parsers refuse: go-yaml folds the line break into a space.
    #[test]
    fn quoted_scalars_continued_in_column_zero_read_as_go_yaml_reads_them() {
        let manifests = parse_manifests(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: yamlq\ndata:\n  k: \"first line\nsecond line\"\n",
        )
        .unwrap();
        assert_eq!(manifests[0].object["data"]["k"], "first line second line");
    }

    #[test]
    fn values_resolve_by_go_yaml_v2() {
        let text = "apiVersion: v1\nkind: X\nmetadata: {name: x}\nv:\n  on: yes\n  off: Off\n  octal: 0755\n  float: 1.0\n  big: 1e20\n  under: 1_000\n  date: 2001-12-14\n  tilde: ~\n  quoted: \"0755\"\n  str: !!str 12\n  fl: !!float 3\n  bin: !!binary aGk=\n  1: int key\n  1.5: float key\n  true: bool key\n  nine: 09\n  hex: 0x1F\n  neg: -0b11\n  plus: +12\n  dot: .5\n  custom: !foo 12\n";
        let object = &parse_manifests(text).unwrap()[0].object;
        assert_eq!(
            object["v"],
            json!({"true": "bool key", "false": false, "octal": 493, "float": 1, "big": 1e20, "under": 1000,
                   "date": "2001-12-14", "tilde": null, "quoted": "0755", "str": "12", "fl": 3, "bin": "hi",
                   "1": "int key", "1.5": "float key", "nine": 9, "hex": 31, "neg": -3, "plus": 12, "dot": 0.5,
                   "custom": "12"})
        );
    }

    #[test]
    fn anchors_aliases_and_merge_keys() {
        let text = "apiVersion: v1\nkind: X\nmetadata: {name: x}\nbase: &b {a: 1, b: 2}\nmore: &m {c: 3}\none: {<<: *b, b: 9}\nlater: {b: 9, <<: *b}\nmany: {<<: [*b, *m, {a: 7}]}\nlist: [*b, *m]\n";
        let object = &parse_manifests(text).unwrap()[0].object;
        assert_eq!(object["one"], json!({"a": 1, "b": 9}));
        assert_eq!(
            object["later"],
            json!({"a": 1, "b": 2}),
            "a merge after a key overrides it, as in go-yaml v2"
        );
        assert_eq!(
            object["many"],
            json!({"a": 1, "b": 2, "c": 3}),
            "earlier maps of a merge list win"
        );
        assert_eq!(object["list"], json!([{"a": 1, "b": 2}, {"c": 3}]));
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut text = String::from(
            "apiVersion: v1\nkind: X\nmetadata: {name: x}\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n",
        );
        for i in 1..9 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let message = parse_manifests(&text).unwrap_err().to_string();
        assert!(message.contains("excessive aliasing"), "{message}");
    }

    /// Within half the stack of a Tokio worker (2 MiB), even unoptimised.
    #[test]
    fn deep_nesting_is_bounded() {
        let deep = |n: usize, open: &str, close: &str| {
            format!(
                "apiVersion: v1\nkind: X\nmetadata: {{name: x}}\nd: {}1{}\n",
                open.repeat(n),
                close.repeat(n)
            )
        };
        let parse = move || {
            let mut messages = Vec::new();
            for (open, close) in [("[", "]"), ("{a: ", "}")] {
                assert!(parse_manifests(&deep(MAX_DEPTH - 1, open, close)).is_ok());
                messages.push(
                    parse_manifests(&deep(MAX_DEPTH, open, close))
                        .unwrap_err()
                        .to_string(),
                );
            }
            messages
        };
        let messages = std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(parse)
            .unwrap()
            .join()
            .unwrap();
        for message in messages {
            assert!(message.contains("max depth"), "{message}");
        }
    }
}
