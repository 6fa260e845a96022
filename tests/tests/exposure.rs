//! Permissions and exposure: what a non-root user, a group member and a pod
//! can reach of a running agent. Non-root users are played by `setpriv` as
//! `nobody` (uid/gid 65534); nothing is added to the machine's user or
//! group databases.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr},
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use rivet_api::PortMapping;
use rivet_tests::{
    Netns, World, bin,
    metrics::METRICS_PORT,
    traffic::{connect, listen},
};

const NOBODY: &str = "65534";
/// An existing system group (Debian's `daemon`), used as the socket group.
const GROUP: &str = "daemon";
const GROUP_ID: u32 = 1;

/// Runs `cmd` as nobody, with `groups` as supplementary groups.
fn as_nobody(groups: &[u32], cmd: &[&std::ffi::OsStr]) -> Output {
    let mut c = Command::new("setpriv");
    c.args(["--reuid", NOBODY, "--regid", NOBODY]);
    if groups.is_empty() {
        c.arg("--clear-groups");
    } else {
        let list: Vec<String> = groups.iter().map(u32::to_string).collect();
        c.arg("--groups").arg(list.join(","));
    }
    c.arg("--").args(cmd).stdin(Stdio::null());
    c.output().expect("setpriv")
}

fn rivetctl_status_as_nobody(socket: &Path, groups: &[u32]) -> Output {
    let ctl = bin("rivetctl");
    as_nobody(
        groups,
        &[
            ctl.as_os_str(),
            "--socket".as_ref(),
            socket.as_os_str(),
            "status".as_ref(),
        ],
    )
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Every path below `dir` (files and directories), recursively.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

fn sysctl(ns: &Netns, key: &str) -> String {
    ns.run("sysctl", &["-n", key]).trim().to_owned()
}

#[test]
fn state_socket_and_pins_are_root_only() {
    let mut w = World::new();
    let n = w.add_node();
    // A socket directory of the agent's own (it creates it).
    w.nodes[n].agent_args.socket = w.dir().join("run-n1").join("rivetd.sock");
    w.start_agent(n);
    let p = w.add_pod_with_ports(
        n,
        vec![PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: rivet_api::Protocol::Tcp,
            host_ip: None,
        }],
    );
    let args = w.nodes[n].agent().args().clone();
    let pin_dir = args.pin_dir();

    // Directories 0700, everything in them unreadable to others, root's.
    for dir in [&args.state_dir, &pin_dir] {
        assert_eq!(mode(dir), 0o700, "{}", dir.display());
        let entries = walk(dir);
        assert!(!entries.is_empty(), "{} is empty", dir.display());
        for e in entries {
            let m = std::fs::symlink_metadata(&e).expect("metadata");
            assert_eq!(m.uid(), 0, "{} owned by root", e.display());
            assert_eq!(
                m.permissions().mode() & 0o077,
                0,
                "{} is private (mode {:o})",
                e.display(),
                m.permissions().mode() & 0o7777
            );
        }
    }
    let lease_files: Vec<PathBuf> = walk(&args.state_dir)
        .into_iter()
        .filter(|p| p.is_file())
        .collect();
    assert!(!lease_files.is_empty(), "the pod's records exist");
    for f in &lease_files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    assert_eq!(mode(&args.socket), 0o600, "API socket");
    let sock_dir = args.socket.parent().expect("socket dir");
    assert_eq!(mode(sock_dir), 0o700, "the agent's own socket directory");

    // nobody: no API, no pins, no records.
    let out = rivetctl_status_as_nobody(&args.socket, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "nobody used the API");
    assert!(err.contains("ermission denied"), "{err}");
    for target in [pin_dir.join("maps"), lease_files[0].clone()] {
        let out = as_nobody(&[], &["cat".as_ref(), target.as_os_str()]);
        assert!(!out.status.success(), "nobody read {}", target.display());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("ermission denied"),
            "{}: {}",
            target.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // A pod reaches neither the metrics port (loopback of the node
    // namespace only) nor anything on 127.0.0.1 of the node.
    let pod = &w.pods[p].ns;
    for ip in [w.nodes[n].ip, Ipv4Addr::new(169, 254, 1, 1)] {
        let r = connect(
            pod,
            SocketAddr::from((ip, METRICS_PORT)),
            Duration::from_secs(2),
        );
        assert!(r.is_err(), "pod reached the metrics port at {ip}");
    }

    // route_localnet stays 0 on every interface of the node, hostPorts and
    // the node's own sockets to them notwithstanding.
    let node = &w.nodes[n].ns;
    let _server = listen(pod, 80);
    connect(
        node,
        SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)),
        Duration::from_secs(5),
    )
    .expect("the node's own socket reaches its hostPort through 127.0.0.1");
    let conf = node.run("ls", &["/proc/sys/net/ipv4/conf"]);
    let ifaces: Vec<&str> = conf.split_whitespace().collect();
    assert!(ifaces.contains(&"all") && ifaces.len() > 3, "{ifaces:?}");
    for iface in ifaces {
        assert_eq!(
            sysctl(node, &format!("net.ipv4.conf.{iface}.route_localnet")),
            "0",
            "route_localnet on {iface}"
        );
    }
}

