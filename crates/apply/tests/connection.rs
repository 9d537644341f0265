//! The operator's clients multiplex over HTTP/2: against a real kube-apiserver, a client with several open
//! watches and many requests in flight holds one connection, where kube's default client (HTTP/1.1) holds a
//! connection per watch. Counted from this process's own sockets (`/proc/self/fd` → `/proc/net/tcp`); this
//! file has one test so that no other test's connections are counted.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{collections::HashSet, time::Duration};

use cso_apply::{ClientLimits, limited_client};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_carries_every_watch_and_request_of_a_client() {
    let control_plane = cso_testenv::shared_management();
    let port: u16 = control_plane
        .server_url()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let setup = control_plane.client().await.unwrap();
    let namespace = cso_testenv::namespace(&setup, "h2").await.unwrap();
    let config = || async {
        cso_testenv::config_from_yaml(control_plane.kubeconfig_yaml())
            .await
            .unwrap()
    };
    let before = connections_to(port);

    // The operator's client: one connection for six watches and twenty requests at once.
    let ours = limited_client(config().await, ClientLimits::UNLIMITED).unwrap();
    let with_ours = connections_while_busy(ours, &namespace, port, 6, 20).await;
    assert_eq!(with_ours - before, 1, "connections of the operator's client");

    // kube's default client, for comparison: a connection per open watch at least.
    let default = Client::try_from(config().await).unwrap();
    let with_default = connections_while_busy(default, &namespace, port, 6, 20).await;
    assert!(
        with_default >= before + 6,
        "kube's default client was expected to hold a connection per watch: {with_default} (before: {before})"
    );
}
