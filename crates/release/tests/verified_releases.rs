//! Verified releases against a real registry (Debian's CNCF distribution registry on loopback) with real
//! cosign signatures (cosign v3, built by `make tools`): a signed release is cached with its provenance, in
//! both of cosign's layouts; an unsigned one, one signed by another key, one re-pushed under its tag after
//! signing, and a pinned tag that moved are refused before anything is cached, and the refusal names the
//! digest. Skipped (with a line on stderr) where cosign is not installed.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{path::Path, sync::Arc, time::Instant};

use cso_api::{Channel, KubernetesVersion, ReleaseId};
use cso_release::{
    CacheError, ReleaseCache, ReleaseSource, SourceError, StackKey,
    archive::UnpackLimits,
    source::{
        PROVENANCE_FILE, Refusal,
        oci::{OciConfig, OciSource},
        releases_of,
        verify::TrustedKey,
    },
};
use cso_testenv::{
    Tools,
    cosign::{Cosign, KeyPair, SignatureLayout},
    registry::{Registry, push_like_oras, push_like_oras_changed},
};

const REPOSITORY: &str = "kaas/cluster-stacks";
const TAG: &str = "docker-ferrol-1-27-v1";

fn fixture(tag: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/releases")
        .join(tag)
}

/// A registry, cosign, and two key pairs made by cosign; `None` (the test skips) without cosign.
struct Signing {
    registry: Registry,
    cosign: Cosign,
    trusted: KeyPair,
    other: KeyPair,
    /// Where the key pairs are, removed with it.
    _keys: tempfile::TempDir,
}

impl Signing {
    async fn start() -> Option<Signing> {
        let Some(cosign) = Cosign::from_env() else {
            eprintln!("skipped: CSO_COSIGN is not set (run `make tools`)");
            return None;
        };
        let registry = Registry::start(&Tools::discover().unwrap()).await.unwrap();
        let keys = tempfile::tempdir().unwrap();
        let trusted = cosign.generate_key_pair(keys.path(), "trusted").await.unwrap();
        let other = cosign.generate_key_pair(keys.path(), "other").await.unwrap();
        Some(Signing {
            registry,
            cosign,
            trusted,
            other,
            _keys: keys,
        })
    }

    /// Pushes release `tag` with the files of fixture `from` as `oras push` does; the manifest digest.
    async fn push(&self, tag: &str, from: &str) -> String {
        push_like_oras(&self.registry, REPOSITORY, tag, &fixture(from))
            .await
            .unwrap()
    }

    /// Pushes release `tag` again with its addon values changed (still a valid release); the new digest.
    async fn push_altered(&self, tag: &str) -> String {
        let change = (
            "cluster-addon-values.yaml",
            b"\n# changed after signing\n".as_slice(),
        );
        push_like_oras_changed(&self.registry, REPOSITORY, tag, &fixture(tag), change)
            .await
            .unwrap()
    }

    async fn sign(&self, key: &KeyPair, digest: &str, layout: SignatureLayout) {
        let reference = format!("{}/{REPOSITORY}@{digest}", self.registry.host());
        self.cosign.sign(key, &reference, layout).await.unwrap();
    }

    /// The OCI source, verifying against the trusted key.
    fn source(&self) -> Arc<OciSource> {
        let config = OciConfig::from_lookup(self.registry.oci_variables(REPOSITORY)).unwrap();
        let key = TrustedKey::from_file(&self.trusted.public).unwrap();
        Arc::new(OciSource::new(config).verifying(vec![key]))
    }

    fn trusted_id(&self) -> String {
        TrustedKey::from_file(&self.trusted.public)
            .unwrap()
            .id()
            .to_owned()
    }

    fn cache(&self, dir: &Path) -> ReleaseCache {
        ReleaseCache::new(dir, self.source(), UnpackLimits::default()).unwrap()
    }
}

fn id(tag: &str) -> ReleaseId {
    ReleaseId::parse_tag(tag).unwrap()
}

/// The refusal of `error`, with its digest and message.
fn refusal(error: CacheError) -> (Refusal, String, String) {
    match error {
        CacheError::Source {
            error:
                SourceError::Refused {
                    refusal,
                    digest,
                    message,
                },
            ..
        } => (refusal, digest, message),
        other => panic!("expected a refusal, got {other}"),
    }
}