#[test]
fn socket_group_members_may_use_the_api_others_not() {
    let mut w = World::new();
    let n = w.add_node();
    let socket = w.dir().join("run-n1").join("rivetd.sock");
    w.nodes[n].agent_args.socket = socket.clone();
    w.nodes[n].agent_args.extra_args = vec!["--socket-group".into(), GROUP.into()];
    w.start_agent(n);

    let meta = std::fs::metadata(&socket).expect("socket");
    assert_eq!((mode(&socket), meta.gid()), (0o660, GROUP_ID));
    let dir = socket.parent().expect("dir");
    let dmeta = std::fs::metadata(dir).expect("dir");
    assert_eq!((mode(dir), dmeta.gid()), (0o710, GROUP_ID));

    let member = rivetctl_status_as_nobody(&socket, &[GROUP_ID]);
    assert!(
        member.status.success(),
        "a member of {GROUP} uses the API: {}",
        String::from_utf8_lossy(&member.stderr)
    );
    assert!(String::from_utf8_lossy(&member.stdout).contains("ready: yes"));
    let other = rivetctl_status_as_nobody(&socket, &[]);
    assert!(!other.status.success(), "a non-member used the API");
    assert!(
        String::from_utf8_lossy(&other.stderr).contains("ermission denied"),
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );
}

#[test]
fn a_shared_socket_directory_keeps_its_mode() {
    // Two shared directories a socket may be put in: a /run-like 0755 one
    // and a /tmp-like sticky 1777 one, with and without the socket group.
    for (dir_mode, group) in [(0o755, false), (0o1777, true)] {
        let mut w = World::new();
        let n = w.add_node();
        let shared = w.dir().join(format!("shared-{dir_mode:o}"));
        std::fs::create_dir(&shared).expect("shared dir");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(dir_mode))
            .expect("chmod");
        let gid_before = std::fs::metadata(&shared).expect("stat").gid();
        let socket = shared.join("rivetd.sock");
        w.nodes[n].agent_args.socket = socket.clone();
        if group {
            w.nodes[n].agent_args.extra_args = vec!["--socket-group".into(), GROUP.into()];
        }
        w.start_agent(n);

        let meta = std::fs::metadata(&shared).expect("stat shared dir");
        assert_eq!(
            (meta.permissions().mode() & 0o7777, meta.gid()),
            (dir_mode, gid_before),
            "the agent changed the mode or group of the shared directory {}",
            shared.display()
        );
        let want = if group { 0o660 } else { 0o600 };
        assert_eq!(mode(&socket), want, "the socket itself is restricted");
        let other = rivetctl_status_as_nobody(&socket, &[]);
        assert!(!other.status.success(), "a non-member used the API");
    }
}

#[test]
fn hostports_match_only_the_nodes_own_addresses() {
    let mut w = World::new();
    let n = w.add_node();
    // The outside host reaches pod addresses directly (routed pod IPs, as
    // with BGP); its replies must keep the pod's address, so its subnet is
    // not masqueraded.
    let underlay = format!("192.168.{}.0/24", w.k);
    w.nodes[n].agent_args.extra_args = vec!["--no-masquerade".into(), underlay];
    w.start_agent(n);
    let p = w.add_pod_with_ports(
        n,
        vec![PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: rivet_api::Protocol::Tcp,
            host_ip: None,
        }],
    );
    let pod_ip = w.pods[p].ip;
    let node_ip = w.nodes[n].ip;
    let pod_cidr = w.nodes[n].pod_cidr.clone();
    let out = w.add_outside();
    // The outside host routes the pod CIDR through the node: transit.
    out.ip(&["route", "add", &pod_cidr, "via", &node_ip.to_string()]);
    let out = w.outside.as_ref().expect("outside");
    let pod = &w.pods[p].ns;
    let _servers = [marker_server(pod, 80), marker_server(pod, 8080)];

    // To the node's address: translated to the pod's port 80.
    assert_eq!(ask(out, SocketAddr::from((node_ip, 8080))), 80);
    // Transit to the pod's own address on the hostPort's number: not
    // translated — the pod's own port 8080 answers.
    assert_eq!(ask(out, SocketAddr::from((pod_ip, 8080))), 8080);
}

/// A server in `ns` on `port` answering every connection with its port
/// number (two bytes); stops when the returned listener handle drops.
fn marker_server(ns: &Netns, port: u16) -> std::thread::JoinHandle<()> {
    let l = listen(ns, port);
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let _ = c.write_all(&port.to_be_bytes());
        }
    })
}

/// Which server answers at `dst` from `ns`.
fn ask(ns: &Netns, dst: SocketAddr) -> u16 {
    let mut c = connect(ns, dst, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connecting to {dst}: {e}"));
    c.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut b = [0; 2];
    c.read_exact(&mut b)
        .unwrap_or_else(|e| panic!("reading from {dst}: {e}"));
    u16::from_be_bytes(b)
}
