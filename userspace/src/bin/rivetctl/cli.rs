//! The command line: global options, verbs and their arguments.

use std::{net::Ipv4Addr, path::PathBuf};

use clap::{Parser, Subcommand, ValueEnum};

use crate::install::NodeArgs;

#[derive(Parser)]
#[command(
    name = "rivetctl",
    version,
    about = "Inspect and drive a rivet node agent"
)]
pub struct Cli {
    /// Agent API socket.
    #[arg(long, short, global = true, default_value = rivet_api::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Pick the agent of node NAME: its socket `/run/rivet/NAME.sock` (for
    /// machines running one agent per node, each with such a socket).
    #[arg(long, global = true, conflicts_with = "socket")]
    pub node: Option<String>,
    /// Output format.
    #[arg(long, short, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Agent status: node, mode, attachments, map fill, store, readiness
    /// (exits non-zero when the agent is not ready).
    Status,
    /// List endpoints (pods attached to this node).
    Endpoints,
    /// Create or delete an endpoint.
    Endpoint {
        #[command(subcommand)]
        action: EndpointAction,
    },
    /// Routes to remote nodes: pod subnets, node addresses, how they are
    /// reached, and the FDB (VTEP MAC, VNI).
    #[command(alias = "nodes")]
    Routes,
    /// Connection-tracking (NAT) entries: masqueraded flows both ways and
    /// hostPort connections.
    Nat {
        /// Only entries with this address on either side.
        #[arg(long)]
        ip: Option<Ipv4Addr>,
        /// Only entries with this port on either side.
        #[arg(long)]
        port: Option<u16>,
        /// At most this many entries (the agent reads the table only as
        /// far as the page needs).
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Skip this many matching entries (the next page: the offset the
        /// previous one printed).
        #[arg(long, default_value_t = 0)]
        offset: usize,
    },
    /// hostPort mappings in the datapath, with the pod that owns each.
    Portmaps {
        /// At most this many mappings.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Skip this many mappings.
        #[arg(long, default_value_t = 0)]
        offset: usize,
    },
    /// Live datapath events, like `hubble observe`: every drop with its
    /// reason, interface and 5-tuple; with --flows also forwarded and
    /// passed packets (turned on in the datapath only while watched).
    Monitor {
        /// Also flow events.
        #[arg(long)]
        flows: bool,
        /// Flow events for one packet in N.
        #[arg(long, value_name = "N", requires = "flows")]
        sample: Option<u32>,
        /// Only events with this reason (drop reason or verdict).
        #[arg(long)]
        reason: Option<String>,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Add, update or remove a remote node by hand (static clusters).
    Node {
        #[command(subcommand)]
        action: NodeAction,
    },
    /// Datapath counters (verdicts and drop reasons).
    Stats {
        /// Also show counters that are zero.
        #[arg(long)]
        all: bool,
        /// Print per-second rates every SECS seconds until interrupted.
        #[arg(long, value_name = "SECS")]
        watch: Option<u64>,
        /// With --watch: stop after this many samples.
        #[arg(long, requires = "watch")]
        count: Option<u64>,
    },
    /// Install rivet-cni and its conflist on this node (or remove them).
    InstallCni {
        /// The rivet-cni binary (default: next to rivetctl).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// CNI binary directory.
        #[arg(long, default_value = rivet::install::DEFAULT_BIN_DIR)]
        bin_dir: PathBuf,
        /// CNI configuration directory.
        #[arg(long, default_value = rivet::install::DEFAULT_CONF_DIR)]
        conf_dir: PathBuf,
        /// Network name in the conflist.
        #[arg(long, default_value = "rivet")]
        network: String,
        /// Remove instead of install.
        #[arg(long)]
        uninstall: bool,
    },
    /// Store Kubernetes objects (like `kubectl apply -f`): Services,
    /// EndpointSlices, Namespaces, Pods, NetworkPolicies, in JSON or YAML,
    /// one object, a List or several `---` documents. The agent validates
    /// the whole document and stores all of it or nothing.
    Apply {
        /// The document (`-` reads standard input).
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
    },
    /// Remove the objects a document names (like `kubectl delete -f`).
    Delete {
        /// The document (`-` reads standard input).
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
        /// Objects that are not stored are no error (else nothing is
        /// deleted when one is missing).
        #[arg(long)]
        ignore_not_found: bool,
    },
    /// List stored objects (like `kubectl get`): services (svc),
    /// endpointslices, namespaces (ns), pods (po), networkpolicies
    /// (netpol). `-o json` prints them as a List.
    Get {
        /// The kind.
        kind: String,
        /// Only this object.
        name: Option<String>,
        /// The namespace (default: `default`).
        #[arg(short = 'n', long, conflicts_with = "all_namespaces")]
        namespace: Option<String>,
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// The Services this node serves, one line per Service port: its
    /// frontends, backends and what the datapath counted (sockets
    /// translated, flows translated at the uplink, rejected); `-o json`
    /// adds each frontend's scope and backend count, each backend, the
    /// policies, affinity hits and the Service maps' fill.
    #[command(alias = "svc")]
    Services,
    /// The node's BGP sessions (`bgp` mode): peer, role, state, time in
    /// it, prefixes received and advertised, state changes; then what the
    /// node announces and the routes it learned (and damping holds out).
    Bgp,
    /// The NetworkPolicy of this node's pods: which policies select each
    /// pod and its effective rules per direction (ports, peers and the
    /// policies they come from); a pod no policy isolates in a direction
    /// shows "not isolated".
    Policy {
        /// Only this pod: `namespace/name`, or a name in `default`.
        pod: Option<String>,
    },
    /// Print the rivetctl version (and the agent's, if it answers).
    Version,
    /// Install this node as a service: rivetd and rivetctl, rivet-cni and
    /// its conflist, the systemd unit and the configuration.
    Install(NodeArgs),
    /// Undo `install`: stop the service, `rivetd unload` (pod veths,
    /// programs, links, pins, state), then remove the files.
    Uninstall(NodeArgs),
}

#[derive(Subcommand)]
pub enum NodeAction {
    /// Add or update a node.
    Set {
        /// Its pod subnet.
        #[arg(long)]
        subnet: String,
        /// Its uplink address.
        #[arg(long)]
        node_ip: Ipv4Addr,
        /// Its VTEP MAC (default: derived from the address).
        #[arg(long)]
        vtep_mac: Option<String>,
    },
    /// Forget a node.
    Del {
        /// Its pod subnet.
        #[arg(long)]
        subnet: String,
    },
}

#[derive(Subcommand)]
pub enum EndpointAction {
    /// Attach a pod: veth, address, routes, map entry, program.
    Add {
        /// Container (sandbox) ID.
        #[arg(long)]
        container_id: String,
        /// Pod network namespace path.
        #[arg(long)]
        netns: String,
        /// Pod address (inside the node's pod CIDR); default: the agent's IPAM chooses.
        #[arg(long)]
        ip: Option<Ipv4Addr>,
        /// Interface name inside the pod.
        #[arg(long, default_value = "eth0")]
        ifname: String,
    },
    /// Set or clear the bandwidth limits of a running pod (the CNI
    /// `bandwidth` capability's; rates in bit/s and bursts in bits, with
    /// k/M/G suffixes: `--egress-rate 10M --egress-burst 1M`; no rate
    /// given: no limits).
    Bandwidth {
        /// Container (sandbox) ID.
        #[arg(long)]
        container_id: String,
        /// Interface name inside the pod.
        #[arg(long, default_value = "eth0")]
        ifname: String,
        /// Rate into the pod.
        #[arg(long, value_parser = parse_bits)]
        ingress_rate: Option<u64>,
        /// Burst into the pod.
        #[arg(long, value_parser = parse_bits)]
        ingress_burst: Option<u64>,
        /// Rate out of the pod.
        #[arg(long, value_parser = parse_bits)]
        egress_rate: Option<u64>,
        /// Burst out of the pod.
        #[arg(long, value_parser = parse_bits)]
        egress_burst: Option<u64>,
    },
    /// Verify every resource of an attachment.
    Check {
        /// Container (sandbox) ID.
        #[arg(long)]
        container_id: String,
        /// Interface name inside the pod.
        #[arg(long, default_value = "eth0")]
        ifname: String,
    },
    /// Detach a pod (idempotent).
    Del {
        /// Container (sandbox) ID.
        #[arg(long)]
        container_id: String,
        /// Interface name inside the pod.
        #[arg(long, default_value = "eth0")]
        ifname: String,
    },
}

/// Bits (or bits per second) with an optional SI suffix: `1500`, `10k`,
/// `10M`, `1G` (powers of 1000, as Kubernetes' bandwidth annotations).
pub fn parse_bits(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, factor) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000),
        Some((i, 'M')) => (&t[..i], 1_000_000),
        Some((i, 'G')) => (&t[..i], 1_000_000_000),
        _ => (t, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: a number of bits with an optional k, M or G"))?;
    n.checked_mul(factor)
        .ok_or_else(|| format!("{text:?}: too large"))
}
