//! cosign (v3, built by hack/tools.sh from the wrapper module hack/testenv/cosign, `CSO_COSIGN`) for the tests of
//! release verification, and a signer in Rust that writes what cosign writes.
//!
//! [`Cosign`] runs the binary fully offline against a plain-HTTP registry on loopback ([`crate::registry`]):
//! keys with an empty password, `sign` without a transparency log (`--tlog-upload=false
//! --use-signing-config=false`), `verify --key` with `--insecure-ignore-tlog`. Verifying with a key never fetches
//! the Sigstore TUF root (checked with strace: its only connections are to the registry); every run still gets a
//! `HOME`, `TUF_ROOT` and `DOCKER_CONFIG` of its own, so that nothing outside the test's directory is read or
//! written.
//!
//! Where cosign 3 puts a signature of manifest `D = sha256:<hex>` (against distribution 2.8, which answers 404
//! to the referrers API):
//! - [`SignatureLayout::Bundle`] (cosign 3's default): a Sigstore bundle v0.3 (a DSSE envelope around an in-toto
//!   statement with predicate type `https://sigstore.dev/cosign/sign/v1`) as the one layer of a referrer
//!   manifest whose `subject` is `D`, listed in the OCI index under the referrers tag schema's tag
//!   `sha256-<hex>` (every further signature adds an entry; the entries are sorted by digest, so the newest is not
//!   necessarily the last).
//! - [`SignatureLayout::Legacy`] (`--new-bundle-format=false`): tag `sha256-<hex>.sig`, an image manifest with
//!   one `application/vnd.dev.cosign.simplesigning.v1+json` layer per signature, each annotated with
//!   `dev.cosignproject.cosign/signature`.
//!
//! [`sign_bundle_in_rust`] writes the bundle layout the way cosign does, signed by a [`RustKey`] (ECDSA P-256,
//! SHA-256, on ring): the cross-check that what we understand of the format is what cosign accepts.
//!
//! Found while writing this (cosign v3.1.3): keys imported with `cosign import-key-pair` sign P-384 with SHA-384,
//! which `cosign verify` accepts only with `--signature-digest-algorithm=sha384`; Ed25519 keys sign as
//! Ed25519ph (RFC 8032's pre-hashed variant, over SHA-512 of the message), which `cosign verify --key` does not
//! accept at all, in either layout.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Stdio,
};

use base64::{Engine, engine::general_purpose::STANDARD as B64};
use reqwest::StatusCode;
use ring::{
    rand::SystemRandom,
    signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair as _},
};
use sha2::{Digest, Sha256};

use crate::{
    Error,
    registry::{RepositoryClient, sha256_digest},
};

/// The media type of a Sigstore bundle v0.3, the layer and the artifact type of a bundle referrer.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The predicate type of the in-toto statement that `cosign sign` signs.
pub const COSIGN_SIGN_PREDICATE_TYPE: &str = "https://sigstore.dev/cosign/sign/v1";
/// The DSSE payload type of an in-toto statement.
pub const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The layer media type of a legacy (`.sig`) signature.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation of a legacy signature layer holding the base64 of the DER signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
use crate::registry::IMAGE_MANIFEST_MEDIA_TYPE as MANIFEST_MEDIA_TYPE;
pub use crate::registry::INDEX_MEDIA_TYPE;
const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";

/// Where a signature is stored: see the module doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignatureLayout {
    /// A Sigstore bundle v0.3 as an OCI referrer (tag `sha256-<hex>` where the registry lacks the referrers API).
    Bundle,
    /// cosign's older layout: tag `sha256-<hex>.sig`.
    Legacy,
}

impl SignatureLayout {
    /// The tag this layout adds for a signature of `digest` (`sha256:<hex>`) on a registry without the referrers
    /// API.
    pub fn tag(self, digest: &str) -> String {
        let tag = digest.replacen(':', "-", 1);
        match self {
            SignatureLayout::Bundle => tag,
            SignatureLayout::Legacy => tag + ".sig",
        }
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            SignatureLayout::Bundle => &[],
            SignatureLayout::Legacy => &["--new-bundle-format=false"],
        }
    }
}

