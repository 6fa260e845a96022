//! The test suite's Kubernetes API server (`rivet_tests::apiserver`) speaks
//! the real protocol: `kubectl` drives it like a cluster, and a raw HTTP
//! client checks lists, watches, patches, errors and authentication on
//! the wire. Everything runs in a world's underlay namespace.

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use rivet_tests::{
    Netns, World,
    apiserver::{ApiServer, Verb},
};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// A minimal HTTP/1.1 client (inside the namespace).

/// A response: status, headers (lower-case names), body.
struct Resp {
    code: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response {} is not JSON ({e}): {}",
                self.code,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn connect(ns: &Netns, addr: SocketAddr) -> TcpStream {
    let s = ns
        .exec(move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .unwrap_or_else(|e| panic!("connecting to the API server at {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    s
}

fn send(
    s: &mut TcpStream,
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nUser-Agent: rivet-apiserver-test\r\nAccept: application/json\r\n"
    );
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(ct) = content_type {
        head.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes()).expect("writing the request");
    s.write_all(body).expect("writing the request body");
}

fn read_head(r: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).expect("reading the status line");
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).expect("reading a header");
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((h, ""));
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    (code, headers)
}

/// Reads one chunk of a chunked body: `Some(data)`, `None` at the last
/// chunk; an error if the connection ends mid-body.
fn read_chunk(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<Vec<u8>>> {
    let mut size = String::new();
    if r.read_line(&mut size)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let n = usize::from_str_radix(size.trim(), 16)
        .map_err(|_| std::io::Error::other(format!("bad chunk size {size:?}")))?;
    let mut data = vec![0; n + 2];
    r.read_exact(&mut data)?;
    data.truncate(n);
    Ok((n > 0).then_some(data))
}

/// Which token a request carries.
#[derive(Clone, Copy)]
enum Auth<'a> {
    Server,
    Token(&'a str),
    None,
}

struct Http<'a> {
    ns: &'a Netns,
    api: &'a ApiServer,
}

impl Http<'_> {
    fn request(&self, method: &str, path: &str, auth: Auth, ct: Option<&str>, body: &[u8]) -> Resp {
        let addr = self.api.addr();
        let mut s = connect(self.ns, addr);
        let token = self.api.token();
        let token = match auth {
            Auth::Server => Some(token.as_str()),
            Auth::Token(t) => Some(t),
            Auth::None => None,
        };
        send(&mut s, addr, method, path, token, ct, body);
        let mut r = BufReader::new(s);
        let (code, headers) = read_head(&mut r);
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let mut body = Vec::new();
        if chunked {
            while let Some(c) = read_chunk(&mut r).expect("reading a chunk") {
                body.extend_from_slice(&c);
            }
        } else {
            r.read_to_end(&mut body).expect("reading the body");
        }
        Resp {
            code,
            headers,
            body,
        }
    }

    fn get(&self, path: &str) -> Resp {
        self.request("GET", path, Auth::Server, None, b"")
    }

    fn send_json(&self, method: &str, path: &str, ct: &str, body: &Value) -> Resp {
        self.request(
            method,
            path,
            Auth::Server,
            Some(ct),
            body.to_string().as_bytes(),
        )
    }

    /// GET expecting 200 with JSON.
    fn get_ok(&self, path: &str) -> Value {
        let r = self.get(path);
        assert_eq!(
            r.code,
            200,
            "GET {path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        r.json()
    }

    fn watch(&self, path: &str) -> Watch {
        let addr = self.api.addr();
        let mut s = connect(self.ns, addr);
        send(
            &mut s,
            addr,
            "GET",
            path,
            Some(&self.api.token()),
            None,
            b"",
        );
        let mut r = BufReader::new(s);
        let (code, headers) = read_head(&mut r);
        assert_eq!(code, 200, "watch {path}");
        let has = |k: &str, v: &str| headers.iter().any(|(hk, hv)| hk == k && hv.contains(v));
        assert!(
            has("content-type", "application/json"),
            "watch {path}: {headers:?}"
        );
        assert!(
            has("transfer-encoding", "chunked"),
            "watch {path}: {headers:?}"
        );
        Watch {
            r,
            buf: Vec::new(),
            path: path.to_string(),
        }
    }
}

/// An open watch response.
struct Watch {
    r: BufReader<TcpStream>,
    buf: Vec<u8>,
    path: String,
}

/// What a watch gave next.
#[derive(Debug)]
enum Next {
    Event(Value),
    /// The response ended with its last chunk.
    End,
    /// The connection ended mid-response.
    Aborted,
}

impl Watch {
    fn next(&mut self) -> Next {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let v = serde_json::from_slice(&line).unwrap_or_else(|e| {
                    panic!(
                        "watch {}: event not JSON ({e}): {}",
                        self.path,
                        String::from_utf8_lossy(&line)
                    )
                });
                return Next::Event(v);
            }
            match read_chunk(&mut self.r) {
                Ok(Some(c)) => self.buf.extend_from_slice(&c),
                Ok(None) => {
                    assert!(
                        self.buf.is_empty(),
                        "watch {}: partial line at the end",
                        self.path
                    );
                    return Next::End;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    panic!("watch {}: nothing within the read timeout", self.path)
                }
                Err(_) => return Next::Aborted,
            }
        }
    }

    /// The next event; panics on the end of the stream.
    fn event(&mut self) -> Value {
        match self.next() {
            Next::Event(v) => v,
            other => panic!("watch {}: expected an event, got {other:?}", self.path),
        }
    }
}

