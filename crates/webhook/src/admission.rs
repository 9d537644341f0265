//! Validating admission webhooks for ClusterStack, ClusterStackRelease, ClusterAddon and Cluster API
//! `Cluster`, on the Go operator's paths so its `ValidatingWebhookConfiguration` works unchanged.
//!
//! The rules are pure functions over the objects (and, where needed, the Clusters or the release the
//! request concerns), so each is unit-tested; the handlers only read what the rules need from the API. The
//! rules the controllers share (what a ClusterStack's spec means, which Clusters use a release or a stack)
//! live in `cso_api::rules`; only what is the webhook's alone (immutability, references, upgrades) is here.
//! Compared with the Go operator: only Clusters whose class is named like a cluster stack's are checked
//! (others pass untouched), a Cluster update keeps its immutability checks even when the release cannot be
//! read, versions are validated on update too and must belong to the channel, a ClusterStack's provider,
//! name and Kubernetes version must make release names (the controller refuses them otherwise), one
//! non-conforming Cluster does not switch off the delete protection, and a ClusterAddon's `clusterRef` may
//! leave out the namespace.
//!
//! A Cluster under review is read in whatever version the API server sends (the view understands `v1beta1`
//! and `v1beta2`; the chart's webhook configuration names both, so each request comes in the version it was
//! made in). Clusters listed for the delete protection are read in the version the operator decided at
//! start-up (`cso_apply::cluster_resource`), given to [`router`].

use std::sync::Arc;

use axum::{Json, Router, extract::State, routing::post};
use cso_api::{
    ClusterAddon, ClusterStack, ClusterStackRelease, ClusterStackRollout, ReleaseId,
    capi::Cluster,
    rules::{self, StackSpec},
};
use kube::{
    Api, Client, ResourceExt,
    api::ListParams,
    core::{
        ApiResource, DynamicObject, Status,
        admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
    },
};
use serde::de::DeserializeOwned;

pub const CLUSTER_PATH: &str = "/validate-cluster-x-k8s-io-v1beta1-cluster";
pub const CLUSTER_ADDON_PATH: &str = "/validate-clusterstack-x-k8s-io-v1alpha1-clusteraddon";
pub const CLUSTER_STACK_PATH: &str = "/validate-clusterstack-x-k8s-io-v1alpha1-clusterstack";
pub const CLUSTER_STACK_RELEASE_PATH: &str = "/validate-clusterstack-x-k8s-io-v1alpha1-clusterstackrelease";
pub const CLUSTER_STACK_ROLLOUT_PATH: &str = "/validate-clusterstack-x-k8s-io-v1alpha1-clusterstackrollout";

/// One rejected field.
pub use cso_api::rules::FieldError;

/// The answer to one admission request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed, with warnings shown to the client (kubectl prints them).
    Allowed { warnings: Vec<String> },
    /// HTTP 422: fields of the object are invalid.
    Invalid(Vec<FieldError>),
    /// HTTP 400: the object is still in use and cannot be deleted.
    InUse(String),
}

impl Verdict {
    fn allowed() -> Self {
        Verdict::Allowed { warnings: vec![] }
    }

    fn warn(warning: String) -> Self {
        Verdict::Allowed {
            warnings: vec![warning],
        }
    }

