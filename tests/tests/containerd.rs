//! containerd (Debian 1.6, CRI plugin, runc, cgroupfs) on rivet, driven
//! through its CRI gRPC API the way kubelet drives it: a private containerd
//! in a node namespace reads rivet's conflist (as `rivetctl install` writes
//! it), runs pod sandboxes from locally built images and calls rivet-cni
//! with its own conventions — capability args with Go field names
//! (`{"HostPort":…,"ContainerPort":…,"Protocol":"tcp","HostIP":""}`),
//! `CNI_ARGS` with the K8S_POD_* keys, netns under its state directory. A
//! hostPort pod must come up, answer on its address and on the node's
//! hostPort (from the outside, from another pod), be recorded with its
//! Kubernetes identity, and StopPodSandbox (twice) must run a DEL that
//! leaves no veth, record or hostPort behind.

use std::{
    collections::HashMap,
    io::Read,
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use rivet_api::{Endpoint, PodMeta, PortMapping, PortmapEntry, Protocol, Request, Response};
use rivet_tests::{
    Netns, Node, World,
    cri::{Containerd, ContainerdOptions, api, images},
};

/// The image of every container and of the sandboxes (`sleep` by default).
const IMAGE: &str = "rivet.test/busybox:1";
const HOST_PORT: u16 = 18080;
const CONTAINER_PORT: u16 = 8080;
const POD_NAMESPACE: &str = "rivet-e2e";
/// The reference loopback plugin, which containerd runs for the pod's `lo`.
const LOOPBACK: &str = "/usr/lib/cni/loopback";

/// Every tool the test needs; a missing one fails the test.
fn require_tools() {
    for tool in [
        "containerd",
        "ctr",
        "runc",
        "nsenter",
        "tar",
        "gzip",
        "sha256sum",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "{tool} not installed (cargo xtask setup installs it)"
        );
    }
    for file in [images::BUSYBOX, LOOPBACK] {
        assert!(
            Path::new(file).exists(),
            "{file} missing (cargo xtask setup installs busybox-static and containernetworking-plugins)"
        );
    }
}

/// containerd's CNI bin dir: rivet-cni and the loopback plugin.
fn cni_bin_dir(dir: &Path) -> PathBuf {
    let bin = dir.join("cni-bin");
    std::fs::create_dir_all(&bin).expect("cni bin dir");
    let cni = std::fs::canonicalize(rivet_tests::cni_bin()).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (build it: cargo build -p rivet-cni)",
            rivet_tests::cni_bin().display()
        )
    });
    std::os::unix::fs::symlink(&cni, bin.join("rivet-cni")).expect("rivet-cni link");
    std::os::unix::fs::symlink(LOOPBACK, bin.join("loopback")).expect("loopback link");
    bin
}

fn sandbox_config(
    name: &str,
    uid: &str,
    ctrd: &Containerd,
    log_dir: &Path,
    port_mappings: Vec<api::PortMapping>,
) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: POD_NAMESPACE.into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.join(name).display().to_string(),
        port_mappings,
        labels: HashMap::from([("app".to_owned(), name.to_owned())]),
        annotations: HashMap::new(),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: ctrd.cgroup_parent().into(),
        }),
    }
}

fn container_config(name: &str, command: &[&str]) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: IMAGE.into(),
        }),
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        args: Vec::new(),
        log_path: format!("{name}.log"),
    }
}

/// Runs a sandbox and one container in it; returns (sandbox ID, container ID).
fn run_pod(
    ctrd: &Containerd,
    config: &api::PodSandboxConfig,
    container: &str,
    command: &[&str],
) -> (String, String) {
    let cri = ctrd.cri();
    let name = config
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    let t = Instant::now();
    let sandbox = cri
        .run_pod_sandbox(config.clone())
        .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {:?}: {}", e.code(), e.message()));
    eprintln!("RunPodSandbox {name}: {:?}", t.elapsed());
    let id = cri
        .create_container(
            &sandbox,
            container_config(container, command),
            config.clone(),
        )
        .unwrap_or_else(|e| panic!("CreateContainer {container} in {name}: {e}"));
    cri.start_container(&id)
        .unwrap_or_else(|e| panic!("StartContainer {container} in {name}: {e}"));
    (sandbox, id)
}

