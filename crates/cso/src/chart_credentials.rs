//! `--chart-mirror-credentials=NAMESPACE/NAME`: the basic credentials of private chart mirrors and
//! repositories, from a Secret of type `kubernetes.io/dockerconfigjson` (its `auths`, by host: for `oci://`
//! registries and HTTP(S) chart repositories alike), handed to the release cache's dependency resolver.
//!
//! The Secret is read once before the controllers start, so the first releases fetched already use it, and
//! then followed with a watch on that one Secret: a rotated password or a Secret created after the start
//! applies to the next fetch, without a restart. A missing or unusable Secret is logged (never its content)
//! and the dependencies are fetched without its credentials meanwhile; a deleted Secret takes its
//! credentials with it. Credentials never reach logs, events or conditions: only the hosts are logged.

use cso_release::{DependencyResolver, deps::ChartCredentials};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};

const SECRET_TYPE: &str = "kubernetes.io/dockerconfigjson";
const KEY: &str = ".dockerconfigjson";

/// `NAMESPACE/NAME`.
pub fn parse_reference(text: &str) -> Result<(String, String), String> {
    match text.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((namespace.to_owned(), name.to_owned()))
        }
        _ => Err(format!(
            "--chart-mirror-credentials {text:?}: expected NAMESPACE/NAME of a {SECRET_TYPE} Secret"
        )),
    }
}

/// The credentials in `secret`: of type `kubernetes.io/dockerconfigjson`, its `.dockerconfigjson`.
pub fn credentials_of(secret: &Secret) -> Result<ChartCredentials, String> {
    let kind = secret.type_.as_deref().unwrap_or_default();
    if kind != SECRET_TYPE {
        return Err(format!("its type is {kind:?}, not {SECRET_TYPE}"));
    }
    let data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KEY))
        .ok_or_else(|| format!("it has no {KEY}"))?;
    ChartCredentials::from_docker_config(&data.0)
}

/// Reads the Secret `reference` into `resolver` now, then follows it in the background.
pub async fn follow(client: Client, reference: &str, resolver: DependencyResolver) -> anyhow::Result<()> {
    let (namespace, name) = parse_reference(reference).map_err(anyhow::Error::msg)?;
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let shown = format!("{namespace}/{name}");
    match api.get_opt(&name).await {
        Ok(Some(secret)) => take(&secret, &resolver, &shown),
        Ok(None) => tracing::warn!(
            secret = %shown,
            "the chart mirror credentials Secret does not exist (yet): dependencies are fetched without it"
        ),
        Err(error) => tracing::warn!(
            secret = %shown,
            %error,
            "the chart mirror credentials Secret cannot be read; watching it"
        ),
    }
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret)) => {
                    take(&secret, &resolver, &shown)
                }
                Ok(watcher::Event::Delete(_)) => {
                    resolver.set_credentials(ChartCredentials::default());
                    tracing::warn!(secret = %shown, "the chart mirror credentials Secret was deleted");
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                Err(error) => {
                    tracing::debug!(secret = %shown, %error, "chart mirror credentials watch interrupted")
                }
            }
        }
    });
    Ok(())
}

fn take(secret: &Secret, resolver: &DependencyResolver, shown: &str) {
    match credentials_of(secret) {
        Ok(credentials) => {
            tracing::info!(secret = %shown, hosts = ?credentials.hosts(), "chart mirror credentials read");
            resolver.set_credentials(credentials);
        }
        Err(error) => {
            resolver.set_credentials(ChartCredentials::default());
            tracing::warn!(secret = %shown, %error, "the chart mirror credentials Secret is not usable");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test: a failed unwrap is a failed test")]

    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn a_dockerconfigjson_secret_by_reference() {
        assert_eq!(
            parse_reference("cso-system/mirror").unwrap(),
            ("cso-system".into(), "mirror".into())
        );
        for bad in ["mirror", "/mirror", "ns/", "a/b/c"] {
            assert!(parse_reference(bad).is_err(), "{bad}");
        }
        let secret = |kind: &str, data: &str| Secret {
            type_: Some(kind.into()),
            data: Some([(KEY.to_owned(), ByteString(data.as_bytes().to_vec()))].into()),
            ..Default::default()
        };
        let config = r#"{"auths": {"https://charts.example": {"username": "u", "password": "pw"}}}"#;
        let credentials = credentials_of(&secret(SECRET_TYPE, config)).unwrap();
        assert_eq!(credentials.for_host("charts.example"), Some(("u", "pw")));
        let wrong_type = credentials_of(&secret("Opaque", config)).unwrap_err();
        assert!(
            wrong_type.contains("Opaque") && !wrong_type.contains("pw"),
            "{wrong_type}"
        );
        let broken = credentials_of(&secret(SECRET_TYPE, "{\"auths\": pw")).unwrap_err();
        assert!(!broken.contains("pw"), "{broken}");
    }
}