    fn from_errors(errors: Vec<FieldError>) -> Self {
        if errors.is_empty() {
            Verdict::allowed()
        } else {
            Verdict::Invalid(errors)
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// The rules.

/// ClusterStack create and update: the spec means a stack ([`StackSpec::validate`]: release-name segments, a
/// Kubernetes minor, versions that parse and belong to the channel), its digest pins name listed versions and
/// manifest digests ([`rules::version_digest_errors`]), a provider reference unless `noProvider`; on update
/// the stack's identity (provider, name, channel, Kubernetes minor) is immutable (pins may change).
pub fn cluster_stack(new: &ClusterStack, old: Option<&ClusterStack>) -> Vec<FieldError> {
    let spec = &new.spec;
    let mut errors = StackSpec::validate(new).err().unwrap_or_default();
    errors.extend(rules::version_digest_errors(new));
    if spec.provider_ref.is_none() && !spec.no_provider {
        errors.push(FieldError::new(
            "spec.providerRef",
            "empty provider ref, even though noProvider mode is turned off",
        ));
    }
    if let Some(old) = old {
        let before = &old.spec;
        let immutable = [
            ("spec.provider", before.provider != spec.provider),
            ("spec.name", before.name != spec.name),
            ("spec.channel", before.channel != spec.channel),
            (
                "spec.kubernetesVersion",
                before.kubernetes_version != spec.kubernetes_version,
            ),
        ];
        for (field, changed) in immutable {
            if changed {
                errors.push(FieldError::new(field, "field is immutable"));
            }
        }
    }
    errors
}

/// ClusterAddon create and update: the reference names a `Cluster` in the ClusterAddon's own namespace
/// (an empty namespace means that one); on update the Cluster it names is immutable.
pub fn cluster_addon(new: &ClusterAddon, old: Option<&ClusterAddon>) -> Vec<FieldError> {
    let reference = &new.spec.cluster_ref;
    let mut errors = Vec::new();
    if reference.name.as_deref().unwrap_or_default().is_empty() {
        errors.push(FieldError::new("spec.clusterRef.name", "must not be empty"));
    }
    if reference.kind.as_deref().is_some_and(|k| k != "Cluster") {
        errors.push(FieldError::new("spec.clusterRef.kind", "kind must be Cluster"));
    }
    let own_namespace = new.namespace().unwrap_or_default();
    if reference
        .namespace
        .as_deref()
        .is_some_and(|ns| !ns.is_empty() && ns != own_namespace)
    {
        errors.push(FieldError::new(
            "spec.clusterRef.namespace",
            "cluster and clusterAddon need to be in same namespace",
        ));
    }
    if let Some(old) = old {
        let before = &old.spec.cluster_ref;
        if before.name != reference.name {
            errors.push(FieldError::new("spec.clusterRef.name", "field is immutable"));
        }
        if before.kind.as_deref().unwrap_or("Cluster") != reference.kind.as_deref().unwrap_or("Cluster") {
            errors.push(FieldError::new("spec.clusterRef.kind", "field is immutable"));
        }
    }
    errors
}

/// What is known of the ClusterStackRelease behind a Cluster's class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseLookup {
    /// Found; its `status.kubernetesVersion` (empty until it was applied).
    Found { kubernetes_version: String },
    /// Not readable (not found, or the API failed): the Kubernetes version cannot be checked.
    Unavailable(String),
}

/// Cluster create and update, for Clusters whose class is a cluster stack's (others are allowed as they
/// are): the topology's Kubernetes version is the release's; on update the provider and stack stay the same,
/// and the Kubernetes minor stays or goes up by one (same major).
pub fn cluster(new: &Cluster, old: Option<&Cluster>, release: &ReleaseLookup) -> Verdict {
    let old_release = old.and_then(Cluster::stack_release);
    let Some((id, _)) = new.stack_release() else {
        return match old_release {
            // Leaving the cluster stack is a different stack: refused like any other change of stack.
            Some((before, _)) => Verdict::Invalid(vec![FieldError::new(
                "spec.topology.class",
                format!(
                    "the Cluster uses cluster stack {}; its class must stay one of that stack's, \
                     <provider>-<clusterStackName>-<kubernetesVersion>-<clusterStackVersion>",
                    before.stack_prefix()
                ),
            )]),
            None => Verdict::allowed(),
        };
    };
    let mut errors = Vec::new();
    if let Some((before, _)) = &old_release {
        if before.provider != id.provider {
            errors.push(FieldError::new(
                "spec.topology.class",
                format!(
                    "provider name must not change. Got {}, want {}",
                    id.provider, before.provider
                ),
            ));
        }
        if before.name != id.name {
            errors.push(FieldError::new(
                "spec.topology.class",
                format!(
                    "cluster stack name must not change. Got {}, want {}",
                    id.name, before.name
                ),
            ));
        }
        let (from, to) = (before.kubernetes, id.kubernetes);
        let minor_step = i64::from(to.minor) - i64::from(from.minor);
        if to.major != from.major || !(0..=1).contains(&minor_step) {
            errors.push(FieldError::new(
                "spec.topology.class",
                format!(
                    "kubernetes version must be the same or higher by one. Got {}, want {} or {}.{}",
                    to.to_dot(),
                    from.to_dot(),
                    from.major,
                    from.minor + 1
                ),
            ));
        }
    }
    let class = id.cluster_class_name();
    let mut warnings = Vec::new();
    match release {
        ReleaseLookup::Unavailable(error) => warnings.push(format!(
            "cannot validate clusterClass and Kubernetes version. Getting clusterStackRelease object failed: {error}"
        )),
        ReleaseLookup::Found { kubernetes_version } if kubernetes_version.is_empty() => {
            warnings.push(format!(
                "no Kubernetes version set in status of clusterStackRelease object. Cannot validate Kubernetes \
                 version. Check out the ClusterStackRelease {} manually",
                id.tag()
            ))
        }
        ReleaseLookup::Found { kubernetes_version } => {
            let got = new.topology_version().unwrap_or_default();
            if got != kubernetes_version {
                errors.push(FieldError::new(
                    "spec.topology.version",
                    format!("clusterClass {class} expects Kubernetes version {kubernetes_version}, but got {got}"),
                ));
            }
        }
    }
    if errors.is_empty() {
        Verdict::Allowed { warnings }
    } else {
        Verdict::Invalid(errors)
    }
}

// ---------------------------------------------------------------------------------------------------------
// Serving.

struct Admission {
    client: Client,
    /// The version Clusters are listed in.
    cluster_resource: ApiResource,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").finish_non_exhaustive()
    }
}

/// The four validating webhooks on the Go operator's paths; Clusters are listed in `cluster_resource`'s
/// version.
pub fn router(client: Client, cluster_resource: ApiResource) -> Router {
    Router::new()
        .route(CLUSTER_STACK_PATH, post(review_cluster_stack))
        .route(CLUSTER_STACK_RELEASE_PATH, post(review_cluster_stack_release))
        .route(CLUSTER_ADDON_PATH, post(review_cluster_addon))
        .route(CLUSTER_PATH, post(review_cluster))
        .route(CLUSTER_STACK_ROLLOUT_PATH, post(review_cluster_stack_rollout))
        .with_state(Arc::new(Admission {
            client,
            cluster_resource,
        }))
}

type Review = Json<AdmissionReview<DynamicObject>>;
type Answer = Json<AdmissionReview<DynamicObject>>;

/// Unpacks the request, runs `decide` and packs its verdict; a review that cannot be read is refused.
async fn answer<F, Fut>(kind: &str, review: AdmissionReview<DynamicObject>, decide: F) -> Answer
where
    F: FnOnce(AdmissionRequest<DynamicObject>) -> Fut,
    Fut: Future<Output = Result<Verdict, String>>,
{
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(e) => {
            return Json(AdmissionResponse::invalid(format!("not an AdmissionReview: {e}")).into_review());
        }
    };
    let response = AdmissionResponse::from(&request);
    let (name, operation) = (request.name.clone(), request.operation.clone());
    let response = match decide(request).await {
        Ok(verdict) => {
            tracing::debug!(kind, %name, ?operation, ?verdict, "admission review");
            respond(response, kind, &name, verdict)
        }
        Err(message) => deny(response, 400, "BadRequest", message),
    };
    Json(response.into_review())
}

