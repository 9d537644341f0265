//! Keeps every address the simulated clusters invent on this machine.
//!
//! A control plane of the environment hands out Service ClusterIPs, the simulated nodes have pod CIDRs and
//! `InternalIP`s, kwok gives pods IPs, and the tests write Cluster networks into Cluster objects. Nothing on
//! the machine owns those addresses, so whatever dials one (the aggregator checking an `APIService`, an
//! admission webhook called through its Service, `kubectl logs` dialling a node's kubelet) would otherwise
//! follow the default route off the machine. While any environment runs, [`ensure`] keeps them here twice
//! over:
//!
//! - an `unreachable` route for each range in [`GUARDED`] (marked with the routing protocol number
//!   [`ROUTE_PROTOCOL`], so they are told apart from anyone else's), so a dial fails at once with "no route to
//!   host" instead of waiting for a timeout;
//! - a chain [`CHAIN`] jumped to from `OUTPUT` and `FORWARD` (iptables and ip6tables) that drops and counts
//!   every packet to those ranges leaving through an uplink (a device that carries a default route). With the
//!   routes in place its counters stay at zero: [`counters`] reads them, and the suite's guard test fails on
//!   anything else. A last rule drops and counts packets to [`CANARY`], an address no route covers, so a test
//!   can show that the counting works on the uplink's path without a packet leaving.
//!
//! Before adding anything, [`ensure`] checks that no range touches what the machine really uses: its own
//! addresses, its routes and their gateways, its DNS resolvers and a proxy given by address. A conflict stops
//! the environment with one line naming both.
//!
//! Several environments (test binaries, `cso-dev up`) share the routes and the chain: each process that uses
//! them leaves its pid in [`STATE_DIR`]`/holders`, under a lock. The last one out takes everything away again;
//! a watchdog (`sh`) does it for a process that exits, panics or is killed, a few seconds after it is gone, so
//! that the processes it started are stopped first. Where the machine cannot do any of this (not root,
//! no iptables), [`ensure`] fails with one line saying so; `CSO_TESTENV_UNGUARDED=1` starts the environment
//! without the guard on a machine where that is acceptable (the guard test then fails).

use std::{
    collections::BTreeSet,
    fs::File,
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
};

use ipnet::IpNet;

use crate::Error;

/// One address range the environment uses, and what for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardedRange {
    pub cidr: &'static str,
    pub used_for: &'static str,
}

/// Every address range the environment hands out or writes into the objects it creates.
pub const GUARDED: &[GuardedRange] = &[
    GuardedRange {
        cidr: SERVICE_CIDR,
        used_for: "Service ClusterIPs of every control plane (kube-apiserver --service-cluster-ip-range)",
    },
    GuardedRange {
        cidr: NODE_POD_CIDRS,
        used_for: "pod CIDRs of the environment's nodes (10.244.<n>.0/24) and the pod network of the Clusters \
                   the tests create",
    },
    GuardedRange {
        cidr: KWOK_POD_CIDR,
        used_for: "the IPs kwok gives simulated pods",
    },
    GuardedRange {
        cidr: NODE_ADDRESSES,
        used_for: "nodes' InternalIP (172.18.0.<n + 2>): an API server dials a node's kubelet for logs, exec \
                   and port-forward",
    },
    GuardedRange {
        cidr: CLUSTER_POD_CIDR_V6,
        used_for: "the IPv6 pod network of the Clusters the tests create",
    },
];

/// `--service-cluster-ip-range` of every control plane of the environment.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The block the environment's nodes take their pod CIDRs from (`10.244.<n>.0/24`).
pub const NODE_POD_CIDRS: &str = "10.244.0.0/16";
/// kwok's `--cidr`: the IPs of simulated pods.
pub const KWOK_POD_CIDR: &str = "10.245.0.0/16";
/// The block of the nodes' `InternalIP`s.
pub const NODE_ADDRESSES: &str = "172.18.0.0/16";
/// The IPv6 pod network written into the tests' Clusters.
pub const CLUSTER_POD_CIDR_V6: &str = "fd10:244::/48";

