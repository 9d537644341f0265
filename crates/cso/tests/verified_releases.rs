//! `cso run --verify-key` as a process, against a real registry with real cosign signatures (cosign v3, built
//! by `make tools`): a signed and pinned release is applied and its status names digest, signer and layout; a
//! release signed by another key is refused with a condition, an event and a metric, nothing of it cached,
//! and recovers once signed by the trusted key, without a restart; a pinned tag that moved is refused by a
//! restarted operator with an empty cache while the applied ClusterClass keeps serving, and a new pin
//! recovers. Skipped (with a line on stderr) where cosign is not installed.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{path::Path, time::Duration};

use cso_api::{
    ClusterStack, ClusterStackRelease,
    cluster_stack_release::ReleaseProvenance,
    conditions::{ConditionStatus, ConditionsExt},
    names::{condition, event, reason},
};
use cso_release::source::verify::TrustedKey;
use cso_testenv::{
    cosign::{Cosign, KeyPair, SignatureLayout},
    registry::{Registry, push_like_oras, push_like_oras_changed},
};
use k8s_openapi::api::core::v1::Event;
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
    discovery::ApiResource,
};
use serde_json::json;

mod support;

use support::*;

const REPOSITORY: &str = "kaas/cluster-stacks";
const V1: &str = "docker-ferrol-1-27-v1";
const V2: &str = "docker-ferrol-1-27-v2";
const PHASE: Duration = Duration::from_secs(90);

async fn push(registry: &Registry, tag: &str) -> String {
    push_like_oras(registry, REPOSITORY, tag, &fixtures().join(tag))
        .await
        .unwrap()
}

/// Pushes `tag` again with its addon values changed (still a valid release); the new digest.
async fn push_altered(registry: &Registry, tag: &str) -> String {
    let change = (
        "cluster-addon-values.yaml",
        b"\n# changed after v1 was pinned\n".as_slice(),
    );
    push_like_oras_changed(registry, REPOSITORY, tag, &fixtures().join(tag), change)
        .await
        .unwrap()
}

async fn sign(cosign: &Cosign, registry: &Registry, key: &KeyPair, digest: &str, layout: SignatureLayout) {
    let reference = format!("{}/{REPOSITORY}@{digest}", registry.host());
    cosign.sign(key, &reference, layout).await.unwrap();
}

/// The ClusterStackRelease `name` once `check` holds for it.
async fn release_where(
    client: &Client,
    namespace: &str,
    name: &str,
    what: &str,
    check: impl Fn(&ClusterStackRelease) -> bool,
) -> ClusterStackRelease {
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), namespace);
    wait_for(&format!("{name}: {what}"), PHASE, || async {
        releases.get_opt(name).await.unwrap().filter(|r| check(r))
    })
    .await
}

fn verified_is(release: &ClusterStackRelease, status: ConditionStatus, reason: Option<&str>) -> bool {
    release
        .get_condition(condition::RELEASE_VERIFIED)
        .is_some_and(|c| c.status == status && c.reason.as_deref() == reason)
}