fn respond(response: AdmissionResponse, kind: &str, name: &str, verdict: Verdict) -> AdmissionResponse {
    match verdict {
        Verdict::Allowed { warnings } => {
            let mut response = response;
            response.warnings = (!warnings.is_empty()).then_some(warnings);
            response
        }
        Verdict::Invalid(errors) => {
            let fields: Vec<String> = errors
                .iter()
                .map(|e| format!("{}: {}", e.field, e.message))
                .collect();
            let message = format!("{kind} {name:?} is invalid: {}", fields.join("; "));
            deny(response, 422, "Invalid", message)
        }
        Verdict::InUse(message) => deny(response, 400, "BadRequest", message),
    }
}

fn deny(response: AdmissionResponse, code: u16, reason: &str, message: String) -> AdmissionResponse {
    let mut response = response.deny(&message);
    response.result = Status::failure(&message, reason).with_code(code);
    response
}

fn object<K: DeserializeOwned>(object: Option<&DynamicObject>) -> Result<Option<K>, String> {
    object
        .map(|o| serde_json::to_value(o).and_then(serde_json::from_value))
        .transpose()
        .map_err(|e| format!("cannot read the object: {e}"))
}

fn required<K: DeserializeOwned>(o: Option<&DynamicObject>) -> Result<K, String> {
    object(o)?.ok_or_else(|| "the request carries no object".to_owned())
}

