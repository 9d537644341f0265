//! CEL wait conditions of addon stages (`waitForPreCondition`, `waitForPostCondition`): the named objects
//! are fetched from the target cluster and bound under their keys, then the expression is evaluated.
//!
//! A missing object, a kind the cluster does not serve yet, or a field that is not there yet (a status a
//! controller has not written) mean "not yet", never an error. An expression that does not compile is a
//! permanent error, found before anything is fetched; so is a result that is not a boolean. Expressions are
//! limited in length and evaluated off the async runtime with a time limit.

use std::time::Duration;

use cso_api::wait::WaitCondition;

use crate::{
    ClusterDiscovery,
    discovery::{ApiRef, DiscoveryError, GetObjectError},
};

const MAX_EXPRESSION_LEN: usize = 10_000;
const EVALUATION_TIMEOUT: Duration = Duration::from_secs(2);

/// A condition that cannot work, whatever the cluster holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    #[error("CEL expression {expression:?} does not compile: {message}")]
    Compile { expression: String, message: String },
    #[error("CEL expression {expression:?} gave {found}, not a boolean")]
    NotBool { expression: String, found: String },
    #[error("CEL expression {expression:?} took longer than {EVALUATION_TIMEOUT:?}")]
    Timeout { expression: String },
    #[error("failed to read {object} for a CEL condition: {message}")]
    Fetch { object: String, message: String },
}

/// The answer of a condition that works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CelOutcome {
    Satisfied,
    /// Not yet, and why (for the condition message).
    Waiting(String),
}

/// A wait condition whose expression compiled.
#[derive(Debug, Clone)]
pub struct CompiledCondition {
    condition: WaitCondition,
}

/// Compiles the expression (without fetching anything) so that a broken stack is reported at once.
pub fn compile(condition: &WaitCondition) -> Result<CompiledCondition, CelError> {
    check_compiles(&condition.conditions)?;
    Ok(CompiledCondition {
        condition: condition.clone(),
    })
}

fn check_compiles(expression: &str) -> Result<cel::Program, CelError> {
    let compile_error = |message: String| CelError::Compile {
        expression: expression.to_owned(),
        message,
    };
    if expression.len() > MAX_EXPRESSION_LEN {
        return Err(compile_error(format!(
            "longer than {MAX_EXPRESSION_LEN} characters"
        )));
    }
    cel::Program::compile(expression).map_err(|e| compile_error(e.to_string()))
}

impl CompiledCondition {
    /// Fetches the objects from the cluster and evaluates the expression.
    pub async fn evaluate(&self, discovery: &ClusterDiscovery) -> Result<CelOutcome, CelError> {
        let mut bound = Vec::new();
        for object in &self.condition.objects {
            let described = if object.namespace.is_empty() {
                format!("{} {}", object.kind, object.name)
            } else {
                format!("{} {}/{}", object.kind, object.namespace, object.name)
            };
            let namespace = (!object.namespace.is_empty()).then_some(object.namespace.as_str());
            let read = discovery
                .get_object(
                    ApiRef::Version(&object.api_version),
                    &object.kind,
                    namespace,
                    &object.name,
                )
                .await;
            match read {
                Ok(Some(found)) => {
                    let value = serde_json::to_value(&found).map_err(|e| CelError::Fetch {
                        object: described.clone(),
                        message: e.to_string(),
                    })?;
                    bound.push((object.key.clone(), value));
                }
                Ok(None) => return Ok(CelOutcome::Waiting(format!("waiting for {described} to exist"))),
                Err(GetObjectError::Discovery(DiscoveryError::UnknownKind(_))) => {
                    return Ok(CelOutcome::Waiting(format!(
                        "the cluster does not serve {} yet",
                        object.api_version
                    )));
                }
                Err(e) => {
                    return Err(CelError::Fetch {
                        object: described,
                        message: e.to_string(),
                    });
                }
            }
        }
        let expression = self.condition.conditions.clone();
        let evaluation = tokio::task::spawn_blocking(move || evaluate_bound(&expression, bound));
        match tokio::time::timeout(EVALUATION_TIMEOUT, evaluation).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(CelError::Fetch {
                object: "the evaluation".into(),
                message: join.to_string(),
            }),
            Err(_) => Err(CelError::Timeout {
                expression: self.condition.conditions.clone(),
            }),
        }
    }
}