fn rv_of(v: &Value) -> u64 {
    v.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no resourceVersion in {v}"))
}

fn name_of(v: &Value) -> &str {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no name in {v}"))
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": "a"}},
        "spec": {"podCIDR": "10.244.1.0/24"}})
}

// ---------------------------------------------------------------------------
// kubectl.

fn kubectl_bin() -> PathBuf {
    let bin = std::env::var_os("RIVET_KUBECTL")
        .map_or_else(|| PathBuf::from("/usr/bin/kubectl"), PathBuf::from);
    assert!(
        bin.exists(),
        "{} missing: `cargo xtask setup` installs kubectl (Debian package kubernetes-client)",
        bin.display()
    );
    bin
}

struct Kubectl<'a> {
    ns: &'a Netns,
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl<'_> {
    fn command(&self, kubeconfig: &Path, args: &[&str]) -> std::process::Command {
        let mut cmd = self.ns.command(&kubectl_bin().to_string_lossy());
        cmd.env("HOME", &self.dir)
            .env_remove("KUBECONFIG")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("cache"))
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    fn run_with(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        self.command(kubeconfig, args)
            .output()
            .unwrap_or_else(|e| panic!("running kubectl {args:?}: {e}"))
    }

    /// Runs kubectl; panics unless it succeeds. Returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run_with(&self.kubeconfig, args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("kubectl {args:?}: not JSON ({e}): {out}"))
    }
}

const NAMESPACE: &str = "\
apiVersion: v1
kind: Namespace
metadata:
  name: shop
";

fn objects(zone: &str) -> String {
    format!(
        "\
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  labels:
    app: web
spec:
  clusterIP: 10.96.0.10
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
    protocol: TCP
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  namespace: shop
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
endpoints:
- addresses:
  - 10.1.1.5
  conditions:
    ready: true
  nodeName: n1
ports:
- name: http
  port: 8080
  protocol: TCP
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: deny
  namespace: shop
spec:
  podSelector:
    matchLabels:
      app: web
  policyTypes:
  - Ingress
---
apiVersion: v1
kind: Node
metadata:
  name: n1
  labels:
    zone: {zone}
spec:
  podCIDR: 10.244.1.0/24
  podCIDRs:
  - 10.244.1.0/24
"
    )
}