/// An address (TEST-NET-2) that no route of ours covers and the chain drops and counts: the guard test sends
/// one datagram to it to show that the counters see the uplink's path.
pub const CANARY: &str = "198.51.100.254";

/// The iptables/ip6tables chain that drops and counts what would leave.
pub const CHAIN: &str = "CSO-TESTENV-EGRESS";
/// The routing protocol number that marks our `unreachable` routes (unassigned in `rt_protos`).
pub const ROUTE_PROTOCOL: u8 = 199;
/// Where the holders, the lock and the release script live.
pub const STATE_DIR: &str = "/run/cso-testenv/egress";
/// Set to `1` to start the environment without the guard.
pub const UNGUARDED_ENV: &str = "CSO_TESTENV_UNGUARDED";
/// Seconds the watchdog waits after its process is gone, so that the processes it started are stopped first
/// (their own watchdogs need up to about 4 s).
const RELEASE_DELAY_SECS: u32 = 6;
const COMMENT: &str = "cso-testenv egress guard";
const CANARY_COMMENT: &str = "cso-testenv egress canary";

/// Makes every range of [`GUARDED`] unreachable off the machine for as long as this process runs (once per
/// process; later calls return the first outcome).
pub fn ensure() -> Result<(), Error> {
    static ONCE: OnceLock<Result<(), String>> = OnceLock::new();
    ONCE.get_or_init(|| {
        if std::env::var(UNGUARDED_ENV).is_ok_and(|v| v == "1") {
            eprintln!(
                "cso-testenv: {UNGUARDED_ENV}=1: the simulated clusters' addresses are NOT kept on this machine"
            );
            return Ok(());
        }
        install(Path::new(STATE_DIR), std::process::id()).map_err(|e| format!("egress guard: {e}"))
    })
    .clone()
    .map_err(Error::Process)
}

/// The guard's packet counts since the chain was made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets to a guarded range that reached an uplink (and were dropped there): `(destination, device,
    /// packets)` for every rule, zero or not.
    pub guarded: Vec<(String, String, u64)>,
    /// Packets to [`CANARY`].
    pub canary: u64,
}

impl Counters {
    /// Packets to a guarded range that reached an uplink, in all.
    pub fn leaked(&self) -> u64 {
        self.guarded.iter().map(|(_, _, packets)| packets).sum()
    }
}

/// Reads the chain's counters (iptables and ip6tables).
pub fn counters() -> Result<Counters, Error> {
    let mut counters = Counters::default();
    for tool in ["iptables", "ip6tables"] {
        let rules = run(tool, &["-w", "-v", "-S", CHAIN])?;
        let parsed = parse_rules(&rules);
        if parsed.is_empty() {
            return Err(Error::Process(format!(
                "{tool}: the chain {CHAIN} has no rules: the egress guard is not in place"
            )));
        }
        for rule in parsed {
            if rule.comment == CANARY_COMMENT {
                counters.canary += rule.packets;
            } else if rule.comment == COMMENT {
                counters
                    .guarded
                    .push((rule.destination, rule.device, rule.packets));
            }
        }
    }
    Ok(counters)
}

/// The processes that hold the guard now (live pids in [`STATE_DIR`]`/holders`).
pub fn live_holders() -> Vec<u32> {
    std::fs::read_dir(Path::new(STATE_DIR).join("holders"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| Path::new("/proc").join(pid.to_string()).exists())
        .collect()
}

/// What of the guard is on the machine: its routes (marked [`ROUTE_PROTOCOL`]) and its chains. Empty once the
/// last holder is gone.
pub fn left_on_the_machine() -> Vec<String> {
    let mut found = Vec::new();
    for family in ["-4", "-6"] {
        let routes = run(
            "ip",
            &[family, "route", "show", "proto", &ROUTE_PROTOCOL.to_string()],
        )
        .unwrap_or_default();
        found.extend(
            routes
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| format!("route {l}")),
        );
    }
    for tool in ["iptables", "ip6tables"] {
        if run(tool, &["-w", "-S", CHAIN]).is_ok() {
            found.push(format!("{tool} chain {CHAIN}"));
        }
    }
    found
}

