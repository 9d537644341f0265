//! The operator's clients multiplex over HTTP/2: against a real kube-apiserver, a client with several open
//! watches and many requests in flight holds one connection, where kube's default client (HTTP/1.1) holds a
//! connection per watch; a client whose watches ride its connection keeps it through quiet spells, one
//! without watches lets it go. Counted from this process's own sockets (`/proc/self/fd` → `/proc/net/tcp`),
//! each test's to a loopback proxy of its own in front of the API server, so that no other test's
//! connections are counted.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{collections::HashSet, time::Duration};

use cso_apply::{ClientLimits, Connections, IdleConnection, limited_client};
use cso_testenv::proxy::ApiProxy;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client, runtime::watcher};

/// Established TCP connections of this process to `port` on 127.0.0.1.
fn connections_to(port: u16) -> usize {
    let own: HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let remote = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // remote address, state 01 (ESTABLISHED), inode
            fields.len() > 9 && fields[2] == remote && fields[3] == "01" && own.contains(fields[9])
        })
        .count()
}

/// Opens `watches` watches of ConfigMaps in `namespace` and sends `requests` GETs at once, with `client`;
/// returns the connections to `port` while all of it is open.
async fn connections_while_busy(
    client: Client,
    namespace: &str,
    port: u16,
    watches: usize,
    requests: usize,
) -> usize {
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let mut open = Vec::new();
    for i in 0..watches {
        let stream = watcher(
            api.clone(),
            watcher::Config::default().labels(&format!("watch={i}")),
        );
        open.push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while stream.next().await.is_some() {}
        }));
    }
    // Let every watch list and settle on its open watch request.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let params = kube::api::ListParams::default();
    let gets = futures::future::join_all((0..requests).map(|_| api.list(&params))).await;
    assert!(gets.iter().all(Result::is_ok));
    let count = connections_to(port);
    for task in open {
        task.abort();
    }
    count
}

/// A proxy of its own in front of the shared management API server, its port, and a config for it.
async fn behind_a_proxy() -> (ApiProxy, u16, kube::Config) {
    let control_plane = cso_testenv::shared_management();
    let proxy = ApiProxy::start(control_plane.server_url()).await.unwrap();
    let port: u16 = proxy.url().rsplit(':').next().unwrap().parse().unwrap();
    let yaml = control_plane
        .kubeconfig_yaml()
        .replace(control_plane.server_url(), &proxy.url());
    let config = cso_testenv::config_from_yaml(&yaml).await.unwrap();
    (proxy, port, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_carries_every_watch_and_request_of_a_client() {
    let setup = cso_testenv::shared_management().client().await.unwrap();
    let namespace = cso_testenv::namespace(&setup, "h2").await.unwrap();
    let (_proxy, port, config) = behind_a_proxy().await;
    let before = connections_to(port);

    // The operator's client: one connection for six watches and twenty requests at once.
    let ours = limited_client(config.clone(), ClientLimits::UNLIMITED, IdleConnection::Kept).unwrap();
    let with_ours = connections_while_busy(ours, &namespace, port, 6, 20).await;
    assert_eq!(with_ours - before, 1, "connections of the operator's client");

    // kube's default client, for comparison: a connection per open watch at least.
    let default = Client::try_from(config).unwrap();
    let with_default = connections_while_busy(default, &namespace, port, 6, 20).await;
    assert!(
        with_default >= before + 6,
        "kube's default client was expected to hold a connection per watch: {with_default} (before: {before})"
    );
}

/// Opens a watch of ConfigMaps in `namespace` with `client` and lets it settle on its watch request.
async fn open_watch(client: Client, namespace: &str) -> tokio::task::JoinHandle<()> {
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let stream = watcher(api, watcher::Config::default());
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    task
}

/// A GET of the ConfigMaps in `namespace` with `client`.
async fn request(client: &Client, namespace: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    api.list(&kube::api::ListParams::default()).await.unwrap();
}

/// Applies ConfigMap `name` with `size` bytes of data, and checks that the server got all of it.
async fn apply_config_map(client: &Client, namespace: &str, name: &str, size: usize) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let data = "x".repeat(size);
    let object = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"payload": data},
    });
    let params = kube::api::PatchParams::apply("connection-test");
    let applied = api
        .patch(name, &params, &kube::api::Patch::Apply(&object))
        .await
        .unwrap();
    assert_eq!(applied.data.unwrap()["payload"].len(), size);
}

