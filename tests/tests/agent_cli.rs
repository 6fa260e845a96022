//! rivetd and rivetctl as an operator runs them: bad input, load/unload,
//! one agent per pin directory; rivet-cni VERSION.

use std::process::{Command, Output, Stdio};

use aya::programs::{SchedClassifier, TcAttachType};
use rivet_tests::{World, agent::AgentArgs, bin};

fn run(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("spawn")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The error is one line naming the problem, exit status non-zero.
fn assert_fails_with(o: &Output, needle: &str) {
    assert!(
        !o.status.success(),
        "expected failure, got success: {}",
        stderr(o)
    );
    let err = stderr(o);
    let line = err
        .lines()
        .find(|l| l.starts_with("rivetd: error:"))
        .unwrap_or_else(|| panic!("no error line in: {err}"));
    assert!(
        line.contains(needle),
        "error line {line:?} does not name {needle:?}"
    );
}

fn args_for(w: &World, n: usize) -> AgentArgs {
    w.nodes[n].agent_args.clone()
}

#[test]
fn bad_configuration_is_a_one_line_error_and_creates_nothing() {
    let mut w = World::new();
    let n = w.add_node();
    let args = args_for(&w, n);

    let cfg = w.dir().join("bad.toml");
    for (text, needle) in [
        ("pod_cidr = \"banana\"\n", "pod_cidr"),
        ("pod_cdir = \"10.0.0.0/24\"\n", "pod_cdir"),
        ("mtu = 12\n", "mtu"),
        ("gateway = \"10.1.2.3.4\"\n", "gateway"),
    ] {
        std::fs::write(&cfg, text).expect("write config");
        let mut cmd = Command::new(bin("rivetd"));
        cmd.arg("--config")
            .arg(&cfg)
            .arg("--node-name")
            .arg(&args.node_name)
            .arg("load");
        assert_fails_with(&run(cmd), needle);
        assert!(!args.pin_dir().exists(), "pin dir created for {text}");
    }

    // A flag value that is wrong.
    let mut bad = args.clone();
    bad.pod_cidr = "10.1.1.1/24".into();
    let mut cmd = bad.command();
    cmd.arg("load");
    assert_fails_with(&run(cmd), "host bits set");

    // bpffs missing at the configured path.
    let mut cmd = args.command();
    cmd.arg("--bpffs").arg(w.dir()).arg("load");
    assert_fails_with(&run(cmd), "is not a bpf filesystem");

    // An uplink that does not exist.
    let mut bad = args.clone();
    bad.uplink = Some("nope0".into());
    let mut cmd = bad.command();
    cmd.arg("load");
    assert_fails_with(&run(cmd), "uplink interface nope0 does not exist");
    assert!(
        !args.pin_dir().exists(),
        "pin dir created for a missing uplink"
    );

    // A namespace that does not exist.
    let mut cmd = Command::new(bin("rivetd"));
    cmd.args([
        "--netns",
        "rivet-no-such-ns",
        "--node-name",
        &args.node_name,
        "load",
    ]);
    assert_fails_with(&run(cmd), "rivet-no-such-ns does not exist");
    assert!(!args.pin_dir().exists());
}

#[test]
fn one_agent_per_pin_directory() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let mut second = w.nodes[n].agent_args.clone();
    second.socket = w.dir().join("second.sock");
    assert_fails_with(&run(second.command()), "in use by another rivetd");
    // The first one is unaffected.
    let p = w.add_pod(n);
    rivet_tests::traffic::assert_ping(&w.pods[p].ns, w.nodes[n].ip, 2);
}

