//! Kubernetes objects through the real `rivetctl` against a real agent:
//! `apply -f` (YAML with every kind, re-applied unchanged, modified,
//! from standard input, an invalid List refused whole), `get` (tables and
//! `-o json` Lists), the objects kept across an agent restart, `delete -f`
//! (and `--ignore-not-found`), and a List of 10,000 Services.

use std::{
    io::Write as _,
    path::Path,
    process::{Command, Output, Stdio},
    time::Instant,
};

use rivet_tests::{World, bin};
use serde_json::{Value, json};

/// Runs `rivetctl --socket SOCKET ARGS`, with `stdin` as its input.
fn rivetctl(socket: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(bin("rivetctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rivetctl");
    if let Some(text) = stdin {
        let mut input = child.stdin.take().expect("stdin");
        input.write_all(text.as_bytes()).expect("writing stdin");
    }
    child.wait_with_output().expect("rivetctl output")
}

/// Its standard output; it must have succeeded.
#[track_caller]
fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Its standard error; it must have failed.
#[track_caller]
fn failed(out: &Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The items of `rivetctl -o json get ARGS`, a `List`.
#[track_caller]
fn get_json(socket: &Path, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["-o", "json", "get"];
    all.extend_from_slice(args);
    let out = ok(&rivetctl(socket, &all, None), &format!("get {args:?}"));
    let list: Value = serde_json::from_str(&out).expect("get -o json prints JSON");
    assert_eq!(list["kind"], "List", "{out}");
    assert_eq!(list["apiVersion"], "v1", "{out}");
    list["items"].as_array().expect("items").clone()
}

/// `namespace/name` of each item.
fn names(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|o| {
            let name = o["metadata"]["name"].as_str().unwrap_or("?");
            match o["metadata"]["namespace"].as_str() {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_owned(),
            }
        })
        .collect()
}

/// The table's rows, cells split on runs of spaces.
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

const OBJECTS: &str = r"# every kind rivet keeps, as kubectl would take them
apiVersion: v1
kind: Namespace
metadata:
  name: shop
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  labels: {app: web}
spec:
  clusterIP: 10.96.7.7
  selector: {app: web}
  ports:
  - name: http
    port: 80
    targetPort: http
  - name: dns
    port: 53
    protocol: UDP
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-a
  namespace: shop
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
endpoints:
- addresses: [10.244.1.5]
  conditions: {ready: true}
  nodeName: n1
- addresses: [10.244.2.5]
  conditions: {ready: false}
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: dns, port: 53, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-b
  namespace: shop
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
endpoints:
- addresses: [10.244.3.5]
- addresses: [10.244.3.6]
- addresses: [10.244.3.7]
- addresses: [10.244.3.8]
ports:
- {name: http, port: 8080}
---
apiVersion: v1
kind: Pod
metadata:
  name: web-0
  namespace: shop
  labels: {app: web}
spec:
  containers:
  - name: web
    image: nginx
    ports: [{name: http, containerPort: 8080}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: web-only
  namespace: shop
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - ports: [{port: 8080}]
";

#[test]
fn apply_get_restart_delete_through_rivetctl() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let socket = w.nodes[n].agent().socket().to_owned();
    let file = w.dir().join("objects.yaml");
    std::fs::write(&file, OBJECTS).expect("writing the document");
    let file = file.to_str().expect("utf-8 path").to_owned();

    // Apply: every object created, in document order.
    let out = ok(&rivetctl(&socket, &["apply", "-f", &file], None), "apply");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "namespace/shop created",
            "service/web created",
            "endpointslice.discovery.k8s.io/web-a created",
            "endpointslice.discovery.k8s.io/web-b created",
            "pod/web-0 created",
            "networkpolicy.networking.k8s.io/web-only created",
        ],
        "{out}"
    );

    // Tables, like kubectl's.
    let svc = ok(
        &rivetctl(&socket, &["get", "services", "-n", "shop"], None),
        "get svc",
    );
    assert_eq!(
        rows(&svc),
        [
            ["NAMESPACE", "NAME", "TYPE", "CLUSTER-IP", "PORT(S)"],
            ["shop", "web", "ClusterIP", "10.96.7.7", "80/TCP,53/UDP"],
        ],
        "{svc}"
    );
    let slices = ok(
        &rivetctl(&socket, &["get", "endpointslices", "-n", "shop"], None),
        "get slices",
    );
    assert_eq!(
        rows(&slices),
        [
            vec!["NAMESPACE", "NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS"],
            vec!["shop", "web-a", "IPv4", "8080,53", "10.244.1.5,10.244.2.5"],
            vec![
                "shop",
                "web-b",
                "IPv4",
                "8080",
                "10.244.3.5,10.244.3.6,10.244.3.7",
                "+",
                "1",
                "more..."
            ],
        ],
        "{slices}"
    );
    let ns = ok(&rivetctl(&socket, &["get", "ns"], None), "get ns");
    assert_eq!(rows(&ns), [["NAME"], ["shop"]], "{ns}");
    let pods = ok(&rivetctl(&socket, &["get", "po", "-A"], None), "get pods");
    assert_eq!(
        rows(&pods),
        [["NAMESPACE", "NAME"], ["shop", "web-0"]],
        "{pods}"
    );
    let netpol = ok(
        &rivetctl(&socket, &["get", "netpol", "-n", "shop"], None),
        "get netpol",
    );
    assert_eq!(
        rows(&netpol),
        [["NAMESPACE", "NAME"], ["shop", "web-only"]],
        "{netpol}"
    );
    // The default namespace holds none of them.
    let empty = rivetctl(&socket, &["get", "svc"], None);
    assert_eq!(ok(&empty, "get svc in default"), "");
    assert!(String::from_utf8_lossy(&empty.stderr).contains("No resources found"));

    // JSON: a List of the objects as Kubernetes serializes them, with
    // the uid and creation time the store gave them.
    let services = get_json(&socket, &["services", "-A"]);
    assert_eq!(names(&services), ["shop/web"]);
    let web = &services[0];
    assert_eq!(
        (&web["apiVersion"], &web["kind"]),
        (&json!("v1"), &json!("Service"))
    );
    assert_eq!(web["spec"]["ports"][0]["targetPort"], "http");
    assert_eq!(web["spec"]["ports"][0]["protocol"], "TCP", "defaulted");
    let uid = web["metadata"]["uid"].as_str().expect("uid").to_owned();
    let created = web["metadata"]["creationTimestamp"]
        .as_str()
        .expect("creationTimestamp")
        .to_owned();
    assert_eq!(uid.len(), 36, "{uid}");
    assert!(created.ends_with('Z'), "{created}");
    let one = get_json(&socket, &["svc", "web", "-n", "shop"]);
    assert_eq!(names(&one), ["shop/web"]);
    assert_eq!(
        names(&get_json(&socket, &["endpointslices", "-A"])),
        ["shop/web-a", "shop/web-b"]
    );
    assert_eq!(names(&get_json(&socket, &["namespaces"])), ["shop"]);
    assert_eq!(
        names(&get_json(&socket, &["pods", "-n", "shop"])),
        ["shop/web-0"]
    );
    assert_eq!(
        names(&get_json(&socket, &["networkpolicies", "-A"])),
        ["shop/web-only"]
    );
    let e = failed(
        &rivetctl(&socket, &["get", "svc", "nope", "-n", "shop"], None),
        "get a missing Service",
    );
    assert!(e.contains("services \"nope\" not found"), "{e}");
    let e = failed(
        &rivetctl(&socket, &["get", "deployments"], None),
        "get an unknown kind",
    );
    assert!(
        e.contains("unknown kind \"deployments\"") && e.contains("endpointslices"),
        "{e}"
    );

    // The same again: unchanged.
    let out = ok(
        &rivetctl(&socket, &["apply", "-f", &file], None),
        "re-apply",
    );
    assert_eq!(out.lines().count(), 6, "{out}");
    assert!(out.lines().all(|l| l.ends_with(" unchanged")), "{out}");

    // A changed Service: configured, its uid and creation time kept.
    let changed = OBJECTS.replace("    port: 80\n", "    port: 8000\n");
    assert_ne!(changed, OBJECTS);
    std::fs::write(&file, &changed).expect("writing the document");
    let out = ok(
        &rivetctl(&socket, &["apply", "-f", &file], None),
        "apply a change",
    );
    assert!(out.lines().any(|l| l == "service/web configured"), "{out}");
    assert_eq!(
        out.lines().filter(|l| l.ends_with(" unchanged")).count(),
        5,
        "{out}"
    );
    let web = &get_json(&socket, &["svc", "web", "-n", "shop"])[0];
    assert_eq!(web["spec"]["ports"][0]["port"], 8000);
    assert_eq!(web["metadata"]["uid"], uid.as_str());
    assert_eq!(web["metadata"]["creationTimestamp"], created.as_str());

    // From standard input.
    let extra =
        "apiVersion: v1\nkind: Service\nmetadata: {name: extra}\nspec:\n  ports: [{port: 9000}]\n";
    let out = ok(
        &rivetctl(&socket, &["apply", "-f", "-"], Some(extra)),
        "apply from stdin",
    );
    assert_eq!(out.trim(), "service/extra created");

    // An invalid List: nothing of it is stored, the error names the object
    // and the field.
    let mut items: Vec<Value> = (0..4)
        .map(|i| {
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": format!("listed-{i}"), "namespace": "shop"},
                   "spec": {"ports": [{"port": 80}]}})
        })
        .collect();
    items[2]["spec"]["ports"][0]["port"] = "x".into();
    items.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "listed"}}));
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    let e = failed(
        &rivetctl(&socket, &["apply", "-f", "-"], Some(&list)),
        "apply an invalid List",
    );
    assert!(
        e.contains("Service shop/listed-2: items[2].spec.ports[0].port: invalid type: string \"x\", expected i32"),
        "{e}"
    );
    // A semantic error too.
    let bad_port = list.replace("\"x\"", "0");
    let e = failed(
        &rivetctl(&socket, &["apply", "-f", "-"], Some(&bad_port)),
        "apply port 0",
    );
    assert!(
        e.contains("Service shop/listed-2: items[2].spec.ports[0].port: port 0 is out of range"),
        "{e}"
    );
    assert_eq!(
        names(&get_json(&socket, &["svc", "-A"])),
        ["default/extra", "shop/web"]
    );
    assert_eq!(names(&get_json(&socket, &["ns"])), ["shop"]);

    // Kept across a restart of the agent, as they were.
    let before: Vec<Vec<Value>> = ["svc", "endpointslices", "ns", "pods", "netpol"]
        .iter()
        .map(|k| get_json(&socket, &[k, "-A"]))
        .collect();
    let state = w.nodes[n].agent_args.state_dir.join("objects");
    assert!(state.join("services/shop/web.json").is_file());
    assert!(state.join("namespaces/shop.json").is_file());
    let agent = w.nodes[n].agent_mut();
    let stopped = agent.stop().expect("agent was running");
    assert!(stopped.success(), "the agent stopped with {stopped}");
    agent.restart();
    let after: Vec<Vec<Value>> = ["svc", "endpointslices", "ns", "pods", "netpol"]
        .iter()
        .map(|k| get_json(&socket, &[k, "-A"]))
        .collect();
    assert_eq!(before, after, "the objects changed across the restart");
    assert!(
        w.nodes[n]
            .agent()
            .log()
            .contains("Kubernetes objects read back")
    );
    let out = ok(
        &rivetctl(&socket, &["apply", "-f", &file], None),
        "re-apply after the restart",
    );
    assert!(out.lines().all(|l| l.ends_with(" unchanged")), "{out}");

    // Delete: everything the document names; then not found, unless ignored.
    let out = ok(&rivetctl(&socket, &["delete", "-f", &file], None), "delete");
    assert_eq!(out.lines().count(), 6, "{out}");
    assert!(out.lines().all(|l| l.ends_with(" deleted")), "{out}");
    assert!(out.contains("service/web deleted"), "{out}");
    for kind in ["svc", "endpointslices", "pods", "netpol"] {
        let left = names(&get_json(&socket, &[kind, "-n", "shop"]));
        assert!(left.is_empty(), "{kind} left: {left:?}");
    }
    assert!(get_json(&socket, &["ns"]).is_empty());
    assert!(!state.join("services/shop/web.json").exists());
    let e = failed(
        &rivetctl(&socket, &["delete", "-f", &file], None),
        "delete again",
    );
    assert!(
        e.contains("not found: Namespace shop, Service shop/web"),
        "{e}"
    );
    let out = ok(
        &rivetctl(
            &socket,
            &["delete", "-f", &file, "--ignore-not-found"],
            None,
        ),
        "delete --ignore-not-found",
    );
    assert_eq!(out, "");
    // One missing object keeps the others: nothing deleted.
    let both = format!("{extra}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: gone}}\n");
    let e = failed(
        &rivetctl(&socket, &["delete", "-f", "-"], Some(&both)),
        "delete with a missing Pod",
    );
    assert!(
        e.contains("Pod default/gone") && e.contains("nothing was deleted"),
        "{e}"
    );
    assert_eq!(names(&get_json(&socket, &["svc", "-A"])), ["default/extra"]);
    let out = ok(
        &rivetctl(
            &socket,
            &["delete", "-f", "-", "--ignore-not-found"],
            Some(&both),
        ),
        "delete ignoring",
    );
    assert_eq!(out.trim(), "service/extra deleted");
    assert!(get_json(&socket, &["svc", "-A"]).is_empty());
}

