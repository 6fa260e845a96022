//! Running rivet as a node service: the shipped systemd unit, example
//! configuration and Kubernetes DaemonSet are checked for what a real node
//! needs (no cluster runs here, so the manifest is parsed, not applied),
//! and `rivetctl install` → agent → `rivetctl uninstall` leaves the node
//! exactly as before.

use std::{
    collections::BTreeSet,
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use rivet::config::FileConfig;
use rivet_tests::{Netns, World, bin};
use yaml_rust2::{Yaml, YamlLoader};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every key FileConfig accepts, from serde's own "expected one of" list.
fn config_keys() -> BTreeSet<String> {
    let err = FileConfig::from_toml("no_such_key_at_all = 1").expect_err("unknown key refused");
    let list = err
        .split_once("expected one of")
        .unwrap_or_else(|| panic!("no key list in {err:?}"))
        .1;
    // `a`, `b`, ... (in `the input`): the quoted names, not the input.
    list.split('`')
        .skip(1)
        .step_by(2)
        .filter(|k| !k.contains(' '))
        .map(str::to_owned)
        .collect()
}

#[test]
fn example_config_documents_every_option_with_valid_values() {
    let text = read("deploy/rivet.toml");
    // Uncommented, every example line must be accepted by the agent.
    let mut keys = BTreeSet::new();
    let uncommented: String = text
        .lines()
        .filter_map(|l| {
            let line = l.strip_prefix("# ")?;
            let (key, _) = line.split_once(" = ")?;
            if !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                return None;
            }
            keys.insert(key.to_owned());
            Some(format!("{line}\n"))
        })
        .collect();
    FileConfig::from_toml(&uncommented)
        .unwrap_or_else(|e| panic!("the example's values are refused: {e}\n{uncommented}"));
    assert_eq!(keys, config_keys(), "every option, once, in the example");
    // As shipped (all commented) it is a valid, empty configuration.
    FileConfig::from_toml(&text).expect("the example parses");
}

#[test]
fn systemd_unit_runs_the_agent_from_its_config() {
    let unit = read("deploy/rivetd.service");
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in the unit"))
    };
    assert_eq!(
        value("ExecStart"),
        "/usr/local/bin/rivetd --config /etc/rivet/rivet.toml"
    );
    assert_eq!(value("KillSignal"), "SIGTERM");
    assert_eq!(value("Restart"), "always");
    assert_eq!(value("WantedBy"), "multi-user.target");
    assert!(unit.contains("[Unit]") && unit.contains("[Service]") && unit.contains("[Install]"));
}

fn find<'a>(list: &'a Yaml, name: &str) -> &'a Yaml {
    list.as_vec()
        .and_then(|v| v.iter().find(|i| i["name"].as_str() == Some(name)))
        .unwrap_or_else(|| panic!("no {name:?} in {list:?}"))
}