/// The notes of the events about `name` with `reason`.
async fn events(client: &Client, namespace: &str, name: &str, reason: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_releases_are_applied_and_the_rest_refused_until_fixed() {
    let Some(cosign) = Cosign::from_env() else {
        eprintln!("skipped: CSO_COSIGN is not set (run `make tools`)");
        return;
    };
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "verified").await.unwrap();
    let registry = Registry::start(&cso_testenv::Tools::discover().unwrap())
        .await
        .unwrap();
    let work = tempfile::Builder::new().prefix("cso-verified").tempdir().unwrap();
    let trusted = cosign.generate_key_pair(work.path(), "trusted").await.unwrap();
    let other = cosign.generate_key_pair(work.path(), "other").await.unwrap();
    let signer = TrustedKey::from_file(&trusted.public).unwrap().id().to_owned();

    // v1 signed by the trusted key (a bundle), v2 by another (legacy).
    let v1 = push(&registry, V1).await;
    sign(&cosign, &registry, &trusted, &v1, SignatureLayout::Bundle).await;
    let v2 = push(&registry, V2).await;
    sign(&cosign, &registry, &other, &v2, SignatureLayout::Legacy).await;

    let certs = work.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    cso_testenv::pki::write_serving_certificate(&certs).unwrap();
    let log = work.path().join("operator.log");
    let verify_key = format!("--verify-key={}", trusted.public.display());
    let source = Source::Oci {
        registry: registry.host(),
        repository: REPOSITORY,
    };
    let instance = Instance::new(&certs, false);
    let start = |release_dir: &Path| {
        std::fs::create_dir_all(release_dir).unwrap();
        start_operator_with(
            plane.kubeconfig_path(),
            release_dir,
            Some(&ns),
            &source,
            &log,
            &instance,
            &[verify_key.as_str()],
        )
    };
    let first_cache = work.path().join("releases-1");
    let mut operator = start(&first_cache);

    // v1 pinned to what was signed.
    let mut stack = ferrol_stack(&ns, &["v1", "v2"]);
    stack.spec.version_digests.insert("v1".into(), v1.clone());
    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), &ns);
    stacks.create(&PostParams::default(), &stack).await.unwrap();

    let applied = release_where(&client, &ns, V1, "applied and verified", |r| {
        r.status.as_ref().is_some_and(|s| s.ready) && verified_is(r, ConditionStatus::True, None)
    })
    .await;
    assert_eq!(
        applied.spec.digest.as_deref(),
        Some(v1.as_str()),
        "the pin is copied"
    );
    assert_eq!(
        applied.status.clone().unwrap().source,
        Some(ReleaseProvenance {
            kind: "oci".into(),
            digest: Some(v1.clone()),
            verified: true,
            signer: Some(signer.clone()),
            layout: Some("bundle-v0.3".into()),
        })
    );
    wait_for("the verification event", PHASE, || async {
        let announced = events(&client, &ns, V1, event::RELEASE_VERIFIED).await;
        announced
            .iter()
            .any(|e| e.contains(&v1) && e.contains(&signer))
            .then_some(())
    })
    .await;

    // v2: signed, but not by the trusted key. Refused before anything is cached.
    let refused = release_where(&client, &ns, V2, "refused", |r| {
        verified_is(r, ConditionStatus::False, Some(reason::SIGNATURE_MISMATCH))
    })
    .await;
    let message = refused
        .get_condition(condition::RELEASE_VERIFIED)
        .unwrap()
        .message
        .clone()
        .unwrap();
    assert!(message.contains(&v2), "the refusal names the digest: {message}");
    assert!(
        refused.is_condition_false(condition::CLUSTER_STACK_RELEASE_DOWNLOADED),
        "not downloaded either"
    );
    assert!(!refused.status.clone().unwrap().ready);
    assert!(
        !first_cache.join("cluster-stacks").join(V2).exists(),
        "nothing of v2 is cached"
    );
    wait_for("the refusal event", PHASE, || async {
        (!events(&client, &ns, V2, event::RELEASE_REFUSED).await.is_empty()).then_some(())
    })
    .await;
    let metrics = metrics_text(instance.metrics_port).await;
    assert!(
        metric_sum(
            &metrics,
            "cso_release_verifications_total",
            &["outcome=\"verified\""]
        ) >= 1.0,
        "{metrics}"
    );
    assert!(
        metric_sum(
            &metrics,
            "cso_release_verifications_total",
            &["outcome=\"signature_mismatch\""]
        ) >= 1.0
    );

    // Signed by the trusted key as well: v2 recovers at the next retry, without a restart.
    sign(&cosign, &registry, &trusted, &v2, SignatureLayout::Legacy).await;
    let recovered = release_where(&client, &ns, V2, "recovered", |r| {
        r.status.as_ref().is_some_and(|s| s.ready) && verified_is(r, ConditionStatus::True, None)
    })
    .await;
    let source = recovered.status.unwrap().source.unwrap();
    assert_eq!(
        (source.digest, source.layout),
        (Some(v2.clone()), Some("legacy-sig".into()))
    );

    let class = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cluster.x-k8s.io",
        "v1beta1",
        "ClusterClass",
    ));
    let classes = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &class);
    let applied_class = classes.get(V1).await.unwrap().metadata.resource_version;

    // The v1 tag moves to other content (signed, even). An operator restarted with an empty cache refuses
    // it: the tag is no longer at its pin. The ClusterClass applied from the pinned release stays.
    let moved = push_altered(&registry, V1).await;
    sign(&cosign, &registry, &trusted, &moved, SignatureLayout::Bundle).await;
    assert_eq!(terminate(&mut operator).code(), Some(0));
    let second_cache = work.path().join("releases-2");
    let mut operator = start(&second_cache);
    let held = release_where(&client, &ns, V1, "refused as moved", |r| {
        verified_is(r, ConditionStatus::False, Some(reason::TAG_MOVED))
    })
    .await;
    let message = held
        .get_condition(condition::RELEASE_VERIFIED)
        .unwrap()
        .message
        .clone()
        .unwrap();
    assert!(message.contains(&v1) && message.contains(&moved), "{message}");
    let status = held.status.clone().unwrap();
    assert!(status.ready, "what was applied keeps serving");
    assert_eq!(status.source.unwrap().digest, Some(v1.clone()));
    assert!(!second_cache.join("cluster-stacks").join(V1).exists());
    assert_eq!(
        classes.get(V1).await.unwrap().metadata.resource_version,
        applied_class,
        "the ClusterClass applied from the pinned release is left as it was"
    );

    // Pinned to the new digest: accepted, and the status follows.
    stacks
        .patch(
            "ferrol",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"versionDigests": {"v1": moved}}})),
        )
        .await
        .unwrap();
    let repinned = release_where(&client, &ns, V1, "re-pinned", |r| {
        verified_is(r, ConditionStatus::True, None)
            && r.status
                .as_ref()
                .and_then(|s| s.source.as_ref())
                .is_some_and(|s| s.digest.as_deref() == Some(moved.as_str()))
    })
    .await;
    assert_eq!(repinned.spec.digest.as_deref(), Some(moved.as_str()));

    // The pin taken away: the release is no longer pinned (a merge patch removes the field).
    stacks
        .patch(
            "ferrol",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"versionDigests": {"v1": null}}})),
        )
        .await
        .unwrap();
    release_where(&client, &ns, V1, "unpinned", |r| r.spec.digest.is_none()).await;
    assert_eq!(terminate(&mut operator).code(), Some(0));
}
