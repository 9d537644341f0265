//! The outage proxy (`cso_testenv::proxy`) in front of a real API server: requests pass while it forwards; a
//! cut refuses them; a silence holds them (a request sent in it is answered once it is restored).
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client, Config, config::Kubeconfig};

async fn client_through(proxy: &cso_testenv::proxy::ApiProxy) -> Client {
    let plane = cso_testenv::shared_management();
    let yaml = plane.kubeconfig_yaml().replace(plane.server_url(), &proxy.url());
    let kubeconfig = Kubeconfig::from_yaml(&yaml).unwrap();
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.read_timeout = Some(Duration::from_secs(3));
    Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_pass_are_refused_in_a_cut_and_held_in_a_silence() {
    let plane = cso_testenv::shared_management();
    let mut proxy = cso_testenv::proxy::ApiProxy::start(plane.server_url())
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(client_through(&proxy).await);
    namespaces.get("default").await.unwrap();

    proxy.cut();
    assert!(namespaces.get("default").await.is_err(), "refused in a cut");
    proxy.restore().await.unwrap();
    namespaces.get("default").await.unwrap();

    proxy.silence();
    assert!(
        namespaces.get("default").await.is_err(),
        "no answer in a silence (read timeout)"
    );
    let held = tokio::spawn({
        let namespaces = namespaces.clone();
        async move { namespaces.get("default").await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.restore().await.unwrap();
    held.await.unwrap().unwrap();
}

/// A watch open through the proxy hears nothing of a change made the moment a cut returns: the cut is over
/// before it returns, not when its connections' tasks next pause (in CI a deletion made behind a cut once
/// reached the operator's watch that way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_hears_nothing_made_behind_a_cut() {
    use futures::StreamExt as _;
    use kube::runtime::watcher;

    let plane = cso_testenv::shared_management();
    let direct = plane.client().await.unwrap();
    for round in 0..20 {
        let mut proxy = cso_testenv::proxy::ApiProxy::start(plane.server_url())
            .await
            .unwrap();
        let name = format!("behind-the-cut-{round}");
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let through: Api<Namespace> = Api::all(client_through(&proxy).await);
        let mut events = watcher(through, config).boxed();
        // Listed (nothing there) and watching.
        while !matches!(events.next().await, Some(Ok(watcher::Event::InitDone))) {}
        proxy.cut();
        let namespaces: Api<Namespace> = Api::all(direct.clone());
        let namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
        namespaces.create(&Default::default(), &namespace).await.unwrap();
        let heard = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                match events.next().await {
                    Some(Ok(watcher::Event::Apply(_) | watcher::Event::InitApply(_))) => return true,
                    Some(_) => {}
                    None => return false,
                }
            }
        })
        .await
        .unwrap_or(false);
        assert!(!heard, "round {round}: the creation behind the cut was heard");
        namespaces.delete(&name, &Default::default()).await.unwrap();
    }
}