#[test]
fn kubectl_applies_gets_watches_and_deletes() {
    let w = World::new();
    let api = w.start_apiserver();
    let dir = w.dir.join("kubectl");
    std::fs::create_dir_all(&dir).expect("kubectl dir");
    let kubeconfig = dir.join("config");
    api.write_kubeconfig_tls(&kubeconfig);
    let k = Kubectl {
        ns: &w.underlay,
        dir: dir.clone(),
        kubeconfig: kubeconfig.clone(),
    };
    let ns_file = dir.join("namespace.yaml");
    let obj_file = dir.join("objects.yaml");
    std::fs::write(&ns_file, NAMESPACE).expect("namespace.yaml");
    std::fs::write(&obj_file, objects("a")).expect("objects.yaml");
    let (nsf, objf) = (ns_file.to_string_lossy(), obj_file.to_string_lossy());

    // apply: GET → 404 → POST for each.
    let out = k.ok(&["apply", "--validate=false", "-f", &nsf, "-f", &objf]);
    for line in [
        "namespace/shop created",
        "service/web created",
        "endpointslice.discovery.k8s.io/web-abc created",
        "networkpolicy.networking.k8s.io/deny created",
        "node/n1 created",
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "apply output lacks {line:?}: {out}"
        );
    }
    assert_eq!(api.count("nodes", Verb::Create), 1);
    assert_eq!(api.count("endpointslices", Verb::Create), 1);

    // get -o json: the fields as applied, metadata as the server set it.
    let svc = k.json(&["get", "service", "web", "-n", "shop", "-o", "json"]);
    assert_eq!(svc["kind"], "Service");
    assert_eq!(svc["spec"]["clusterIP"], "10.96.0.10");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080);
    assert_eq!(svc["metadata"]["namespace"], "shop");
    let stored = api.get("services", "shop", "web").expect("stored service");
    assert_eq!(svc["metadata"]["uid"], stored["metadata"]["uid"]);
    assert_eq!(
        svc["metadata"]["resourceVersion"],
        stored["metadata"]["resourceVersion"]
    );
    let eps = k.json(&[
        "get",
        "endpointslices.discovery.k8s.io",
        "web-abc",
        "-n",
        "shop",
        "-o",
        "json",
    ]);
    assert_eq!(eps["endpoints"][0]["addresses"], json!(["10.1.1.5"]));
    assert_eq!(
        eps["metadata"]["labels"]["kubernetes.io/service-name"],
        "web"
    );
    let pol = k.json(&["get", "netpol", "deny", "-n", "shop", "-o", "json"]);
    assert_eq!(pol["spec"]["podSelector"]["matchLabels"]["app"], "web");
    assert_eq!(pol["apiVersion"], "networking.k8s.io/v1");
    let nsobj = k.json(&["get", "ns", "shop", "-o", "json"]);
    assert_eq!(nsobj["kind"], "Namespace");
    let n1 = k.json(&["get", "node", "n1", "-o", "json"]);
    assert_eq!(n1["spec"]["podCIDR"], "10.244.1.0/24");
    assert_eq!(n1["metadata"]["labels"]["zone"], "a");
    assert_eq!(n1["metadata"]["generation"], 1);
    assert!(
        n1["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .is_some_and(|s| s.contains("\"zone\":\"a\"")),
        "no last-applied-configuration: {n1}"
    );
    let rv_before = rv_of(&n1);
    // A list through kubectl (JSON), and the printed table.
    let list = k.json(&["get", "services", "--all-namespaces", "-o", "json"]);
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1), "{list}");
    let table = k.ok(&["get", "nodes"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(header, ["NAME", "AGE"], "{table}");
    let row: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(row.first(), Some(&"n1"), "{table}");
    assert_eq!(lines.next(), None, "{table}");

    // apply again with a changed label: GET → strategic merge PATCH.
    let patches_before = api.count("nodes", Verb::Patch);
    std::fs::write(&obj_file, objects("b")).expect("objects.yaml");
    let out = k.ok(&["apply", "--validate=false", "-f", &objf]);
    assert!(out.lines().any(|l| l == "node/n1 configured"), "{out}");
    assert!(out.lines().any(|l| l == "service/web unchanged"), "{out}");
    assert_eq!(api.count("nodes", Verb::Patch), patches_before + 1);
    let p = api.patches("nodes", "", "n1");
    let last = p.last().expect("a PATCH of n1");
    assert_eq!(last.content_type, "application/strategic-merge-patch+json");
    assert_eq!(
        last.body["metadata"]["labels"]["zone"], "b",
        "{:?}",
        last.body
    );
    assert_eq!(last.code, 200);
    let n1 = k.json(&["get", "node", "n1", "-o", "json"]);
    assert_eq!(n1["metadata"]["labels"]["zone"], "b");
    assert!(rv_of(&n1) > rv_before, "resourceVersion not bumped: {n1}");
    assert_eq!(
        n1["spec"]["podCIDR"], "10.244.1.0/24",
        "spec lost by the patch"
    );

    // get --watch in the background while the node is patched.
    let mut child = k
        .command(&kubeconfig, &["get", "nodes", "--watch", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning kubectl get --watch");
    let mut stdout = child.stdout.take().expect("kubectl stdout");
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while api.watching("nodes") == 0 {
        assert!(
            Instant::now() < deadline,
            "kubectl never started watching nodes"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let http = Http {
        ns: &w.underlay,
        api: &api,
    };
    let r = http.send_json(
        "PATCH",
        "/api/v1/nodes/n1",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"watched": "yes"}}}),
    );
    assert_eq!(r.code, 200, "{}", String::from_utf8_lossy(&r.body));
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&seen).contains("\"watched\": \"yes\"") {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(chunk) => seen.extend_from_slice(&chunk),
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "kubectl get --watch did not show the change: {}",
                    String::from_utf8_lossy(&seen)
                );
            }
        }
    }
    child.kill().expect("stopping kubectl get --watch");
    let _ = child.wait();
    reader.join().expect("kubectl reader");
    let watches = api.watch_starts("nodes");
    assert!(
        watches
            .iter()
            .any(|rv| rv.as_deref().is_some_and(|rv| rv != "0")),
        "kubectl's watch did not start from its list's resourceVersion: {watches:?}"
    );

    // delete -f: every object gone from the store.
    let out = k.ok(&["delete", "-f", &objf]);
    assert!(out.contains("node \"n1\" deleted"), "{out}");
    let out = k.ok(&["delete", "-f", &nsf]);
    assert!(out.contains("namespace \"shop\" deleted"), "{out}");
    for (res, ns) in [
        ("nodes", None),
        ("namespaces", None),
        ("services", Some("shop")),
        ("endpointslices", Some("shop")),
        ("networkpolicies", Some("shop")),
    ] {
        assert_eq!(api.list(res, ns), Vec::<Value>::new(), "{res} left");
    }
    let out = k.run_with(&kubeconfig, &["get", "node", "n1", "-o", "json"]);
    assert!(!out.status.success(), "get of a deleted node succeeded");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A bad token: Unauthorized, counted.
    let refused = api.unauthorized();
    let bad = dir.join("bad-config");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&kubeconfig)
            .expect("kubeconfig")
            .replace(&api.token(), "not-the-token"),
    )
    .expect("bad kubeconfig");
    let out = k.run_with(&bad, &["get", "nodes", "-o", "json"]);
    assert!(!out.status.success(), "kubectl with a bad token succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Unauthorized"), "{err}");
    assert!(api.unauthorized() > refused, "401 not counted");

    // A token file, rotated: the server's tokens and the file change together.
    let token_file = dir.join("token");
    std::fs::write(&token_file, api.token()).expect("token file");
    let tf_config = dir.join("tf-config");
    api.write_kubeconfig_with(&tf_config, true, Some(&token_file));
    assert!(k.run_with(&tf_config, &["get", "nodes"]).status.success());
    api.set_tokens(&["rotated-token"]);
    let out = k.run_with(&tf_config, &["get", "nodes"]);
    assert!(!out.status.success(), "an old token still accepted");
    std::fs::write(&token_file, "rotated-token").expect("token file");
    let out = k.run_with(&tf_config, &["get", "nodes"]);
    assert!(
        out.status.success(),
        "rotated token refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Over plain HTTP kubectl sends no credentials at all: refused.
    let plain = dir.join("plain-config");
    api.write_kubeconfig(&plain);
    let refused = api.unauthorized();
    let out = k.run_with(&plain, &["get", "nodes"]);
    assert!(
        !out.status.success(),
        "kubectl without credentials succeeded"
    );
    assert!(api.unauthorized() > refused);
}

