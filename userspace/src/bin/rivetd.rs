//! rivetd: the rivet node agent.

use std::{path::PathBuf, process::ExitCode, sync::Arc};

use clap::{Parser, Subcommand};
use rivet::{
    agent::{self, Agent, AgentError, RECONCILE_INTERVAL},
    cluster::etcd::EtcdCluster,
    config::{AgentConfig, FileConfig},
    datapath::{self, pins::PinLayout},
    netlink::netns,
};

#[derive(Parser)]
#[command(
    name = "rivetd",
    version,
    about = "rivet node agent: owns the eBPF datapath of one node"
)]
struct Cli {
    /// TOML configuration file; flags override its values.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Node name (names the pin directory).
    #[arg(long)]
    node_name: Option<String>,
    /// Pod CIDR of this node.
    #[arg(long)]
    pod_cidr: Option<String>,
    /// Pods' gateway address (answered for in BPF).
    #[arg(long)]
    gateway: Option<std::net::Ipv4Addr>,
    /// Uplink interface of the node.
    #[arg(long)]
    uplink: Option<String>,
    /// Pod interface MTU.
    #[arg(long)]
    mtu: Option<u32>,
    /// Network namespace to run in (name under /run/netns, or a path).
    #[arg(long)]
    netns: Option<String>,
    /// bpffs mount point.
    #[arg(long)]
    bpffs: Option<PathBuf>,
    /// Pin directory (default <bpffs>/rivet/<node-name>).
    #[arg(long)]
    pin_dir: Option<PathBuf>,
    /// State directory (default /var/lib/rivet/<node-name>).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// API socket path.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Metrics and health endpoints (address:port, or "off"; default 127.0.0.1:9402).
    #[arg(long)]
    metrics_addr: Option<String>,
    /// How programs attach to pod veths: tc (netlink cls_bpf, default) or tcx.
    #[arg(long)]
    pod_attach: Option<rivet::datapath::AttachMode>,
    /// Cross-node mode: vxlan (default), ipip, native, hybrid.
    #[arg(long)]
    mode: Option<rivet::config::Mode>,
    /// Cluster CIDR (all nodes' pod CIDRs).
    #[arg(long)]
    cluster_cidr: Option<String>,
    /// VXLAN network identifier.
    #[arg(long)]
    vni: Option<u32>,
    /// VXLAN UDP port.
    #[arg(long)]
    vxlan_port: Option<u16>,
    /// etcd endpoints, comma-separated (cluster mode).
    #[arg(long, value_delimiter = ',')]
    etcd_endpoints: Option<Vec<String>>,
    /// etcd key prefix.
    #[arg(long)]
    etcd_prefix: Option<String>,
    /// Registration lease TTL in seconds.
    #[arg(long)]
    etcd_lease_ttl: Option<u64>,
    /// Masquerade pod traffic leaving the cluster (default true).
    #[arg(long)]
    masquerade: Option<bool>,
    /// Source ports of masqueraded flows, "first-last" (default 61000-65535).
    #[arg(long)]
    nat_port_range: Option<String>,
    /// More destinations that keep the pod's address, comma-separated CIDRs.
    #[arg(long, value_delimiter = ',')]
    no_masquerade: Option<Vec<String>>,
    /// Idle timeout of established TCP flows through NAT, seconds.
    #[arg(long)]
    nat_tcp_timeout: Option<u64>,
    /// Idle timeout of UDP flows through NAT, seconds.
    #[arg(long)]
    nat_udp_timeout: Option<u64>,
    /// How long an ended TCP flow stays in the NAT table, seconds.
    #[arg(long)]
    nat_tcp_closing_timeout: Option<u64>,
    /// Seconds between NAT table garbage collections.
    #[arg(long)]
    nat_gc_interval: Option<u64>,
    /// Capacity of the NAT table, entries (default 131072).
    #[arg(long)]
    nat_max_entries: Option<u32>,
    /// Masqueraded flows one pod may hold at a time, 0 = no limit
    /// (default nat_max_entries / 8).
    #[arg(long)]
    nat_max_per_pod: Option<u32>,
    /// Fragments to the node's stack: each pod's budget refill, bytes per
    /// second, 0 = no budget (default 32768).
    #[arg(long)]
    frag_budget_rate: Option<u64>,
    /// Fragments to the node's stack: each pod's burst, bytes (default
    /// 262144).
    #[arg(long)]
    frag_budget_burst: Option<u64>,
    /// Capacity of the endpoints map, pods (default 16384).
    #[arg(long)]
    max_endpoints: Option<u32>,
    /// Capacity of the routes and peers maps, remote nodes (default 4096).
    #[arg(long)]
    max_routes: Option<u32>,
    /// Capacity of the hostPort map, mappings (default 16384).
    #[arg(long)]
    max_hostports: Option<u32>,
    /// Group allowed to use the API socket (mode 0660; default root only).
    #[arg(long)]
    socket_group: Option<String>,
    /// Load the programs from this eBPF object file instead of the embedded
    /// one: rolls out a rebuilt datapath (a hotfix) without a new rivetd.
    /// The running programs are swapped atomically; the object must define
    /// the maps exactly as this rivetd does, else rivetd refuses to start.
    #[arg(long)]
    ebpf_object: Option<PathBuf>,
    /// Log filter (tracing env-filter syntax); RUST_LOG also works.
    #[arg(long, default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Clone, Copy)]
enum Command {
    /// Load and attach the datapath, then serve the API (default).
    Run,
    /// Load, pin and attach the datapath, print what is attached, and exit
    /// (the datapath keeps running from its pins).
    Load,
    /// Remove everything the agent made on this node: pod veths, links,
    /// programs, maps, pins, records.
    Unload,
}

impl Cli {
    fn file_config(&self) -> Result<FileConfig, AgentError2> {
        let file = match &self.config {
            Some(p) => FileConfig::from_file(p)?,
            None => FileConfig::default(),
        };
        Ok(file.merge(FileConfig {
            node_name: self.node_name.clone(),
            pod_cidr: self.pod_cidr.clone(),
            gateway: self.gateway,
            uplink: self.uplink.clone(),
            mtu: self.mtu,
            netns: self.netns.clone(),
            bpffs: self.bpffs.clone(),
            pin_dir: self.pin_dir.clone(),
            state_dir: self.state_dir.clone(),
            socket: self.socket.clone(),
            metrics_addr: self.metrics_addr.clone(),
            pod_attach: self.pod_attach,
            mode: self.mode,
            cluster_cidr: self.cluster_cidr.clone(),
            vni: self.vni,
            vxlan_port: self.vxlan_port,
            etcd_endpoints: self.etcd_endpoints.clone(),
            etcd_prefix: self.etcd_prefix.clone(),
            etcd_lease_ttl: self.etcd_lease_ttl,
            masquerade: self.masquerade,
            nat_port_range: self.nat_port_range.clone(),
            no_masquerade: self.no_masquerade.clone(),
            nat_tcp_timeout: self.nat_tcp_timeout,
            nat_udp_timeout: self.nat_udp_timeout,
            nat_tcp_closing_timeout: self.nat_tcp_closing_timeout,
            nat_gc_interval: self.nat_gc_interval,
            nat_max_entries: self.nat_max_entries,
            nat_max_per_pod: self.nat_max_per_pod,
            frag_budget_rate: self.frag_budget_rate,
            frag_budget_burst: self.frag_budget_burst,
            max_endpoints: self.max_endpoints,
            max_routes: self.max_routes,
            max_hostports: self.max_hostports,
            socket_group: self.socket_group.clone(),
            ebpf_object: self.ebpf_object.clone(),
        }))
    }
}

/// Every error rivetd can exit with.
#[derive(Debug, thiserror::Error)]
enum AgentError2 {
    #[error(transparent)]
    Config(#[from] rivet::config::ConfigError),
    #[error(transparent)]
    Netns(#[from] rivet::netlink::netns::NetnsError),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cli.log))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rivetd: error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `outer: inner: root`, skipping causes whose text the outer one already carries.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        source = s.source();
    }
    text
}

fn run(cli: &Cli) -> Result<(), AgentError2> {
    let cfg = AgentConfig::resolve(cli.file_config()?)?;
    // setns applies to the calling thread: do it before any other thread
    // (tokio workers) exists, so they all inherit the node namespace.
    if let Some(ns) = &cfg.netns {
        netns::enter(ns)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(AgentError2::Runtime)?;
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => rt.block_on(serve(cfg))?,
        Command::Load => rt.block_on(load(cfg))?,
        Command::Unload => rt.block_on(unload(cfg))?,
    }
    Ok(())
}

/// In cluster mode: registers in etcd and takes the cluster-wide settings
/// and this node's subnet from there.
async fn register(cfg: &mut AgentConfig) -> Result<Option<EtcdCluster>, AgentError> {
    let Some(settings) = cfg.etcd.clone() else {
        return Ok(None);
    };
    let node_ip = agent::uplink_ipv4(cfg).await?.ok_or(AgentError::NoNodeIp)?;
    rivet::store::create_private_dir(&cfg.state_dir)?;
    let cluster = EtcdCluster::register(
        &settings,
        node_ip,
        (cfg.cluster_cidr, cfg.mode, cfg.vni, cfg.vxlan_port),
        &cfg.state_dir,
    )
    .await?;
    let reg = cluster.registration();
    cfg.cluster_cidr = reg.network;
    cfg.mode = reg.mode;
    cfg.vni = reg.vni;
    cfg.vxlan_port = reg.port;
    cfg.pod_cidr = reg.subnet;
    Ok(Some(cluster))
}

async fn serve(mut cfg: AgentConfig) -> Result<(), AgentError> {
    agent::preflight(&cfg).await?;
    let (lock, dp) = agent::prepare(&cfg)?;
    let etcd = register(&mut cfg).await?;
    let socket = cfg.socket.clone();
    let pod_cidr = cfg.pod_cidr;
    let agent = Arc::new(Agent::start(cfg, lock, dp, pod_cidr).await?);
    if let Some(cluster) = etcd {
        tokio::spawn(cluster.run(Arc::clone(&agent)));
    }
    let nat_collector = tokio::spawn(Arc::clone(&agent).collect_nat());
    let events = {
        let hub = Arc::clone(agent.events());
        tokio::spawn(async move {
            if let Err(e) = hub.run().await {
                tracing::warn!(error = %e, "datapath events stopped");
            }
        })
    };
    let metrics = match agent.config().metrics_addr {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| AgentError::Metrics { addr, source })?;
            tracing::info!(%addr, "serving metrics, /healthz, /readyz");
            Some(tokio::spawn(rivet::server::metrics::serve(
                Arc::clone(&agent),
                listener,
            )))
        }
        None => None,
    };
    let listener = rivet::server::bind(&socket, agent.config().socket_group.as_deref())?;
    tracing::info!(socket = %socket.display(), "serving");

