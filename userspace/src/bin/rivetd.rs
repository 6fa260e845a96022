//! rivetd: the rivet node agent.

use std::{path::PathBuf, process::ExitCode, sync::Arc};

use clap::{Args as _, FromArgMatches as _, Parser, Subcommand};
use rivet::{
    agent::{self, Agent, AgentError, RECONCILE_INTERVAL},
    cluster::{
        etcd::EtcdCluster,
        kubernetes::{
            self,
            node::{OwnNode, Published},
            watch::{self, NodeWatch},
        },
    },
    config::{AgentConfig, FAULT_STEPS, FileConfig, TEST_FAULTS_ENV},
    datapath::{self, pins::PinLayout},
    netlink::netns,
    server::waiting::Waiting,
};

/// jemalloc, not glibc's malloc: see [`rivet::agent::heap`].
#[global_allocator]
static ALLOCATOR: agent::heap::Allocator = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "rivetd",
    version,
    about = "rivet node agent: owns the eBPF datapath of one node",
    long_about = None
)]
struct Cli {
    /// TOML configuration file; flags override its values.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Log filter (tracing env-filter syntax); RUST_LOG also works.
    #[arg(long, default_value = "info")]
    log: String,
    /// Test only: make every endpoint ADD fail at this step. Accepted only
    /// with RIVET_TEST_FAULTS=1 in the environment.
    #[arg(long, hide = true, value_parser = clap::builder::PossibleValuesParser::new(FAULT_STEPS))]
    test_fault_add_at: Option<String>,
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
    /// The file's knobs with the flags given in `matches` over them, then
    /// validated; and the test-only fault, if allowed.
    fn config(&self, matches: &clap::ArgMatches) -> Result<AgentConfig, AgentError2> {
        let file = match &self.config {
            Some(p) => FileConfig::from_file(p)?,
            None => FileConfig::default(),
        };
        let mut cfg = AgentConfig::resolve(file.with_flags(matches)?)?;
        if let Some(step) = &self.test_fault_add_at {
            if std::env::var(TEST_FAULTS_ENV).as_deref() != Ok("1") {
                return Err(AgentError2::TestOnly);
            }
            cfg.fail_add_at = Some(step.clone());
        }
        Ok(cfg)
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
    #[error("--test-fault-add-at is for tests only: it needs {TEST_FAULTS_ENV}=1")]
    TestOnly,
}

fn main() -> ExitCode {
    // Every knob is a flag too (FileConfig: one definition for both); the
    // flags given are read from `matches` over the file's values.
    // (Cli's last, so that its name, version and about are rivetd's.)
    let matches =
        Cli::augment_args(FileConfig::augment_args(clap::Command::new("rivetd"))).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cli.log))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: logs in files and journals stay
        // plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(&cli, &matches) {
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

fn run(cli: &Cli, matches: &clap::ArgMatches) -> Result<(), AgentError2> {
    let cfg = cli.config(matches)?;
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

/// With the Kubernetes source: waits for this node's pod CIDR in its Node
/// object (answering not ready meanwhile), publishes flannel's annotations
/// and the `NetworkUnavailable=False` condition on the Node, and returns what
/// the Node watch needs, and the not-ready answers (still answering,
/// "starting", until the agent's own socket and port take over).
async fn register_kube(cfg: &mut AgentConfig) -> Result<Option<(NodeWatch, Waiting)>, AgentError> {
    let Some(settings) = cfg.kubernetes.clone() else {
        return Ok(None);
    };
    let node_ip = agent::uplink_ipv4(cfg).await?.ok_or(AgentError::NoNodeIp)?;
    let client = kubernetes::connect(&settings).await?;
    let own = OwnNode::new(client, &cfg.node_name);
    let waiting = Waiting::start(cfg, format!("reading Node {}", cfg.node_name)).await?;
    let (pod_cidr, node) = own
        .wait_for_pod_cidr(cfg.cluster_cidr, &|why| waiting.say(why))
        .await;
    waiting.say(format!("starting with pod CIDR {pod_cidr}"));
    let published = Published {
        mode: cfg.mode,
        vni: cfg.vni,
        port: cfg.vxlan_port,
        node_ip,
        vtep_mac: rivet::cluster::node::vtep_mac_for(node_ip),
    };
    if let Err(e) = own.publish(&published, &node).await {
        // The Node watch publishes again when it sees them missing.
        tracing::warn!(error = %e, "publishing the Node's annotations");
    }
    if let Err(e) = own.set_network_available().await {
        tracing::warn!(error = %e, "setting the Node's NetworkUnavailable condition");
    }
    tracing::info!(node = %cfg.node_name, %pod_cidr, "pod CIDR from the Node object");
    cfg.pod_cidr = pod_cidr;
    let watch = NodeWatch {
        node_name: cfg.node_name.clone(),
        published,
        default_vni: cfg.vni,
    };
    Ok(Some((watch, waiting)))
}

async fn serve(mut cfg: AgentConfig) -> Result<(), AgentError> {
    agent::preflight(&cfg).await?;
    let (lock, dp) = agent::prepare(&cfg)?;
    let etcd = register(&mut cfg).await?;
    let kube = register_kube(&mut cfg).await?;
    let kube_settings = cfg.kubernetes.clone();
    let socket = cfg.socket.clone();
    let pod_cidr = cfg.pod_cidr;
    let agent = Arc::new(Agent::start(cfg, lock, dp, pod_cidr).await?);
    if let Some(cluster) = etcd {
        tokio::spawn(cluster.run(Arc::clone(&agent)));
    }
    let (kube, waiting) = kube.unzip();
    if let Some(waiting) = waiting {
        // The agent's own socket and port are bound next.
        waiting.stop().await;
    }
    let mut watches = Vec::new();
    if let (Some(settings), Some(node_watch)) = (kube_settings, kube) {
        watches.push(tokio::spawn(watch::nodes(
            settings.clone(),
            node_watch,
            Arc::clone(&agent),
        )));
        watches.push(tokio::spawn(watch::objects(settings, Arc::clone(&agent))));
    }
    let nat_collector = tokio::spawn(Arc::clone(&agent).collect_nat());
    let bgp = tokio::spawn(Arc::clone(&agent).run_bgp());
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
    // The speaker keeps running: peers keep this node's routes while
    // the agent restarts.
    bgp.abort();
    for w in &watches {
        w.abort();
    }
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
    if let Some((_, waiting)) = register_kube(&mut cfg).await? {
        waiting.stop().await;
    }
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
    if rivet::cluster::bgp::bird::Bird::stop(&rivet::cluster::bgp::paths(&cfg.state_dir)) {
        println!("stopped the BGP speaker (its peers withdraw this node's routes)");
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