// ---------------------------------------------------------------------------
// The protocol on the wire.

#[test]
fn list_pages_share_one_snapshot() {
    let w = World::new();
    let api = w.start_apiserver();
    let http = Http {
        ns: &w.underlay,
        api: &api,
    };
    api.apply_all((0..1200).map(|i| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{i:04}"), "namespace": if i % 2 == 0 { "a" } else { "b" },
                "labels": {"tier": if i % 3 == 0 { "fe" } else { "be" }}},
            "spec": {"nodeName": if i < 100 { "n1" } else { "n2" }}})
    }));
    let mut names = Vec::new();
    let mut rvs = BTreeSet::new();
    let mut path = "/api/v1/pods?limit=500".to_string();
    let mut pages = 0;
    let mut first_token = None;
    loop {
        let list = http.get_ok(&path);
        pages += 1;
        assert_eq!(list["kind"], "PodList");
        assert_eq!(list["apiVersion"], "v1");
        let items = list["items"].as_array().expect("items");
        assert!(
            items.iter().all(|i| i.get("kind").is_none()),
            "list items carry kind"
        );
        names.extend(items.iter().map(|i| name_of(i).to_string()));
        rvs.insert(
            list["metadata"]["resourceVersion"]
                .as_str()
                .expect("list rv")
                .to_string(),
        );
        if pages == 1 {
            assert_eq!(items.len(), 500);
            // A write between pages must not show in the later pages.
            api.apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p9999", "namespace": "b"}}));
            api.delete("pods", "a", "p0998").expect("p0998");
        }
        match list["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => {
                first_token.get_or_insert_with(|| c.to_string());
                path = format!("/api/v1/pods?limit=500&continue={c}");
            }
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(rvs.len(), 1, "pages at different resourceVersions: {rvs:?}");
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(names.len(), 1200, "items listed twice or missed");
    assert_eq!(unique.len(), 1200);
    assert!(unique.contains(&"p0998".to_string()) && !unique.contains(&"p9999".to_string()));
    let rec = api.requests();
    let lists: Vec<_> = rec.iter().filter(|r| r.verb == Verb::List).collect();
    assert_eq!(lists.len(), 3);
    assert_eq!(lists.iter().filter(|r| r.continued).count(), 2);

    // One namespace, selectors.
    let a = http.get_ok("/api/v1/namespaces/a/pods");
    assert_eq!(a["items"].as_array().map(Vec::len), Some(599));
    let fe = http.get_ok("/api/v1/pods?labelSelector=tier%3Dfe");
    assert_eq!(fe["items"].as_array().map(Vec::len), Some(400));
    let fe_a = http.get_ok("/api/v1/namespaces/a/pods?labelSelector=tier+in+(fe)");
    assert_eq!(fe_a["items"].as_array().map(Vec::len), Some(200));
    let not_fe = http.get_ok("/api/v1/pods?labelSelector=tier!%3Dfe,tier");
    assert_eq!(not_fe["items"].as_array().map(Vec::len), Some(799));
    let on_n1 = http.get_ok("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1");
    assert_eq!(on_n1["items"].as_array().map(Vec::len), Some(100));
    let one =
        http.get_ok("/api/v1/pods?fieldSelector=metadata.name%3Dp0001,metadata.namespace%3Db");
    assert_eq!(one["items"][0]["metadata"]["name"], "p0001");
    assert_eq!(one["items"].as_array().map(Vec::len), Some(1));
    let bad = http.get("/api/v1/nodes?fieldSelector=spec.nodeName%3Dn1");
    assert_eq!(bad.code, 400);
    // Selected pages: limit counts selected items.
    let page = http.get_ok("/api/v1/pods?labelSelector=tier%3Dfe&limit=150");
    assert_eq!(page["items"].as_array().map(Vec::len), Some(150));
    assert!(
        page["metadata"]["continue"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
    );

    // A continue token older than the history: 410 Expired.
    api.compact();
    let token = first_token.expect("a continue token");
    let r = http.get(&format!("/api/v1/pods?limit=500&continue={token}"));
    assert_eq!(r.code, 410, "{}", String::from_utf8_lossy(&r.body));
    let s = r.json();
    assert_eq!(s["kind"], "Status");
    assert_eq!(s["reason"], "Expired");
    assert_eq!(s["code"], 410);

    // 10,000 objects in pages of 500: linear, not quadratic.
    api.apply_all((0..10_000).map(|i| {
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("s{i:05}"), "namespace": format!("ns{}", i % 10)},
            "spec": {"clusterIP": format!("10.96.{}.{}", i / 250, i % 250), "ports": [{"port": 80}]}})
    }));
    let start = Instant::now();
    let mut total = 0;
    let mut path = "/api/v1/services?limit=500".to_string();
    loop {
        let list = http.get_ok(&path);
        total += list["items"].as_array().map_or(0, Vec::len);
        match list["metadata"]["continue"].as_str() {
            Some(c) => path = format!("/api/v1/services?limit=500&continue={c}"),
            None => break,
        }
    }
    let took = start.elapsed();
    assert_eq!(total, 10_000);
    assert!(
        took < Duration::from_secs(5),
        "listing 10,000 services took {took:?}"
    );
}

