//! Cosign signatures of release manifests, checked offline against the public keys the operator was given
//! (`--verify-key`): what `cosign sign --key` writes, in both of its layouts.
//!
//! - **Sigstore bundle v0.3** (cosign 3's default, cosign 2.4+ with `--new-bundle-format`): a referrer of the
//!   release manifest (the registry's referrers API, or the referrers tag schema `sha256-<hex>`) whose one
//!   layer is a bundle holding a DSSE envelope. The envelope's signature covers the DSSE pre-authentication
//!   encoding of an in-toto statement whose subject is the manifest digest and whose predicate type is
//!   cosign's `https://sigstore.dev/cosign/sign/v1`.
//! - **Legacy** (`sha256-<hex>.sig` tag): one layer per signature, a "simple signing" JSON document naming the
//!   manifest digest, signed byte for byte, the signature in the layer's `dev.cosignproject.cosign/signature`
//!   annotation.
//!
//! What is trusted is the signature and what it covers, nothing else: the bundle's key hint, the referrer
//! manifest's `subject` and the simple-signing document's `docker-reference` (mirrors rename hosts) only
//! help finding, never decide. A key-signed bundle carries no transparency-log entry and no timestamp when it
//! is made offline, so none is required (the Rust crates that verify bundles require one: see
//! docs/plans/verified-releases.md); keyless signatures (a certificate in the bundle) are not accepted by key.
//!
//! Keys are cosign's `PUBLIC KEY` PEM (SubjectPublicKeyInfo): ECDSA P-256 with SHA-256 (what
//! `cosign generate-key-pair` makes), ECDSA P-384 (cosign signs with SHA-384; SHA-256 is accepted too) and RSA
//! (PKCS#1 v1.5 or PSS, SHA-256). Ed25519 keys are refused at start: cosign signs with them as Ed25519ph (the
//! pre-hashed variant), which cosign itself does not verify with `--key` and ring does not implement.
//! The checks here are pure: finding the signatures in a registry is [`super::oci`]'s job.

use std::path::Path;

use base64::Engine;
use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use x509_parser::{
    oid_registry::{
        OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION, OID_SIG_ED25519,
    },
    prelude::FromDer,
    x509::SubjectPublicKeyInfo,
};

/// The artifact type of a Sigstore bundle referrer, and the media type of its layer.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The media type of a legacy signature layer.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation of a legacy signature layer that holds the base64 signature.
pub const LEGACY_SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The predicate type of what `cosign sign` signs in a bundle.
const COSIGN_SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";
const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
const IN_TOTO_STATEMENT_TYPES: [&str; 2] = [
    "https://in-toto.io/Statement/v1",
    "https://in-toto.io/Statement/v0.1",
];
const SIMPLE_SIGNING_TYPE: &str = "cosign container image signature";

/// Where a signature was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignatureLayout {
    /// A Sigstore bundle v0.3 referrer.
    Bundle,
    /// The legacy `sha256-<hex>.sig` tag.
    Legacy,
}

impl SignatureLayout {
    /// As the status and the metric name it: `bundle-v0.3` or `legacy-sig`.
    pub fn as_str(self) -> &'static str {
        use cso_api::cluster_stack_release::ReleaseProvenance;
        match self {
            SignatureLayout::Bundle => ReleaseProvenance::BUNDLE_V0_3,
            SignatureLayout::Legacy => ReleaseProvenance::LEGACY_SIG,
        }
    }
}

/// A public key the operator trusts to sign releases.
#[derive(Clone)]
pub struct TrustedKey {
    /// `key:SHA256:<unpadded base64 of the SHA-256 of the SubjectPublicKeyInfo DER>`, the name the status gives
    /// the signer (the same for the same key, whichever file it came from).
    id: String,
    /// Where it came from (a file name), for messages.
    origin: String,
    algorithms: Vec<&'static dyn VerificationAlgorithm>,
    /// What ring verifies with: the point (EC), the raw key (Ed25519) or the PKCS#1 RSAPublicKey (RSA).
    key: Vec<u8>,
}

