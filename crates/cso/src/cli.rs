//! The command line: `cso run`, `cso crds`, `cso render`, `cso status`. (The local control planes and the demo are
//! `cso-dev`, a binary of its own, so that the operator does not link the test environment.)
//!
//! `cso run` takes the Go operator's flags with Go's spelling rules, so existing manifests work unchanged:
//! one or two dashes (`-local`, `--local`), booleans as `--flag`, `--flag=true` or `--flag=false` (never
//! `--flag false`), durations like `5m` or `30s`.

use std::{path::PathBuf, time::Duration};

use clap::{ArgAction, Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cso",
    version,
    about = "Cluster stack operator: cluster stacks for Cluster API, in Rust",
    // Like Go's flag package, a flag given twice takes its last value: the chart appends the Go chart's
    // `controllerManager.manager.args` after its own, and they win.
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per process")]
pub enum Command {
    /// Run the operator against the cluster of `--kubeconfig` (else `KUBECONFIG`, else in-cluster).
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions as YAML.
    Crds,
    /// Show what a release would do, touching nothing: the ClusterClass objects and the objects of each
    /// addon chart or stage; with `--diff`, what it would create, change and prune in the live clusters.
    Render(RenderArgs),
    /// The fleet: per release, how many Clusters have their addons on it and how many of them are ready,
    /// progressing or failing, naming the first failing ones (from the ClusterAddons).
    Status(StatusArgs),
    /// ClusterStackRollouts: `cso rollout status NAME` shows one's waves, progress and failing Clusters.
    #[command(subcommand)]
    Rollout(RolloutCommand),
}

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// A rollout's phase, its waves (Clusters, moved, done, failing, skipped), the failing Clusters with why,
    /// and the Clusters the preflight refused.
    Status(RolloutStatusArgs),
}