/// Evaluates `expression` with `bound` variables (pure; the cluster has been read already).
pub fn evaluate_bound(
    expression: &str,
    bound: Vec<(String, serde_json::Value)>,
) -> Result<CelOutcome, CelError> {
    let program = check_compiles(expression)?;
    let mut context = cel::Context::default();
    for (key, value) in bound {
        context.add_variable_from_value(key, to_cel(value));
    }
    match program.execute(&context) {
        Ok(cel::Value::Bool(true)) => Ok(CelOutcome::Satisfied),
        Ok(cel::Value::Bool(false)) => Ok(CelOutcome::Waiting(format!("{expression} is false"))),
        Ok(other) => Err(CelError::NotBool {
            expression: expression.to_owned(),
            found: format!("{other:?}"),
        }),
        // A field that is not there yet (no status written) is something to wait for.
        Err(e) => Ok(CelOutcome::Waiting(format!("{expression}: {e}"))),
    }
}

/// JSON to CEL as Kubernetes' unstructured objects do it: whole numbers are `int` (so `replicas + 1` and
/// `replicas == 2` work as in the Go operator), other numbers `double`.
fn to_cel(value: serde_json::Value) -> cel::Value {
    use serde_json::Value as Json;
    match value {
        Json::Null => cel::Value::Null,
        Json::Bool(b) => cel::Value::Bool(b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => cel::Value::String(s.into()),
        Json::Array(items) => cel::Value::from(items.into_iter().map(to_cel).collect::<Vec<_>>()),
        Json::Object(map) => cel::Value::from(
            map.into_iter()
                .map(|(k, v)| (k, to_cel(v)))
                .collect::<std::collections::HashMap<_, _>>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(replicas: i64) -> serde_json::Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"replicas": replicas}})
    }

    #[test]
    fn true_false_and_missing_fields() {
        let bound = || {
            vec![
                ("ms".to_owned(), deployment(2)),
                ("ngnix".to_owned(), deployment(2)),
            ]
        };
        assert_eq!(
            evaluate_bound("ms.spec.replicas == ngnix.spec.replicas", bound()),
            Ok(CelOutcome::Satisfied)
        );
        assert_eq!(
            evaluate_bound("ms.spec.replicas == 2 && ms.spec.replicas + 1 == 3", bound()),
            Ok(CelOutcome::Satisfied)
        );
        assert_eq!(
            evaluate_bound("ms.spec.replicas == 3", bound()),
            Ok(CelOutcome::Waiting("ms.spec.replicas == 3 is false".into()))
        );
        let waiting = evaluate_bound("ms.status.readyReplicas == 2", bound()).unwrap();
        assert!(
            matches!(waiting, CelOutcome::Waiting(ref why) if why.contains("readyReplicas") || why.contains("status")),
            "{waiting:?}"
        );
    }

    #[test]
    fn compile_errors_and_non_booleans_are_permanent() {
        let broken = WaitCondition {
            objects: vec![],
            conditions: "ms.spec.replicas ==".into(),
        };
        assert!(matches!(compile(&broken), Err(CelError::Compile { .. })));
        let long = WaitCondition {
            objects: vec![],
            conditions: "true && ".repeat(2000) + "true",
        };
        assert!(matches!(compile(&long), Err(CelError::Compile { .. })));
        let number = evaluate_bound("ms.spec.replicas + 1", vec![("ms".into(), deployment(1))]);
        assert_eq!(
            number,
            Err(CelError::NotBool {
                expression: "ms.spec.replicas + 1".into(),
                found: "Int(2)".into()
            })
        );
        assert!(matches!(number, Err(CelError::NotBool { .. })), "{number:?}");
    }
}
