//! A real container runtime on rivet: podman (Debian 4.3, CNI backend, runc,
//! cgroupfs) runs containers from a local busybox rootfs on rivet's conflist,
//! inside a node namespace. The containers get their addresses from the
//! agent and reach each other through the BPF datapath; removing them runs
//! DEL and leaves nothing behind.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use rivet_tests::World;

/// podman with a private configuration, storage and run directory, inside
/// the node's network namespace (`nsenter --net`, not `ip netns exec`, which
/// remounts /sys and hides the cgroups from runc).
struct Podman {
    node_ns: PathBuf,
    conf: PathBuf,
    storage: PathBuf,
    names: Vec<String>,
}

impl Podman {
    fn new(dir: &Path, node_ns: &Path, socket: &Path) -> Self {
        let net_d = dir.join("net.d");
        std::fs::create_dir_all(&net_d).expect("net.d");
        let conflist = rivet::install::conflist("rivet", socket);
        std::fs::write(net_d.join("10-rivet.conflist"), conflist.to_string()).expect("conflist");
        let plugin_dir = rivet_tests::cni_bin()
            .parent()
            .map(Path::to_path_buf)
            .expect("bin dir");
        let conf = dir.join("containers.conf");
        std::fs::write(
            &conf,
            format!(
                "[containers]\n\
                 default_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n\
                 [engine]\n\
                 runtime = \"runc\"\n\
                 cgroup_manager = \"cgroupfs\"\n\
                 events_logger = \"file\"\n\
                 [network]\n\
                 network_backend = \"cni\"\n\
                 cni_plugin_dirs = [\"{}\", \"/usr/lib/cni\"]\n\
                 network_config_dir = \"{}\"\n\
                 default_network = \"rivet\"\n",
                plugin_dir.display(),
                net_d.display()
            ),
        )
        .expect("containers.conf");
        let storage = dir.join("storage.conf");
        std::fs::write(
            &storage,
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                dir.join("graph").display(),
                dir.join("run").display()
            ),
        )
        .expect("storage.conf");
        Self {
            node_ns: node_ns.to_owned(),
            conf,
            storage,
            names: Vec::new(),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg(format!("--net={}", self.node_ns.display()))
            .args(["--", "podman", "--network-backend", "cni"])
            .args(args)
            .env("CONTAINERS_CONF", &self.conf)
            .env("CONTAINERS_STORAGE_CONF", &self.storage)
            .stdin(Stdio::null())
            .output()
            .expect("podman")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = self.run(&["rm", "-f", "-t", "0", n]);
        }
    }
}

fn busybox_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    for d in ["bin", "proc", "sys", "dev", "etc", "tmp"] {
        std::fs::create_dir_all(root.join(d)).expect("rootfs dir");
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("busybox-static");
    for applet in ["sh", "ip", "ping", "sleep", "nc", "cat"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).expect("applet link");
    }
    root
}

#[test]
fn podman_containers_get_addresses_and_talk() {
    // `cargo xtask setup` installs all three: a missing one is a broken
    // machine, not a reason to pass without running a container.
    let mut missing: Vec<&str> = ["podman", "runc"]
        .into_iter()
        .filter(|p| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {p}")])
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if !Path::new("/bin/busybox").exists() {
        missing.push("busybox-static (/bin/busybox)");
    }
    assert!(
        missing.is_empty(),
        "not installed: {}; `cargo xtask setup` installs them",
        missing.join(", ")
    );
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let dir = w.dir().join("podman");
    std::fs::create_dir_all(&dir).expect("dir");
    let rootfs = busybox_rootfs(&dir);
    let rootfs = rootfs.display().to_string();
    let mut podman = Podman::new(&dir, &w.nodes[n].ns.path(), w.nodes[n].agent().socket());
    let srv = format!("{}-srv", w.prefix);
    podman.names.push(srv.clone());

    podman.ok(&[
        "run",
        "-d",
        "--name",
        &srv,
        "--network",
        "rivet",
        "--rootfs",
        &rootfs,
        "/bin/sleep",
        "60",
    ]);
    let srv_ip = podman.ok(&["inspect", "-f", "{{.NetworkSettings.IPAddress}}", &srv]);
    assert!(
        srv_ip.starts_with(&format!("10.{}.{}.", w.k, n + 1)),
        "server address {srv_ip} is from the node's pod CIDR {}",
        w.nodes[n].pod_cidr
    );
    // A second container reaches the first through rivet, and the node.
    let out = podman.ok(&[
        "run",
        "--rm",
        "--network",
        "rivet",
        "--rootfs",
        &rootfs,
        "/bin/sh",
        "-c",
        &format!(
            "ip -4 addr show eth0; ping -c 2 -W 2 {srv_ip} && ping -c 1 -W 2 {}",
            w.nodes[n].ip
        ),
    ]);
    assert!(
        out.contains("2 packets received"),
        "container to container: {out}"
    );
    assert!(
        out.contains("1 packets received"),
        "container to node: {out}"
    );
    // The server container reaches the node too (exec into it).
    let out = podman.ok(&[
        "exec",
        &srv,
        "/bin/ping",
        "-c",
        "1",
        "-W",
        "2",
        &w.nodes[n].ip.to_string(),
    ]);
    assert!(out.contains("1 packets received"), "{out}");

    // The agent knows the running container; removing it runs DEL.
    let eps = w.nodes[n]
        .agent()
        .client()
        .call(&rivet_api::Request::EndpointList {});
    let Ok(rivet_api::Response::Endpoints { endpoints }) = eps else {
        panic!("{eps:?}");
    };
    assert_eq!(
        endpoints.len(),
        1,
        "only the running container: {endpoints:?}"
    );
    assert_eq!(endpoints[0].ip.to_string(), srv_ip);
    podman.ok(&["rm", "-f", "-t", "0", &srv]);
    podman.names.clear();
    w.nodes[n].assert_no_pod_state("after podman rm");
}
