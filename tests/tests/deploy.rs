//! Running rivet as a node service: the shipped systemd unit, example
//! configuration and Kubernetes manifests are checked for what a real node
//! needs (no cluster runs here, so the manifests are read into their
//! Kubernetes types and checked, not applied), and `rivetctl install` → agent → `rivetctl uninstall` leaves the node
//! exactly as before.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{ConfigMap, Container, NodeSelector, PodSpec, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use rivet::config::FileConfig;
use rivet_tests::{Netns, World, bin};
use serde::{Deserialize as _, Serialize, de::DeserializeOwned};
use serde_json::Value;
use yaml_rust2::{Event, parser::Parser, scanner::TScalarStyle};

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

// --- the Kubernetes manifests --------------------------------------------
//
// No cluster runs here: each document is read into its Kubernetes type
// (k8s-openapi) and written back, and every field of the file must come
// back with its value, so a misspelled or misplaced field (which serde, like
// the API server's decoder, would drop) fails. Then what the objects mean
// is checked against the agent and the binaries the image ships.

/// The manifest that installs rivet on a cluster.
const MANIFEST: &str = "deploy/daemonset.yaml";
/// The patch that keeps flannel's DaemonSet off rivet's nodes.
const FLANNEL_PATCH: &str = "deploy/flannel-off-rivet-nodes.yaml";

/// The objects a manifest holds, each as its Kubernetes type.
#[derive(Default)]
struct Manifest {
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    config_maps: Vec<ConfigMap>,
    daemon_sets: Vec<DaemonSet>,
}

/// Where `out` lacks a field of `src` or holds another value there.
fn differences(src: &Value, out: &Value, path: &str, diffs: &mut Vec<String>) {
    match (src, out) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let at = format!("{path}.{key}");
                match b.get(key) {
                    Some(back) => differences(value, back, &at, diffs),
                    None => diffs.push(format!("{at}: dropped ({value})")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (value, back)) in a.iter().zip(b).enumerate() {
                differences(value, back, &format!("{path}[{i}]"), diffs);
            }
        }
        _ if src == out => {}
        _ => diffs.push(format!("{path}: {src} came back as {out}")),
    }
}

/// `doc` read into `T` and written back; `Err` names what was lost or
/// changed.
fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let object: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&object).map_err(|e| e.to_string())?;
    let mut diffs = Vec::new();
    differences(doc, &back, "", &mut diffs);
    if diffs.is_empty() {
        Ok(object)
    } else {
        Err(format!(
            "fields its Kubernetes type does not hold (misspelled or misplaced):\n{}",
            diffs.join("\n")
        ))
    }
}

fn typed<T: DeserializeOwned + Serialize>(doc: &Value, what: &str) -> T {
    round_trip(doc).unwrap_or_else(|e| panic!("{what}: {e}\n{doc:#}"))
}

/// Plain (unquoted) scalars that YAML 1.1 — the Kubernetes decoder's — reads
/// otherwise than YAML 1.2 does (`on` is a boolean there, `0644` octal), so
/// the objects checked here are the ones the API server gets.
fn yaml11_ambiguities(text: &str, path: &str) -> Vec<String> {
    let mut parser = Parser::new_from_str(text);
    let mut found = Vec::new();
    loop {
        let (event, mark) = parser
            .next_token()
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        match event {
            Event::StreamEnd => return found,
            Event::Scalar(value, TScalarStyle::Plain, _, None) => {
                let lower = value.to_ascii_lowercase();
                let boolean = ["y", "yes", "n", "no", "on", "off"].contains(&lower.as_str());
                let octal = value.len() > 1
                    && value.starts_with('0')
                    && value.bytes().all(|b| b.is_ascii_digit());
                // Sexagesimal: 1:30 is 90 there.
                let sexagesimal = value.contains(':')
                    && value
                        .split(':')
                        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
                if boolean || octal || sexagesimal {
                    found.push(format!("{path}:{}: {value}", mark.line()));
                }
            }
            _ => {}
        }
    }
}