#[test]
fn load_then_unload_leaves_nothing() {
    let mut w = World::new();
    let n = w.add_node();
    let args = args_for(&w, n);
    let out = run({
        let mut c = args.command();
        c.arg("load");
        c
    });
    assert!(out.status.success(), "load: {}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("maps/ENDPOINTS"), "{text}");
    assert!(text.contains("eth0 ingress -> from_uplink"), "{text}");
    let attached = w.nodes[n]
        .ns
        .exec(|| SchedClassifier::query_tcx("eth0", TcAttachType::Ingress).map(|(_, p)| p.len()))
        .expect("query");
    assert_eq!(attached, 1, "uplink program attached after load exits");

    // The datapath runs without an agent: start one, add a pod, stop it, and
    // unload removes the pod's veth, the programs and every pin.
    w.start_agent(n);
    let p = w.add_pod(n);
    w.nodes[n].agent_mut().stop();
    rivet_tests::traffic::assert_ping(&w.pods[p].ns, w.nodes[n].ip, 2);

    let out = run({
        let mut c = args.command();
        c.arg("unload");
        c
    });
    assert!(out.status.success(), "unload: {}", stderr(&out));
    assert!(!args.pin_dir().exists());
    assert!(!args.state_dir.exists());
    let attached = w.nodes[n]
        .ns
        .exec(|| SchedClassifier::query_tcx("eth0", TcAttachType::Ingress).map(|(_, p)| p.len()))
        .expect("query");
    assert_eq!(attached, 0, "uplink program still attached after unload");
    let veths = w.nodes[n]
        .ns
        .run("ip", &["-o", "link", "show", "type", "veth"]);
    assert!(!veths.contains(": rv"), "{veths}");
    // Unloading twice is fine.
    let out = run({
        let mut c = args.command();
        c.arg("unload");
        c
    });
    assert!(out.status.success(), "second unload: {}", stderr(&out));
}

#[test]
fn rivetctl_reports_errors_naming_the_socket() {
    let out = run({
        let mut c = Command::new(bin("rivetctl"));
        c.args(["--socket", "/run/rivet/no-such-agent.sock", "status"]);
        c
    });
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("/run/rivet/no-such-agent.sock"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn rivetctl_lists_endpoints_and_stats() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let a = w.add_pod(n);
    let b = w.add_pod(n);
    rivet_tests::traffic::assert_ping(&w.pods[a].ns, w.pods[b].ip, 2);
    let sock = w.nodes[n].agent().socket().to_owned();
    let ctl = |args: &[&str]| {
        let out = run({
            let mut c = Command::new(bin("rivetctl"));
            c.arg("--socket").arg(&sock).args(args);
            c
        });
        assert!(out.status.success(), "rivetctl {args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = ctl(&["endpoints"]);
    assert!(
        table.contains(&w.pods[a].ip.to_string()) && table.contains(&w.pods[b].ip.to_string()),
        "{table}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ctl(&["-o", "json", "endpoints"])).expect("json");
    assert_eq!(
        json["endpoints"].as_array().map(Vec::len),
        Some(2),
        "{json}"
    );
    let stats = ctl(&["stats"]);
    assert!(stats.contains("fwd_local"), "{stats}");
    let status = ctl(&["status"]);
    assert!(
        status.contains("from_pod") && status.contains("from_uplink"),
        "{status}"
    );
    assert!(status.contains("masquerade: ports 61000-65535"), "{status}");
}

#[test]
fn cni_plugin_answers_version() {
    let out = run({
        let mut c = Command::new(bin("rivet-cni"));
        c.env("CNI_COMMAND", "VERSION");
        c
    });
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["cniVersion"], "1.1.0");
    let versions: Vec<&str> = v["supportedVersions"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|x| x.as_str())
        .collect();
    assert_eq!(versions, ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]);

    let out = run(Command::new(bin("rivet-cni")));
    assert!(!out.status.success());
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).expect("error json on stdout");
    assert_eq!(e["code"], 4);
}

#[test]
fn install_cni_writes_binary_and_conflist_atomically() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let dir = std::env::temp_dir().join(format!("rivet-install-{}", rivet_tests::unique_prefix()));
    let (bin_dir, conf_dir) = (dir.join("bin"), dir.join("net.d"));
    let install = || {
        run({
            let mut c = Command::new(bin("rivetctl"));
            c.args([
                "--socket",
                "/run/rivet/test.sock",
                "install-cni",
                "--bin-dir",
            ])
            .arg(&bin_dir)
            .arg("--conf-dir")
            .arg(&conf_dir);
            c
        })
    };
    for round in 0..2 {
        let out = install();
        assert!(out.status.success(), "install #{round}: {}", stderr(&out));
    }
    let plugin = bin_dir.join("rivet-cni");
    let meta = std::fs::metadata(&plugin).expect("plugin installed");
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    let version = run({
        let mut c = Command::new(&plugin);
        c.env("CNI_COMMAND", "VERSION");
        c
    });
    assert!(version.status.success(), "installed binary runs");
    let conf_path = conf_dir.join("10-rivet.conflist");
    let meta = std::fs::metadata(&conf_path).expect("conflist installed");
    assert_eq!(meta.permissions().mode() & 0o777, 0o644);
    let conf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&conf_path).expect("read")).expect("json");
    assert_eq!(conf["plugins"][0]["type"], "rivet-cni");
    assert_eq!(conf["plugins"][0]["socket"], "/run/rivet/test.sock");
    assert_eq!(conf["plugins"][0]["capabilities"]["portMappings"], true);
    // No temporary files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&bin_dir)
        .expect("ls")
        .chain(std::fs::read_dir(&conf_dir).expect("ls"))
        .count()
        .to_string()
        .chars()
        .collect();
    assert_eq!(leftovers, vec!['2']);
    for round in 0..2 {
        let out = run({
            let mut c = Command::new(bin("rivetctl"));
            c.args(["install-cni", "--uninstall", "--bin-dir"])
                .arg(&bin_dir)
                .arg("--conf-dir")
                .arg(&conf_dir);
            c
        });
        assert!(out.status.success(), "uninstall #{round}: {}", stderr(&out));
    }
    assert!(!plugin.exists() && !conf_path.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
