//! cosign v3 against the loopback registry: where each signature layout lands (the tags it adds), that `cosign
//! verify` accepts the signer's key and refuses another, and the cross-check that a bundle made by
//! `cso_testenv::cosign::sign_bundle_in_rust` passes `cosign verify`. Skipped (with a note on stderr) when
//! `CSO_COSIGN` is not set and the tools' `env` file does not name it (`make tools` builds it).

#![allow(clippy::unwrap_used, reason = "a test: a failed unwrap is a failed test")]

use std::path::Path;

use cso_testenv::{
    Tools,
    cosign::{
        self, BUNDLE_MEDIA_TYPE, Cosign, INDEX_MEDIA_TYPE, RustKey, SIGNATURE_ANNOTATION,
        SIMPLE_SIGNING_MEDIA_TYPE, SignatureLayout, Subject,
    },
    registry::{self, IMAGE_MANIFEST_MEDIA_TYPE, Registry},
};

const REPOSITORY: &str = "kaas/stacks";

fn cosign_or_skip(test: &str) -> Option<Cosign> {
    let cosign = Cosign::from_env();
    if cosign.is_none() {
        eprintln!("{test}: skipped, CSO_COSIGN is not set (run `make tools`)");
    }
    cosign
}

/// A registry with one small release pushed as `oras push` does; its manifest as a signature subject.
async fn registry_with_release(dir: &Path, tag: &str) -> (Registry, Subject) {
    let registry = Registry::start(&Tools::discover().unwrap()).await.unwrap();
    let release = dir.join(tag);
    std::fs::create_dir_all(&release).unwrap();
    std::fs::write(
        release.join("metadata.yaml"),
        format!("apiVersion: metadata.clusterstack.x-k8s.io/v1alpha1\nversions:\n  clusterStack: {tag}\n"),
    )
    .unwrap();
    let digest = registry::push_like_oras(&registry, REPOSITORY, tag, &release)
        .await
        .unwrap();
    let manifest = cosign::get_manifest(registry.host(), REPOSITORY, &digest)
        .await
        .unwrap()
        .unwrap();
    let subject = Subject {
        digest,
        size: manifest.len() as u64,
        media_type: IMAGE_MANIFEST_MEDIA_TYPE.to_owned(),
    };
    (registry, subject)
}

async fn json_at(registry: &Registry, reference: &str) -> serde_json::Value {
    let body = cosign::get_manifest(registry.host(), REPOSITORY, reference)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("nothing at {reference}"));
    serde_json::from_slice(&body).unwrap()
}

async fn tags(registry: &Registry) -> Vec<String> {
    let mut tags = cosign::list_tags(registry.host(), REPOSITORY).await.unwrap();
    tags.sort();
    tags
}

/// go-containerregistry keeps the tag schema's index sorted by digest: the newest signature is not the last entry.
fn assert_sorted_by_digest(index: &serde_json::Value) {
    let digests: Vec<&str> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["digest"].as_str().unwrap())
        .collect();
    assert!(digests.is_sorted(), "{digests:?}");
}

