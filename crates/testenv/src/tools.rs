//! Where the external tools are: kube-apiserver, etcd, helm, the Cluster API and cert-manager CRDs, the
//! OCI registry, the go-yaml reference converter, the renderer on Helm's engine, and what makes a control plane
//! run workloads (kube-controller-manager, kube-scheduler, kwok: [`crate::workloads`]). cosign is looked up by
//! [`crate::cosign::Cosign::from_env`], since only its own tests need it.
//!
//! `make tools` (hack/tools.sh) builds them into a cache outside the repository and writes their paths to
//! `<cache>/env` as `KEY=value` lines. Environment variables of the same names override that file.
//!
//! Only kube-apiserver (and etcd, which comes with a crate) must be there: `make demo` (`hack/tools.sh install
//! --for demo`) builds kube-apiserver, kube-controller-manager, kube-scheduler, kwok, cso-renderer and Cluster
//! API's managers and lists only what is built, so helm, the registry, yaml2json and the CRD directories of
//! Cluster API v1.10 and cert-manager are then `None` (empty), and only the tests that use them need `make tools`;
//! so are `promtool` and `prometheus` (Debian's `prometheus` package, for the alert rules and dashboard tests).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use crate::Error;

/// Paths of the tools a control plane and the tests need.
#[derive(Clone, Debug)]
pub struct Tools {
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
    pub helm: Option<PathBuf>,
    pub registry: Option<PathBuf>,
    /// Directories with the Cluster API `v1beta1` CRDs (core, kubeadm bootstrap and control plane, Docker).
    pub capi_crd_dirs: Vec<PathBuf>,
    /// cert-manager's CRD files (Helm-templated in places; see [`crate::crds::read_helm_templated`]).
    pub cert_manager_crd_dir: Option<PathBuf>,
    /// hack/tools.sh's `yaml2json`: a YAML stream on stdin to a JSON array of its documents, split and converted as
    /// kubectl and Helm do (apimachinery's YAMLReader, sigs.k8s.io/yaml): the manifest parser's reference.
    pub yaml2json: Option<PathBuf>,
    /// hack/tools.sh's `cso-renderer` (hack/renderer): the long-lived renderer on Helm's own engine that
    /// `cso_render::engine` drives.
    pub renderer: Option<PathBuf>,
    /// kube-controller-manager, of the same Kubernetes version as `kube_apiserver` (`CSO_KUBE_CONTROLLER_MANAGER`).
    pub kube_controller_manager: Option<PathBuf>,
    /// kube-scheduler, of the same Kubernetes version as `kube_apiserver` (`CSO_KUBE_SCHEDULER`).
    pub kube_scheduler: Option<PathBuf>,
    /// kwok (`sigs.k8s.io/kwok/cmd/kwok`, `CSO_KWOK`): simulated nodes and the pods bound to them.
    pub kwok: Option<PathBuf>,
    /// Prometheus' `promtool` (Debian's `prometheus` package, `CSO_PROMTOOL`): checks and unit-tests alert rules.
    pub promtool: Option<PathBuf>,
    /// The Prometheus server of the same package (`CSO_PROMETHEUS`).
    pub prometheus: Option<PathBuf>,
    /// kubelet and kube-proxy, of the same Kubernetes version as `kube_apiserver` (`CSO_KUBELET`,
    /// `CSO_KUBE_PROXY`): real nodes ([`crate::node`]).
    pub kubelet: Option<PathBuf>,
    pub kube_proxy: Option<PathBuf>,
    /// Debian's containerd (`CSO_CONTAINERD`) and the CNI plugins' directory (`CSO_CNI_BIN_DIR`).
    pub containerd: Option<PathBuf>,
    pub cni_bin_dir: Option<PathBuf>,
    /// The sandbox image `registry.k8s.io/pause`, an OCI archive built by `make tools` (`CSO_PAUSE_IMAGE`).
    pub pause_image: Option<PathBuf>,
    /// A test image of this project's, `cso.test/busybox:debian-12` (Debian's static busybox), an OCI archive
    /// built by `make tools` (`CSO_BUSYBOX_IMAGE`).
    pub busybox_image: Option<PathBuf>,
    /// The real nodes' cluster DNS, `cso.test/coredns:<version>` (CoreDNS with a cluster DNS's plugins only), an
    /// OCI archive built by `make tools` (`CSO_COREDNS_IMAGE`).
    pub coredns_image: Option<PathBuf>,
    /// The ferrol stacks' metrics-server, built here from its source under the name its chart uses
    /// (`registry.k8s.io/metrics-server/metrics-server:v0.6.4`), an image archive for real nodes
    /// ([`crate::node::RealCluster::import_image`]).
    pub metrics_server_image: Option<PathBuf>,
    /// The ferrol stacks' kindnet (`kindest/kindnetd:v20230511-dc714da8`), built here the same way.
    pub kindnetd_image: Option<PathBuf>,
    /// This project's static web server, `cso.test/web:v1`: what real nodes run where a stack asks for nginx
    /// ([`crate::node::substitute_image`]).
    pub web_image: Option<PathBuf>,
}