fn install(state: &Path, pid: u32) -> Result<(), String> {
    if !is_root() {
        return Err(format!(
            "keeping the simulated clusters' addresses ({}) on this machine takes unreachable routes and an \
             iptables chain, which need root (CAP_NET_ADMIN); run as root, or set {UNGUARDED_ENV}=1 where \
             packets to those addresses may leave the machine",
            cidrs().join(", ")
        ));
    }
    for tool in ["ip", "iptables", "ip6tables", "flock"] {
        if which(tool).is_none() {
            return Err(format!(
                "{tool} is not installed: `make tools` installs it (Debian's iproute2, iptables, util-linux)"
            ));
        }
    }
    let guarded: Vec<IpNet> = cidrs()
        .iter()
        .map(|c| c.parse().map_err(|e| format!("{c}: {e}")))
        .collect::<Result<_, _>>()?;
    let canary: IpNet = IpNet::from(CANARY.parse::<IpAddr>().map_err(|e| e.to_string())?);

    std::fs::create_dir_all(state.join("holders")).map_err(|e| format!("{}: {e}", state.display()))?;
    let lock_path = state.join("lock");
    let lock = File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("{}: {e}", lock_path.display()))?;

    let machine = Machine::observe()?;
    let mut checked = guarded.clone();
    checked.push(canary);
    if let Some(conflict) = machine.conflict(&checked) {
        return Err(format!(
            "{conflict}: choose other ranges in cso_testenv::egress (nothing legitimate may use them)"
        ));
    }
    let uplinks = machine.uplinks();

    for net in &guarded {
        let family = family_flag(net);
        run(
            "ip",
            &[
                family,
                "route",
                "replace",
                "unreachable",
                &net.to_string(),
                "proto",
                &ROUTE_PROTOCOL.to_string(),
            ],
        )
        .map_err(|e| e.to_string())?;
    }
    for (tool, v6) in [("iptables", false), ("ip6tables", true)] {
        let nets: Vec<&IpNet> = guarded
            .iter()
            .filter(|n| matches!(n, IpNet::V6(_)) == v6)
            .collect();
        guard_chain(tool, &uplinks, &nets, (!v6).then_some(&canary)).map_err(|e| e.to_string())?;
    }

    let script = state.join("release.sh");
    std::fs::write(&script, release_script(state, &guarded))
        .map_err(|e| format!("{}: {e}", script.display()))?;
    std::fs::write(state.join("holders").join(pid.to_string()), "")
        .map_err(|e| format!("{}: {e}", state.display()))?;
    spawn_release_watchdog(pid, &lock_path, &script).map_err(|e| format!("the release watchdog: {e}"))?;
    drop(lock);
    Ok(())
}

/// Makes the chain (kept, with its counters, when it exists), its rules and the jumps to it, each only once.
fn guard_chain(tool: &str, uplinks: &[String], nets: &[&IpNet], canary: Option<&IpNet>) -> Result<(), Error> {
    if run(tool, &["-w", "-S", CHAIN]).is_err() {
        run(tool, &["-w", "-N", CHAIN])?;
    }
    let mut rules: Vec<Vec<String>> = Vec::new();
    for device in uplinks {
        for net in nets {
            rules.push(rule(&net.to_string(), device, COMMENT));
        }
        if let Some(canary) = canary {
            rules.push(rule(&canary.to_string(), device, CANARY_COMMENT));
        }
    }
    for rule in rules {
        let spec: Vec<&str> = rule.iter().map(String::as_str).collect();
        let check = [&["-w", "-C", CHAIN][..], &spec].concat();
        if run(tool, &check).is_err() {
            run(tool, &[&["-w", "-A", CHAIN][..], &spec].concat())?;
        }
    }
    for builtin in ["OUTPUT", "FORWARD"] {
        if run(tool, &["-w", "-C", builtin, "-j", CHAIN]).is_err() {
            run(tool, &["-w", "-I", builtin, "1", "-j", CHAIN])?;
        }
    }
    Ok(())
}

