//! Counts the requests a Kubernetes client makes, by verb and resource, as the API server's own
//! `apiserver_request_total` would (`get`, `list`, `watch`, `create`, `patch`, `update`, `delete`, ...):
//! what the operator costs the management cluster, seen from the operator. A tower layer in the client's
//! stack calls a [`RequestObserver`] once per request; the metrics and the benchmarks decide what to do with
//! it. Classification is pure ([`classify`]) and tested beside.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use tower::{Layer, Service};

/// One request's kind: the Kubernetes verb and the resource (`clusteraddons`, `secrets`,
/// `clusteraddons/status`; `discovery` for discovery documents, `other` for the rest).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKind {
    pub verb: &'static str,
    pub resource: String,
}

/// Told of every request a client makes.
pub type RequestObserver = Arc<dyn Fn(&RequestKind) + Send + Sync>;

/// A request's verb and resource from its method and URI, the way the API server names them.
pub fn classify(method: &http::Method, uri: &http::Uri) -> RequestKind {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let query = uri.query().unwrap_or_default();
    let watching = query.split('&').any(|p| p == "watch=true" || p == "watch=1");
    // `/api/v1/...` or `/apis/<group>/<version>/...`; then optionally `namespaces/<ns>/`, then the
    // resource, a name and a subresource.
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => {
            return RequestKind {
                verb: verb_of(method, false, watching),
                resource: "other".to_owned(),
            };
        }
    };
    let rest = match rest {
        // A namespace itself is `namespaces/<name>`; a namespaced resource is `namespaces/<ns>/<resource>`.
        ["namespaces", _namespace, resource, tail @ ..] => {
            let mut parts = vec![*resource];
            parts.extend_from_slice(tail);
            parts
        }
        other => other.to_vec(),
    };
    let (resource, named) = match rest.as_slice() {
        [] => ("discovery".to_owned(), true),
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, subresource, ..] => (format!("{resource}/{subresource}"), true),
    };
    RequestKind {
        verb: verb_of(method, named, watching),
        resource,
    }
}

fn verb_of(method: &http::Method, named: bool, watching: bool) -> &'static str {
    match *method {
        http::Method::GET if watching => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PATCH => "patch",
        http::Method::PUT => "update",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "other",
    }
}

/// A plain count of requests by kind, for benchmarks and tests: `tally.observer()` goes into the client,
/// `tally.counts()` reads it.
#[derive(Debug, Default)]
pub struct RequestTally {
    counts: Mutex<BTreeMap<RequestKind, u64>>,
}

impl RequestTally {
    /// An observer that adds to this tally.
    pub fn observer(self: &Arc<Self>) -> RequestObserver {
        let tally = self.clone();
        Arc::new(move |kind: &RequestKind| {
            *tally
                .counts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(kind.clone())
                .or_default() += 1;
        })
    }

    /// The requests counted so far.
    pub fn counts(&self) -> BTreeMap<RequestKind, u64> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The layer that tells an observer of each request.
#[derive(Clone)]
pub(crate) struct TallyLayer(pub(crate) RequestObserver);

impl<S> Layer<S> for TallyLayer {
    type Service = Tally<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Tally {
            inner,
            observer: self.0.clone(),
        }
    }
}

pub(crate) struct Tally<S> {
    inner: S,
    observer: RequestObserver,
}

impl<S, B> Service<http::Request<B>> for Tally<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        (self.observer)(&classify(request.method(), request.uri()));
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_named_as_the_api_server_names_them() {
        let cases = [
            (
                "GET",
                "/api/v1/namespaces/ns/secrets/c-kubeconfig",
                "get",
                "secrets",
            ),
            (
                "GET",
                "/api/v1/namespaces/ns/secrets?labelSelector=x",
                "list",
                "secrets",
            ),
            (
                "GET",
                "/apis/clusterstack.x-k8s.io/v1alpha1/clusteraddons?watch=true&resourceVersion=5",
                "watch",
                "clusteraddons",
            ),
            (
                "PATCH",
                "/apis/clusterstack.x-k8s.io/v1alpha1/namespaces/ns/clusteraddons/a/status?fieldManager=x",
                "patch",
                "clusteraddons/status",
            ),
            (
                "POST",
                "/apis/clusterstack.x-k8s.io/v1alpha1/namespaces/ns/clusteraddons",
                "create",
                "clusteraddons",
            ),
            (
                "DELETE",
                "/api/v1/namespaces/ns/configmaps/x",
                "delete",
                "configmaps",
            ),
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
                "update",
                "leases",
            ),
            ("GET", "/api/v1/namespaces/kube-system", "get", "namespaces"),
            ("GET", "/api/v1/namespaces", "list", "namespaces"),
            ("GET", "/apis/cluster.x-k8s.io/v1beta2", "get", "discovery"),
            ("GET", "/apis", "list", "other"),
            ("GET", "/readyz", "list", "other"),
        ];
        for (method, uri, verb, resource) in cases {
            let kind = classify(&method.parse().unwrap(), &uri.parse().unwrap());
            assert_eq!(
                kind,
                RequestKind {
                    verb,
                    resource: resource.to_owned()
                },
                "{method} {uri}"
            );
        }
    }

    #[tokio::test]
    async fn the_layer_counts_each_request_once() {
        let tally = Arc::new(RequestTally::default());
        let service =
            tower::service_fn(|_: http::Request<()>| async { Ok::<_, std::convert::Infallible>(()) });
        let mut counted = TallyLayer(tally.observer()).layer(service);
        for _ in 0..3 {
            let request = http::Request::get("/api/v1/namespaces/ns/secrets/s")
                .body(())
                .unwrap();
            tower::ServiceExt::ready(&mut counted).await.unwrap();
            counted.call(request).await.unwrap();
        }
        let counts = tally.counts();
        assert_eq!(counts.len(), 1);
        assert_eq!(
            counts[&RequestKind {
                verb: "get",
                resource: "secrets".to_owned()
            }],
            3
        );
    }
}