fn load(path: &str) -> Manifest {
    let text = read(path);
    let ambiguous = yaml11_ambiguities(&text, path);
    assert!(ambiguous.is_empty(), "quote these: {ambiguous:?}");
    let mut manifest = Manifest::default();
    for (i, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let doc = Value::deserialize(document).unwrap_or_else(|e| panic!("{path}: {e}"));
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        let kind = doc["kind"].as_str().unwrap_or_default();
        let what = format!("{path} document {i} ({api_version} {kind})");
        match (api_version, kind) {
            ("v1", "ServiceAccount") => manifest.service_accounts.push(typed(&doc, &what)),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                manifest.cluster_roles.push(typed(&doc, &what));
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                manifest.cluster_role_bindings.push(typed(&doc, &what));
            }
            ("v1", "ConfigMap") => manifest.config_maps.push(typed(&doc, &what)),
            ("apps/v1", "DaemonSet") => manifest.daemon_sets.push(typed(&doc, &what)),
            _ => panic!("{what}: not an object rivet's manifests are expected to hold"),
        }
    }
    manifest
}

fn one<'a, T>(objects: &'a [T], what: &str) -> &'a T {
    match objects {
        [object] => object,
        _ => panic!("{} {what} objects, expected one", objects.len()),
    }
}

fn name_of(meta: &ObjectMeta) -> (&str, &str) {
    (
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().expect("a name"),
    )
}

/// The ConfigMap's rivet.toml.
fn agent_config(manifest: &Manifest) -> String {
    let cm = one(&manifest.config_maps, "ConfigMap");
    cm.data
        .as_ref()
        .and_then(|d| d.get("rivet.toml"))
        .expect("the ConfigMap holds rivet.toml")
        .clone()
}

/// A key's value in TOML text (uncommented lines), as written.
fn setting<'a>(toml: &'a str, key: &str) -> Option<&'a str> {
    toml.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find_map(|l| l.split_once('=').filter(|(k, _)| k.trim() == key))
        .map(|(_, v)| v.trim())
}

#[test]
fn manifests_parse_into_their_kubernetes_types_without_losing_a_field() {
    let m = load(MANIFEST);
    let counts = [
        m.service_accounts.len(),
        m.cluster_roles.len(),
        m.cluster_role_bindings.len(),
        m.config_maps.len(),
        m.daemon_sets.len(),
    ];
    assert_eq!(counts, [1; 5], "one of each object");
    let patch = load(FLANNEL_PATCH);
    assert_eq!(patch.daemon_sets.len(), 1, "flannel's patch is a DaemonSet");
    // The round trip catches what serde would drop: a field in the wrong
    // place must fail it.
    let misplaced: Value = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "x"},
        "spec": {"template": {"spec": {"containers": [], "tolerations": [{"operator": "Exists"}],
                 "livenessProbe": {"httpGet": {"path": "/healthz", "port": 9402}}}}},
    });
    let err = round_trip::<DaemonSet>(&misplaced).expect_err("a probe on the pod passed");
    assert!(
        err.contains(".spec.template.spec.livenessProbe: dropped"),
        "{err}"
    );
    assert_eq!(
        yaml11_ambiguities("a: on\nb: \"on\"\nc: 0644\nd: 1:30\ne: 10.0.0.1:80\n", "t"),
        ["t:1: on", "t:3: 0644", "t:4: 1:30"],
        "YAML 1.1 readings"
    );
}