fn rule(destination: &str, device: &str, comment: &str) -> Vec<String> {
    [
        "-d",
        destination,
        "-o",
        device,
        "-m",
        "comment",
        "--comment",
        comment,
        "-j",
        "DROP",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The shell script that takes one holder away and, when no other holder lives, everything the guard added.
/// Run under the lock (`flock`) by the watchdog; `$1` is the pid that left.
fn release_script(state: &Path, guarded: &[IpNet]) -> String {
    let holders = state.join("holders");
    let holders = holders.display();
    let mut script = format!(
        "#!/bin/sh\n# Written by cso_testenv::egress: release the egress guard of process $1.\n\
         rm -f \"{holders}/$1\"\n\
         for held in \"{holders}\"/*; do\n  [ -e \"$held\" ] || continue\n  \
         if kill -0 \"${{held##*/}}\" 2>/dev/null; then exit 0; fi\n  rm -f \"$held\"\ndone\n"
    );
    for net in guarded {
        script.push_str(&format!(
            "ip {} route del unreachable {net} proto {ROUTE_PROTOCOL} 2>/dev/null\n",
            family_flag(net)
        ));
    }
    for tool in ["iptables", "ip6tables"] {
        script.push_str(&format!(
            "{tool} -w -D OUTPUT -j {CHAIN} 2>/dev/null\n{tool} -w -D FORWARD -j {CHAIN} 2>/dev/null\n\
             {tool} -w -F {CHAIN} 2>/dev/null\n{tool} -w -X {CHAIN} 2>/dev/null\n"
        ));
    }
    script.push_str("exit 0\n");
    script
}

/// Releases `pid`'s hold once it is gone (and [`RELEASE_DELAY_SECS`] later), in a process group of its own so
/// that killing the test's group leaves it running.
fn spawn_release_watchdog(pid: u32, lock: &Path, script: &Path) -> std::io::Result<()> {
    let body = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; sleep {RELEASE_DELAY_SECS}; \
         exec flock \"$1\" sh \"$2\" {pid}"
    );
    let mut command = Command::new("sh");
    command
        .args(["-c", &body, "cso-egress-watchdog"])
        .arg(lock)
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    // Not waited for: it outlives this process by design (init reaps it).
    command.spawn().map(drop)
}

fn cidrs() -> Vec<&'static str> {
    GUARDED.iter().map(|r| r.cidr).collect()
}

fn family_flag(net: &IpNet) -> &'static str {
    match net {
        IpNet::V4(_) => "-4",
        IpNet::V6(_) => "-6",
    }
}

/// What the machine really uses, read from `ip`, `/etc/resolv.conf` and the proxy variables.
#[derive(Debug, Default)]
struct Machine {
    /// Local addresses with their interface.
    addresses: Vec<(IpAddr, String)>,
    /// Routes other than the defaults and our own: destination, gateway, device.
    routes: Vec<(IpNet, Option<IpAddr>, String)>,
    /// Default routes: gateway and device.
    defaults: Vec<(Option<IpAddr>, String)>,
    resolvers: Vec<IpAddr>,
    proxies: Vec<(IpAddr, String)>,
}