async fn clusters_or_warning(state: &Admission, what: &str) -> Result<Vec<Cluster>, Verdict> {
    Api::<Cluster>::all_with(state.client.clone(), &state.cluster_resource)
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
        .map_err(|e| {
            Verdict::warn(format!(
                "cannot validate whether {what} is still in use. Watch out for potentially orphaned resources: {e}"
            ))
        })
}

async fn review_cluster_stack(State(state): State<Arc<Admission>>, Json(review): Review) -> Answer {
    answer(
        "ClusterStack.clusterstack.x-k8s.io",
        review,
        |request| async move {
            Ok(match request.operation {
                Operation::Delete if deleted_for_move(request.old_object.as_ref()) => Verdict::allowed(),
                Operation::Delete => {
                    let stack: ClusterStack = required(request.old_object.as_ref())?;
                    match clusters_or_warning(&state, "clusterstack").await {
                        Err(warning) => warning,
                        Ok(clusters) => in_use("ClusterStack", rules::stack_users(&clusters, &stack)),
                    }
                }
                _ => {
                    let stack: ClusterStack = required(request.object.as_ref())?;
                    let old: Option<ClusterStack> = object(request.old_object.as_ref())?;
                    Verdict::from_errors(cluster_stack(&stack, old.as_ref()))
                }
            })
        },
    )
    .await
}

async fn review_cluster_stack_release(State(state): State<Arc<Admission>>, Json(review): Review) -> Answer {
    answer(
        "ClusterStackRelease.clusterstack.x-k8s.io",
        review,
        |request| async move {
            if request.operation != Operation::Delete || deleted_for_move(request.old_object.as_ref()) {
                return Ok(Verdict::allowed());
            }
            let namespace = request.namespace.clone().unwrap_or_default();
            Ok(match clusters_or_warning(&state, "clusterstackrelease").await {
                Err(warning) => warning,
                // A name that is not a release's cannot be a class's: nobody uses it.
                Ok(clusters) => in_use(
                    "ClusterStackRelease",
                    ReleaseId::parse_tag(&request.name)
                        .map(|release| rules::release_users(&clusters, &namespace, &release))
                        .unwrap_or_default(),
                ),
            })
        },
    )
    .await
}

/// Whether `clusterctl move` deletes the object, after copying it to the target management cluster (it
/// annotates each object it deletes so): its Clusters live on there, so being in use does not hold it.
fn deleted_for_move(old: Option<&DynamicObject>) -> bool {
    old.is_some_and(|o| {
        o.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(cso_api::capi::DELETE_FOR_MOVE_ANNOTATION))
    })
}

fn in_use(kind: &str, users: Vec<String>) -> Verdict {
    if users.is_empty() {
        Verdict::allowed()
    } else {
        Verdict::InUse(format!(
            "can't delete {kind} as there are clusters using it: [{}]",
            users.join(", ")
        ))
    }
}