#[test]
fn cluster_role_grants_exactly_what_the_agent_uses() {
    let m = load(MANIFEST);
    let role = one(&m.cluster_roles, "ClusterRole");
    assert!(role.aggregation_rule.is_none(), "no aggregated rules");
    let mut granted = BTreeSet::new();
    for rule in role.rules.as_deref().expect("rules") {
        assert!(
            rule.resource_names.is_none() && rule.non_resource_urls.is_none(),
            "{rule:?}"
        );
        for group in rule.api_groups.as_deref().expect("apiGroups") {
            for resource in rule.resources.as_deref().expect("resources") {
                for verb in &rule.verbs {
                    let new = granted.insert((group.as_str(), resource.as_str(), verb.as_str()));
                    assert!(new, "{group}/{resource} {verb} granted twice");
                }
            }
        }
    }
    let read = ["list", "watch"];
    let mut expected = BTreeSet::new();
    // Its own Node (pod CIDR, public-ip-overwrite) and the other nodes.
    for verb in ["get", "list", "watch", "patch"] {
        expected.insert(("", "nodes", verb));
    }
    // NetworkUnavailable=False.
    expected.insert(("", "nodes/status", "patch"));
    for (group, resource) in [
        ("", "pods"),
        ("", "services"),
        ("", "namespaces"),
        ("discovery.k8s.io", "endpointslices"),
        ("networking.k8s.io", "networkpolicies"),
    ] {
        for verb in read {
            expected.insert((group, resource, verb));
        }
    }
    assert_eq!(granted, expected, "the ClusterRole's grants");

    // Bound to the ServiceAccount the DaemonSet runs as.
    let sa = one(&m.service_accounts, "ServiceAccount");
    let (sa_ns, sa_name) = name_of(&sa.metadata);
    let binding = one(&m.cluster_role_bindings, "ClusterRoleBinding");
    assert_eq!(
        (
            binding.role_ref.api_group.as_str(),
            binding.role_ref.kind.as_str(),
            binding.role_ref.name.as_str()
        ),
        (
            "rbac.authorization.k8s.io",
            "ClusterRole",
            role.metadata.name.as_deref().expect("role name")
        )
    );
    let subjects: Vec<_> = binding
        .subjects
        .iter()
        .flatten()
        .map(|s| (s.kind.as_str(), s.namespace.as_deref(), s.name.as_str()))
        .collect();
    assert_eq!(subjects, [("ServiceAccount", Some(sa_ns), sa_name)]);
    let ds = one(&m.daemon_sets, "DaemonSet");
    let pod = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    assert_eq!(
        name_of(&ds.metadata).0,
        sa_ns,
        "DaemonSet beside its ServiceAccount"
    );
    assert_eq!(pod.service_account_name.as_deref(), Some(sa_name));
    assert_ne!(
        pod.automount_service_account_token,
        Some(false),
        "the agent needs its token"
    );
}

#[test]
fn configmap_runs_the_agent_from_the_kubernetes_api() {
    let m = load(MANIFEST);
    let toml = agent_config(&m);
    assert_eq!(setting(&toml, "source"), Some("\"kubernetes\""), "{toml}");
    for key in [
        "etcd_endpoints",
        "etcd_prefix",
        "node_name",
        "pod_cidr",
        "kubeconfig",
    ] {
        assert_eq!(
            setting(&toml, key),
            None,
            "{key}: set by the Kubernetes source or the DaemonSet"
        );
    }
    // flannel's defaults: its pod network and its VXLAN.
    assert_eq!(setting(&toml, "cluster_cidr"), Some("\"10.244.0.0/16\""));
    assert_eq!(setting(&toml, "mode"), Some("\"vxlan\""));
    assert_eq!(setting(&toml, "metrics_addr"), Some("\"127.0.0.1:9402\""));
    let config = FileConfig::from_toml(&toml).expect(
        "the ConfigMap's rivet.toml is refused: this rivetd lacks the Kubernetes API source \
         (`source = \"kubernetes\"`), which the manifest needs",
    );
    assert_eq!(config.cluster_cidr.as_deref(), Some("10.244.0.0/16"));
    assert_eq!(config.metrics_addr.as_deref(), Some("127.0.0.1:9402"));
}

/// Whether a node with these labels satisfies required node affinity.
fn schedulable(affinity: &NodeSelector, labels: &[(&str, &str)]) -> bool {
    affinity.node_selector_terms.iter().any(|term| {
        assert!(term.match_fields.is_none(), "{term:?}");
        term.match_expressions.iter().flatten().all(|e| {
            let value = labels.iter().find(|(k, _)| *k == e.key).map(|(_, v)| *v);
            let values = e.values.as_deref().unwrap_or_default();
            let listed = value.is_some_and(|v| values.iter().any(|w| w == v));
            match e.operator.as_str() {
                "In" => listed,
                "NotIn" => !listed,
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                op => panic!("operator {op} not modelled"),
            }
        })
    })
}