impl std::fmt::Debug for TrustedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustedKey")
            .field("id", &self.id)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// A key file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("verification key {origin}: {message}")]
pub struct KeyError {
    pub origin: String,
    pub message: String,
}

impl TrustedKey {
    /// Reads a cosign public key file (`PUBLIC KEY` PEM).
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        let origin = path.display().to_string();
        let pem = std::fs::read(path).map_err(|e| KeyError {
            origin: origin.clone(),
            message: e.to_string(),
        })?;
        Self::from_pem(&origin, &pem)
    }

    /// Parses a `PUBLIC KEY` PEM block; `origin` names it in messages.
    pub fn from_pem(origin: &str, pem: &[u8]) -> Result<Self, KeyError> {
        let error = |message: String| KeyError {
            origin: origin.to_owned(),
            message,
        };
        let (_, block) =
            x509_parser::pem::parse_x509_pem(pem).map_err(|e| error(format!("not a PEM file: {e}")))?;
        if block.label != "PUBLIC KEY" {
            return Err(error(format!(
                "a {:?} PEM block, where a cosign public key (PUBLIC KEY) is expected",
                block.label
            )));
        }
        let (rest, spki) = SubjectPublicKeyInfo::from_der(&block.contents)
            .map_err(|e| error(format!("not a SubjectPublicKeyInfo: {e}")))?;
        if !rest.is_empty() {
            return Err(error("trailing bytes after the SubjectPublicKeyInfo".into()));
        }
        let oid = &spki.algorithm.algorithm;
        let curve = spki.algorithm.parameters.as_ref().and_then(|p| p.as_oid().ok());
        // What ring would only find out at the first signature (a compressed point, a short RSA modulus): a
        // key that can never verify is refused now.
        let key = &spki.subject_public_key.data;
        let uncompressed = |length: usize| key.len() == length && key.first() == Some(&4);
        let (algorithms, usable): (Vec<&'static dyn VerificationAlgorithm>, bool) = if *oid
            == OID_KEY_TYPE_EC_PUBLIC_KEY
        {
            match curve {
                Some(c) if c == OID_EC_P256 => (vec![&signature::ECDSA_P256_SHA256_ASN1], uncompressed(65)),
                Some(c) if c == OID_NIST_EC_P384 => (
                    vec![
                        &signature::ECDSA_P384_SHA384_ASN1,
                        &signature::ECDSA_P384_SHA256_ASN1,
                    ],
                    uncompressed(97),
                ),
                other => return Err(error(format!("unsupported elliptic curve {other:?}"))),
            }
        } else if *oid == OID_SIG_ED25519 {
            return Err(error(
                "an Ed25519 key: cosign signs with it as Ed25519ph, which cannot be verified here (nor by \
                     `cosign verify --key`); use an ECDSA P-256 key (`cosign generate-key-pair`)"
                    .into(),
            ));
        } else if *oid == OID_PKCS1_RSAENCRYPTION {
            let bits = match spki.parsed() {
                Ok(x509_parser::public_key::PublicKey::RSA(rsa)) => rsa.key_size(),
                _ => 0,
            };
            (
                vec![
                    &signature::RSA_PKCS1_2048_8192_SHA256,
                    &signature::RSA_PSS_2048_8192_SHA256,
                ],
                (2048..=8192).contains(&bits),
            )
        } else {
            return Err(error(format!("unsupported key algorithm {oid}")));
        };
        if !usable {
            return Err(error(
                "not a usable key (an uncompressed P-256 or P-384 point, or RSA of 2048 to 8192 bits)".into(),
            ));
        }
        let digest = Sha256::digest(&block.contents);
        Ok(TrustedKey {
            id: format!(
                "key:SHA256:{}",
                base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
            ),
            origin: origin.to_owned(),
            algorithms,
            key: spki.subject_public_key.data.to_vec(),
        })
    }

    /// The signer's name in the status: `key:SHA256:…`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether `signature` is this key's signature of `message`.
    fn signed(&self, message: &[u8], signature: &[u8]) -> bool {
        self.algorithms.iter().any(|algorithm| {
            UnparsedPublicKey::new(*algorithm, &self.key)
                .verify(message, signature)
                .is_ok()
        })
    }
}