async fn review_cluster_addon(State(_): State<Arc<Admission>>, Json(review): Review) -> Answer {
    answer(
        "ClusterAddon.clusterstack.x-k8s.io",
        review,
        |request| async move {
            if request.operation == Operation::Delete {
                return Ok(Verdict::allowed());
            }
            let addon: ClusterAddon = required(request.object.as_ref())?;
            let old: Option<ClusterAddon> = object(request.old_object.as_ref())?;
            Ok(Verdict::from_errors(cluster_addon(&addon, old.as_ref())))
        },
    )
    .await
}

/// ClusterStackRollout create and update: its spec on its own ([`rules::rollout::validate`]: the version,
/// the durations, the waves' names, the selectors). Whether its ClusterStack exists and has the version is
/// the controller's to report: either may come after the rollout.
pub fn cluster_stack_rollout(new: &ClusterStackRollout) -> Vec<FieldError> {
    rules::rollout::validate(&new.spec)
}

async fn review_cluster_stack_rollout(State(_): State<Arc<Admission>>, Json(review): Review) -> Answer {
    answer(
        "ClusterStackRollout.clusterstack.x-k8s.io",
        review,
        |request| async move {
            if request.operation == Operation::Delete {
                return Ok(Verdict::allowed());
            }
            let rollout: ClusterStackRollout = required(request.object.as_ref())?;
            Ok(Verdict::from_errors(cluster_stack_rollout(&rollout)))
        },
    )
    .await
}