fn required_affinity(ds: &DaemonSet) -> &NodeSelector {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .expect("required node affinity")
}

fn host_path<'a>(pod: &'a PodSpec, volume: &str) -> &'a str {
    pod.volumes
        .iter()
        .flatten()
        .find(|v| v.name == volume)
        .and_then(|v| v.host_path.as_ref())
        .map(|h| h.path.as_str())
        .unwrap_or_else(|| panic!("no hostPath volume {volume}"))
}

fn container<'a>(list: Option<&'a Vec<Container>>, name: &str) -> &'a Container {
    list.into_iter()
        .flatten()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

#[test]
fn daemonset_runs_the_agent_on_every_node_with_what_it_needs() {
    let m = load(MANIFEST);
    let ds = one(&m.daemon_sets, "DaemonSet");
    let spec = ds.spec.as_ref().expect("spec");
    let strategy = spec.update_strategy.as_ref().expect("updateStrategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let pod = spec.template.spec.as_ref().expect("pod spec");
    assert_eq!(pod.host_network, Some(true), "host network");
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    // Every taint tolerated: one toleration, operator Exists, no key/effect.
    let tolerations: Vec<_> = pod
        .tolerations
        .iter()
        .flatten()
        .map(|t| (t.operator.as_deref(), t.key.as_deref(), t.effect.as_deref()))
        .collect();
    assert_eq!(tolerations, [(Some("Exists"), None, None)]);
    assert!(pod.node_selector.is_none(), "every node");
    // Every Linux node, but those left to flannel during a replacement; and
    // flannel's patch is the exact complement.
    let flannel = load(FLANNEL_PATCH);
    let flannel = required_affinity(one(&flannel.daemon_sets, "DaemonSet"));
    let rivet = required_affinity(ds);
    for (labels, on_rivet) in [
        (&[("kubernetes.io/os", "linux")][..], true),
        (
            &[("kubernetes.io/os", "linux"), ("rivet.io/enabled", "true")],
            true,
        ),
        (
            &[("kubernetes.io/os", "linux"), ("rivet.io/enabled", "false")],
            false,
        ),
    ] {
        assert_eq!(schedulable(rivet, labels), on_rivet, "rivet on {labels:?}");
        assert_eq!(
            schedulable(flannel, labels),
            !on_rivet,
            "flannel on {labels:?}"
        );
    }
    assert!(!schedulable(rivet, &[("kubernetes.io/os", "windows")]));

    let agent = container(Some(&pod.containers), "rivetd");
    let privileged = |c: &Container| c.security_context.as_ref().and_then(|s| s.privileged);
    assert_eq!(
        privileged(agent),
        Some(true),
        "BPF and netns work need privileges"
    );
    // Each host directory a node needs, mounted at the same path in the agent.
    let mounts = |c: &Container| -> Vec<(String, String, Option<String>)> {
        c.volume_mounts
            .iter()
            .flatten()
            .map(|v| {
                (
                    v.name.clone(),
                    v.mount_path.clone(),
                    v.mount_propagation.clone(),
                )
            })
            .collect()
    };
    let agent_mounts = mounts(agent);
    for (path, propagation) in [
        ("/sys/fs/bpf", Some("Bidirectional")),
        ("/sys/fs/cgroup", None),
        ("/opt/cni/bin", None),
        ("/etc/cni/net.d", None),
        ("/run/rivet", None),
        ("/var/lib/rivet", None),
        ("/run/netns", Some("HostToContainer")),
    ] {
        let mount = agent_mounts
            .iter()
            .find(|(name, _, _)| {
                pod.volumes.iter().flatten().any(|v| {
                    &v.name == name && v.host_path.as_ref().is_some_and(|h| h.path == path)
                })
            })
            .unwrap_or_else(|| panic!("no mount of the host's {path}"));
        assert_eq!(mount.1, path, "{} mounted where the host has it", mount.0);
        assert_eq!(mount.2.as_deref(), propagation, "{} propagation", mount.0);
    }

    // The node's name from the pod's spec.nodeName, passed as --node-name.
    let node_name = agent
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .expect("NODE_NAME from a field");
    assert_eq!(node_name.field_path, "spec.nodeName");
    let args = agent.args.as_deref().unwrap_or_default();
    assert!(
        args.iter().any(|a| a == "--node-name=$(NODE_NAME)"),
        "{args:?}"
    );

    // The configuration: the ConfigMap, mounted where --config reads it.
    let cm = one(&m.config_maps, "ConfigMap");
    let config_volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.config_map
                .as_ref()
                .is_some_and(|c| c.name == cm.metadata.name.clone().unwrap_or_default())
        })
        .expect("a volume of the ConfigMap");
    let (_, dir, _) = agent_mounts
        .iter()
        .find(|(name, _, _)| *name == config_volume.name)
        .expect("the ConfigMap mounted");
    assert!(
        args.contains(&format!("--config={dir}/rivet.toml")),
        "{args:?} reads {dir}/rivet.toml"
    );

    // The probes: the agent's health endpoints on metrics_addr, plain HTTP.
    let toml = agent_config(&m);
    let metrics: SocketAddr = setting(&toml, "metrics_addr")
        .expect("metrics_addr")
        .trim_matches('"')
        .parse()
        .expect("metrics_addr is an address");
    for (probe, path) in [
        (agent.liveness_probe.as_ref(), "/healthz"),
        (agent.readiness_probe.as_ref(), "/readyz"),
    ] {
        let get = probe
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            get.host.as_deref(),
            Some(metrics.ip().to_string().as_str()),
            "{path}"
        );
        assert_eq!(get.port, IntOrString::Int(metrics.port().into()), "{path}");
        assert!(
            matches!(get.scheme.as_deref(), None | Some("HTTP")),
            "{path}"
        );
    }

    // The init container writes into the host's CNI directories, and the
    // conflist names the socket where the agent serves it on the host.
    let init = container(pod.init_containers.as_ref(), "install-cni");
    let init_mounts = mounts(init);
    let command = init.command.as_deref().expect("command");
    let flag = |name: &str| {
        command
            .iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .unwrap_or_else(|| panic!("no --{name}= in {command:?}"))
    };
    for (name, host) in [("bin-dir", "/opt/cni/bin"), ("conf-dir", "/etc/cni/net.d")] {
        let (volume, _, _) = init_mounts
            .iter()
            .find(|(_, path, _)| path == flag(name))
            .unwrap_or_else(|| panic!("--{name} is not a mount"));
        assert_eq!(host_path(pod, volume), host, "--{name}");
        assert_eq!(
            host_path(pod, volume),
            agent_mounts
                .iter()
                .find(|m| &m.0 == volume)
                .map_or("", |m| m.1.as_str()),
            "{volume} as the agent sees it"
        );
    }
    let socket = Path::new(flag("socket"));
    let (run, _, _) = agent_mounts
        .iter()
        .find(|(_, path, _)| socket.parent() == Some(Path::new(path)))
        .expect("the socket's directory mounted in the agent");
    assert_eq!(
        Path::new(host_path(pod, run)),
        socket.parent().expect("dir"),
        "same path on the host"
    );
    let image = |c: &Container| c.image.clone().expect("image");
    assert_eq!(image(init), image(agent), "one image");
}