    let reconciler = {
        let agent = Arc::clone(&agent);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RECONCILE_INTERVAL);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(e) = agent.reconcile().await {
                    tracing::warn!(error = %e, "reconcile");
                    agent.note_error(format!("reconcile: {e}"));
                }
            }
        })
    };
    rivet::server::serve(Arc::clone(&agent), listener, shutdown_signal()).await;
    reconciler.abort();
    nat_collector.abort();
    events.abort();
    if let Some(m) = metrics {
        m.abort();
    }
    agent.quiesce().await;
    let _ = std::fs::remove_file(&socket);
    tracing::info!("stopped; the datapath stays attached through its pins");
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
}

async fn load(mut cfg: AgentConfig) -> Result<(), AgentError> {
    agent::preflight(&cfg).await?;
    let (lock, dp) = agent::prepare(&cfg)?;
    register(&mut cfg).await?;
    let pin_dir = cfg.pin_dir.clone();
    let pod_cidr = cfg.pod_cidr;
    let agent = Agent::start(cfg, lock, dp, pod_cidr).await?;
    drop(agent);
    let layout = PinLayout::new(&pin_dir);
    println!("pinned under {}:", pin_dir.display());
    for dir in [layout.maps_dir(), layout.progs_dir(), layout.links_dir()] {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        for n in names {
            println!("  {}", dir.join(n).display());
        }
    }
    println!("attached:");
    for l in datapath::links(&layout)? {
        println!(
            "  {} {} -> {} (program id {}, link id {})",
            l.interface,
            l.hook.as_str(),
            l.program,
            l.program_id,
            l.link_id
        );
    }
    Ok(())
}

