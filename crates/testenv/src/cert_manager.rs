//! A stand-in for cert-manager, for the chart tests: cert-manager's controller and cainjector are not on the Go
//! module proxy as buildable modules (only the library module is), so they cannot run here. This does, once when
//! called, the part of their contract the Go operator's chart relies on, and nothing more:
//! - a `Certificate` whose `issuerRef` names an `Issuer` with `spec.selfSigned` gets its Secret `spec.secretName`
//!   (type `kubernetes.io/tls`: `tls.crt`, `tls.key`, and `ca.crt`, which for a self-signed issuer is the
//!   certificate itself), for the Certificate's `dnsNames`, annotated as cert-manager annotates it; an existing
//!   Secret is left alone, as cert-manager leaves a valid one;
//! - a `ValidatingWebhookConfiguration` annotated `cert-manager.io/inject-ca-from: NAMESPACE/CERTIFICATE` gets that
//!   Certificate's `ca.crt` as the `caBundle` of every webhook (cainjector).

use k8s_openapi::{
    ByteString,
    api::{admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Secret},
};
use kube::{
    Api, Client,
    api::{DynamicObject, ObjectMeta, Patch, PatchParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use rcgen::{CertificateParams, KeyPair};

use crate::Error;

const INJECT_ANNOTATION: &str = "cert-manager.io/inject-ca-from";

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cert-manager.io", "v1", kind))
}

fn kube_error(what: &str) -> impl Fn(kube::Error) -> Error + '_ {
    move |e| Error::Kube(format!("cert-manager stand-in: {what}: {e}"))
}

/// Issues the Secret of every Certificate of `namespace` that a self-signed Issuer signs and that has none yet.
/// Returns the names of the Secrets it created.
pub async fn issue_self_signed(client: &Client, namespace: &str) -> Result<Vec<String>, Error> {
    let certificates: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &resource("Certificate"));
    let issuers: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource("Issuer"));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut issued = Vec::new();
    for certificate in certificates
        .list(&Default::default())
        .await
        .map_err(kube_error("list Certificates"))?
    {
        let spec = &certificate.data["spec"];
        let (Some(secret_name), Some(issuer_name)) =
            (spec["secretName"].as_str(), spec["issuerRef"]["name"].as_str())
        else {
            continue;
        };
        if spec["issuerRef"]["kind"].as_str().unwrap_or("Issuer") != "Issuer" {
            continue;
        }
        let Some(issuer) = issuers
            .get_opt(issuer_name)
            .await
            .map_err(kube_error("read Issuer"))?
        else {
            continue;
        };
        if issuer.data["spec"]["selfSigned"].is_null()
            || secrets
                .get_opt(secret_name)
                .await
                .map_err(kube_error("read Secret"))?
                .is_some()
        {
            continue;
        }
        let dns_names: Vec<String> = spec["dnsNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|name| name.as_str().map(str::to_owned))
            .collect();
        let (certificate_pem, key_pem) = self_signed(&dns_names)?;
        let certificate_name = certificate.metadata.name.clone().unwrap_or_default();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name.to_owned()),
                annotations: Some(
                    [
                        ("cert-manager.io/certificate-name", certificate_name.as_str()),
                        ("cert-manager.io/issuer-name", issuer_name),
                        ("cert-manager.io/issuer-kind", "Issuer"),
                        ("cert-manager.io/issuer-group", "cert-manager.io"),
                        ("cert-manager.io/alt-names", &dns_names.join(",")),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                ),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(
                [
                    ("tls.crt", certificate_pem.clone()),
                    ("tls.key", key_pem),
                    ("ca.crt", certificate_pem),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
                .collect(),
            ),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .map_err(kube_error("create Secret"))?;
        issued.push(secret_name.to_owned());
    }
    Ok(issued)
}

/// cainjector's part: every ValidatingWebhookConfiguration annotated `cert-manager.io/inject-ca-from` gets the
/// `ca.crt` of that Certificate's Secret as the `caBundle` of each webhook. Returns the configurations patched.
pub async fn inject_ca(client: &Client) -> Result<Vec<String>, Error> {
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mut injected = Vec::new();
    for configuration in configurations
        .list(&Default::default())
        .await
        .map_err(kube_error("list ValidatingWebhookConfigurations"))?
    {
        let Some((namespace, certificate_name)) = configuration
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(INJECT_ANNOTATION))
            .and_then(|from| from.split_once('/'))
        else {
            continue;
        };
        let certificates: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &resource("Certificate"));
        let Some(certificate) = certificates
            .get_opt(certificate_name)
            .await
            .map_err(kube_error("read Certificate"))?
        else {
            continue;
        };
        let Some(secret_name) = certificate.data["spec"]["secretName"].as_str() else {
            continue;
        };
        let Some(ca) = Api::<Secret>::namespaced(client.clone(), namespace)
            .get_opt(secret_name)
            .await
            .map_err(kube_error("read Secret"))?
            .and_then(|s| s.data)
            .and_then(|mut data| data.remove("ca.crt"))
        else {
            continue;
        };
        let name = configuration.metadata.name.clone().unwrap_or_default();
        let webhooks: Vec<serde_json::Value> = configuration
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| serde_json::json!({"name": w.name, "clientConfig": {"caBundle": ca}}))
            .collect();
        configurations
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Strategic(serde_json::json!({ "webhooks": webhooks })),
            )
            .await
            .map_err(kube_error("inject caBundle"))?;
        injected.push(name);
    }
    Ok(injected)
}

/// A self-signed serving certificate for `dns_names` (the first is the common name) and its key, in PEM.
fn self_signed(dns_names: &[String]) -> Result<(String, String), Error> {
    let pki_err = |e: rcgen::Error| Error::Pki(e.to_string());
    let key = KeyPair::generate().map_err(pki_err)?;
    let mut params = CertificateParams::new(dns_names.to_vec()).map_err(pki_err)?;
    if let Some(first) = dns_names.first() {
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, first.as_str());
    }
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let certificate = params.self_signed(&key).map_err(pki_err)?;
    Ok((certificate.pem(), key.serialize_pem()))
}