/// The long flags a binary's help lists.
fn help_flags(binary: &str, args: &[&str]) -> BTreeSet<String> {
    let out = run(Command::new(bin(binary)).args(args).arg("--help"));
    assert!(out.status.success(), "{binary} {args:?} --help");
    String::from_utf8_lossy(&out.stdout)
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[' || c == '<')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_owned)
        .collect()
}

/// `--name=value` or `--name` → `--name`.
fn flag_name(arg: &str) -> &str {
    arg.split_once('=').map_or(arg, |(name, _)| name)
}

/// The agent's shell command, its script and the binary it runs.
fn agent_script(agent: &Container) -> &str {
    match agent.command.as_deref() {
        Some([sh, c, script, _name]) if sh == "/bin/sh" && c == "-c" => script,
        other => panic!("the agent's command: {other:?}"),
    }
}

#[test]
fn container_commands_use_flags_the_shipped_binaries_have() {
    let m = load(MANIFEST);
    let ds = one(&m.daemon_sets, "DaemonSet");
    let pod = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    let dockerfile = read("deploy/Dockerfile");
    assert!(
        dockerfile
            .lines()
            .any(|l| l == "COPY rivetd rivetctl rivet-cni /usr/local/bin/"),
        "the image ships the three binaries in /usr/local/bin"
    );

    let init = container(pod.init_containers.as_ref(), "install-cni");
    let command = init.command.as_deref().expect("command");
    assert_eq!(command[..2], ["/usr/local/bin/rivetctl", "install-cni"]);
    let known = help_flags("rivetctl", &["install-cni"]);
    for arg in &command[2..] {
        assert!(
            known.contains(flag_name(arg)),
            "rivetctl install-cni has no {arg}: {known:?}"
        );
    }
    assert!(command.contains(&"--binary=/usr/local/bin/rivet-cni".to_owned()));

    let agent = container(Some(&pod.containers), "rivetd");
    let script = agent_script(agent);
    assert!(
        script.contains("exec /usr/local/bin/rivetd \"$@\" --uplink="),
        "{script}"
    );
    let known = help_flags("rivetd", &[]);
    for arg in agent
        .args
        .iter()
        .flatten()
        .map(String::as_str)
        .chain(["--uplink"])
    {
        assert!(
            known.contains(flag_name(arg)),
            "rivetd has no {arg}: {known:?}"
        );
    }
}

#[test]
fn agent_command_takes_the_default_route_interface_as_uplink() {
    let m = load(MANIFEST);
    let ds = one(&m.daemon_sets, "DaemonSet");
    let pod = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    let agent = container(Some(&pod.containers), "rivetd");
    // The script as the container runs it, printing rivetd's arguments
    // instead of running it.
    let script = agent_script(agent).replace("exec /usr/local/bin/rivetd", "exec echo");
    assert!(!script.contains("rivetd \""), "{script}");
    let uplink_env = agent
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "UPLINK")
        .expect("UPLINK in the environment");
    assert_eq!(
        uplink_env.value.as_deref(),
        Some(""),
        "automatic by default"
    );
    let args = agent.args.as_deref().unwrap_or_default();

    let prefix = rivet_tests::unique_prefix();
    let ns = Netns::new(format!("{prefix}-uplink"));
    let sh = |env: &[(&str, &str)]| {
        let mut cmd = ns.command("/bin/sh");
        cmd.arg("-c")
            .arg(&script)
            .arg("rivetd")
            .args(args)
            .env_remove("UPLINK");
        cmd.envs(env.iter().copied());
        run(&mut cmd)
    };
    // No default route: refused, with the reason.
    let out = sh(&[]);
    assert!(!out.status.success(), "started without an uplink");
    assert!(String::from_utf8_lossy(&out.stderr).contains("set UPLINK"));
    // The default route's interface, not the first one.
    for (name, addr) in [("first0", "192.0.2.1/24"), ("wan0", "198.51.100.2/24")] {
        let peer = format!("{name}p");
        ns.ip(&["link", "add", name, "type", "veth", "peer", "name", &peer]);
        ns.ip(&["addr", "add", addr, "dev", name]);
        for link in [name, peer.as_str()] {
            ns.ip(&["link", "set", link, "up"]);
        }
    }
    ns.ip(&[
        "route",
        "add",
        "default",
        "via",
        "198.51.100.1",
        "dev",
        "wan0",
    ]);
    let mut expected = args.join(" ");
    expected.push_str(" --uplink=wan0\n");
    let out = sh(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    // UPLINK wins.
    let out = sh(&[("UPLINK", "first0")]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        expected.replace("wan0", "first0")
    );
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
    assert_eq!(
        hooks.len(),
        rivet_common::program_names::SOCKET_HOOKS.len(),
        "socket hooks loaded"
    );
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