#[test]
fn watch_replays_history_in_order_then_goes_live() {
    let w = World::new();
    let api = w.start_apiserver();
    let http = Http {
        ns: &w.underlay,
        api: &api,
    };
    api.apply(node("a"));
    let from = api.resource_version();
    let mut a = node("a");
    a["metadata"]["labels"]["zone"] = json!("b");
    api.apply(a);
    api.apply(node("b"));
    api.apply(
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "x"}}),
    );
    api.delete("nodes", "", "a").expect("a");
    let mut watch = http.watch(&format!("/api/v1/nodes?watch=1&resourceVersion={from}"));
    let mut got = Vec::new();
    for _ in 0..3 {
        let e = watch.event();
        got.push((
            e["type"].as_str().unwrap_or("").to_string(),
            name_of(&e["object"]).to_string(),
            rv_of(&e["object"]),
        ));
        assert_eq!(e["object"]["kind"], "Node");
        assert_eq!(e["object"]["apiVersion"], "v1");
    }
    assert_eq!(
        got,
        [
            ("MODIFIED".to_string(), "a".to_string(), from + 1),
            ("ADDED".to_string(), "b".to_string(), from + 2),
            ("DELETED".to_string(), "a".to_string(), from + 4),
        ]
    );
    // Live.
    api.apply(node("c"));
    let e = watch.event();
    assert_eq!(
        (e["type"].as_str(), name_of(&e["object"])),
        (Some("ADDED"), "c")
    );
    assert_eq!(rv_of(&e["object"]), api.resource_version());
    assert_eq!(api.watch_starts("nodes"), [Some(from.to_string())]);

    // From "0": the current objects as ADDED, then live.
    let mut zero = http.watch("/api/v1/nodes?watch=true&resourceVersion=0");
    let mut names = BTreeSet::new();
    for _ in 0..2 {
        let e = zero.event();
        assert_eq!(e["type"], "ADDED");
        names.insert(name_of(&e["object"]).to_string());
    }
    assert_eq!(names, BTreeSet::from(["b".to_string(), "c".to_string()]));

    // Concurrent writes: every event, in resourceVersion order, no gap.
    let start = api.resource_version();
    let mut live = http.watch(&format!("/api/v1/nodes?watch=1&resourceVersion={start}"));
    const WRITES: u64 = 600;
    std::thread::scope(|s| {
        for t in 0..3 {
            let api = &api;
            s.spawn(move || {
                for i in 0..WRITES / 3 {
                    let mut n = node(&format!("w{t}"));
                    n["metadata"]["labels"]["i"] = json!(i.to_string());
                    api.apply(n);
                }
            });
        }
        let mut expect = start + 1;
        while expect <= start + WRITES {
            let e = live.event();
            assert_eq!(
                rv_of(&e["object"]),
                expect,
                "event out of order or missing: {e}"
            );
            expect += 1;
        }
    });
    // Both watches above are still open on "b" and "c"; selectors apply.
    let mut sel = http.watch(&format!(
        "/api/v1/nodes?watch=1&resourceVersion={}&labelSelector=zone%3Dq",
        api.resource_version()
    ));
    let mut b = node("b");
    b["metadata"]["labels"]["zone"] = json!("q");
    api.apply(b.clone());
    let e = sel.event();
    assert_eq!(
        (e["type"].as_str(), name_of(&e["object"])),
        (Some("ADDED"), "b")
    );
    b["metadata"]["labels"]["zone"] = json!("r");
    api.apply(b);
    let e = sel.event();
    assert_eq!(
        (e["type"].as_str(), name_of(&e["object"])),
        (Some("DELETED"), "b")
    );

    // drop_watches: every open watch ends mid-response, also one whose
    // client has not read for a while (`zero` has 600 events queued).
    let mut fresh = http.watch(&format!(
        "/api/v1/nodes?watch=1&resourceVersion={}",
        api.resource_version()
    ));
    api.drop_watches();
    assert!(matches!(fresh.next(), Next::Aborted), "watch not aborted");
    let mut queued = 0;
    loop {
        match zero.next() {
            Next::Event(_) => queued += 1,
            Next::Aborted => break,
            Next::End => panic!("a dropped watch ended cleanly"),
        }
    }
    assert!(queued <= WRITES as usize + 2, "{queued} events");
    let deadline = Instant::now() + Duration::from_secs(5);
    while api.watching("nodes") != 0 {
        assert!(
            Instant::now() < deadline,
            "{} watches still open",
            api.watching("nodes")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn watch_bookmarks_timeout_and_expiry() {
    let w = World::new();
    let api = w.start_apiserver();
    api.set_bookmark_interval(Duration::from_millis(200));
    let http = Http {
        ns: &w.underlay,
        api: &api,
    };
    api.apply(node("a"));
    let rv = api.resource_version();

    // Asked for: bookmarks at the current resourceVersion; the stream ends
    // at timeoutSeconds with its last chunk.
    let start = Instant::now();
    let mut watch = http.watch(&format!(
        "/api/v1/nodes?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=2"
    ));
    let mut bookmarks = 0;
    loop {
        match watch.next() {
            Next::Event(e) => {
                assert_eq!(e["type"], "BOOKMARK", "{e}");
                assert_eq!(e["object"]["kind"], "Node");
                assert_eq!(e["object"]["apiVersion"], "v1");
                assert_eq!(e["object"]["metadata"]["resourceVersion"], rv.to_string());
                bookmarks += 1;
            }
            Next::End => break,
            Next::Aborted => panic!("watch aborted instead of ending"),
        }
    }
    let took = start.elapsed();
    assert!(
        (Duration::from_millis(1800)..Duration::from_secs(4)).contains(&took),
        "timeoutSeconds=2 ended after {took:?}"
    );
    assert!(bookmarks >= 3, "{bookmarks} bookmarks in 2 s at 200 ms");
    assert!(
        api.requests()
            .iter()
            .any(|r| r.verb == Verb::Watch && r.bookmarks)
    );

    // Not asked for: none.
    let mut watch = http.watch(&format!(
        "/api/v1/nodes?watch=1&resourceVersion={rv}&timeoutSeconds=1"
    ));
    assert!(
        matches!(watch.next(), Next::End),
        "an event without bookmarks asked"
    );

    // History compacted: an ERROR event with a 410 Status, then the end.
    api.apply(node("b"));
    api.compact();
    let mut old = http.watch(&format!("/api/v1/nodes?watch=1&resourceVersion={rv}"));
    let e = old.event();
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["kind"], "Status");
    assert_eq!(e["object"]["code"], 410);
    assert_eq!(e["object"]["reason"], "Expired");
    assert!(matches!(old.next(), Next::End), "stream went on after 410");
    // From the compaction point on it works.
    let now = api.resource_version();
    let mut fresh = http.watch(&format!(
        "/api/v1/nodes?watch=1&resourceVersion={now}&timeoutSeconds=5"
    ));
    api.apply(node("c"));
    let e = fresh.event();
    assert_eq!(
        (e["type"].as_str(), name_of(&e["object"])),
        (Some("ADDED"), "c")
    );
    assert_eq!(api.watch_starts("nodes").len(), 4);
}

#[test]
fn patches_status_subresource_and_conflicts() {
    let w = World::new();
    let api = w.start_apiserver();
    let http = Http {
        ns: &w.underlay,
        api: &api,
    };
    api.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "labels": {"zone": "a"}, "annotations": {"x": "1", "y": "2"}},
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "Booting"},
            {"type": "MemoryPressure", "status": "False"}
        ], "addresses": [{"type": "InternalIP", "address": "192.168.1.11"}]}}));
    let rv0 = rv_of(&api.get("nodes", "", "n1").expect("n1"));

    // Merge patch of annotations: null deletes, others merge.
    let r = http.send_json(
        "PATCH",
        "/api/v1/nodes/n1",
        "application/merge-patch+json",
        &json!({"metadata": {"annotations": {"x": null, "z": "3"}}}),
    );
    assert_eq!(r.code, 200, "{}", String::from_utf8_lossy(&r.body));
    let n = r.json();
    assert_eq!(n["metadata"]["annotations"], json!({"y": "2", "z": "3"}));
    assert_eq!(rv_of(&n), rv0 + 1);
    assert_eq!(
        n["metadata"]["generation"], 1,
        "metadata change bumped generation"
    );

    // Strategic patch of a condition through /status: merged by type.
    let r = http.send_json("PATCH", "/api/v1/nodes/n1/status", "application/strategic-merge-patch+json",
        &json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
                "metadata": {"labels": {"zone": "changed"}}}));
    assert_eq!(r.code, 200, "{}", String::from_utf8_lossy(&r.body));
    let n = r.json();
    assert_eq!(
        n["status"]["conditions"],
        json!([
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            {"type": "MemoryPressure", "status": "False"}
        ])
    );
    assert_eq!(
        n["metadata"]["labels"]["zone"], "a",
        "/status changed labels"
    );
    assert_eq!(n["status"]["addresses"][0]["address"], "192.168.1.11");

    // The main resource does not change status.
    let r = http.send_json("PATCH", "/api/v1/nodes/n1", "application/strategic-merge-patch+json",
        &json!({"metadata": {"labels": {"zone": "b"}}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}));
    assert_eq!(r.code, 200);
    let n = r.json();
    assert_eq!(n["metadata"]["labels"]["zone"], "b");
    assert_eq!(
        n["status"]["conditions"][0]["status"], "True",
        "main resource changed status"
    );

    // A merge patch replaces lists.
    let r = http.send_json(
        "PATCH",
        "/api/v1/nodes/n1/status",
        "application/merge-patch+json",
        &json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
    );
    assert_eq!(
        r.json()["status"]["conditions"],
        json!([{"type": "Ready", "status": "False"}])
    );

    // JSON patch; spec change bumps generation.
    let r = http.send_json(
        "PATCH",
        "/api/v1/nodes/n1",
        "application/json-patch+json",
        &json!([{"op": "add", "path": "/spec/unschedulable", "value": true}]),
    );
    assert_eq!(r.code, 200, "{}", String::from_utf8_lossy(&r.body));
    let n = r.json();
    assert_eq!(n["spec"]["unschedulable"], true);
    assert_eq!(n["metadata"]["generation"], 2);

    // A stale resourceVersion: 409 Conflict, for PATCH and PUT.
    let r = http.send_json(
        "PATCH",
        "/api/v1/nodes/n1",
        "application/merge-patch+json",
        &json!({"metadata": {"resourceVersion": rv0.to_string(), "labels": {"zone": "c"}}}),
    );
    assert_eq!(r.code, 409);
    assert_eq!(r.json()["reason"], "Conflict");
    let mut stale = api.get("nodes", "", "n1").expect("n1");
    stale["metadata"]["resourceVersion"] = json!(rv0.to_string());
    let r = http.send_json("PUT", "/api/v1/nodes/n1", "application/json", &stale);
    assert_eq!(r.code, 409);
    // A current one: replaced; status kept by PUT on the main resource.
    let mut cur = api.get("nodes", "", "n1").expect("n1");
    cur["metadata"]["labels"]["zone"] = json!("d");
    cur["status"] = json!({});
    let r = http.send_json("PUT", "/api/v1/nodes/n1", "application/json", &cur);
    assert_eq!(r.code, 200);
    let n = r.json();
    assert_eq!(n["metadata"]["labels"]["zone"], "d");
    assert_eq!(n["status"]["conditions"][0]["type"], "Ready");

    // The patch log.
    let log = api.patches("nodes", "", "n1");
    assert_eq!(
        log.iter()
            .map(|p| (p.content_type.as_str(), p.subresource.as_deref(), p.code))
            .collect::<Vec<_>>(),
        [
            ("application/merge-patch+json", None, 200),
            (
                "application/strategic-merge-patch+json",
                Some("status"),
                200
            ),
            ("application/strategic-merge-patch+json", None, 200),
            ("application/merge-patch+json", Some("status"), 200),
            ("application/json-patch+json", None, 200),
            ("application/merge-patch+json", None, 409),
        ]
    );
    assert_eq!(log[0].body["metadata"]["annotations"]["z"], "3");

    // Strategic merge of Service ports by port, of containers by name.
    api.apply(
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "x"},
        "spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}}),
    );
    let r = http.send_json("PATCH", "/api/v1/namespaces/x/services/s", "application/strategic-merge-patch+json",
        &json!({"spec": {"ports": [{"port": 443, "targetPort": 8443}, {"port": 53, "$patch": "delete"}]}}));
    assert_eq!(r.code, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["spec"]["ports"],
        json!([{"port": 80, "name": "http"}, {"port": 443, "name": "https", "targetPort": 8443}])
    );
    api.apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "x"},
        "spec": {"containers": [{"name": "a", "image": "i1", "ports": [{"containerPort": 80}]}, {"name": "b", "image": "i2"}]}}));
    let r = http.send_json(
        "PATCH",
        "/api/v1/namespaces/x/pods/p",
        "application/strategic-merge-patch+json",
        &json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 81}]}]}}),
    );
    assert_eq!(
        r.json()["spec"]["containers"],
        json!([{"name": "a", "image": "i1", "ports": [{"containerPort": 80}, {"containerPort": 81}]}, {"name": "b", "image": "i2"}])
    );
    // Unsupported patch type.
    let r = http.send_json(
        "PATCH",
        "/api/v1/nodes/n1",
        "application/apply-patch+yaml",
        &json!({}),
    );
    assert_eq!(r.code, 415);
}