/// A cosign key pair made by [`Cosign::generate_key_pair`] or [`Cosign::import_key_pair`]: the private key is
/// cosign's encrypted format (`ENCRYPTED SIGSTORE PRIVATE KEY`, empty password), the public key a `PUBLIC KEY`
/// (SPKI) PEM.
#[derive(Clone, Debug)]
pub struct KeyPair {
    pub private: PathBuf,
    pub public: PathBuf,
}

/// The cosign binary, run offline. Each instance has a directory of its own for cosign's `HOME`, `TUF_ROOT` and
/// `DOCKER_CONFIG`, removed when it drops.
#[derive(Debug)]
pub struct Cosign {
    binary: PathBuf,
    home: tempfile::TempDir,
}

impl Cosign {
    /// cosign from `CSO_COSIGN`, else from the tools' `env` file (what hack/tools.sh writes); `None` when neither
    /// names it, so that a test can skip. A named path that does not exist is a misconfiguration: panics.
    /// In CI (`CI=true`), where `make tools` always builds it, a missing cosign is a failure, not a skip.
    pub fn from_env() -> Option<Cosign> {
        let binary = std::env::var("CSO_COSIGN")
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| crate::tools::from_env_file("CSO_COSIGN"))
            .map(PathBuf::from);
        let Some(binary) = binary else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CSO_COSIGN is not set in CI: `make tools` builds cosign, and the signature tests must run"
            );
            return None;
        };
        assert!(
            binary.is_file(),
            "CSO_COSIGN={} does not exist: run `make tools`",
            binary.display()
        );
        match Cosign::new(binary) {
            Ok(cosign) => Some(cosign),
            Err(e) => panic!("cosign: {e}"),
        }
    }

    /// cosign at `binary`.
    pub fn new(binary: PathBuf) -> Result<Cosign, Error> {
        let home = tempfile::Builder::new()
            .prefix("cso-cosign-")
            .tempdir()
            .map_err(|e| Error::io(Path::new("/tmp"), e))?;
        Ok(Cosign { binary, home })
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// A command running cosign with `args`, offline and isolated (see the type's doc), with an empty key password.
    pub fn command<I, S>(&self, args: I) -> tokio::process::Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let home = self.home.path();
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .args(args)
            .current_dir(home)
            .env("HOME", home)
            .env("TUF_ROOT", home.join("tuf"))
            .env("SIGSTORE_NO_CACHE", "true")
            .env("DOCKER_CONFIG", home.join("docker"))
            .env("COSIGN_PASSWORD", "")
            .env_remove("COSIGN_EXPERIMENTAL")
            .env_remove("COSIGN_REPOSITORY")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// Runs cosign with `args`; its stdout, or its stderr as the error.
    pub async fn run<I, S>(&self, args: I) -> Result<String, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let output = self
            .command(args)
            .output()
            .await
            .map_err(|e| format!("failed to run {}: {e}", self.binary.display()))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "cosign exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// `cosign generate-key-pair`: an ECDSA P-256 key pair, `<dir>/<name>.key` and `<dir>/<name>.pub`.
    pub async fn generate_key_pair(&self, dir: &Path, name: &str) -> Result<KeyPair, Error> {
        let prefix = dir.join(name);
        self.run([
            OsStr::new("generate-key-pair"),
            OsStr::new("--output-key-prefix"),
            prefix.as_os_str(),
        ])
        .await
        .map_err(Error::Process)?;
        Ok(key_pair(&prefix))
    }

    /// `cosign import-key-pair`: a PKCS#8 (or SEC1/PKCS#1) private key PEM made elsewhere (openssl: P-384,
    /// Ed25519, RSA) as `<dir>/<name>.key` and `<dir>/<name>.pub`.
    pub async fn import_key_pair(
        &self,
        private_pem: &Path,
        dir: &Path,
        name: &str,
    ) -> Result<KeyPair, Error> {
        let prefix = dir.join(name);
        self.run([
            OsStr::new("import-key-pair"),
            OsStr::new("--key"),
            private_pem.as_os_str(),
            OsStr::new("--output-key-prefix"),
            prefix.as_os_str(),
        ])
        .await
        .map_err(Error::Process)?;
        Ok(key_pair(&prefix))
    }

    /// `cosign sign --key` of `reference` (`host/repository@sha256:<hex>`) in `layout`, without a transparency log.
    pub async fn sign(&self, key: &KeyPair, reference: &str, layout: SignatureLayout) -> Result<(), Error> {
        let mut args: Vec<&OsStr> = vec![
            OsStr::new("sign"),
            OsStr::new("--key"),
            key.private.as_os_str(),
            OsStr::new("--tlog-upload=false"),
            OsStr::new("--use-signing-config=false"),
            OsStr::new("--allow-http-registry"),
            OsStr::new("--yes"),
        ];
        args.extend(layout.flags().iter().map(OsStr::new));
        args.push(OsStr::new(reference));
        self.run(args)
            .await
            .map(drop)
            .map_err(|e| Error::Process(format!("cosign sign {reference}: {e}")))
    }

    /// `cosign verify --key public --insecure-ignore-tlog` of `reference` in `layout`; the error is cosign's
    /// stderr. (For a P-384 key, see [`Cosign::verify_with`] and the module doc.)
    pub async fn verify(
        &self,
        public: &Path,
        reference: &str,
        layout: SignatureLayout,
    ) -> Result<(), String> {
        self.verify_with(public, reference, layout, &[]).await
    }

    /// [`Cosign::verify`] with further flags (e.g. `--signature-digest-algorithm=sha384`).
    pub async fn verify_with(
        &self,
        public: &Path,
        reference: &str,
        layout: SignatureLayout,
        extra: &[&str],
    ) -> Result<(), String> {
        let mut args: Vec<&OsStr> = vec![
            OsStr::new("verify"),
            OsStr::new("--key"),
            public.as_os_str(),
            OsStr::new("--insecure-ignore-tlog"),
            OsStr::new("--allow-http-registry"),
        ];
        args.extend(layout.flags().iter().map(OsStr::new));
        args.extend(extra.iter().map(OsStr::new));
        args.push(OsStr::new(reference));
        self.run(args).await.map(drop)
    }
}