impl Machine {
    fn observe() -> Result<Self, String> {
        let mut machine = Machine::default();
        let addresses: serde_json::Value =
            serde_json::from_str(&run("ip", &["-j", "address"]).map_err(|e| e.to_string())?)
                .map_err(|e| format!("ip -j address: {e}"))?;
        for link in addresses.as_array().into_iter().flatten() {
            let device = link["ifname"].as_str().unwrap_or_default().to_owned();
            if is_ours(&device) {
                continue;
            }
            for info in link["addr_info"].as_array().into_iter().flatten() {
                if let Some(address) = info["local"].as_str().and_then(|a| a.parse().ok()) {
                    machine.addresses.push((address, device.clone()));
                }
            }
        }
        for family in ["-4", "-6"] {
            let routes =
                run("ip", &["-j", family, "route", "show", "table", "all"]).map_err(|e| e.to_string())?;
            let routes: serde_json::Value =
                serde_json::from_str(&routes).map_err(|e| format!("ip -j {family} route: {e}"))?;
            machine.add_routes(&routes);
        }
        let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        machine.resolvers = resolvers(&resolv);
        for name in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            if let Some(address) = std::env::var(name).ok().as_deref().and_then(proxy_address) {
                machine.proxies.push((address, name.to_owned()));
            }
        }
        Ok(machine)
    }

    fn add_routes(&mut self, routes: &serde_json::Value) {
        for route in routes.as_array().into_iter().flatten() {
            // `ip -j` prints a protocol without a name in rt_protos as its number, in a string.
            let protocol = match &route["protocol"] {
                serde_json::Value::String(name) => name.parse::<u64>().ok(),
                number => number.as_u64(),
            };
            let ours = route["type"] == "unreachable" && protocol == Some(ROUTE_PROTOCOL.into());
            // Local and broadcast routes of the local table are the addresses, checked as such.
            let table = route["table"].as_str().unwrap_or("main");
            if ours || table == "local" {
                continue;
            }
            let gateway = route["gateway"].as_str().and_then(|g| g.parse().ok());
            let device = route["dev"].as_str().unwrap_or_default().to_owned();
            if is_ours(&device) {
                continue;
            }
            match route["dst"].as_str() {
                Some("default") => self.defaults.push((gateway, device)),
                Some(dst) => {
                    let net = dst
                        .parse::<IpNet>()
                        .ok()
                        .or_else(|| dst.parse::<IpAddr>().ok().map(IpNet::from));
                    if let Some(net) = net {
                        self.routes.push((net, gateway, device));
                    }
                }
                None => {}
            }
        }
    }

    /// The devices of the default routes: where a packet would leave the machine.
    fn uplinks(&self) -> Vec<String> {
        let devices: BTreeSet<String> = self
            .defaults
            .iter()
            .map(|(_, device)| device.clone())
            .filter(|d| !d.is_empty())
            .collect();
        devices.into_iter().collect()
    }

    /// The first thing of the machine's that one of `nets` would hide, said in one line.
    fn conflict(&self, nets: &[IpNet]) -> Option<String> {
        for net in nets {
            let hides = |address: &IpAddr| net.contains(address);
            if let Some((address, device)) = self.addresses.iter().find(|(a, _)| hides(a)) {
                return Some(format!(
                    "{net} holds {address}, an address of this machine ({device})"
                ));
            }
            if let Some(address) = self.resolvers.iter().find(|a| hides(a)) {
                return Some(format!(
                    "{net} holds {address}, a DNS resolver of this machine (/etc/resolv.conf)"
                ));
            }
            if let Some((address, name)) = self.proxies.iter().find(|(a, _)| hides(a)) {
                return Some(format!("{net} holds {address}, the proxy in {name}"));
            }
            for (gateway, device) in &self.defaults {
                if let Some(gateway) = gateway.filter(|g| hides(g)) {
                    return Some(format!("{net} holds {gateway}, the default gateway ({device})"));
                }
            }
            for (dst, gateway, device) in &self.routes {
                if net.contains(dst) || dst.contains(net) {
                    return Some(format!("{net} overlaps the route to {dst} ({device})"));
                }
                if let Some(gateway) = gateway.filter(|g| hides(g)) {
                    return Some(format!(
                        "{net} holds {gateway}, the gateway of the route to {dst}"
                    ));
                }
            }
        }
        None
    }
}

/// Whether a network device is the environment's own (a real-node bridge or veth, `crate::node`): its
/// addresses and routes are inside the guarded ranges by design.
fn is_ours(device: &str) -> bool {
    device.starts_with("cso")
}