#[test]
fn errors_and_authentication() {
    let w = World::new();
    let api = w.start_apiserver();
    let http = Http {
        ns: &w.underlay,
        api: &api,
    };

    // No token, a wrong token: 401 Status, counted; rotation.
    let r = http.request("GET", "/api/v1/nodes", Auth::None, None, b"");
    assert_eq!(r.code, 401);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let s = r.json();
    assert_eq!(
        (
            s["kind"].as_str(),
            s["apiVersion"].as_str(),
            s["status"].as_str(),
            s["reason"].as_str(),
            s["code"].as_u64()
        ),
        (
            Some("Status"),
            Some("v1"),
            Some("Failure"),
            Some("Unauthorized"),
            Some(401)
        )
    );
    let r = http.request("GET", "/version", Auth::Token("nope"), None, b"");
    assert_eq!(r.code, 401);
    assert_eq!(api.unauthorized(), 2);
    api.set_tokens(&["t2", "t3"]);
    assert_eq!(
        http.request("GET", "/api", Auth::Token("t3"), None, b"")
            .code,
        200
    );
    assert_eq!(
        http.request("GET", "/api", Auth::Token("rivet-test-token"), None, b"")
            .code,
        401
    );
    assert_eq!(api.unauthorized(), 3);
    assert_eq!(api.token(), "t2");

    // Discovery.
    let v = http.get_ok("/version");
    assert_eq!(
        (v["major"].as_str(), v["minor"].as_str()),
        (Some("1"), Some("35"))
    );
    assert_eq!(http.get_ok("/api")["versions"], json!(["v1"]));
    let groups = http.get_ok("/apis");
    let names: Vec<&str> = groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    assert_eq!(names, ["discovery.k8s.io", "networking.k8s.io"]);
    let core = http.get_ok("/api/v1");
    let nodes = core["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .find(|r| r["name"] == "nodes")
        .expect("nodes");
    assert_eq!(
        (nodes["kind"].as_str(), nodes["namespaced"].as_bool()),
        (Some("Node"), Some(false))
    );
    assert_eq!(nodes["shortNames"], json!(["no"]));
    let eps = http.get_ok("/apis/discovery.k8s.io/v1");
    assert_eq!(eps["resources"][0]["kind"], "EndpointSlice");
    assert_eq!(http.get("/openapi/v2").code, 404);

    // Store errors as Status objects.
    let r = http.get("/api/v1/nodes/missing");
    assert_eq!(r.code, 404);
    let s = r.json();
    assert_eq!(
        (s["reason"].as_str(), s["code"].as_u64()),
        (Some("NotFound"), Some(404))
    );
    assert_eq!(s["message"], "nodes \"missing\" not found");
    let n = node("n1");
    let r = http.send_json("POST", "/api/v1/nodes", "application/json", &n);
    assert_eq!(r.code, 201, "{}", String::from_utf8_lossy(&r.body));
    let created = r.json();
    assert!(
        created["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36),
        "{created}"
    );
    assert!(
        created["metadata"]["creationTimestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert_eq!(created["metadata"]["generation"], 1);
    let r = http.send_json("POST", "/api/v1/nodes", "application/json", &n);
    assert_eq!(
        (r.code, r.json()["reason"].as_str().map(str::to_string)),
        (409, Some("AlreadyExists".into()))
    );
    let r = http.send_json(
        "POST",
        "/api/v1/nodes",
        "application/json",
        &json!({"kind": "Node", "apiVersion": "v1", "metadata": {}}),
    );
    assert_eq!(r.code, 422);
    assert_eq!(r.json()["reason"], "Invalid");
    let r = http.request(
        "POST",
        "/api/v1/nodes",
        Auth::Server,
        Some("application/json"),
        b"{not json",
    );
    assert_eq!(r.code, 400);
    assert_eq!(r.json()["reason"], "BadRequest");
    let r = http.send_json("POST", "/api/v1/namespaces/x/services", "application/json",
        &json!({"kind": "Service", "apiVersion": "v1", "metadata": {"name": "s", "namespace": "y"}}));
    assert_eq!(r.code, 400, "namespace mismatch accepted");
    // Namespaced objects: created in the path's namespace, listed at both scopes.
    let r = http.send_json("POST", "/apis/networking.k8s.io/v1/namespaces/x/networkpolicies", "application/json",
        &json!({"kind": "NetworkPolicy", "apiVersion": "networking.k8s.io/v1", "metadata": {"name": "p"}, "spec": {"podSelector": {}}}));
    assert_eq!(r.code, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["metadata"]["namespace"], "x");
    assert_eq!(
        http.get_ok("/apis/networking.k8s.io/v1/networkpolicies")["items"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(
        http.get_ok("/apis/networking.k8s.io/v1/namespaces/y/networkpolicies")["items"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );
    // DELETE returns the object; a second one is 404.
    let r = http.request(
        "DELETE",
        "/apis/networking.k8s.io/v1/namespaces/x/networkpolicies/p",
        Auth::Server,
        None,
        b"",
    );
    assert_eq!(r.code, 200);
    assert_eq!(r.json()["metadata"]["name"], "p");
    let r = http.request(
        "DELETE",
        "/apis/networking.k8s.io/v1/namespaces/x/networkpolicies/p",
        Auth::Server,
        None,
        b"",
    );
    assert_eq!(r.code, 404);
    let verbs: Vec<(Verb, u16)> = api
        .requests()
        .iter()
        .filter(|r| r.resource == "networkpolicies")
        .map(|r| (r.verb, r.code))
        .collect();
    assert_eq!(
        verbs,
        [
            (Verb::Create, 201),
            (Verb::List, 200),
            (Verb::List, 200),
            (Verb::Delete, 200),
            (Verb::Delete, 404)
        ]
    );
}