impl Tools {
    /// `helm template RELEASE CHART --namespace NAMESPACE` with this helm: the chart's objects, as the operator
    /// renders a cluster-class chart.
    pub fn helm_template(
        &self,
        chart: &Path,
        release: &str,
        namespace: &str,
    ) -> Result<Vec<serde_json::Value>, Error> {
        let helm = self
            .helm
            .as_ref()
            .ok_or_else(|| Error::Tools("helm not found: run `make tools`".into()))?;
        let output = std::process::Command::new(helm)
            .args(["template", release])
            .arg(chart)
            .args(["--namespace", namespace])
            .output()
            .map_err(|e| Error::io(helm, e))?;
        if !output.status.success() {
            return Err(Error::Process(format!(
                "helm template {}: {}",
                chart.display(),
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        let docs: Vec<Option<serde_json::Value>> =
            serde_saphyr::from_multiple(&String::from_utf8_lossy(&output.stdout))
                .map_err(|e| Error::Process(format!("helm template {}: not YAML: {e}", chart.display())))?;
        Ok(docs.into_iter().flatten().collect())
    }

    /// Finds the tools from the environment and the cache's `env` file.
    pub fn discover() -> Result<Self, Error> {
        let env_file = cache_dir().join("env");
        let from_file = read_env_file(&env_file);
        let lookup = |key: &str| {
            std::env::var(key)
                .ok()
                .filter(|v| !v.is_empty())
                .or_else(|| from_file.get(key).cloned())
        };
        Self::from_lookup(lookup, &env_file)
    }

    /// The tools `lookup` names (`CSO_KUBE_APISERVER`, ...); `env_file` is where `make tools` writes them, for
    /// the message when kube-apiserver is missing.
    fn from_lookup(lookup: impl Fn(&str) -> Option<String>, env_file: &Path) -> Result<Self, Error> {
        let kube_apiserver = lookup("CSO_KUBE_APISERVER").map(PathBuf::from).ok_or_else(|| {
            Error::Tools(format!(
                "kube-apiserver not found: run `make tools` (writes {}) or set CSO_KUBE_APISERVER",
                env_file.display()
            ))
        })?;
        if !kube_apiserver.is_file() {
            return Err(Error::Tools(format!(
                "{} does not exist: run `make tools`",
                kube_apiserver.display()
            )));
        }
        let etcd = match lookup("CSO_ETCD") {
            Some(path) => PathBuf::from(path),
            None => match etcd_bin_vendored_linux_amd64::etcd_bin_path() {
                Ok(path) => path.to_path_buf(),
                Err(never) => match never {},
            },
        };
        let capi_crd_dirs = lookup("CSO_CAPI_CRD_DIRS")
            .map(|dirs| {
                dirs.split(':')
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Tools {
            kube_apiserver,
            etcd,
            helm: lookup("CSO_HELM").map(PathBuf::from),
            registry: lookup("CSO_REGISTRY").map(PathBuf::from),
            capi_crd_dirs,
            cert_manager_crd_dir: lookup("CSO_CERT_MANAGER_CRD_DIR").map(PathBuf::from),
            yaml2json: lookup("CSO_YAML2JSON").map(PathBuf::from),
            renderer: lookup("CSO_RENDERER").map(PathBuf::from),
            kube_controller_manager: lookup("CSO_KUBE_CONTROLLER_MANAGER").map(PathBuf::from),
            kube_scheduler: lookup("CSO_KUBE_SCHEDULER").map(PathBuf::from),
            kwok: lookup("CSO_KWOK").map(PathBuf::from),
            promtool: lookup("CSO_PROMTOOL").map(PathBuf::from),
            prometheus: lookup("CSO_PROMETHEUS").map(PathBuf::from),
            kubelet: lookup("CSO_KUBELET").map(PathBuf::from),
            kube_proxy: lookup("CSO_KUBE_PROXY").map(PathBuf::from),
            containerd: lookup("CSO_CONTAINERD").map(PathBuf::from),
            cni_bin_dir: lookup("CSO_CNI_BIN_DIR").map(PathBuf::from),
            pause_image: lookup("CSO_PAUSE_IMAGE").map(PathBuf::from),
            busybox_image: lookup("CSO_BUSYBOX_IMAGE").map(PathBuf::from),
            coredns_image: lookup("CSO_COREDNS_IMAGE").map(PathBuf::from),
            metrics_server_image: lookup("CSO_METRICS_SERVER_IMAGE").map(PathBuf::from),
            kindnetd_image: lookup("CSO_KINDNETD_IMAGE").map(PathBuf::from),
            web_image: lookup("CSO_WEB_IMAGE").map(PathBuf::from),
        })
    }
}

/// `$CSO_TOOLS_DIR`, else `$XDG_CACHE_HOME/cso`, else `~/.cache/cso` (the same rule as hack/tools.sh).
/// A tool `make tools` builds or installs, at `path` when it is there; else one line saying `what` is missing
/// and how to get it.
pub fn built(path: &Option<PathBuf>, what: &str) -> Result<PathBuf, String> {
    path.clone()
        .filter(|p| p.exists())
        .ok_or_else(|| format!("{what} is missing: run `make tools`"))
}

pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CSO_TOOLS_DIR") {
        return dir.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"));
    base.join("cso")
}

/// `key`'s value in the cache's `env` file (what hack/tools.sh writes), for the tools a test may go without (see
/// [`crate::cosign::Cosign::from_env`]).
pub(crate) fn from_env_file(key: &str) -> Option<String> {
    read_env_file(&cache_dir().join("env"))
        .remove(key)
        .filter(|v| !v.is_empty())
}

fn read_env_file(path: &Path) -> HashMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn what_make_demo_builds_is_enough_and_the_rest_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        let kube_apiserver = dir.path().join("kube-apiserver");
        std::fs::write(&kube_apiserver, "").unwrap();
        let env_file = dir.path().join("env");
        // What `hack/tools.sh install --for demo` lists on a machine that has nothing else.
        std::fs::write(
            &env_file,
            format!(
                "CSO_KUBE_APISERVER={}\nCSO_KUBE_CONTROLLER_MANAGER=/c/kcm\nCSO_KUBE_SCHEDULER=/c/ks\n\
                 CSO_KWOK=/c/kwok\nCSO_RENDERER=/c/cso-renderer\nCSO_CAPI_MANAGER_VERSION=v1.14.2\n",
                kube_apiserver.display()
            ),
        )
        .unwrap();
        let listed = read_env_file(&env_file);
        let tools = Tools::from_lookup(|key| listed.get(key).cloned(), &env_file).unwrap();
        assert_eq!(tools.kube_apiserver, kube_apiserver);
        assert_eq!(tools.renderer, Some(PathBuf::from("/c/cso-renderer")));
        assert_eq!(tools.kwok, Some(PathBuf::from("/c/kwok")));
        assert_eq!(tools.kube_scheduler, Some(PathBuf::from("/c/ks")));
        assert_eq!(tools.kube_controller_manager, Some(PathBuf::from("/c/kcm")));
        assert_eq!(
            (
                &tools.helm,
                &tools.registry,
                &tools.yaml2json,
                &tools.cert_manager_crd_dir,
                &tools.promtool,
                &tools.prometheus
            ),
            (&None, &None, &None, &None, &None, &None)
        );
        assert!(tools.capi_crd_dirs.is_empty());
    }

    #[test]
    fn without_kube_apiserver_discovery_says_to_run_make_tools() {
        let error = Tools::from_lookup(|_| None, Path::new("/cache/env")).unwrap_err();
        assert!(
            error.to_string().contains("run `make tools` (writes /cache/env)"),
            "{error}"
        );
    }
}