/// The `nameserver` addresses of a resolv.conf.
fn resolvers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| line.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|address| address.split('%').next()?.parse().ok())
        .collect()
}

/// The address of a proxy URL whose host is an IP literal (a name is resolved through the resolvers, which are
/// checked on their own).
fn proxy_address(url: &str) -> Option<IpAddr> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host_port = rest.split('/').next()?;
    let host_port = host_port.rsplit_once('@').map_or(host_port, |(_, h)| h);
    if let Some(v6) = host_port.strip_prefix('[') {
        return v6.split(']').next()?.parse().ok();
    }
    host_port.split(':').next()?.parse().ok()
}

/// One rule of the chain as `iptables -v -S` prints it.
#[derive(Debug, PartialEq, Eq)]
struct Rule {
    destination: String,
    device: String,
    comment: String,
    packets: u64,
}

fn parse_rules(listing: &str) -> Vec<Rule> {
    listing
        .lines()
        .filter(|line| line.starts_with(&format!("-A {CHAIN} ")))
        .filter_map(|line| {
            let words = shell_words(line);
            let after = |flag: &str| {
                words
                    .iter()
                    .position(|w| w == flag)
                    .and_then(|i| words.get(i + 1))
                    .cloned()
            };
            let packets = after("-c")?.parse().ok()?;
            Some(Rule {
                destination: after("-d")?,
                device: after("-o")?,
                comment: after("--comment").unwrap_or_default(),
                packets,
            })
        })
        .collect()
}

/// Splits a line of `iptables -S` into words, keeping a double-quoted comment whole.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

pub(crate) fn is_root() -> bool {
    // /proc/self/status: "Uid: real effective saved fs".
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

pub(crate) fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
}

