//! Cluster DNS for the real nodes: CoreDNS (built by `make tools` from the wrapper module `hack/testenv/coredns`,
//! only a cluster DNS's plugins) as a Deployment in `kube-system` behind the Service `kube-dns` at
//! [`crate::node::CLUSTER_DNS`], the address every kubelet gives its pods, as kubeadm and kind set it up.
//!
//! It answers for `cluster.local` and the reverse zones from the API (Services, their endpoints, pods), and for
//! the nodes' names as `<node>.cluster.local`, which a pod's search path finds for a bare node name (a kind node's
//! name resolves through Docker's DNS; metrics-server dials kubelets by `Hostname`). It refuses every other name:
//! nothing is forwarded, so no query leaves the machine. It listens on an unprivileged
//! port in its pod (the image runs as 65532 without capabilities); the Service maps port 53 to it.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::Error;

/// The namespace and name of the Deployment and its Service.
const NAMESPACE: &str = "kube-system";
const NAME: &str = "coredns";
/// The port CoreDNS listens on in its pod.
const DNS_PORT: u16 = 1053;
/// How long the Deployment may take to become available.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The Corefile: the cluster's zones from the API, and the names of `hosts` (the nodes) as `<name>.cluster.local`,
/// which a pod's search path finds for the bare name; nothing else.
fn corefile(hosts: &[(String, IpAddr)]) -> String {
    let entries: String = hosts
        .iter()
        .map(|(name, address)| format!("        {address} {name}.cluster.local\n"))
        .collect();
    format!(
        "cluster.local:{DNS_PORT} in-addr.arpa:{DNS_PORT} ip6.arpa:{DNS_PORT} {{\n    errors\n    health :8080\n    \
         ready :8181\n    hosts {{\n{entries}        no_reverse\n        fallthrough\n    }}\n    \
         kubernetes cluster.local in-addr.arpa ip6.arpa {{\n        pods insecure\n    }}\n    \
         cache 30\n    loop\n    reload\n    loadbalance\n}}\n"
    )
}

/// The objects of cluster DNS running `image` (a name the nodes' containerd has), answering for `hosts`.
fn objects(image: &str, hosts: &[(String, IpAddr)]) -> Vec<Value> {
    let labels = json!({"k8s-app": "kube-dns"});
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": NAME, "namespace": NAMESPACE}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "system:coredns"},
        "rules": [
            {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
             "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "system:coredns"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
               "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": NAME, "namespace": NAMESPACE},
               "data": {"Corefile": corefile(hosts)}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    // Its own resolver is not itself.
                    "dnsPolicy": "Default",
                    "containers": [{
                        "name": "coredns",
                        "image": image,
                        "imagePullPolicy": "Never",
                        "args": ["-conf", "/etc/coredns/Corefile"],
                        "ports": [
                            {"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"},
                            {"name": "dns-tcp", "containerPort": DNS_PORT, "protocol": "TCP"},
                        ],
                        "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181},
                                           "periodSeconds": 1},
                        "resources": {"limits": {"memory": "170Mi"},
                                      "requests": {"cpu": "10m", "memory": "32Mi"}},
                        "securityContext": {
                            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": true}],
                    }],
                    "volumes": [{"name": "config", "configMap": {"name": NAME}}],
                },
            },
        }}),
        json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "clusterIP": crate::node::CLUSTER_DNS,
            "selector": labels,
            "ports": [
                {"name": "dns", "port": 53, "targetPort": DNS_PORT, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "targetPort": DNS_PORT, "protocol": "TCP"},
            ],
        }}),
    ]
}

/// Deploys cluster DNS running `image`, answering for the nodes `hosts` too, and returns once it is available
/// (its readiness probe passed: the API's objects are loaded).
pub async fn deploy(client: &Client, image: &str, hosts: &[(String, IpAddr)]) -> Result<(), Error> {
    deploy_without_waiting(client, image, hosts).await?;
    wait_available(client).await
}

/// Deploys cluster DNS as [`deploy`] does, without waiting for it: for nodes without a pod network yet (a
/// cluster whose CNI is an addon still to come), where DNS starts with the network.
pub async fn deploy_without_waiting(
    client: &Client,
    image: &str,
    hosts: &[(String, IpAddr)],
) -> Result<(), Error> {
    for object in objects(image, hosts) {
        crate::apply_object(client, &object, "cso-testenv").await?;
    }
    Ok(())
}

/// Returns once cluster DNS is available, or an error after [`READY_TIMEOUT`].
pub async fn wait_available(client: &Client) -> Result<(), Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let deployment = deployments
            .get(NAME)
            .await
            .map_err(|e| Error::Kube(e.to_string()))?;
        let available = deployment
            .status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0);
        if available >= 1 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Process(format!(
                "cluster DNS not available after {READY_TIMEOUT:?}: {:?}",
                deployment.status
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test: a failed unwrap is a failed test")]
    use super::*;

    #[test]
    fn only_the_cluster_zones_with_the_nodes_in_them_are_served_and_nothing_is_forwarded() {
        let hosts = [
            ("w-node-0".to_owned(), "172.18.4.2".parse().unwrap()),
            ("w-node-1".to_owned(), "172.18.4.3".parse().unwrap()),
        ];
        let corefile = corefile(&hosts);
        assert!(corefile.starts_with("cluster.local:1053 in-addr.arpa:1053 ip6.arpa:1053 {"));
        assert!(!corefile.contains("forward"), "{corefile}");
        assert!(!corefile.contains(".:"), "a catch-all zone: {corefile}");
        // The nodes' names inside the cluster's zone, before the API's names (which get the rest).
        let hosts_at = corefile
            .find("        172.18.4.2 w-node-0.cluster.local\n        172.18.4.3 w-node-1.cluster.local\n");
        assert!(
            hosts_at.is_some_and(|at| at < corefile.find("kubernetes cluster.local").unwrap()),
            "{corefile}"
        );
    }

    #[test]
    fn the_service_is_at_the_address_the_kubelets_give_pods_and_maps_53_to_the_pods_port() {
        let service = objects("cso.test/coredns:v1", &[])
            .into_iter()
            .find(|o| o["kind"] == "Service")
            .unwrap();
        assert_eq!(service["spec"]["clusterIP"], crate::node::CLUSTER_DNS);
        assert_eq!(service["spec"]["ports"][0]["port"], 53);
        assert_eq!(service["spec"]["ports"][0]["targetPort"], DNS_PORT);
    }
}