#[tokio::test]
async fn a_signed_release_is_cached_with_its_signer_in_either_layout() {
    let Some(signing) = Signing::start().await else {
        return;
    };
    for (tag, layout, name) in [
        (TAG, SignatureLayout::Bundle, "bundle-v0.3"),
        ("docker-ferrol-1-27-v2", SignatureLayout::Legacy, "legacy-sig"),
    ] {
        let digest = signing.push(tag, tag).await;
        signing.sign(&signing.trusted, &digest, layout).await;
        let dir = tempfile::tempdir().unwrap();
        let cache = signing.cache(dir.path());
        let started = Instant::now();
        let release = cache.get(&id(tag)).await.unwrap_or_else(|e| panic!("{tag}: {e}"));
        eprintln!("{tag}: fetched and verified ({name}) in {:?}", started.elapsed());
        let provenance = release.provenance.clone().unwrap();
        assert_eq!(provenance.kind, "oci");
        assert_eq!(provenance.digest.as_deref(), Some(digest.as_str()));
        assert_eq!(provenance.signer, Some(signing.trusted_id()));
        assert_eq!(provenance.layout.as_deref(), Some(name));
        assert!(
            dir.path()
                .join("cluster-stacks")
                .join(tag)
                .join(PROVENANCE_FILE)
                .is_file()
        );

        // Loaded again from disk by a new process, the record comes with it and is still accepted.
        let again = signing.cache(dir.path());
        let cached = again.cached(&id(tag)).unwrap().expect("cached");
        assert_eq!(cached.provenance, Some(provenance));
    }

    // The tags the signatures added are listed, and are no releases.
    let tags = signing.source().list_tags().await.unwrap();
    assert!(
        tags.iter()
            .any(|t| t.starts_with("sha256-") && !t.ends_with(".sig")),
        "{tags:?}"
    );
    assert!(
        tags.iter()
            .any(|t| t.starts_with("sha256-") && t.ends_with(".sig")),
        "{tags:?}"
    );
    let stack = StackKey {
        provider: "docker".into(),
        name: "ferrol".into(),
        kubernetes: KubernetesVersion { major: 1, minor: 27 },
    };
    let releases: Vec<String> = releases_of(&tags, &stack, Channel::Stable)
        .iter()
        .map(ReleaseId::tag)
        .collect();
    assert_eq!(releases, [TAG, "docker-ferrol-1-27-v2"]);
}

#[tokio::test]
async fn unsigned_and_wrongly_signed_releases_are_refused_before_caching() {
    let Some(signing) = Signing::start().await else {
        return;
    };
    let unsigned = signing.push(TAG, TAG).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = signing.cache(dir.path());
    let (reason, digest, message) = refusal(cache.get(&id(TAG)).await.unwrap_err());
    assert_eq!((reason, digest.as_str()), (Refusal::Unsigned, unsigned.as_str()));
    assert!(
        message.contains(&unsigned) && message.contains("no cosign signature"),
        "{message}"
    );
    assert!(
        !dir.path().join("cluster-stacks").join(TAG).exists(),
        "nothing of a refused release is cached"
    );

    // Signed, by a key the operator does not trust, in both layouts.
    signing
        .sign(&signing.other, &unsigned, SignatureLayout::Bundle)
        .await;
    signing
        .sign(&signing.other, &unsigned, SignatureLayout::Legacy)
        .await;
    let (reason, _, message) = refusal(cache.get(&id(TAG)).await.unwrap_err());
    assert_eq!(reason, Refusal::SignatureMismatch, "{message}");
    assert!(
        message.contains("bundle sha256:") && message.contains(".sig layer 0"),
        "{message}"
    );
    assert!(!dir.path().join("cluster-stacks").join(TAG).exists());

    // A signature by the trusted key added: the next attempt recovers, without a restart.
    signing
        .sign(&signing.trusted, &unsigned, SignatureLayout::Bundle)
        .await;
    let release = cache.get(&id(TAG)).await.unwrap();
    assert_eq!(
        release.provenance.clone().unwrap().signer,
        Some(signing.trusted_id())
    );
}