#[derive(Debug, Args)]
pub struct RolloutStatusArgs {
    /// The ClusterStackRollout.
    pub name: String,
    /// Its namespace; default: `default`.
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
    /// Kubeconfig of the management cluster; default: `KUBECONFIG`, then in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Only the ClusterAddons of this namespace; default: every namespace.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Kubeconfig of the management cluster; default: `KUBECONFIG`, then in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// A release directory (named by its tag, e.g. `docker-ferrol-1-27-v2`) or a release tag to fetch.
    pub release: String,
    /// The Cluster the addons are rendered for: a YAML file, or `NAMESPACE/NAME` of a live Cluster.
    /// Without it, an example Cluster of the release stands in.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Namespace of the ClusterStackRelease (default: the Cluster's, else `default`).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Compare with the live clusters (server-side dry run): the management cluster for the cluster class,
    /// the Cluster's workload cluster for the addons.
    #[arg(long)]
    pub diff: bool,
    /// Kubeconfig of the management cluster; default: `KUBECONFIG`, then in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Where fetched releases are cached.
    #[arg(long, default_value = "/tmp/downloads/")]
    pub release_dir: PathBuf,
    /// Where a release tag is fetched from: `github` or `oci` (configured as for `cso run`).
    #[arg(long, default_value = "github")]
    pub source: String,
    /// The GitHub API (GitHub Enterprise, or a stand-in).
    #[arg(long, default_value = "https://api.github.com")]
    pub github_api_url: String,
    /// The `helm` binary: a path, or a name looked up on `PATH`. Default: the `helm` beside `cso`, else on
    /// `PATH`.
    #[arg(long, env = "CSO_HELM")]
    pub helm: Option<PathBuf>,
    /// Where chart dependencies the release does not vendor are fetched from, as for `cso run`: `URL` (an
    /// HTTP(S) chart repository or an `oci://` prefix) for all, `FROM=URL` for one repository. Repeatable.
    /// Without it they come from the repositories their `Chart.yaml` names.
    #[arg(long = "chart-mirror", value_name = "[FROM=]URL")]
    pub chart_mirror: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kubeconfig of the management cluster; default: `KUBECONFIG`, then the in-cluster service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Where metrics are served (`/metrics`).
    #[arg(long, default_value = ":8080")]
    pub metrics_bind_address: String,
    /// Where `/healthz` and `/readyz` are served.
    #[arg(long, default_value = ":9440")]
    pub health_probe_bind_address: String,
    /// Elect a leader with a Lease before running the controllers.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true")]
    pub leader_elect: bool,
    /// Namespace of the leader-election Lease (default: the pod's namespace, else the kubeconfig's).
    #[arg(long, default_value = "")]
    pub leader_elect_namespace: String,
    /// How long the leader's Lease is valid without renewal: the longest a failover can take.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// Only reconcile objects labelled `cluster.x-k8s.io/watch-filter=<value>`.
    #[arg(long, default_value = "")]
    pub watch_filter: String,
    /// Only watch this namespace.
    #[arg(long, default_value = "")]
    pub namespace: String,
    /// ClusterStacks reconciled at the same time.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub clusterstack_concurrency: u16,
    /// ClusterStackReleases reconciled at the same time.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub clusterstackrelease_concurrency: u16,
    /// ClusterAddons reconciled at the same time. The Go operator's default is 1; 10 measured best here
    /// (`docs/benchmarks.md`, "Scale as its own process"): a ClusterAddon's time is mostly waiting for API
    /// servers, and more at once only queue on the API servers' CPU.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub clusteraddon_concurrency: u16,
    /// `debug`, `info` or `error` (anything else means `info`, as in the Go operator).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// `json` (one object per line, as the Go operator logs) or `text`.
    #[arg(long, default_value = "json", value_parser = ["json", "text"])]
    pub log_format: String,
    /// The release cache: releases live in `<release-dir>/cluster-stacks/<tag>/`.
    #[arg(long, default_value = "/tmp/downloads/")]
    pub release_dir: PathBuf,
    /// Use the releases already in the release directory; never download.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true")]
    pub local: bool,
    /// With `--local`: where a release whose charts do not vendor their dependencies is copied and its
    /// dependencies resolved (from `--chart-mirror`, else the repositories in `Chart.yaml`), once per content
    /// of its files (`<tag>@<digest>`), so the release directory is never written and a rebuilt release is
    /// resolved again. Default: `cso-local-cache` in the temporary directory (`TMPDIR`, else `/tmp`).
    #[arg(long)]
    pub local_cache_dir: Option<PathBuf>,
    /// Where releases come from: `github` or `oci` (configured by the `GIT_*` / `OCI_*` variables).
    #[arg(long, default_value = "github")]
    pub source: String,
    /// Requests per second to each API server (management and every workload cluster), client-side;
    /// 0 for no limit. The Go operator's default is 50 (with a burst of 100); 1000 Clusters installed at once
    /// need about 5,400 management requests, which at 50 a second alone take 108 s.
    #[arg(long, default_value_t = 200.0)]
    pub qps: f64,
    /// Requests allowed at once above `--qps` before it applies.
    #[arg(long, default_value_t = 400)]
    pub burst: u32,
    /// Port of the validating admission webhooks (hard-coded 9443 in the Go operator).
    #[arg(long, default_value_t = 9443)]
    pub webhook_port: u16,
    /// Certificates of the admission webhooks (`tls.crt`, `tls.key`).
    #[arg(long, default_value = "/tmp/k8s-webhook-server/serving-certs/")]
    pub webhook_cert_dir: PathBuf,
    /// Port of the runtime-extension (lifecycle hook) server.
    #[arg(long, default_value_t = 9442)]
    pub hook_port: u16,
    /// Certificates of the runtime-extension server (`tls.crt`, `tls.key`).
    #[arg(long, default_value = "/tmp/k8s-hook-server/serving-certs/")]
    pub hook_cert_dir: PathBuf,
    /// How often a ClusterStack with `autoSubscribe` asks its source for new releases.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// How often applied objects are re-applied (drift correction) when no watch announced a change.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub resync_interval: Duration,
    /// A reconcile still running after this long is stopped (event `ReconcileTimedOut`) and retried.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub reconcile_timeout: Duration,
    /// A stage of a lifecycle hook that has not finished after this long (its CEL condition never holds, its
    /// objects cannot be applied) is given up with a Warning (condition `HookStagesCompleted`, event
    /// `StageTimedOut`), so that Cluster API can go on instead of holding the Cluster forever.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub stage_timeout: Duration,
    /// Ready means running: applied addons count as ready only once what they applied runs (Deployments
    /// available, DaemonSets rolled out, StatefulSets ready, Jobs complete, CRDs established, APIServices
    /// available), waited for up to `--stage-timeout` (condition `AddonsHealthy`) and checked again at every
    /// resync. The next stage of a hook waits for the objects of the one before to run. `false`: ready once
    /// applied, as the Go operator has it.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true")]
    pub addon_health_checks: bool,
    /// Watch what was applied to each workload cluster (metadata only, one watch per kind over the cluster's one
    /// connection), so that drift is put back within seconds and a periodic pass writes nothing when nothing
    /// drifted. `false`: drift is found by the periodic pass only (`--resync-interval`: each object read, what
    /// differs written), as the Go operator has it (it re-applies everything); it saves the watches' memory, about
    /// a quarter of what each workload cluster costs (docs/benchmarks.md).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true")]
    pub drift_watches: bool,
    /// With the health checks: while addons are waited for after an apply, a Deployment, DaemonSet or
    /// StatefulSet counts as running only once every container of its pods has been up this long, so that a
    /// container that exits at start (Ready for a moment after each start when it has no readiness probe) is
    /// not taken for running. `0s`: as its controller says.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub addon_settle_time: Duration,
    /// Field managers whose applied fields are taken over (comma-separated; `kubectl` is how the Go
    /// operator applies, so swapping operators leaves no fields stranded). Empty to disable.
    #[arg(long, default_value = "kubectl", value_delimiter = ',')]
    pub take_over_field_managers: Vec<String>,
    /// What renders charts and values templates: `engine`, one long-lived `cso-renderer` process on Helm's
    /// own engine (no process per render), or `helm`, a `helm template` process per render.
    #[arg(long, default_value = "engine", env = "CSO_RENDER_WITH", value_parser = ["engine", "helm"])]
    pub renderer: String,
    /// The `cso-renderer` binary (with `--renderer=engine`): a path, or a name looked up on `PATH`. Default:
    /// the `cso-renderer` beside `cso` (as in the image), else on `PATH`. Checked at start: `cso run` refuses
    /// to start without a renderer that answers.
    #[arg(long, env = "CSO_RENDERER")]
    pub renderer_binary: Option<PathBuf>,
    /// The `helm` binary (with `--renderer=helm`): a path, or a name looked up on `PATH`. Default: the `helm`
    /// beside `cso`, else on `PATH`.
    #[arg(long, env = "CSO_HELM")]
    pub helm: Option<PathBuf>,
    /// How long one render may take.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub helm_timeout: Duration,
    /// The GitHub API (GitHub Enterprise, or a stand-in).
    #[arg(long, default_value = "https://api.github.com")]
    pub github_api_url: String,
    /// This replica's shard (`NAME`, a DNS-1123 label): it handles the addons of the Clusters labelled
    /// `clusterstack.x-k8s.io/shard=NAME` only (its watches select them) and elects its leader with a Lease of
    /// its own (`clusterstack.x-k8s.io-shard-NAME`), so each shard can have standbys. Without it, the default
    /// shard: unlabelled Clusters, and the ClusterStacks and ClusterStackReleases. Needs leader election.
    #[arg(long, default_value = "", value_parser = parse_shard)]
    pub shard: cso_api::shard::Shard,
    /// How long a shard may go without a replica holding its Lease before the default shard reports its
    /// Clusters (gauge `cso_unattended_clusters`, condition `ShardReconciling` on their ClusterAddons).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub shard_grace: Duration,
    /// A cosign public key (`PUBLIC KEY` PEM, as `cosign generate-key-pair` writes `cosign.pub`). Repeatable:
    /// with any, every release fetched from OCI must carry a cosign signature (a Sigstore bundle referrer
    /// or a `sha256-<digest>.sig` tag) by one of these keys, checked before anything of it is cached;
    /// anything else is refused (condition `ReleaseVerified`). GitHub releases carry no signature and are
    /// then refused. Read at start: a key that cannot be read stops the start.
    #[arg(long = "verify-key", value_name = "PATH")]
    pub verify_key: Vec<PathBuf>,
    /// Where the chart dependencies of a release are fetched from (once, when it enters the cache) instead of
    /// the repository its `Chart.yaml` names: `URL` (an HTTP(S) chart repository or an `oci://` prefix) for
    /// every dependency, or `FROM=URL` for the repository FROM as written in `Chart.yaml`. Repeatable; basic
    /// credentials in the URL (`https://user:password@host/`).
    #[arg(long = "chart-mirror", value_name = "[FROM=]URL")]
    pub chart_mirror: Vec<String>,
    /// A Secret of type `kubernetes.io/dockerconfigjson` with the basic credentials of private chart mirrors
    /// and repositories, by host (its `auths`): for `oci://` registries and HTTP(S) chart repositories alike.
    /// Read at start and followed, so a rotated password applies to the next fetch. Without it, OCI
    /// credentials come from the usual registry config (`REGISTRY_AUTH_FILE`, `~/.docker/config.json`,
    /// Helm's registry config); credentials in a `--chart-mirror` URL come first.
    #[arg(long = "chart-mirror-credentials", value_name = "NAMESPACE/NAME")]
    pub chart_mirror_credentials: Option<String>,
}