async fn review_cluster(State(state): State<Arc<Admission>>, Json(review): Review) -> Answer {
    answer("Cluster.cluster.x-k8s.io", review, |request| async move {
        if request.operation == Operation::Delete {
            return Ok(Verdict::allowed());
        }
        let new: Cluster = required(request.object.as_ref())?;
        let old: Option<Cluster> = object(request.old_object.as_ref())?;
        let Some((id, class_namespace)) = new.stack_release() else {
            return Ok(cluster(
                &new,
                old.as_ref(),
                &ReleaseLookup::Unavailable(String::new()),
            ));
        };
        let releases: Api<ClusterStackRelease> = Api::namespaced(state.client.clone(), &class_namespace);
        let release = match releases.get(&id.tag()).await {
            Ok(release) => ReleaseLookup::Found {
                kubernetes_version: release.status.unwrap_or_default().kubernetes_version,
            },
            Err(e) => ReleaseLookup::Unavailable(e.to_string()),
        };
        Ok(cluster(&new, old.as_ref(), &release))
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

    use super::*;
    use serde_json::json;

    fn stack(spec: serde_json::Value) -> ClusterStack {
        serde_json::from_value(json!({
            "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
            "metadata": {"name": "ferrol", "namespace": "ns"}, "spec": spec,
        }))
        .unwrap()
    }

    fn ferrol(versions: serde_json::Value) -> ClusterStack {
        stack(
            json!({"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27",
                     "noProvider": true, "versions": versions}),
        )
    }

    fn cluster_with(namespace: &str, name: &str, class: &str, version: &str) -> Cluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"topology": {"class": class, "version": version}},
        }))
        .unwrap()
    }

    fn plain_cluster() -> Cluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": "plain", "namespace": "ns"}, "spec": {},
        }))
        .unwrap()
    }

    fn fields(errors: &[FieldError]) -> Vec<&str> {
        errors.iter().map(|e| e.field.as_ref()).collect()
    }

    fn found(version: &str) -> ReleaseLookup {
        ReleaseLookup::Found {
            kubernetes_version: version.into(),
        }
    }

    #[test]
    fn cluster_stack_versions_must_parse_and_match_the_channel() {
        assert!(cluster_stack(&ferrol(json!(["v1", "v2"])), None).is_empty());
        let errors = cluster_stack(&ferrol(json!(["v1-alpha"])), None);
        assert_eq!(fields(&errors), ["spec.versions"]);
        let errors = cluster_stack(&ferrol(json!(["v0-sha.hipstsw"])), None);
        assert!(errors[0].message.contains("channel custom"), "{errors:?}");
        let custom = stack(
            json!({"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27",
            "channel": "custom", "noProvider": true, "versions": ["v0-sha.hipstsw", "v2"]}),
        );
        assert_eq!(fields(&cluster_stack(&custom, None)), ["spec.versions"]);
    }

    #[test]
    fn cluster_stack_identity_must_make_release_names() {
        let mut bad = ferrol(json!(["v1"]));
        bad.spec.provider = "dock-er".into();
        bad.spec.kubernetes_version = "1.x".into();
        assert_eq!(
            fields(&cluster_stack(&bad, None)),
            ["spec.provider", "spec.kubernetesVersion"]
        );
    }

    #[test]
    fn cluster_stack_needs_a_provider_ref_unless_no_provider() {
        let without = stack(json!({"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27"}));
        assert_eq!(fields(&cluster_stack(&without, None)), ["spec.providerRef"]);
    }

    #[test]
    fn cluster_stack_identity_is_immutable_and_versions_checked_on_update() {
        let old = ferrol(json!(["v1"]));
        let mut new = ferrol(json!(["v1", "v2"]));
        assert!(cluster_stack(&new, Some(&old)).is_empty());
        new.spec.provider = "openstack".into();
        new.spec.kubernetes_version = "1.28".into();
        new.spec.versions.push("2".into());
        assert_eq!(
            fields(&cluster_stack(&new, Some(&old))),
            ["spec.versions", "spec.provider", "spec.kubernetesVersion"]
        );
    }

    const DIGEST_1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const DIGEST_2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn pinned(versions: serde_json::Value, pins: serde_json::Value) -> ClusterStack {
        let mut stack = ferrol(versions);
        stack.spec.version_digests = serde_json::from_value(pins).unwrap();
        stack
    }

    #[test]
    fn cluster_stack_pins_name_listed_versions_and_manifest_digests() {
        assert!(cluster_stack(&pinned(json!(["v1", "v2"]), json!({"v2": DIGEST_1})), None).is_empty());
        let unlisted = cluster_stack(&pinned(json!(["v1"]), json!({"v2": DIGEST_1})), None);
        assert_eq!(fields(&unlisted), ["spec.versionDigests[v2]"]);
        assert!(
            unlisted[0].message.contains("not in spec.versions"),
            "{unlisted:?}"
        );
        for bad in [
            "sha256:abc",
            "latest",
            &DIGEST_1.replace('1', "A"),
            &DIGEST_1[7..],
        ] {
            let errors = cluster_stack(&pinned(json!(["v1"]), json!({"v1": bad})), None);
            assert_eq!(fields(&errors), ["spec.versionDigests[v1]"], "{bad}");
            assert!(errors[0].message.contains("not a manifest digest"), "{errors:?}");
        }
        // The denial names the entry.
        let response = respond(
            AdmissionResponse::invalid(""),
            "ClusterStack.clusterstack.x-k8s.io",
            "ferrol",
            Verdict::from_errors(unlisted),
        );
        assert!(
            response
                .result
                .message
                .contains("spec.versionDigests[v2]: version \"v2\""),
            "{}",
            response.result.message
        );
    }

    #[test]
    fn cluster_stack_pins_may_change_on_update() {
        let old = pinned(json!(["v1", "v2"]), json!({"v2": DIGEST_1}));
        for pins in [
            json!({"v2": DIGEST_2}),
            json!({}),
            json!({"v1": DIGEST_1, "v2": DIGEST_2}),
        ] {
            let new = pinned(json!(["v1", "v2"]), pins.clone());
            assert!(cluster_stack(&new, Some(&old)).is_empty(), "{pins}");
        }
        // Dropping a pinned version from the list without its pin is refused, as on create.
        let new = pinned(json!(["v1"]), json!({"v2": DIGEST_1}));
        assert_eq!(
            fields(&cluster_stack(&new, Some(&old))),
            ["spec.versionDigests[v2]"]
        );
    }

    #[test]
    fn cluster_addon_reference_rules() {
        let addon = |reference: serde_json::Value| -> ClusterAddon {
            serde_json::from_value(json!({
                "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterAddon",
                "metadata": {"name": "cluster-addon-c1", "namespace": "ns"},
                "spec": {"clusterRef": reference},
            }))
            .unwrap()
        };
        let good = addon(json!({"kind": "Cluster", "name": "c1"}));
        assert!(cluster_addon(&good, None).is_empty());
        assert!(
            cluster_addon(&good, Some(&good)).is_empty(),
            "an empty namespace is the own one"
        );
        let wrong_kind = addon(json!({"kind": "Machine", "name": "c1", "namespace": "ns"}));
        assert_eq!(
            fields(&cluster_addon(&wrong_kind, None)),
            ["spec.clusterRef.kind"]
        );
        let elsewhere = addon(json!({"kind": "Cluster", "name": "c1", "namespace": "other"}));
        assert_eq!(
            fields(&cluster_addon(&elsewhere, None)),
            ["spec.clusterRef.namespace"]
        );
        let renamed = addon(json!({"kind": "Cluster", "name": "c2"}));
        assert_eq!(
            fields(&cluster_addon(&renamed, Some(&good))),
            ["spec.clusterRef.name"]
        );
        assert_eq!(
            fields(&cluster_addon(&addon(json!({})), None)),
            ["spec.clusterRef.name"]
        );
    }

    #[test]
    fn clusters_without_a_cluster_stack_class_are_not_ours() {
        let unavailable = ReleaseLookup::Unavailable("not found".into());
        assert_eq!(cluster(&plain_cluster(), None, &unavailable), Verdict::allowed());
        let odd = cluster_with("ns", "odd", "test-cluster-class", "v1.27.3");
        assert_eq!(
            cluster(&odd, Some(&plain_cluster()), &unavailable),
            Verdict::allowed()
        );
        // An update from a topology-less Cluster is not a panic.
        let ours = cluster_with("ns", "c", "docker-ferrol-1-27-v1", "v1.27.3");
        assert_eq!(
            cluster(&ours, Some(&plain_cluster()), &found("v1.27.3")),
            Verdict::allowed()
        );
    }

    #[test]
    fn cluster_version_must_be_the_releases() {
        let ours = cluster_with("ns", "c", "docker-ferrol-1-27-v1", "v1.27.3");
        assert_eq!(cluster(&ours, None, &found("v1.27.3")), Verdict::allowed());
        let Verdict::Invalid(errors) = cluster(&ours, None, &found("v1.27.4")) else {
            panic!("expected a denial")
        };
        assert_eq!(fields(&errors), ["spec.topology.version"]);
        assert!(
            errors[0]
                .message
                .contains("expects Kubernetes version v1.27.4, but got v1.27.3")
        );
        let Verdict::Allowed { warnings } = cluster(&ours, None, &found("")) else {
            panic!("expected a warning")
        };
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn cluster_upgrades_keep_the_stack_and_step_one_minor_even_without_the_release() {
        let old = cluster_with("ns", "c", "docker-ferrol-1-27-v1", "v1.27.3");
        let unavailable = ReleaseLookup::Unavailable("not found".into());
        let next_minor = cluster_with("ns", "c", "docker-ferrol-1-28-v1", "v1.28.1");
        assert!(matches!(
            cluster(&next_minor, Some(&old), &unavailable),
            Verdict::Allowed { .. }
        ));
        for (class, field_count) in [
            ("docker-ferrol-1-29-v1", 1),
            ("docker-ferrol-1-26-v1", 1),
            ("openstack-scs-1-27-v1", 2),
            ("docker-ferrol-2-27-v1", 1),
        ] {
            let new = cluster_with("ns", "c", class, "v1.27.3");
            let Verdict::Invalid(errors) = cluster(&new, Some(&old), &unavailable) else {
                panic!("{class} should be refused")
            };
            assert_eq!(errors.len(), field_count, "{class}: {errors:?}");
        }
        let left = cluster_with("ns", "c", "my-own-class", "v1.27.3");
        assert!(matches!(
            cluster(&left, Some(&old), &unavailable),
            Verdict::Invalid(_)
        ));
    }
}