fn key_pair(prefix: &Path) -> KeyPair {
    KeyPair {
        private: prefix.with_extension("key"),
        public: prefix.with_extension("pub"),
    }
}

/// The DER header of a P-256 `SubjectPublicKeyInfo` (id-ecPublicKey, prime256v1, a 65-byte BIT STRING), before
/// the uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86,
    0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// An ECDSA P-256 key of the Rust signer ([`sign_bundle_in_rust`]), made by ring.
pub struct RustKey {
    pkcs8: Vec<u8>,
    key: EcdsaKeyPair,
    rng: SystemRandom,
}

impl std::fmt::Debug for RustKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RustKey")
            .field("hint", &self.hint())
            .finish_non_exhaustive()
    }
}

impl RustKey {
    /// A new random key.
    pub fn generate() -> Result<RustKey, Error> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(|e| Error::Pki(format!("P-256 key: {e}")))?;
        RustKey::from_pkcs8(pkcs8.as_ref())
    }

    /// The key of a PKCS#8 v1 DER document of a P-256 key (as [`RustKey::pkcs8_der`] returns).
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<RustKey, Error> {
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8, &rng)
            .map_err(|e| Error::Pki(format!("P-256 PKCS#8: {e}")))?;
        Ok(RustKey {
            pkcs8: pkcs8.to_vec(),
            key,
            rng,
        })
    }

    /// The private key, PKCS#8 DER.
    pub fn pkcs8_der(&self) -> &[u8] {
        &self.pkcs8
    }

    /// The public key, `SubjectPublicKeyInfo` DER.
    pub fn public_spki_der(&self) -> Vec<u8> {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(self.key.public_key().as_ref());
        der
    }

    /// The public key as cosign writes it: a `PUBLIC KEY` PEM.
    pub fn public_pem(&self) -> String {
        pem("PUBLIC KEY", &self.public_spki_der())
    }

    /// Writes [`RustKey::public_pem`] to `path`.
    pub fn write_public_pem(&self, path: &Path) -> Result<(), Error> {
        std::fs::write(path, self.public_pem()).map_err(|e| Error::io(path, e))
    }

    /// The bundle's `verificationMaterial.publicKey.hint`, as cosign computes it: base64 of the SHA-256 of the
    /// SPKI DER.
    pub fn hint(&self) -> String {
        B64.encode(Sha256::digest(self.public_spki_der()))
    }

    /// An ASN.1 DER ECDSA signature over SHA-256 of `message`.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, Error> {
        self.key
            .sign(&self.rng, message)
            .map(|s| s.as_ref().to_vec())
            .map_err(|e| Error::Pki(format!("ECDSA: {e}")))
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = B64.encode(der);
    let mut text = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        text.push_str(&String::from_utf8_lossy(line));
        text.push('\n');
    }
    text + &format!("-----END {label}-----\n")
}