/// `--shard`: a DNS-1123 label, or empty for the default shard.
fn parse_shard(text: &str) -> Result<cso_api::shard::Shard, String> {
    cso_api::shard::Shard::parse(text)
}

/// Go-style durations: `300ms`, `30s`, `5m`, `1h`, and sums such as `1m30s` (`cso_api::duration`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    cso_api::duration::parse(text)
}

/// Rewrites Go's single-dash long flags (`-leader-elect=false`) into clap's `--leader-elect=false`.
pub fn go_style_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut options_done = false;
    for arg in args {
        if options_done || arg == "--" {
            options_done = true;
            out.push(arg);
            continue;
        }
        let is_single_dash_long = arg.starts_with('-')
            && !arg.starts_with("--")
            && arg.split('=').next().is_some_and(|name| name.len() > 2);
        out.push(if is_single_dash_long {
            format!("-{arg}")
        } else {
            arg
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_run(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let argv = go_style_args(["cso", "run"].iter().chain(args).map(|s| (*s).to_owned()));
        match Cli::try_parse_from(argv)?.command {
            Command::Run(run) => Ok(*run),
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn a_shard_is_a_dns_label_and_the_default_is_none() {
        assert_eq!(parse_run(&[]).unwrap().shard, cso_api::shard::Shard::Default);
        assert_eq!(
            parse_run(&["--shard=eu-1"]).unwrap().shard,
            cso_api::shard::Shard::Named("eu-1".into())
        );
        let refused = parse_run(&["--shard=EU_1"]).unwrap_err().to_string();
        assert!(refused.contains("DNS-1123"), "{refused}");
    }

    #[test]
    fn upstream_defaults() {
        let run = parse_run(&[]).unwrap();
        assert!(run.leader_elect);
        assert!(!run.local);
        assert_eq!(run.source, "github");
        assert_eq!(run.release_dir, PathBuf::from("/tmp/downloads/"));
        assert_eq!(run.hook_port, 9442);
        assert_eq!(
            (run.clusterstack_concurrency, run.clusterstackrelease_concurrency),
            (1, 1)
        );
        assert_eq!(run.poll_interval, Duration::from_secs(300));
        assert_eq!(run.take_over_field_managers, ["kubectl"]);
    }

    #[test]
    fn chart_mirrors_repeat() {
        let run = parse_run(&[
            "--chart-mirror=https://charts.example/",
            "--chart-mirror=https://helm.cilium.io/=oci://registry.example/cilium",
        ])
        .unwrap();
        let mirrors = cso_release::ChartMirrors::parse(&run.chart_mirror).unwrap();
        assert_eq!(
            mirrors.repository_for("https://helm.cilium.io/"),
            "oci://registry.example/cilium"
        );
        assert_eq!(
            mirrors.repository_for("https://kubernetes-sigs.github.io/metrics-server/"),
            "https://charts.example/"
        );
        assert!(parse_run(&[]).unwrap().chart_mirror.is_empty());
    }

    #[test]
    fn chart_mirror_credentials_name_a_secret() {
        let run = parse_run(&["--chart-mirror-credentials=cso-system/mirror-pull"]).unwrap();
        let reference = run.chart_mirror_credentials.as_deref().unwrap();
        assert_eq!(
            crate::chart_credentials::parse_reference(reference).unwrap(),
            ("cso-system".to_owned(), "mirror-pull".to_owned())
        );
        assert!(parse_run(&[]).unwrap().chart_mirror_credentials.is_none());
    }

    #[test]
    fn go_style_flags_as_in_the_upstream_manifests() {
        let run = parse_run(&[
            "--leader-elect=false",
            "-local=true",
            "--log-level=debug",
            "-clusterstack-concurrency=3",
            "--release-dir",
            "/var/cache/cso",
            "--watch-filter=team-a",
        ])
        .unwrap();
        assert!(!run.leader_elect);
        assert!(run.local);
        assert_eq!(run.log_level, "debug");
        assert_eq!(run.clusterstack_concurrency, 3);
        assert_eq!(run.release_dir, PathBuf::from("/var/cache/cso"));
        assert_eq!(run.watch_filter, "team-a");
        assert!(
            parse_run(&["--local"]).unwrap().local,
            "a bare boolean flag means true"
        );
        assert!(
            parse_run(&["--local", "false"]).is_err(),
            "like Go, a boolean takes its value only with ="
        );
        assert!(parse_run(&["--clusterstack-concurrency=0"]).is_err());
        let repeated = parse_run(&[
            "--leader-elect=true",
            "--log-level=info",
            "--leader-elect=false",
            "-log-level=debug",
        ])
        .unwrap();
        assert!(
            !repeated.leader_elect && repeated.log_level == "debug",
            "like Go, the last of a repeated flag wins"
        );
        let keys = parse_run(&["--verify-key=a.pub", "--verify-key=b.pub"]).unwrap();
        assert_eq!(
            keys.verify_key.len(),
            2,
            "a repeatable flag still collects every value"
        );
    }
}