/// Runs a system tool (found on `PATH`, else in `/usr/sbin` and `/sbin`) and returns its standard output.
pub(crate) fn run(tool: &str, args: &[&str]) -> Result<String, Error> {
    let program = which(tool).unwrap_or_else(|| PathBuf::from(tool));
    let output = Command::new(&program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Process(format!("{tool}: {e}")))?;
    if !output.status.success() {
        return Err(Error::Process(format!(
            "{tool} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use rstest::rstest;
    use serde_json::json;

    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn machine() -> Machine {
        let mut machine = Machine {
            addresses: vec![
                ("127.0.0.1".parse().unwrap(), "lo".into()),
                ("192.0.2.2".parse().unwrap(), "eth0".into()),
                ("fd00::2".parse().unwrap(), "eth0".into()),
            ],
            resolvers: resolvers("# generated\nnameserver 10.255.255.53\nnameserver fe80::1%eth0\n"),
            proxies: vec![("100.64.1.1".parse().unwrap(), "HTTPS_PROXY".into())],
            ..Machine::default()
        };
        machine.add_routes(&json!([
            {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
            {"dst": "192.0.2.0/24", "dev": "eth0", "protocol": "kernel"},
            {"dst": "172.30.0.0/16", "gateway": "192.0.2.9", "dev": "eth0"},
            {"type": "unreachable", "dst": "10.0.0.0/24", "protocol": "199"},
            {"type": "local", "dst": "192.0.2.2", "table": "local", "dev": "eth0"},
            {"dst": "default", "gateway": "fd00::1", "dev": "eth0"},
            {"dst": "172.18.3.0/24", "dev": "cso3br", "protocol": "kernel"},
        ]));
        machine
    }

    #[rstest]
    #[case::the_environments_ranges("10.0.0.0/24", None)]
    #[case::kwok("10.245.0.0/16", None)]
    #[case::v6_pods("fd10:244::/48", None)]
    #[case::the_resolver("10.255.0.0/16", Some("10.255.255.53, a DNS resolver"))]
    #[case::an_own_address("192.0.2.0/28", Some("192.0.2.2, an address of this machine (eth0)"))]
    #[case::an_own_v6_address("fd00::/104", Some("fd00::2, an address of this machine"))]
    #[case::a_route("172.30.5.0/24", Some("overlaps the route to 172.30.0.0/16"))]
    #[case::a_wider_range_over_a_route("172.16.0.0/12", Some("overlaps the route to 172.30.0.0/16"))]
    #[case::the_proxy("100.64.0.0/10", Some("the proxy in HTTPS_PROXY"))]
    #[case::the_default_gateway("192.0.2.0/31", Some("the default gateway (eth0)"))]
    fn ranges_that_hide_what_the_machine_uses_are_refused(
        #[case] range: &str,
        #[case] expected: Option<&str>,
    ) {
        let found = machine().conflict(&[net(range)]);
        match expected {
            None => assert_eq!(found, None),
            Some(part) => assert!(found.as_deref().is_some_and(|f| f.contains(part)), "{found:?}"),
        }
    }

    #[test]
    fn our_own_routes_are_no_conflict_and_uplinks_are_the_default_routes_devices() {
        let machine = machine();
        assert!(!machine.routes.iter().any(|(dst, ..)| *dst == net("10.0.0.0/24")));
        assert_eq!(machine.uplinks(), vec!["eth0".to_owned()]);
    }

    #[test]
    fn every_guarded_range_parses_and_none_overlaps_another() {
        let nets: Vec<IpNet> = cidrs().iter().map(|c| net(c)).collect();
        for (i, a) in nets.iter().enumerate() {
            for b in &nets[i + 1..] {
                assert!(!a.contains(b) && !b.contains(a), "{a} and {b}");
            }
        }
        assert!(
            !nets
                .iter()
                .any(|n| n.contains(&CANARY.parse::<IpAddr>().unwrap()))
        );
    }

    #[rstest]
    #[case("http://10.1.2.3:3128", Some("10.1.2.3"))]
    #[case("http://user:pw@[fd00::5]:3128/", Some("fd00::5"))]
    #[case("proxy.example:3128", None)]
    #[case("10.9.9.9", Some("10.9.9.9"))]
    fn proxies_given_by_address_are_read(#[case] url: &str, #[case] expected: Option<&str>) {
        assert_eq!(proxy_address(url), expected.map(|a| a.parse().unwrap()));
    }

    #[test]
    fn the_counters_are_read_from_the_rule_listing() {
        let listing = format!(
            "-N {CHAIN}\n\
             -A {CHAIN} -d 10.0.0.0/24 -o eth0 -m comment --comment \"{COMMENT}\" -c 0 0 -j DROP\n\
             -A {CHAIN} -d 172.18.0.0/16 -o eth0 -m comment --comment \"{COMMENT}\" -c 3 180 -j DROP\n\
             -A {CHAIN} -d 198.51.100.254/32 -o eth0 -m comment --comment \"{CANARY_COMMENT}\" -c 1 29 -j DROP\n"
        );
        let rules = parse_rules(&listing);
        assert_eq!(rules.len(), 3);
        assert_eq!(
            rules[1],
            Rule {
                destination: "172.18.0.0/16".into(),
                device: "eth0".into(),
                comment: COMMENT.into(),
                packets: 3
            }
        );
        assert_eq!(rules[2].comment, CANARY_COMMENT);
    }

    #[test]
    fn the_release_script_removes_exactly_what_was_added() {
        let script = release_script(Path::new("/run/x"), &[net("10.0.0.0/24"), net("fd10:244::/48")]);
        assert!(script.contains("ip -4 route del unreachable 10.0.0.0/24 proto 199"));
        assert!(script.contains("ip -6 route del unreachable fd10:244::/48 proto 199"));
        for tool in ["iptables", "ip6tables"] {
            assert!(script.contains(&format!("{tool} -w -D OUTPUT -j {CHAIN}")));
            assert!(script.contains(&format!("{tool} -w -X {CHAIN}")));
        }
        assert!(script.contains("if kill -0 \"${held##*/}\" 2>/dev/null; then exit 0; fi"));
    }
}