/// DSSE's pre-authentication encoding, what a DSSE signature signs:
/// `"DSSEv1" SP len(type) SP type SP len(payload) SP payload`, lengths in ASCII decimal.
pub fn dsse_pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut pae = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), payload.len()).into_bytes();
    pae.extend_from_slice(payload);
    pae
}

/// The in-toto statement `cosign sign` signs for manifest `subject_digest` (`sha256:<hex>`).
pub fn cosign_statement(subject_digest: &str) -> Result<Vec<u8>, Error> {
    let hex = subject_digest
        .strip_prefix("sha256:")
        .ok_or_else(|| Error::Pki(format!("not a sha256 digest: {subject_digest}")))?;
    let statement = serde_json::json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{ "digest": { "sha256": hex }, "annotations": {} }],
        "predicateType": COSIGN_SIGN_PREDICATE_TYPE,
        "predicate": {},
    });
    serde_json::to_vec(&statement).map_err(|e| Error::Pki(format!("statement: {e}")))
}

/// The Sigstore bundle v0.3 that `cosign sign --key` makes for `subject_digest`, signed by `key`: a DSSE envelope
/// around [`cosign_statement`], the key's hint, no transparency log entry and no timestamp.
pub fn bundle_v03(key: &RustKey, subject_digest: &str) -> Result<Vec<u8>, Error> {
    let statement = cosign_statement(subject_digest)?;
    let signature = key.sign(&dsse_pae(IN_TOTO_PAYLOAD_TYPE, &statement))?;
    let bundle = serde_json::json!({
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": { "publicKey": { "hint": key.hint() } },
        "dsseEnvelope": {
            "payload": B64.encode(&statement),
            "payloadType": IN_TOTO_PAYLOAD_TYPE,
            "signatures": [{ "sig": B64.encode(signature) }],
        },
    });
    serde_json::to_vec(&bundle).map_err(|e| Error::Pki(format!("bundle: {e}")))
}

/// The manifest a signature is about.
#[derive(Clone, Debug)]
pub struct Subject {
    /// `sha256:<hex>`
    pub digest: String,
    pub size: u64,
    /// e.g. `application/vnd.oci.image.manifest.v1+json`
    pub media_type: String,
}

/// What [`sign_bundle_in_rust`] pushed.
#[derive(Clone, Debug)]
pub struct PushedBundle {
    /// The bundle blob.
    pub bundle: Vec<u8>,
    /// The referrer manifest and its digest.
    pub manifest: Vec<u8>,
    pub manifest_digest: String,
    /// Whether the registry answered the referrers API, so that no `sha256-<hex>` tag was written.
    pub referrers_api: bool,
}

/// Signs `subject` (a manifest in `repository` of the plain-HTTP registry at `registry_host`) with `key` and
/// pushes the signature as cosign 3 does: the [`bundle_v03`] blob through [`push_bundle`].
pub async fn sign_bundle_in_rust(
    registry_host: &str,
    repository: &str,
    subject: &Subject,
    key: &RustKey,
) -> Result<PushedBundle, Error> {
    let bundle = bundle_v03(key, &subject.digest)?;
    push_bundle(registry_host, repository, subject, bundle).await
}

