//! Rendered YAML (a multi-document stream) into objects. Empty documents are skipped; every other
//! document must be an object with `apiVersion`, `kind` and `metadata.name`, or the whole stream is refused
//! with the document's number and Helm's `# Source:` file named. [`Manifest`] itself lives in `cso_api`, where
//! the apply engine takes it from without depending on the renderer.

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
    for (index, document) in split_documents(rendered).into_iter().enumerate() {
        let source = document
            .lines()
            .find_map(|line| line.strip_prefix("# Source: "))
            .map(|s| s.trim().to_owned());
        let error = |what: String| ManifestError {
            index: index + 1,
            template: source.clone(),
            what,
        };
        // Real charts repeat keys (the ferrol addon's kindnet repeats `name`); like the Go operator, the
        // last one wins.
        let options = serde_saphyr::options! { duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins };
        let value: Option<Value> = serde_saphyr::from_str_with_options(&document, options)
            .map_err(|e| error(format!("not valid YAML: {e}")))?;
        let object = match value {
            None | Some(Value::Null) => continue,
            Some(object @ Value::Object(_)) => object,
            Some(other) => return Err(error(format!("expected an object, found {other}"))),
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

/// Splits a YAML stream at `---` lines (Helm puts each template's output behind one).
fn split_documents(stream: &str) -> Vec<String> {
    let mut documents = vec![String::new()];
    for line in stream.lines() {
        if line == "---" || line.starts_with("--- ") {
            documents.push(String::new());
        } else if let Some(current) = documents.last_mut() {
            current.push_str(line);
            current.push('\n');
        }
    }
    documents
        .into_iter()
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            let message = parse_manifests(text).unwrap_err().to_string();
            assert!(message.contains(expected), "{message}");
        }
    }
}