#[test]
fn daemonset_mounts_what_a_node_needs() {
    let docs = YamlLoader::load_from_str(&read("deploy/daemonset.yaml")).expect("valid YAML");
    let ds = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("DaemonSet"))
        .expect("a DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"].as_bool(), Some(true), "host network");
    let agent = find(&pod["containers"], "rivetd");
    assert_eq!(
        agent["securityContext"]["privileged"].as_bool(),
        Some(true),
        "BPF and netns work need privileges"
    );
    // Each host directory a node needs: a hostPath volume, mounted at the
    // same path in the agent.
    for (path, propagation) in [
        ("/sys/fs/bpf", Some("Bidirectional")),
        ("/sys/fs/cgroup", None),
        ("/opt/cni/bin", None),
        ("/etc/cni/net.d", None),
        ("/run/rivet", None),
        ("/var/lib/rivet", None),
        ("/run/netns", Some("HostToContainer")),
    ] {
        let volume = pod["volumes"]
            .as_vec()
            .and_then(|v| {
                v.iter()
                    .find(|v| v["hostPath"]["path"].as_str() == Some(path))
            })
            .unwrap_or_else(|| panic!("no hostPath volume for {path}"));
        let name = volume["name"].as_str().expect("volume name");
        let mount = find(&agent["volumeMounts"], name);
        assert_eq!(mount["mountPath"].as_str(), Some(path), "{name}");
        assert_eq!(
            mount["mountPropagation"].as_str(),
            propagation,
            "{name} propagation"
        );
    }
    // The CNI files are installed by an init container into the host's
    // directories; the probes use the agent's health endpoints.
    let init = find(&pod["initContainers"], "install-cni");
    let cmd: Vec<&str> = init["command"]
        .as_vec()
        .expect("command")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    assert!(cmd.contains(&"install-cni"), "{cmd:?}");
    assert_eq!(
        agent["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert_eq!(
        agent["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    // The configuration it carries is one the agent accepts.
    let cm = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("ConfigMap"))
        .expect("a ConfigMap");
    FileConfig::from_toml(cm["data"]["rivet.toml"].as_str().expect("rivet.toml"))
        .expect("the ConfigMap's rivet.toml is valid");
}

/// What the node namespace looks like: links, addresses, routes, tc
/// filters and BPF attachments of every kind.
fn node_view(ns: &Netns) -> Vec<String> {
    let mut view = Vec::new();
    // IPv4 only: rivet is an IPv4 dataplane, and the kernel's own IPv6
    // link-local routes come and go with DAD on its own schedule.
    for args in [
        &["-br", "link"][..],
        &["-4", "-br", "addr"],
        &["-4", "route", "show", "table", "all"],
        &["-4", "neigh"],
    ] {
        view.push(format!("ip {}: {}", args.join(" "), ns.run("ip", args)));
    }
    // `run`: a tool that fails makes the view unreadable, not "empty".
    for dir in ["ingress", "egress"] {
        let out = ns.run("tc", &["filter", "show", "dev", "eth0", dir]);
        view.push(format!("tc {dir}: {out}"));
    }
    let out = ns.run("bpftool", &["net", "show"]);
    view.push(format!("bpftool net: {out}"));
    view
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("spawn")
}

#[test]
fn install_then_uninstall_leaves_no_trace() {
    let mut w = World::new();
    let n = w.add_node();
    let args = w.nodes[n].agent_args.clone();
    let root = w.dir().join("root");
    let before = node_view(&w.nodes[n].ns);

    // This node's configuration (the shipped example would name the
    // machine itself).
    let config = w.dir().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "node_name = \"{}\"\nnetns = \"{}\"\nuplink = \"eth0\"\npod_cidr = \"{}\"\ncluster_cidr = \"{}\"\nstate_dir = \"{}\"\nsocket = \"{}\"\nmetrics_addr = \"off\"\n",
            args.node_name,
            args.netns.display(),
            args.pod_cidr,
            args.cluster_cidr,
            args.state_dir.display(),
            args.socket.display()
        ),
    )
    .expect("config");
    let dirs = |cmd: &mut Command| {
        cmd.arg("--socket")
            .arg(&args.socket)
            .arg("--from")
            .arg(bin("rivetd").parent().expect("bin dir"))
            .arg("--cni-binary")
            .arg(bin("rivet-cni"))
            .arg("--bin-dir")
            .arg(root.join("usr/local/bin"))
            .arg("--cni-bin-dir")
            .arg(root.join("opt/cni/bin"))
            .arg("--cni-conf-dir")
            .arg(root.join("etc/cni/net.d"))
            .arg("--unit-dir")
            .arg(root.join("etc/systemd/system"))
            .arg("--config-dir")
            .arg(root.join("etc/rivet"))
            .arg("--config")
            .arg(&config);
    };
    let mut c = Command::new(bin("rivetctl"));
    c.arg("install");
    dirs(&mut c);
    let out = run(&mut c);
    assert!(
        out.status.success(),
        "install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "usr/local/bin/rivetd",
        "usr/local/bin/rivetctl",
        "opt/cni/bin/rivet-cni",
        "etc/cni/net.d/10-rivet.conflist",
        "etc/systemd/system/rivetd.service",
        "etc/rivet/rivet.toml",
    ] {
        assert!(root.join(f).is_file(), "{f} installed");
        // Root's, written by nobody else (the runtime executes the plugin
        // and reads the conflist as root).
        let meta = std::fs::metadata(root.join(f)).expect("metadata");
        assert_eq!(meta.uid(), 0, "{f} owned by root");
        assert_eq!(
            meta.permissions().mode() & 0o022,
            0,
            "{f} writable by root only"
        );
    }
    let nobody = |cmd: &str, path: &Path| {
        Command::new("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "--",
            ])
            .arg(cmd)
            .arg(path)
            .output()
            .expect("setpriv")
    };
    for dir in ["opt/cni/bin", "etc/cni/net.d"] {
        // nobody can reach the directory (so the refusal below is the
        // directory's own permission)...
        assert!(
            nobody("ls", &root.join(dir)).status.success(),
            "{dir} reachable"
        );
        // ...and cannot add a file to it.
        let target = root.join(dir).join("99-intruder.conflist");
        let out = nobody("touch", &target);
        let exists = target
            .try_exists()
            .unwrap_or_else(|e| panic!("checking {}: {e}", target.display()));
        assert!(!out.status.success() && !exists, "nobody wrote into {dir}");
    }

    // Run the installed agent as its unit does, attach a pod, stop it.
    let mut agent = Command::new(root.join("usr/local/bin/rivetd"))
        .arg("--config")
        .arg(root.join("etc/rivet/rivet.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("installed rivetd");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !args.socket.exists() {
        assert!(Instant::now() < deadline, "agent did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    let pod = Netns::new(format!("{}-svcpod", w.prefix));
    let out = run(Command::new(root.join("usr/local/bin/rivetctl"))
        .arg("--socket")
        .arg(&args.socket)
        .args(["endpoint", "add", "--container-id", "svc1", "--netns"])
        .arg(pod.path()));
    assert!(
        out.status.success(),
        "endpoint add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(
        node_view(&w.nodes[n].ns),
        before,
        "the agent changed the node"
    );
    let hooks: Vec<u32> = rivet_common::program_names::SOCKET_HOOKS
        .iter()
        .filter_map(|p| {
            aya::programs::ProgramInfo::from_pin(args.pin_dir().join("progs").join(p)).ok()
        })
        .map(|p| p.id())
        .collect();
    assert_eq!(hooks.len(), 4, "socket hooks loaded");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    agent.wait().expect("agent exits");

    let mut c = Command::new(bin("rivetctl"));
    c.arg("uninstall");
    dirs(&mut c);
    let out = run(&mut c);
    assert!(
        out.status.success(),
        "uninstall: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert_eq!(node_view(&w.nodes[n].ns), before, "the node as before");
    // Gone means "does not exist"; a path that cannot be checked fails.
    let gone = |p: &Path| {
        !p.try_exists()
            .unwrap_or_else(|e| panic!("checking {}: {e}", p.display()))
    };
    assert!(gone(&args.pin_dir()), "pins gone");
    assert!(gone(&args.state_dir), "state gone");
    let mut left = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("listing {}: {e}", dir.display()),
        };
        for e in entries {
            let e = e.unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
            let kind = e
                .file_type()
                .unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
            if kind.is_dir() {
                stack.push(e.path());
            } else {
                left.push(e.path());
            }
        }
    }
    assert!(left.is_empty(), "files left: {left:?}");
    let cgroup = rivet::sockhooks::cgroup2_root().expect("cgroup2");
    let out = Command::new("bpftool")
        .args(["-j", "cgroup", "show"])
        .arg(&cgroup)
        .output()
        .expect("bpftool");
    assert!(
        out.status.success(),
        "bpftool cgroup show {}: {}{}",
        cgroup.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // bpftool prints nothing at all when no program is attached.
    let attached: Vec<serde_json::Value> = if out.stdout.iter().all(u8::is_ascii_whitespace) {
        Vec::new()
    } else {
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "bpftool cgroup show: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    };
    let attached_ids: Vec<u32> = attached
        .iter()
        .map(|a| {
            a["id"]
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .unwrap_or_else(|| panic!("attachment without a program ID: {a}"))
        })
        .collect();
    assert!(
        attached_ids.iter().all(|id| !hooks.contains(id)),
        "socket hooks still attached: {attached:?}"
    );
    // The pod's side is gone with its veth.
    let links = pod.run("ip", &["-br", "link"]);
    assert!(!links.contains("eth0"), "{links}");
}