/// A signature that one of the trusted keys made over the manifest digest asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The key's id ([`TrustedKey::id`]).
    pub signer: String,
    pub layout: SignatureLayout,
}

/// What one signature document says about a manifest digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// Signed by a trusted key, over this digest.
    Verified(Verified),
    /// Well formed, about this digest, but signed by none of the trusted keys (or keylessly).
    OtherSigner(String),
    /// Malformed, about another digest, or of another kind: the message says which.
    Invalid(String),
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Verified(verified) => write!(f, "verified, signed by {}", verified.signer),
            Finding::OtherSigner(message) | Finding::Invalid(message) => f.write_str(message),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bundle {
    media_type: String,
    #[serde(default)]
    verification_material: Option<serde_json::Value>,
    dsse_envelope: Option<DsseEnvelope>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DsseEnvelope {
    payload: String,
    payload_type: String,
    signatures: Vec<DsseSignature>,
}

#[derive(Deserialize)]
struct DsseSignature {
    sig: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Statement {
    #[serde(rename = "_type")]
    kind: String,
    subject: Vec<StatementSubject>,
    predicate_type: String,
}

#[derive(Deserialize)]
struct StatementSubject {
    digest: std::collections::BTreeMap<String, String>,
}

/// `sha256:<hex>` → `<hex>`, lowercase; anything else is not a digest cosign signs.
fn sha256_hex(digest: &str) -> Option<&str> {
    digest.strip_prefix("sha256:").filter(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The DSSE pre-authentication encoding: what a DSSE signature signs.
fn pre_authentication_encoding(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut message = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    message.extend_from_slice(payload);
    message
}

fn decode_base64(what: &str, text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("{what} is not base64: {e}"))
}

/// Checks a Sigstore bundle (the blob of a bundle referrer) as a signature of the manifest `digest`.
pub fn check_bundle(bundle: &[u8], digest: &str, keys: &[TrustedKey]) -> Finding {
    match signed_statement(bundle, digest) {
        Err(message) => Finding::Invalid(message),
        Ok(SignedStatement {
            message,
            signatures,
            keyless,
        }) => {
            let found = keys
                .iter()
                .find(|key| signatures.iter().any(|sig| key.signed(&message, sig)));
            match found {
                Some(key) => Finding::Verified(Verified {
                    signer: key.id.clone(),
                    layout: SignatureLayout::Bundle,
                }),
                None if keyless => Finding::OtherSigner(
                    "a keyless bundle (signed with a certificate), and keyless signatures are not trusted here".into(),
                ),
                None => Finding::OtherSigner("a bundle signed by none of the trusted keys".into()),
            }
        }
    }
}

/// What a bundle's signatures sign.
struct SignedStatement {
    /// The DSSE pre-authentication encoding of the statement.
    message: Vec<u8>,
    signatures: Vec<Vec<u8>>,
    /// Signed with a certificate rather than a key.
    keyless: bool,
}

/// What the bundle's signatures sign, when the bundle is a cosign signature of `digest`.
fn signed_statement(bundle: &[u8], digest: &str) -> Result<SignedStatement, String> {
    let hex = sha256_hex(digest).ok_or_else(|| format!("{digest:?} is not a sha256 digest"))?;
    let bundle: Bundle = serde_json::from_slice(bundle).map_err(|e| format!("not a Sigstore bundle: {e}"))?;
    if bundle.media_type != BUNDLE_MEDIA_TYPE
        && bundle.media_type != "application/vnd.dev.sigstore.bundle+json;version=0.3"
    {
        return Err(format!(
            "bundle media type {:?} is not {BUNDLE_MEDIA_TYPE}",
            bundle.media_type
        ));
    }
    let keyless = bundle
        .verification_material
        .as_ref()
        .is_some_and(|m| m.get("certificate").is_some() || m.get("x509CertificateChain").is_some());
    let envelope = bundle
        .dsse_envelope
        .ok_or("the bundle holds no DSSE envelope (a message signature is not a signature of a manifest)")?;
    if envelope.payload_type != IN_TOTO_PAYLOAD_TYPE {
        return Err(format!(
            "DSSE payload type {:?} is not {IN_TOTO_PAYLOAD_TYPE}",
            envelope.payload_type
        ));
    }
    let payload = decode_base64("the DSSE payload", &envelope.payload)?;
    let statement: Statement = serde_json::from_slice(&payload)
        .map_err(|e| format!("the DSSE payload is not an in-toto statement: {e}"))?;
    if !IN_TOTO_STATEMENT_TYPES.contains(&statement.kind.as_str()) {
        return Err(format!(
            "statement type {:?} is not an in-toto statement",
            statement.kind
        ));
    }
    if statement.predicate_type != COSIGN_SIGN_PREDICATE {
        return Err(format!(
            "predicate type {:?} is not cosign's signature ({COSIGN_SIGN_PREDICATE}): an attestation is not a signature",
            statement.predicate_type
        ));
    }
    if !statement
        .subject
        .iter()
        .any(|s| s.digest.get("sha256").is_some_and(|d| d == hex))
    {
        return Err(format!(
            "the signed statement is about another manifest than {digest}"
        ));
    }
    let signatures = envelope
        .signatures
        .iter()
        .map(|s| decode_base64("a DSSE signature", &s.sig))
        .collect::<Result<Vec<_>, _>>()?;
    if signatures.is_empty() {
        return Err("the DSSE envelope has no signature".into());
    }
    Ok(SignedStatement {
        message: pre_authentication_encoding(&envelope.payload_type, &payload),
        signatures,
        keyless,
    })
}

#[derive(Deserialize)]
struct SimpleSigning {
    critical: SimpleSigningCritical,
}

#[derive(Deserialize)]
struct SimpleSigningCritical {
    image: SimpleSigningImage,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct SimpleSigningImage {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// Checks a legacy signature: the simple-signing `payload` (the layer blob, byte for byte) and the base64
/// signature from the layer's annotation, as a signature of the manifest `digest`.
pub fn check_legacy(payload: &[u8], signature_base64: &str, digest: &str, keys: &[TrustedKey]) -> Finding {
    let checked = (|| {
        let document: SimpleSigning =
            serde_json::from_slice(payload).map_err(|e| format!("not a simple-signing document: {e}"))?;
        if document.critical.kind != SIMPLE_SIGNING_TYPE {
            return Err(format!(
                "simple-signing type {:?} is not {SIMPLE_SIGNING_TYPE:?}",
                document.critical.kind
            ));
        }
        if document.critical.image.docker_manifest_digest != digest {
            return Err(format!(
                "the signed document is about manifest {}, not {digest}",
                document.critical.image.docker_manifest_digest
            ));
        }
        decode_base64("the signature annotation", signature_base64)
    })();
    match checked {
        Err(message) => Finding::Invalid(message),
        Ok(signature) => match keys.iter().find(|key| key.signed(payload, &signature)) {
            Some(key) => Finding::Verified(Verified {
                signer: key.id.clone(),
                layout: SignatureLayout::Legacy,
            }),
            None => Finding::OtherSigner("a legacy signature by none of the trusted keys".into()),
        },
    }
}

/// Why a release is refused: what the findings of every signature found amount to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Verified(Verified),
    /// No signature document at all.
    Unsigned,
    /// Signatures, none by a trusted key.
    SignatureMismatch(String),
    /// Only malformed signatures, or ones about another manifest.
    InvalidSignature(String),
}

/// One verified signature is enough; otherwise a signature by another signer says more than a broken one,
/// and a broken one more than none.
pub fn verdict(findings: impl IntoIterator<Item = (String, Finding)>) -> Verdict {
    let (mut other, mut invalid) = (Vec::new(), Vec::new());
    for (place, finding) in findings {
        match finding {
            Finding::Verified(verified) => return Verdict::Verified(verified),
            Finding::OtherSigner(message) => other.push(format!("{place}: {message}")),
            Finding::Invalid(message) => invalid.push(format!("{place}: {message}")),
        }
    }
    if !other.is_empty() {
        other.extend(invalid);
        Verdict::SignatureMismatch(other.join("; "))
    } else if !invalid.is_empty() {
        Verdict::InvalidSignature(invalid.join("; "))
    } else {
        Verdict::Unsigned
    }
}

#[cfg(test)]
mod tests {
    use ring::{
        rand::SystemRandom,
        signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair},
    };

    use super::*;

    const DIGEST: &str = "sha256:0f2d1a7e3bd1bb4d6a3ba3b1b8e3b0c1d0a0e3f4f5a6b7c8d9e0f1a2b3c4d5e6";
    const OTHER: &str = "sha256:1f2d1a7e3bd1bb4d6a3ba3b1b8e3b0c1d0a0e3f4f5a6b7c8d9e0f1a2b3c4d5e6";

    /// A P-256 key as `cosign generate-key-pair` makes one: the signer and its `PUBLIC KEY` PEM.
    fn p256() -> (EcdsaKeyPair, TrustedKey) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        // SubjectPublicKeyInfo for id-ecPublicKey + prime256v1 around the uncompressed point.
        let mut spki = hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
        spki.extend_from_slice(pair.public_key().as_ref());
        let key = TrustedKey::from_pem("test", pem("PUBLIC KEY", &spki).as_bytes()).unwrap();
        (pair, key)
    }

    fn pem(label: &str, der: &[u8]) -> String {
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }

    fn sign(pair: &EcdsaKeyPair, message: &[u8]) -> String {
        let signature = pair.sign(&SystemRandom::new(), message).unwrap();
        base64::engine::general_purpose::STANDARD.encode(signature.as_ref())
    }

    fn statement(digest: &str, predicate: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"digest": {"sha256": digest.trim_start_matches("sha256:")}}],
            "predicateType": predicate,
            "predicate": {}
        }))
        .unwrap()
    }

    fn bundle_of(pair: &EcdsaKeyPair, payload: &[u8], payload_type: &str) -> Vec<u8> {
        let signature = sign(pair, &pre_authentication_encoding(payload_type, payload));
        serde_json::to_vec(&serde_json::json!({
            "mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": "ignored"}},
            "dsseEnvelope": {
                "payload": base64::engine::general_purpose::STANDARD.encode(payload),
                "payloadType": payload_type,
                "signatures": [{"sig": signature}]
            }
        }))
        .unwrap()
    }

    fn legacy_payload(digest: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "critical": {
                "identity": {"docker-reference": "127.0.0.1:5000/stacks"},
                "image": {"docker-manifest-digest": digest},
                "type": SIMPLE_SIGNING_TYPE
            },
            "optional": null
        }))
        .unwrap()
    }

    #[test]
    fn a_bundle_verifies_with_its_key_only() {
        let (pair, key) = p256();
        let (_, other_key) = p256();
        let bundle = bundle_of(
            &pair,
            &statement(DIGEST, COSIGN_SIGN_PREDICATE),
            IN_TOTO_PAYLOAD_TYPE,
        );
        assert_eq!(
            check_bundle(&bundle, DIGEST, &[other_key.clone(), key.clone()]),
            Finding::Verified(Verified {
                signer: key.id().to_owned(),
                layout: SignatureLayout::Bundle
            })
        );
        assert!(matches!(
            check_bundle(&bundle, DIGEST, &[other_key]),
            Finding::OtherSigner(_)
        ));
        assert!(key.id().starts_with("key:SHA256:") && !key.id().ends_with('='));
    }

    #[test]
    fn a_bundle_is_invalid_for_another_digest_type_or_predicate() {
        let (pair, key) = p256();
        let keys = [key];
        let invalid = |bundle: &[u8], digest: &str| match check_bundle(bundle, digest, &keys) {
            Finding::Invalid(message) => message,
            other => panic!("expected invalid, got {other:?}"),
        };
        let signed = bundle_of(
            &pair,
            &statement(DIGEST, COSIGN_SIGN_PREDICATE),
            IN_TOTO_PAYLOAD_TYPE,
        );
        assert!(invalid(&signed, OTHER).contains("another manifest"));
        let attestation = bundle_of(
            &pair,
            &statement(DIGEST, "https://slsa.dev/provenance/v1"),
            IN_TOTO_PAYLOAD_TYPE,
        );
        assert!(invalid(&attestation, DIGEST).contains("not a signature"));
        let wrong_type = bundle_of(&pair, &statement(DIGEST, COSIGN_SIGN_PREDICATE), "text/plain");
        assert!(invalid(&wrong_type, DIGEST).contains("payload type"));
        assert!(invalid(b"{", DIGEST).contains("not a Sigstore bundle"));
        let message_signature =
            br#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","messageSignature":{}}"#;
        assert!(invalid(message_signature, DIGEST).contains("no DSSE envelope"));
    }

    #[test]
    fn a_tampered_bundle_does_not_verify() {
        let (pair, key) = p256();
        let mut bundle: serde_json::Value = serde_json::from_slice(&bundle_of(
            &pair,
            &statement(DIGEST, COSIGN_SIGN_PREDICATE),
            IN_TOTO_PAYLOAD_TYPE,
        ))
        .unwrap();
        // The same statement with a space added: still about DIGEST, but not what was signed.
        let mut payload = statement(DIGEST, COSIGN_SIGN_PREDICATE);
        payload.push(b' ');
        bundle["dsseEnvelope"]["payload"] = base64::engine::general_purpose::STANDARD.encode(&payload).into();
        let bundle = serde_json::to_vec(&bundle).unwrap();
        assert!(matches!(
            check_bundle(&bundle, DIGEST, &[key]),
            Finding::OtherSigner(_)
        ));
    }

    #[test]
    fn a_keyless_bundle_is_not_trusted_by_key() {
        let (_, key) = p256();
        let (other, _) = p256();
        let mut bundle: serde_json::Value = serde_json::from_slice(&bundle_of(
            &other,
            &statement(DIGEST, COSIGN_SIGN_PREDICATE),
            IN_TOTO_PAYLOAD_TYPE,
        ))
        .unwrap();
        bundle["verificationMaterial"] = serde_json::json!({"certificate": {"rawBytes": "MAA="}});
        match check_bundle(&serde_json::to_vec(&bundle).unwrap(), DIGEST, &[key]) {
            Finding::OtherSigner(message) => assert!(message.contains("keyless"), "{message}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_legacy_signature_verifies_over_the_exact_bytes() {
        let (pair, key) = p256();
        let (_, other_key) = p256();
        let payload = legacy_payload(DIGEST);
        let signature = sign(&pair, &payload);
        assert_eq!(
            check_legacy(&payload, &signature, DIGEST, std::slice::from_ref(&key)),
            Finding::Verified(Verified {
                signer: key.id().to_owned(),
                layout: SignatureLayout::Legacy
            })
        );
        assert!(matches!(
            check_legacy(&payload, &signature, DIGEST, &[other_key]),
            Finding::OtherSigner(_)
        ));
        let mut reformatted = payload.clone();
        reformatted.push(b'\n');
        assert!(matches!(
            check_legacy(&reformatted, &signature, DIGEST, std::slice::from_ref(&key)),
            Finding::OtherSigner(_)
        ));
        match check_legacy(&payload, &signature, OTHER, std::slice::from_ref(&key)) {
            Finding::Invalid(message) => assert!(message.contains("not sha256:1f2d"), "{message}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            check_legacy(&payload, "%%%", DIGEST, &[key]),
            Finding::Invalid(_)
        ));
    }

    #[test]
    fn ed25519_keys_are_refused_with_the_reason() {
        let rng = SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let mut spki = hex::decode("302a300506032b6570032100").unwrap();
        spki.extend_from_slice(pair.public_key().as_ref());
        let error = TrustedKey::from_pem("ed", pem("PUBLIC KEY", &spki).as_bytes()).unwrap_err();
        assert!(error.to_string().contains("Ed25519ph"), "{error}");
    }

    #[test]
    fn key_files_that_are_not_public_keys_are_refused() {
        let refused = |text: &str| {
            TrustedKey::from_pem("k", text.as_bytes())
                .unwrap_err()
                .to_string()
        };
        assert!(refused("hello").contains("not a PEM file"));
        assert!(refused(&pem("ENCRYPTED SIGSTORE PRIVATE KEY", b"x")).contains("cosign public key"));
        assert!(refused(&pem("PUBLIC KEY", b"\x30\x03\x02\x01\x00")).contains("SubjectPublicKeyInfo"));
        // A compressed P-256 point (33 bytes): ring would refuse every signature.
        let mut compressed = hex::decode("3039301306072a8648ce3d020106082a8648ce3d030107032200").unwrap();
        compressed.push(2);
        compressed.extend_from_slice(&[7; 32]);
        assert!(refused(&pem("PUBLIC KEY", &compressed)).contains("not a usable key"));
        let missing = TrustedKey::from_file(Path::new("/nonexistent/cosign.pub")).unwrap_err();
        assert!(
            missing
                .to_string()
                .starts_with("verification key /nonexistent/cosign.pub")
        );
    }

    /// What cosign v3.1.3 itself wrote (crates/release/tests/fixtures/cosign, made by hack/cosign-fixtures.sh).
    fn fixture(name: &str) -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cosign")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn fixture_key(name: &str) -> TrustedKey {
        TrustedKey::from_pem(name, &fixture(name)).unwrap()
    }

    fn fixture_text(name: &str) -> String {
        String::from_utf8(fixture(name)).unwrap()
    }

    /// cosign's own signatures verify with the key that made them and no other, for every key type cosign
    /// makes that can be verified (P-256, P-384 with SHA-384, RSA), in both layouts.
    #[test]
    fn cosigns_signatures_verify_with_their_key_only() {
        let digest = fixture_text("subject-digest.txt");
        let other = fixture_key("key2.pub");
        for (key, bundle, legacy_signature) in [
            ("key1.pub", "bundle.json", "legacy-signature.txt"),
            ("p384.pub", "p384-bundle.json", "p384-legacy-signature.txt"),
            ("rsa.pub", "rsa-bundle.json", "rsa-legacy-signature.txt"),
        ] {
            let trusted = fixture_key(key);
            let expected = |layout| {
                Finding::Verified(Verified {
                    signer: trusted.id().to_owned(),
                    layout,
                })
            };
            let bundle = fixture(bundle);
            let signature = fixture_text(legacy_signature);
            let payload = fixture("legacy-payload.json");
            assert_eq!(
                check_bundle(&bundle, &digest, &[other.clone(), trusted.clone()]),
                expected(SignatureLayout::Bundle),
                "{key}"
            );
            assert_eq!(
                check_legacy(&payload, &signature, &digest, &[other.clone(), trusted.clone()]),
                expected(SignatureLayout::Legacy),
                "{key}"
            );
            assert!(matches!(
                check_bundle(&bundle, &digest, std::slice::from_ref(&other)),
                Finding::OtherSigner(_)
            ));
            assert!(matches!(
                check_legacy(&payload, &signature, &digest, std::slice::from_ref(&other)),
                Finding::OtherSigner(_)
            ));
        }
        assert!(TrustedKey::from_pem("ed25519.pub", &fixture("ed25519.pub")).is_err());
    }

    /// Any single byte of the signed material changed (every byte of the DSSE payload as decoded, every byte of
    /// the legacy payload, a bit of each signature) and cosign's signature no longer verifies.
    #[test]
    fn no_byte_of_cosigns_signatures_can_change() {
        let digest = fixture_text("subject-digest.txt");
        let key = [fixture_key("key1.pub")];

        let bundle: serde_json::Value = serde_json::from_slice(&fixture("bundle.json")).unwrap();
        let payload = base64::engine::general_purpose::STANDARD
            .decode(bundle["dsseEnvelope"]["payload"].as_str().unwrap())
            .unwrap();
        for index in 0..payload.len() {
            let mut changed = payload.clone();
            changed[index] ^= 0x01;
            let mut tampered = bundle.clone();
            tampered["dsseEnvelope"]["payload"] =
                base64::engine::general_purpose::STANDARD.encode(&changed).into();
            let finding = check_bundle(&serde_json::to_vec(&tampered).unwrap(), &digest, &key);
            assert!(!matches!(finding, Finding::Verified(_)), "payload byte {index}");
        }
        let signature = base64::engine::general_purpose::STANDARD
            .decode(bundle["dsseEnvelope"]["signatures"][0]["sig"].as_str().unwrap())
            .unwrap();
        for index in 0..signature.len() {
            let mut changed = signature.clone();
            changed[index] ^= 0x01;
            let mut tampered = bundle.clone();
            tampered["dsseEnvelope"]["signatures"][0]["sig"] =
                base64::engine::general_purpose::STANDARD.encode(&changed).into();
            let finding = check_bundle(&serde_json::to_vec(&tampered).unwrap(), &digest, &key);
            assert!(!matches!(finding, Finding::Verified(_)), "signature byte {index}");
        }

        let payload = fixture("legacy-payload.json");
        let signature = fixture_text("legacy-signature.txt");
        let signature_bytes = base64::engine::general_purpose::STANDARD
            .decode(&signature)
            .unwrap();
        for index in 0..signature_bytes.len() {
            let mut changed = signature_bytes.clone();
            changed[index] ^= 0x01;
            let changed = base64::engine::general_purpose::STANDARD.encode(&changed);
            assert!(
                !matches!(
                    check_legacy(&payload, &changed, &digest, &key),
                    Finding::Verified(_)
                ),
                "legacy signature byte {index}"
            );
        }
        for index in 0..payload.len() {
            let mut changed = payload.clone();
            changed[index] ^= 0x01;
            assert!(
                !matches!(
                    check_legacy(&changed, &signature, &digest, &key),
                    Finding::Verified(_)
                ),
                "legacy payload byte {index}"
            );
        }
    }

    #[test]
    fn the_verdict_weighs_what_was_found() {
        let verified = Finding::Verified(Verified {
            signer: "key:SHA256:x".into(),
            layout: SignatureLayout::Legacy,
        });
        let other = || ("tag a".to_owned(), Finding::OtherSigner("by k2".into()));
        let invalid = || ("tag b".to_owned(), Finding::Invalid("broken".into()));
        assert_eq!(verdict([]), Verdict::Unsigned);
        assert_eq!(
            verdict([invalid()]),
            Verdict::InvalidSignature("tag b: broken".into())
        );
        assert_eq!(
            verdict([invalid(), other()]),
            Verdict::SignatureMismatch("tag a: by k2; tag b: broken".into())
        );
        assert!(matches!(
            verdict([other(), ("c".into(), verified), invalid()]),
            Verdict::Verified(_)
        ));
    }
}