#[tokio::test]
async fn content_pushed_again_under_a_signed_tag_is_refused() {
    let Some(signing) = Signing::start().await else {
        return;
    };
    let signed = signing.push(TAG, TAG).await;
    signing
        .sign(&signing.trusted, &signed, SignatureLayout::Bundle)
        .await;
    // Other files under the same tag, after the signing: the signature is of the old manifest.
    let tampered = signing.push_altered(TAG).await;
    assert_ne!(signed, tampered);
    let dir = tempfile::tempdir().unwrap();
    let cache = signing.cache(dir.path());
    let (reason, digest, _) = refusal(cache.get(&id(TAG)).await.unwrap_err());
    assert_eq!((reason, digest), (Refusal::Unsigned, tampered.clone()));

    // The old signature copied onto the new manifest's referrer: about another manifest.
    let old_bundle_index = cso_testenv::cosign::get_manifest(
        signing.registry.host(),
        REPOSITORY,
        &SignatureLayout::Bundle.tag(&signed),
    )
    .await
    .unwrap()
    .unwrap();
    let entry: serde_json::Value = serde_json::from_slice(&old_bundle_index).unwrap();
    let referrer = entry["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let referrer: serde_json::Value = serde_json::from_slice(
        &cso_testenv::cosign::get_manifest(signing.registry.host(), REPOSITORY, &referrer)
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    let bundle = cso_testenv::cosign::get_blob(
        signing.registry.host(),
        REPOSITORY,
        referrer["layers"][0]["digest"].as_str().unwrap(),
    )
    .await
    .unwrap();
    let subject = cso_testenv::cosign::Subject {
        digest: tampered.clone(),
        size: 0,
        media_type: "application/vnd.oci.image.manifest.v1+json".into(),
    };
    cso_testenv::cosign::push_bundle(signing.registry.host(), REPOSITORY, &subject, bundle)
        .await
        .unwrap();
    let (reason, _, message) = refusal(cache.get(&id(TAG)).await.unwrap_err());
    assert_eq!(reason, Refusal::InvalidSignature, "{message}");
    assert!(message.contains("another manifest"), "{message}");

    // Signing what is there now recovers; the provenance names the new digest.
    signing
        .sign(&signing.trusted, &tampered, SignatureLayout::Legacy)
        .await;
    let release = cache.get(&id(TAG)).await.unwrap();
    assert_eq!(release.provenance.clone().unwrap().digest, Some(tampered));
}

#[tokio::test]
async fn a_pinned_tag_that_moved_is_refused_and_the_cached_release_keeps_serving() {
    let Some(signing) = Signing::start().await else {
        return;
    };
    let pinned = signing.push(TAG, TAG).await;
    signing
        .sign(&signing.trusted, &pinned, SignatureLayout::Bundle)
        .await;
    let serving = tempfile::tempdir().unwrap();
    let cache = signing.cache(serving.path());
    cache.get_pinned(&id(TAG), Some(&pinned)).await.unwrap();

    // The tag moves to other, signed content.
    let moved = signing.push_altered(TAG).await;
    signing
        .sign(&signing.trusted, &moved, SignatureLayout::Bundle)
        .await;

    // A process with an empty cache refuses it, before downloading anything.
    let fresh = tempfile::tempdir().unwrap();
    let (reason, digest, message) = refusal(
        signing
            .cache(fresh.path())
            .get_pinned(&id(TAG), Some(&pinned))
            .await
            .unwrap_err(),
    );
    assert_eq!((reason, digest.as_str()), (Refusal::TagMoved, moved.as_str()));
    assert!(message.contains(&pinned) && message.contains(&moved), "{message}");
    assert!(!fresh.path().join("cluster-stacks").join(TAG).exists());

    // The cache that holds the pinned release keeps serving it.
    let release = cache.get_pinned(&id(TAG), Some(&pinned)).await.unwrap();
    assert_eq!(release.provenance.clone().unwrap().digest, Some(pinned.clone()));
    // Pinned to the new digest as well (another namespace, or a new pin): fetched and kept beside the
    // first, which stays what the tag's directory holds; both pins are served, from disk, by a new process too.
    let release = cache.get_pinned(&id(TAG), Some(&moved)).await.unwrap();
    assert_eq!(release.provenance.clone().unwrap().digest, Some(moved.clone()));
    let again = signing.cache(serving.path());
    for (pin, digest) in [
        (Some(pinned.as_str()), &pinned),
        (Some(moved.as_str()), &moved),
        (None, &pinned),
    ] {
        let release = again.cached_pinned(&id(TAG), pin).unwrap().expect("cached");
        assert_eq!(
            release.provenance.clone().unwrap().digest.as_ref(),
            Some(digest),
            "{pin:?}"
        );
    }
    assert_eq!(
        again.cached_tags(),
        [TAG],
        "the kept pin is no release of its own"
    );
}

#[tokio::test]
async fn a_release_cached_before_keys_were_given_is_verified_before_use() {
    let Some(signing) = Signing::start().await else {
        return;
    };
    let digest = signing.push(TAG, TAG).await;
    let dir = tempfile::tempdir().unwrap();
    // Cached by a process without keys (as the Go operator or an older cso would have).
    let unverifying =
        OciSource::new(OciConfig::from_lookup(signing.registry.oci_variables(REPOSITORY)).unwrap());
    let release = ReleaseCache::new(dir.path(), Arc::new(unverifying), UnpackLimits::default())
        .unwrap()
        .get(&id(TAG))
        .await
        .unwrap();
    let provenance = release.provenance.clone().unwrap();
    assert_eq!(
        (provenance.digest.as_deref(), provenance.signer),
        (Some(digest.as_str()), None)
    );

    // With a key, the unsigned cached release does not count as cached, and is refused on fetch...
    let cache = signing.cache(dir.path());
    assert!(cache.cached(&id(TAG)).unwrap().is_none());
    let (reason, _, _) = refusal(cache.get(&id(TAG)).await.unwrap_err());
    assert_eq!(reason, Refusal::Unsigned);
    assert!(
        dir.path().join("cluster-stacks").join(TAG).is_dir(),
        "a refused fetch leaves the cached files in place"
    );
    // ...and accepted, in place, once signed.
    signing
        .sign(&signing.trusted, &digest, SignatureLayout::Bundle)
        .await;
    let release = cache.get(&id(TAG)).await.unwrap();
    assert_eq!(
        release.provenance.clone().unwrap().signer,
        Some(signing.trusted_id())
    );
}