#[test]
fn ten_thousand_services_in_one_list() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let socket = w.nodes[n].agent().socket().to_owned();
    const COUNT: usize = 10_000;
    let items: Vec<Value> = (0..COUNT)
        .map(|i| {
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {
                    "name": format!("svc-{i:05}"),
                    "namespace": format!("team-{}", i % 10),
                    "labels": {"app": format!("app-{i:05}"), "tier": "backend"},
                    "annotations": {"description": "a Service of the bulk test, long enough to weigh what real ones do"},
                },
                "spec": {
                    "type": "ClusterIP",
                    "clusterIP": format!("10.96.{}.{}", i / 250, i % 250 + 1),
                    "selector": {"app": format!("app-{i:05}")},
                    "ports": [
                        {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"},
                    ],
                },
            })
        })
        .collect();
    let document =
        serde_json::to_string_pretty(&json!({"apiVersion": "v1", "kind": "List", "items": items}))
            .expect("json");
    assert!(
        document.len() > 4 << 20,
        "the document ({} bytes) must exceed the old 4 MiB request limit",
        document.len()
    );
    let file = w.dir().join("bulk.json");
    std::fs::write(&file, &document).expect("writing the document");
    let file = file.to_str().expect("utf-8 path").to_owned();

    let started = Instant::now();
    let out = ok(
        &rivetctl(&socket, &["apply", "-f", &file], None),
        "apply 10,000 Services",
    );
    let took = started.elapsed();
    assert_eq!(out.lines().count(), COUNT, "one line per Service");
    assert!(
        out.lines().all(|l| l.ends_with(" created")),
        "{}",
        &out[..200]
    );
    let log = w.nodes[n].agent().log();
    let stages = log
        .lines()
        .find(|l| l.contains("objects applied"))
        .unwrap_or("(no \"objects applied\" line in the agent's log)");
    eprintln!(
        "10,000 Services ({} bytes) applied in {took:?}; the agent: {stages}",
        document.len()
    );

    let listed = get_json(&socket, &["services", "-A"]);
    assert_eq!(listed.len(), COUNT);
    let mut seen: Vec<String> = names(&listed);
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), COUNT, "every Service once");
    assert_eq!(
        get_json(&socket, &["svc", "-n", "team-3"]).len(),
        COUNT / 10
    );
    let files = std::fs::read_dir(
        w.nodes[n]
            .agent_args
            .state_dir
            .join("objects/services/team-3"),
    )
    .expect("the namespace's directory")
    .count();
    assert_eq!(files, COUNT / 10, "one file per Service");

    // Again: unchanged, nothing written.
    let out = ok(
        &rivetctl(&socket, &["apply", "-f", &file], None),
        "re-apply 10,000 Services",
    );
    assert!(
        out.lines().all(|l| l.ends_with(" unchanged")),
        "{}",
        &out[..200]
    );
    assert_eq!(out.lines().count(), COUNT);
}