/// A client of `idle` behind a proxy of its own, with a watch open, that sends a request after a quiet spell
/// of three times `quiet`; the connections it then has open.
struct AfterAQuietSpell {
    _proxy: ApiProxy,
    port: u16,
    client: Client,
    watch: tokio::task::JoinHandle<()>,
    connections: usize,
}

async fn a_request_after_a_quiet_spell_beside_a_watch(
    idle: IdleConnection,
    namespace: &str,
    quiet: Duration,
) -> AfterAQuietSpell {
    let (proxy, port, config) = behind_a_proxy().await;
    let client = limited_client(config, ClientLimits::UNLIMITED, idle).unwrap();
    let watch = open_watch(client.clone(), namespace).await;
    tokio::time::sleep(3 * quiet).await;
    request(&client, namespace).await;
    AfterAQuietSpell {
        _proxy: proxy,
        port,
        client,
        watch,
        connections: connections_to(port),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_kept_under_watches_and_let_go_without_them() {
    let setup = cso_testenv::shared_management().client().await.unwrap();
    let namespace = cso_testenv::namespace(&setup, "idle").await.unwrap();
    let quiet = Duration::from_secs(1);

    // Kept: a request after a quiet spell goes over the connection the watch is on.
    let kept = a_request_after_a_quiet_spell_beside_a_watch(IdleConnection::Kept, &namespace, quiet).await;
    assert_eq!(kept.connections, 1, "a kept connection, with a watch on it");
    kept.watch.abort();

    // Released after a quiet spell: the pool lets go of the connection the watch still holds open, and the
    // next request opens a second (what Kept is for).
    let released =
        a_request_after_a_quiet_spell_beside_a_watch(IdleConnection::ReleasedAfter(quiet), &namespace, quiet)
            .await;
    assert_eq!(
        released.connections, 2,
        "a released connection that a watch still holds, and the request's new one"
    );
    // Without the watch, nothing holds either once they are quiet: the client keeps no connection.
    released.watch.abort();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while connections_to(released.port) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} connections left open by an idle client that lets them go",
            connections_to(released.port)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And the next request opens one again.
    request(&released.client, &namespace).await;
    assert_eq!(connections_to(released.port), 1);
}

/// A workload cluster's drift watches ride a direct client: its requests share one lean HTTP/2 connection,
/// which carries the requests of the kube clients made on demand too, and their applies whose bodies the
/// server's windows take (a larger one goes through hyper's pool, released when idle); a watch on it stays open
/// and streams after every kube client is gone; its answers and errors read as kube's client reads them; and
/// the connection closes once the direct client and its watch are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_client_keeps_its_watch_on_a_lean_connection_of_its_own() {
    use cso_apply::{ClusterDiscovery, rate_limit::ClientMaker};
    use http_body_util::BodyExt;

    let setup = cso_testenv::shared_management().client().await.unwrap();
    let namespace = cso_testenv::namespace(&setup, "direct").await.unwrap();
    let (_proxy, port, config) = behind_a_proxy().await;
    let limits = ClientLimits { qps: 50.0, burst: 10 };
    let dropped_after = Duration::from_millis(500);
    let maker = ClientMaker::new(
        config,
        limits,
        None,
        IdleConnection::ReleasedAfter(dropped_after),
        Connections::Lean,
    )
    .unwrap();
    let discovery = ClusterDiscovery::on_demand(maker, dropped_after);
    let direct = discovery.direct_client();

    // Answers and errors as kube's client has them.
    let version = direct.apiserver_version().await.unwrap();
    assert!(!version.git_version.is_empty(), "{version:?}");
    let missing = http::Request::get(format!("/api/v1/namespaces/{namespace}/configmaps/none"))
        .body(Vec::new())
        .unwrap();
    match direct.request::<ConfigMap>(missing).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 404, "{status:?}"),
        other => panic!("a missing object was expected to be a 404 Api error: {other:?}"),
    }

    // A watch through the direct client beside them, on their connection; a kube client's request on one of
    // its own.
    let watch = http::Request::get(format!(
        "/api/v1/namespaces/{namespace}/configmaps?watch=true&timeoutSeconds=60"
    ))
    .body(kube::client::Body::from(Vec::new()))
    .unwrap();
    let response = direct.send(watch).await.unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let mut body = response.into_body();
    assert_eq!(
        connections_to(port),
        1,
        "the direct client's requests and its watch"
    );
    request(&discovery.client(), &namespace).await;
    assert_eq!(
        connections_to(port),
        1,
        "a kube client's request rides the watch's connection"
    );
    // An apply whose body the server's windows take rides it too; one larger than a new stream's window (the
    // API server grants 256 KiB) goes through hyper's pool, released when idle.
    apply_config_map(&discovery.client(), &namespace, "small", 100 << 10).await;
    assert_eq!(
        connections_to(port),
        1,
        "an apply of 100 KiB on the lean connection"
    );
    apply_config_map(&discovery.client(), &namespace, "large", 600 << 10).await;
    assert_eq!(
        connections_to(port),
        2,
        "an apply of 600 KiB through hyper's pool, beside the lean connection"
    );

    // Every kube client dropped (none asked for since) and their connection released: the watch still
    // streams over its own.
    tokio::time::sleep(4 * dropped_after).await;
    assert_eq!(
        connections_to(port),
        1,
        "the kube clients' connection, released when idle"
    );
    let made = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("seen".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(setup, &namespace)
        .create(&Default::default(), &made)
        .await
        .unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("\"seen\"") {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("the watch went quiet")
            .expect("the watch ended")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen.extend_from_slice(&data);
        }
    }
    assert!(String::from_utf8_lossy(&seen).contains("\"ADDED\""));
    assert_eq!(
        connections_to(port),
        1,
        "the watch's connection, kept without a kube client"
    );

    // The watch and the direct client dropped: their connection closes.
    drop((body, direct, discovery));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while connections_to(port) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the lean connection outlived its last handle"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server that does not speak HTTP/2 (plain HTTP/1.1 here) is asked through hyper's client: a direct client's
/// requests are answered as by any other server, over HTTP/1.1, and nothing of HTTP/2 is sent to it.
#[tokio::test]
async fn a_direct_client_asks_a_server_without_http2_over_http1() {
    use cso_apply::rate_limit::ClientMaker;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (heard_tx, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let heard_tx = heard_tx.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buffer = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buffer[..n]),
                    }
                }
                let _ = heard_tx.send(String::from_utf8_lossy(&seen).into_owned());
                let body = r#"{"major":"1","minor":"35","gitVersion":"v1.35.4","gitCommit":"c","gitTreeState":"clean","buildDate":"2026-01-01T00:00:00Z","goVersion":"go1.25","compiler":"gc","platform":"linux/amd64"}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });

    let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
    let idle = IdleConnection::ReleasedAfter(Duration::from_secs(1));
    let maker = ClientMaker::new(config, ClientLimits::UNLIMITED, None, idle, Connections::Lean).unwrap();
    let direct = maker.direct();
    for _ in 0..2 {
        let version = direct.apiserver_version().await.unwrap();
        assert_eq!(version.git_version, "v1.35.4");
        let request = heard.recv().await.unwrap();
        assert!(request.starts_with("GET /version HTTP/1.1\r\n"), "{request}");
    }
}