async fn unload(cfg: AgentConfig) -> Result<(), AgentError> {
    let layout = PinLayout::new(&cfg.pin_dir);
    let _lock = if cfg.pin_dir.exists() {
        Some(layout.lock()?)
    } else {
        None
    };
    let nl = rivet::netlink::Netlink::connect()?;
    if let Some(settings) = &cfg.etcd {
        match rivet::cluster::etcd::leave(settings, &cfg.state_dir).await {
            Ok(Some(subnet)) => println!("left the cluster (deleted the lease of {subnet})"),
            Ok(None) => {}
            Err(e) => eprintln!("rivetd: warning: could not deregister from etcd: {e}"),
        }
    }
    let records = cfg.state_dir.join("endpoints");
    if records.exists() {
        let store = rivet::store::RecordDir::open(&records)?;
        let (eps, _) = store.load_all::<rivet_api::Endpoint>()?;
        for (_, ep) in eps {
            if let Some(link) = nl.link_by_name(&ep.host_ifname).await? {
                nl.delete_link(link.index, &ep.host_ifname).await?;
                println!("deleted {} ({} {})", ep.host_ifname, ep.container_id, ep.ip);
            }
        }
    }
    datapath::unload(&layout)?;
    println!("removed {}", cfg.pin_dir.display());
    for dev in rivet::cluster::node::remove_devices(&nl).await? {
        println!("deleted {dev}");
    }
    if cfg.state_dir.exists() {
        std::fs::remove_dir_all(&cfg.state_dir).map_err(|source| rivet::store::StoreError {
            what: "removing",
            path: cfg.state_dir.clone(),
            source,
        })?;
        println!("removed {}", cfg.state_dir.display());
    }
    if cfg.socket.exists() && std::os::unix::net::UnixStream::connect(&cfg.socket).is_err() {
        let _ = std::fs::remove_file(&cfg.socket);
    }
    Ok(())
}