/// Pushes `bundle` (any bytes: tests push broken ones too) as a bundle referrer of `subject` the way cosign 3 does:
/// the blob and the empty config, a referrer manifest (subject, artifact type, cosign's annotations), and, where
/// the registry does not answer `GET /v2/<repository>/referrers/<digest>`, an entry for it in the OCI index under
/// tag `sha256-<hex>` (the referrers tag schema; an index already there keeps its entries, sorted by digest).
pub async fn push_bundle(
    registry_host: &str,
    repository: &str,
    subject: &Subject,
    bundle: Vec<u8>,
) -> Result<PushedBundle, Error> {
    let registry = RepositoryClient::new(registry_host, repository, None)?;
    let empty = registry.push_blob(b"{}").await?;
    let layer = registry.push_blob(&bundle).await?;
    let created = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        // cosign (go-containerregistry) puts the artifact type on the config descriptor too.
        "config": { "mediaType": EMPTY_MEDIA_TYPE, "size": 2, "digest": empty, "artifactType": BUNDLE_MEDIA_TYPE },
        "layers": [{ "mediaType": BUNDLE_MEDIA_TYPE, "size": bundle.len(), "digest": layer }],
        "annotations": {
            "dev.sigstore.bundle.content": "dsse-envelope",
            "dev.sigstore.bundle.predicateType": COSIGN_SIGN_PREDICATE_TYPE,
            "org.opencontainers.image.created": created,
        },
        "subject": { "mediaType": subject.media_type, "size": subject.size, "digest": subject.digest },
        "artifactType": BUNDLE_MEDIA_TYPE,
    });
    let manifest = serde_json::to_vec(&manifest).map_err(|e| Error::Kube(format!("manifest: {e}")))?;
    let manifest_digest = sha256_digest(&manifest);
    registry
        .put_manifest(&manifest_digest, MANIFEST_MEDIA_TYPE, &manifest)
        .await?;

    let referrers_api = registry.answers_referrers(&subject.digest).await?;
    if !referrers_api {
        let tag = SignatureLayout::Bundle.tag(&subject.digest);
        let mut index = match registry.get_manifest(&tag).await? {
            Some(body) => serde_json::from_slice(&body)
                .map_err(|e| Error::Kube(format!("the index at {tag} does not parse: {e}")))?,
            None => serde_json::json!({ "schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [] }),
        };
        let entries = index["manifests"]
            .as_array_mut()
            .ok_or_else(|| Error::Kube(format!("the index at {tag} has no manifests")))?;
        if !entries.iter().any(|e| e["digest"] == manifest_digest.as_str()) {
            entries.push(serde_json::json!({
                "mediaType": MANIFEST_MEDIA_TYPE,
                "size": manifest.len(),
                "digest": manifest_digest,
                "artifactType": BUNDLE_MEDIA_TYPE,
            }));
        }
        // As go-containerregistry keeps the tag schema's index: sorted by digest, not in the order of signing.
        entries.sort_by(|a, b| a["digest"].as_str().cmp(&b["digest"].as_str()));
        let index = serde_json::to_vec(&index).map_err(|e| Error::Kube(format!("index: {e}")))?;
        registry.put_manifest(&tag, INDEX_MEDIA_TYPE, &index).await?;
    }
    Ok(PushedBundle {
        bundle,
        manifest,
        manifest_digest,
        referrers_api,
    })
}

/// The tags of `repository` (all of them: distribution 2.8 does not page).
pub async fn list_tags(registry_host: &str, repository: &str) -> Result<Vec<String>, Error> {
    let registry = RepositoryClient::new(registry_host, repository, None)?;
    let url = registry.url("tags/list")?;
    let response = registry
        .http
        .get(url)
        .send()
        .await
        .map_err(|e| Error::Kube(format!("tags of {repository}: {e}")))?;
    let list: serde_json::Value = response
        .json()
        .await
        .map_err(|e| Error::Kube(format!("tags of {repository}: {e}")))?;
    Ok(serde_json::from_value(list["tags"].clone()).unwrap_or_default())
}

/// The manifest or index at `reference` (a tag or digest) of `repository`, as stored; `None` when there is none.
pub async fn get_manifest(
    registry_host: &str,
    repository: &str,
    reference: &str,
) -> Result<Option<Vec<u8>>, Error> {
    RepositoryClient::new(registry_host, repository, None)?
        .get_manifest(reference)
        .await
}

/// The blob `digest` of `repository`.
pub async fn get_blob(registry_host: &str, repository: &str, digest: &str) -> Result<Vec<u8>, Error> {
    let registry = RepositoryClient::new(registry_host, repository, None)?;
    let response = registry
        .http
        .get(registry.url(&format!("blobs/{digest}"))?)
        .send()
        .await
        .map_err(|e| Error::Kube(format!("blob {digest}: {e}")))?;
    if response.status() != StatusCode::OK {
        return Err(Error::Kube(format!("blob {digest}: {}", response.status())));
    }
    let body = response
        .bytes()
        .await
        .map_err(|e| Error::Kube(format!("blob {digest}: {e}")))?;
    Ok(body.to_vec())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test: a failed unwrap is a failed test")]

    use ring::signature::{ECDSA_P256_SHA256_ASN1, UnparsedPublicKey};

    use super::*;

    #[test]
    fn the_pae_is_dsse_v1s() {
        assert_eq!(
            dsse_pae("application/vnd.in-toto+json", b"{}"),
            b"DSSEv1 28 application/vnd.in-toto+json 2 {}"
        );
    }

    #[test]
    fn the_tags_are_cosigns() {
        let d = "sha256:2e9f50f1c20176416d43b444914dac76cb128c7cbcd89f71ad8ea63f3c65feca";
        assert_eq!(
            SignatureLayout::Bundle.tag(d),
            "sha256-2e9f50f1c20176416d43b444914dac76cb128c7cbcd89f71ad8ea63f3c65feca"
        );
        assert_eq!(
            SignatureLayout::Legacy.tag(d),
            "sha256-2e9f50f1c20176416d43b444914dac76cb128c7cbcd89f71ad8ea63f3c65feca.sig"
        );
    }

    /// The bundle's signature checks out over the PAE with the SPKI's point, and the key survives PKCS#8.
    #[test]
    fn a_rust_bundle_verifies_with_its_public_key() {
        let key = RustKey::generate().unwrap();
        let again = RustKey::from_pkcs8(key.pkcs8_der()).unwrap();
        assert_eq!(again.public_pem(), key.public_pem());
        assert!(
            key.public_pem()
                .starts_with("-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE")
        );
        let digest = format!("sha256:{}", "ab".repeat(32));
        let bundle: serde_json::Value = serde_json::from_slice(&bundle_v03(&key, &digest).unwrap()).unwrap();
        assert_eq!(bundle["mediaType"], BUNDLE_MEDIA_TYPE);
        assert_eq!(bundle["verificationMaterial"]["publicKey"]["hint"], key.hint());
        let envelope = &bundle["dsseEnvelope"];
        let payload = B64.decode(envelope["payload"].as_str().unwrap()).unwrap();
        let statement: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(statement["subject"][0]["digest"]["sha256"], "ab".repeat(32));
        assert_eq!(statement["predicateType"], COSIGN_SIGN_PREDICATE_TYPE);
        let sig = B64
            .decode(envelope["signatures"][0]["sig"].as_str().unwrap())
            .unwrap();
        let spki = key.public_spki_der();
        let point = &spki[P256_SPKI_PREFIX.len()..];
        let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, point);
        public
            .verify(&dsse_pae(IN_TOTO_PAYLOAD_TYPE, &payload), &sig)
            .unwrap();
        assert!(
            public.verify(&payload, &sig).is_err(),
            "signed over the PAE, not the payload"
        );
    }
}