/// `cosign sign` in both layouts: the tags each adds, what is under them, and `cosign verify` with the signer's
/// key (accepted) and another key (refused), each layout on its own.
#[tokio::test]
async fn cosign_signs_a_release_in_both_layouts() {
    let Some(cosign) = cosign_or_skip("cosign_signs_a_release_in_both_layouts") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (registry, subject) = registry_with_release(dir.path(), "docker-scs-1-35-v1").await;
    let k1 = cosign.generate_key_pair(dir.path(), "k1").await.unwrap();
    let k2 = cosign.generate_key_pair(dir.path(), "k2").await.unwrap();
    assert!(
        std::fs::read_to_string(&k1.public)
            .unwrap()
            .starts_with("-----BEGIN PUBLIC KEY-----\n")
    );
    let reference = format!("{}/{REPOSITORY}@{}", registry.host(), subject.digest);
    let hex = subject.digest.strip_prefix("sha256:").unwrap();

    // Nothing signed yet: both layouts refuse.
    for layout in [SignatureLayout::Bundle, SignatureLayout::Legacy] {
        assert!(cosign.verify(&k1.public, &reference, layout).await.is_err());
    }

    // The bundle: one tag, the referrers tag schema's (distribution 2.8 has no referrers API).
    cosign
        .sign(&k1, &reference, SignatureLayout::Bundle)
        .await
        .unwrap();
    let bundle_tag = format!("sha256-{hex}");
    assert_eq!(
        tags(&registry).await,
        ["docker-scs-1-35-v1".to_owned(), bundle_tag.clone()]
    );
    let index = json_at(&registry, &bundle_tag).await;
    assert_eq!(index["mediaType"], INDEX_MEDIA_TYPE);
    let entries = index["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["artifactType"], BUNDLE_MEDIA_TYPE);
    let referrer = json_at(&registry, entries[0]["digest"].as_str().unwrap()).await;
    assert_eq!(referrer["artifactType"], BUNDLE_MEDIA_TYPE);
    assert_eq!(referrer["subject"]["digest"], subject.digest.as_str());
    assert_eq!(referrer["subject"]["size"], subject.size);
    assert_eq!(
        referrer["annotations"]["dev.sigstore.bundle.content"],
        "dsse-envelope"
    );
    assert_eq!(referrer["layers"][0]["mediaType"], BUNDLE_MEDIA_TYPE);
    let bundle = cosign::get_blob(
        registry.host(),
        REPOSITORY,
        referrer["layers"][0]["digest"].as_str().unwrap(),
    )
    .await
    .unwrap();
    let bundle: serde_json::Value = serde_json::from_slice(&bundle).unwrap();
    assert!(bundle["verificationMaterial"]["publicKey"]["hint"].is_string());
    assert!(
        bundle["verificationMaterial"].get("tlogEntries").is_none(),
        "{bundle}"
    );
    assert_eq!(
        bundle["dsseEnvelope"]["payloadType"],
        "application/vnd.in-toto+json"
    );

    cosign
        .verify(&k1.public, &reference, SignatureLayout::Bundle)
        .await
        .unwrap();
    let refused = cosign
        .verify(&k2.public, &reference, SignatureLayout::Bundle)
        .await
        .unwrap_err();
    assert!(refused.contains("no matching attestations"), "{refused}");
    // The bundle does not count for the legacy layout.
    assert!(
        cosign
            .verify(&k1.public, &reference, SignatureLayout::Legacy)
            .await
            .is_err()
    );

    // Legacy: a second tag, `.sig`.
    cosign
        .sign(&k2, &reference, SignatureLayout::Legacy)
        .await
        .unwrap();
    let sig_tag = format!("sha256-{hex}.sig");
    assert_eq!(
        tags(&registry).await,
        [
            "docker-scs-1-35-v1".to_owned(),
            bundle_tag.clone(),
            sig_tag.clone()
        ]
    );
    let legacy = json_at(&registry, &sig_tag).await;
    assert_eq!(legacy["mediaType"], IMAGE_MANIFEST_MEDIA_TYPE);
    let layers = legacy["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(layers[0]["mediaType"], SIMPLE_SIGNING_MEDIA_TYPE);
    assert!(layers[0]["annotations"][SIGNATURE_ANNOTATION].is_string());
    let payload = cosign::get_blob(registry.host(), REPOSITORY, layers[0]["digest"].as_str().unwrap())
        .await
        .unwrap();
    let payload: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(
        payload["critical"]["image"]["docker-manifest-digest"],
        subject.digest.as_str()
    );
    assert_eq!(payload["critical"]["type"], "cosign container image signature");

    cosign
        .verify(&k2.public, &reference, SignatureLayout::Legacy)
        .await
        .unwrap();
    assert!(
        cosign
            .verify(&k1.public, &reference, SignatureLayout::Legacy)
            .await
            .is_err()
    );
    // Each layout stands alone: k1's bundle still verifies, k2 still has no bundle.
    cosign
        .verify(&k1.public, &reference, SignatureLayout::Bundle)
        .await
        .unwrap();
    assert!(
        cosign
            .verify(&k2.public, &reference, SignatureLayout::Bundle)
            .await
            .is_err()
    );

    // A second bundle signature is a second entry of the same index, not another tag.
    cosign
        .sign(&k2, &reference, SignatureLayout::Bundle)
        .await
        .unwrap();
    assert_eq!(tags(&registry).await.len(), 3);
    let index = json_at(&registry, &bundle_tag).await;
    assert_eq!(index["manifests"].as_array().unwrap().len(), 2);
    assert_sorted_by_digest(&index);
    cosign
        .verify(&k2.public, &reference, SignatureLayout::Bundle)
        .await
        .unwrap();
}

/// The cross-check: a bundle signed in Rust and written as cosign writes it passes `cosign verify` with the Rust
/// key, and not with another key; next to a bundle of cosign's own, in the same index.
#[tokio::test]
async fn cosign_accepts_a_bundle_signed_in_rust() {
    let Some(cosign) = cosign_or_skip("cosign_accepts_a_bundle_signed_in_rust") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (registry, subject) = registry_with_release(dir.path(), "docker-scs-1-35-v2").await;
    let reference = format!("{}/{REPOSITORY}@{}", registry.host(), subject.digest);
    let rust_key = RustKey::generate().unwrap();
    let rust_pub = dir.path().join("rust.pub");
    rust_key.write_public_pem(&rust_pub).unwrap();
    let other = cosign.generate_key_pair(dir.path(), "other").await.unwrap();

    let pushed = cosign::sign_bundle_in_rust(registry.host(), REPOSITORY, &subject, &rust_key)
        .await
        .unwrap();
    assert!(!pushed.referrers_api, "distribution 2.8 has no referrers API");
    let hex = subject.digest.strip_prefix("sha256:").unwrap();
    assert_eq!(
        tags(&registry).await,
        ["docker-scs-1-35-v2".to_owned(), format!("sha256-{hex}")]
    );

    cosign
        .verify(&rust_pub, &reference, SignatureLayout::Bundle)
        .await
        .unwrap();
    let refused = cosign
        .verify(&other.public, &reference, SignatureLayout::Bundle)
        .await
        .unwrap_err();
    assert!(refused.contains("no matching attestations"), "{refused}");

    // A bundle whose statement names another digest, pushed as a referrer of a release: refused, cosign checks the
    // statement's subject against the manifest it verifies.
    let (registry2, subject2) = registry_with_release(dir.path(), "docker-scs-1-35-v3").await;
    let misdirected = cosign::bundle_v03(&rust_key, &format!("sha256:{}", "0".repeat(64))).unwrap();
    cosign::push_bundle(registry2.host(), REPOSITORY, &subject2, misdirected)
        .await
        .unwrap();
    let reference2 = format!("{}/{REPOSITORY}@{}", registry2.host(), subject2.digest);
    let refused = cosign
        .verify(&rust_pub, &reference2, SignatureLayout::Bundle)
        .await
        .unwrap_err();
    assert!(
        refused.contains("does not match any digest in statement"),
        "{refused}"
    );

    // cosign's own signature joins the Rust one in the same index, and both keys verify.
    cosign
        .sign(&other, &reference, SignatureLayout::Bundle)
        .await
        .unwrap();
    let index = json_at(&registry, &format!("sha256-{hex}")).await;
    let entries = index["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert!(
        entries
            .iter()
            .any(|e| e["digest"] == pushed.manifest_digest.as_str())
    );
    assert_sorted_by_digest(&index);
    for key in [&rust_pub, &other.public] {
        cosign
            .verify(key, &reference, SignatureLayout::Bundle)
            .await
            .unwrap();
    }
}