fn sandbox_ip(ctrd: &Containerd, sandbox: &str) -> Ipv4Addr {
    let status = ctrd
        .cri()
        .pod_sandbox_status(sandbox)
        .unwrap_or_else(|e| panic!("PodSandboxStatus {sandbox}: {e}"));
    assert_eq!(
        status.state,
        api::PodSandboxState::SandboxReady as i32,
        "sandbox {sandbox} ready: {status:?}"
    );
    let ip = status.network.map(|n| n.ip).unwrap_or_default();
    ip.parse()
        .unwrap_or_else(|e| panic!("sandbox {sandbox} address {ip:?}: {e}"))
}

/// Connects from `ns` to `dst` and reads until the server closes.
fn fetch(ns: &Netns, dst: SocketAddr) -> std::io::Result<String> {
    ns.exec(move || {
        let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
}

/// Waits (10 s at most) until the server at `dst` answers "hi" to `ns`.
fn assert_answers(ns: &Netns, dst: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = fetch(ns, dst);
        if matches!(&r, Ok(s) if s == "hi\n") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {dst} from {} did not answer \"hi\" within 10 s: {r:?}",
            ns.name()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs `nc dst port` inside a container (ExecSync) and asserts "hi".
fn assert_answers_in_container(ctrd: &Containerd, container: &str, dst: SocketAddr, what: &str) {
    let (ip, port) = (dst.ip().to_string(), dst.port().to_string());
    let cmd = ["timeout", "5", "nc", ip.as_str(), port.as_str()];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = ctrd.cri().exec_sync(container, &cmd, 10);
        let ok = matches!(&r, Ok(out) if out.exit_code == 0 && out.stdout == b"hi\n");
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {cmd:?} in container {container} did not print \"hi\" within 10 s: {}",
            match r {
                Ok(out) => format!(
                    "exit {} stdout {:?} stderr {:?}",
                    out.exit_code,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
                Err(e) => e.to_string(),
            }
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The test's scratch directory, removed on drop unless something is still
/// mounted under it (then left, with a warning).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let mounts = rivet_tests::cri::mounts_under(&self.0);
        if mounts.is_empty() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            eprintln!("warning: leaving {}: mounts {mounts:?}", self.0.display());
        }
    }
}

fn endpoints(node: &Node) -> Vec<Endpoint> {
    match node.agent().client().call(&Request::EndpointList {}) {
        Ok(Response::Endpoints { endpoints }) => endpoints,
        other => panic!("endpoint list of {}: {other:?}", node.name),
    }
}

fn portmaps(node: &Node) -> Vec<PortmapEntry> {
    match node.agent().client().call(&Request::PortmapList {}) {
        Ok(Response::Portmaps { mappings }) => mappings,
        other => panic!("portmap list of {}: {other:?}", node.name),
    }
}

/// `tc class show` output `shown` has the shaper's rate class at the
/// frame rate that passes `rate` bits/s of IP packets on a link of `mtu`
/// (tc prints it rounded to its unit: within 0.1 %).
fn assert_rate(shown: &str, rate: u64, mtu: u32, what: &str) {
    let want = rivet::endpoint::bandwidth::frame_rate(rate / 8, mtu) * 8;
    let token = shown
        .split("class htb 1:1 root rate ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{what}: no rate class: {shown}"));
    let digits = token.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let scale = match &token[digits.len()..] {
        "bit" => 1.0,
        "Kbit" => 1e3,
        "Mbit" => 1e6,
        "Gbit" => 1e9,
        unit => panic!("{what}: rate {token}: unit {unit:?}"),
    };
    let shown_bits = digits
        .parse::<f64>()
        .unwrap_or_else(|e| panic!("{what}: rate {token}: {e}"))
        * scale;
    let ratio = shown_bits / want as f64;
    assert!(
        (0.999..=1.001).contains(&ratio),
        "{what}: rate {token}, want {want} bit/s: {shown}"
    );
}

/// The pod at `ip` (annotated 10M in, 20M out) is recorded with those
/// limits, has its shapers, and sends at 20 Mbit/s.
fn assert_shaped(w: &World, n: usize, ip: Ipv4Addr) {
    let eps = endpoints(&w.nodes[n]);
    let ep = eps
        .iter()
        .find(|e| e.ip == ip)
        .unwrap_or_else(|| panic!("no endpoint for {ip}: {eps:?}"));
    let bw = ep
        .bandwidth
        .as_ref()
        .unwrap_or_else(|| panic!("no bandwidth recorded from the annotations: {ep:?}"));
    eprintln!("containerd's bandwidth capability: {bw:?}");
    assert_eq!(
        (bw.ingress_rate, bw.egress_rate),
        (Some(10_000_000), Some(20_000_000)),
        "{bw:?}"
    );
    assert!(
        bw.ingress_burst.unwrap_or(0) > 0 && bw.egress_burst.unwrap_or(0) > 0,
        "{bw:?}"
    );
    let host = w.nodes[n]
        .ns
        .run("tc", &["class", "show", "dev", &ep.host_ifname]);
    assert_rate(&host, 10_000_000, ep.mtu, "host veth");
    let inside = |args: &[&str]| {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", ep.netns))
            .args(args)
            .output()
            .expect("nsenter");
        assert!(out.status.success(), "{args:?} in the pod: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let pod = inside(&["tc", "class", "show", "dev", &ep.ifname]);
    assert_rate(&pod, 20_000_000, ep.mtu, "pod eth0");
    // 4 s from the pod to the node: the receiver's total within the limit
    // (its first second included, the burst is 10 ms of the rate).
    let _server = ChildOnDrop(
        w.nodes[n]
            .ns
            .command("iperf3")
            .args(["-s", "-1", "-p", "5391"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("iperf3 -s"),
    );
    std::thread::sleep(Duration::from_millis(300));
    let node_ip = w.nodes[n].ip.to_string();
    let json = inside(&["iperf3", "-c", &node_ip, "-p", "5391", "-t", "4", "-J"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("iperf3 JSON");
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| panic!("no receiver total: {json}"));
    assert!(
        (0.8 * 20e6..=1.02 * 20e6).contains(&bps),
        "the annotated pod sent at {bps:.0} bit/s"
    );
}

/// Kills the child on drop.
struct ChildOnDrop(std::process::Child);

impl Drop for ChildOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn containerd_cri_pods_with_host_ports_on_rivet() {
    require_tools();
    let started = Instant::now();
    let mut w = World::new();
    let n = w.add_node_with_agent();
    w.add_outside();
    let node_ip = w.nodes[n].ip;

    // Everything containerd owns lives under its own directory (dropped,
    // unmounted and removed before the world: DEL still reaches the agent).
    let scratch = Scratch(std::env::temp_dir().join(format!("rivet-ctrd-{}", w.prefix)));
    let dir = scratch.0.clone();
    let conf_dir = dir.join("net.d");
    std::fs::create_dir_all(&conf_dir).expect("net.d");
    let conflist = rivet::install::conflist("rivet", w.nodes[n].agent().socket());
    assert_eq!(
        conflist["cniVersion"], "1.0.0",
        "containerd 1.6's libcni reads results up to 1.0.0"
    );
    std::fs::write(conf_dir.join("10-rivet.conflist"), conflist.to_string()).expect("conflist");
    let image = images::busybox_image(&dir.join("image"), IMAGE, &["sleep", "1000000"]);
    let ctrd = Containerd::start(ContainerdOptions {
        netns: w.nodes[n].ns.path(),
        dir: dir.join("containerd"),
        cni_bin_dir: cni_bin_dir(&dir),
        cni_conf_dir: conf_dir,
        sandbox_image: IMAGE.into(),
        cgroup_parent: format!("/rivet-{}", w.prefix),
    });
    let cri = ctrd.cri();
    let version = cri.version().expect("CRI Version");
    assert_eq!(version.runtime_name, "containerd", "{version:?}");
    assert_eq!(version.runtime_api_version, "v1", "{version:?}");
    ctrd.import(&image);
    eprintln!(
        "containerd {} ({} snapshots) up with the image after {:?}",
        version.runtime_version,
        ctrd.snapshotter(),
        started.elapsed()
    );
    let logs = dir.join("logs");

    // A pod with a hostPort, serving "hi" on its container port.
    let web_cfg = sandbox_config(
        "web",
        &format!("{}-web-uid", w.prefix),
        &ctrd,
        &logs,
        vec![api::PortMapping {
            protocol: api::Protocol::Tcp as i32,
            container_port: i32::from(CONTAINER_PORT),
            host_port: i32::from(HOST_PORT),
            host_ip: String::new(),
        }],
    );
    let port = CONTAINER_PORT.to_string();
    let (web, srv) = run_pod(
        &ctrd,
        &web_cfg,
        "srv",
        &["nc", "-ll", "-p", &port, "-e", "echo", "hi"],
    );
    let web_ip = sandbox_ip(&ctrd, &web);
    let cidr: ipnet::Ipv4Net = w.nodes[n].pod_cidr.parse().expect("pod CIDR");
    assert!(
        cidr.contains(&web_ip),
        "pod address {web_ip} from the node's pod CIDR {cidr}"
    );

    // The agent's record: the sandbox ID as container ID, the Kubernetes
    // identity from CNI_ARGS, the hostPort from the capability args.
    let eps = endpoints(&w.nodes[n]);
    let ep = eps
        .iter()
        .find(|e| e.ip == web_ip)
        .unwrap_or_else(|| panic!("no endpoint for {web_ip}: {eps:?}"));
    assert_eq!(ep.container_id, web, "CNI_CONTAINERID is the sandbox ID");
    assert_eq!(
        ep.pod,
        Some(PodMeta {
            namespace: POD_NAMESPACE.into(),
            name: "web".into(),
        }),
        "K8S_POD_NAMESPACE/K8S_POD_NAME from CNI_ARGS"
    );
    assert_eq!(
        ep.port_mappings,
        vec![PortMapping {
            host_port: HOST_PORT,
            container_port: CONTAINER_PORT,
            protocol: Protocol::Tcp,
            host_ip: None,
        }],
        "portMappings with containerd's field names; HostIP \"\" is every node address"
    );
    assert!(
        w.nodes[n].veths().contains(&ep.host_ifname),
        "host veth {} in the node namespace",
        ep.host_ifname
    );

    // Reachable by its address from the node, by the node's hostPort from
    // the outside host.
    assert_answers(
        &w.nodes[n].ns,
        SocketAddr::from((web_ip, CONTAINER_PORT)),
        "node to pod",
    );
    let host_port = SocketAddr::from((node_ip, HOST_PORT));
    let outside = w.outside.as_ref().expect("outside host");
    assert_answers(outside, host_port, "outside to hostPort");

    // A second pod reaches the first by its address and by the hostPort.
    // It carries kubelet's bandwidth annotations, which containerd turns
    // into the CNI `bandwidth` capability.
    let mut client_cfg = sandbox_config(
        "client",
        &format!("{}-client-uid", w.prefix),
        &ctrd,
        &logs,
        vec![],
    );
    client_cfg.annotations.extend([
        (
            "kubernetes.io/ingress-bandwidth".to_owned(),
            "10M".to_owned(),
        ),
        (
            "kubernetes.io/egress-bandwidth".to_owned(),
            "20M".to_owned(),
        ),
    ]);
    let (client, client_ctr) = run_pod(&ctrd, &client_cfg, "sleeper", &["sleep", "1000000"]);
    let client_ip = sandbox_ip(&ctrd, &client);
    assert_shaped(&w, n, client_ip);
    assert_ne!(client_ip, web_ip);
    assert_answers_in_container(
        &ctrd,
        &client_ctr,
        SocketAddr::from((web_ip, CONTAINER_PORT)),
        "pod to pod",
    );
    assert_answers_in_container(&ctrd, &client_ctr, host_port, "pod to hostPort");
    assert_eq!(w.nodes[n].veths().len(), 2, "one veth per sandbox");
    let pm = portmaps(&w.nodes[n]);
    assert!(
        pm.len() == 1
            && pm[0].host_port == HOST_PORT
            && pm[0].pod_ip == web_ip
            && pm[0].container_port == CONTAINER_PORT
            && pm[0].container_id.as_deref() == Some(web.as_str()),
        "the datapath's hostPort table holds the web pod's mapping: {pm:?}"
    );

    // Kubelet's teardown: stop the container, then the sandbox (CNI DEL);
    // the sandbox is stopped more than once; then both are removed.
    cri.stop_container(&srv, 2)
        .unwrap_or_else(|e| panic!("StopContainer srv: {e}"));
    let t = Instant::now();
    cri.stop_pod_sandbox(&web).unwrap_or_else(|e| {
        panic!(
            "StopPodSandbox web (CNI DEL): {:?}: {}",
            e.code(),
            e.message()
        )
    });
    eprintln!("StopPodSandbox web: {:?}", t.elapsed());
    let status = cri
        .pod_sandbox_status(&web)
        .unwrap_or_else(|e| panic!("PodSandboxStatus web after stop: {e}"));
    assert_eq!(
        status.state,
        api::PodSandboxState::SandboxNotready as i32,
        "{status:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(3);
    while w.nodes[n].veths().contains(&ep.host_ifname) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let veths = w.nodes[n].veths();
    assert!(
        !veths.contains(&ep.host_ifname) && veths.len() == 1,
        "after StopPodSandbox web only the client's veth is left: {veths:?}"
    );
    let eps = endpoints(&w.nodes[n]);
    assert!(
        eps.iter().all(|e| e.container_id != web) && eps.len() == 1,
        "after StopPodSandbox web only the client's endpoint is left: {eps:?}"
    );
    assert_eq!(portmaps(&w.nodes[n]), Vec::new(), "hostPort removed by DEL");
    cri.stop_pod_sandbox(&web)
        .unwrap_or_else(|e| panic!("second StopPodSandbox web: {:?}: {}", e.code(), e.message()));
    cri.remove_container(&srv)
        .unwrap_or_else(|e| panic!("RemoveContainer srv: {e}"));
    cri.remove_pod_sandbox(&web)
        .unwrap_or_else(|e| panic!("RemovePodSandbox web: {e}"));
    let r = fetch(outside, host_port);
    assert!(
        r.is_err(),
        "hostPort {host_port} still answers after the pod is gone: {r:?}"
    );

    // The client pod: stopped with its container still running.
    cri.stop_pod_sandbox(&client)
        .unwrap_or_else(|e| panic!("StopPodSandbox client: {:?}: {}", e.code(), e.message()));
    cri.remove_pod_sandbox(&client)
        .unwrap_or_else(|e| panic!("RemovePodSandbox client: {e}"));
    let left = cri.list_pod_sandbox().expect("ListPodSandbox");
    assert!(left.is_empty(), "sandboxes left: {left:?}");
    w.nodes[n].assert_no_pod_state("after both sandboxes are removed");
    drop(ctrd);
    drop(scratch);
    eprintln!("containerd test done in {:?}", started.elapsed());
}
