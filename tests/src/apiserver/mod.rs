//! A Kubernetes API server for the integration tests: the wire protocol of
//! kube-apiserver for exactly what rivet's agents use.
//!
//! This is the only stand-in in the test suite. Everything else the tests
//! drive is the real program (etcd, containerd, podman, the CNI plugins,
//! iptables); kube-apiserver cannot be installed on the machines the suite
//! runs on, so agents whose source of truth is the Kubernetes API talk to
//! this server instead. It serves JSON with bearer tokens from a listener
//! bound inside a test's network namespace (the underlay:
//! [`World::start_apiserver`] binds 192.168.<k>.1:6443), over TLS (a CA and
//! a serving certificate made at start; [`ApiServer::write_kubeconfig_tls`])
//! or plain HTTP on the same port (a connection that starts with a TLS
//! handshake gets TLS). client-go, hence kubectl, sends credentials only
//! over TLS; kube-rs sends them over plain HTTP too.
//!
//! `tests/tests/apiserver.rs` proves it speaks the protocol: Debian's
//! `kubectl` (package `kubernetes-client`, installed by `cargo xtask
//! setup`; any `/usr/bin/kubectl`, or `$RIVET_KUBECTL`) applies, gets,
//! patches, watches and deletes objects against it, and a raw HTTP client
//! checks chunking, watch replay, bookmarks, 410s and patches byte by byte.
//!
//! # What it implements
//!
//! Resources: core `v1` `namespaces`, `nodes` (cluster-scoped), `pods`,
//! `services`; `discovery.k8s.io/v1` `endpointslices`; `networking.k8s.io/v1`
//! `networkpolicies`. Namespaced resources are served at
//! `/…/namespaces/{ns}/{plural}` and across namespaces at `/…/{plural}`.
//! Namespaces, nodes, pods and services have a `/status` subresource: a
//! write to it changes only `status`, a write to the main resource keeps
//! the stored `status` (on create the given status is kept, unlike the
//! real server for pods and services, so tests can create ready objects).
//!
//! * Authentication: `Authorization: Bearer <token>` against a set of
//!   tokens the test can replace at any time ([`ApiServer::set_tokens`]);
//!   anything else is 401 with a `Status` (reason `Unauthorized`), counted
//!   ([`ApiServer::unauthorized`]). Every path needs a token.
//! * Store: one resourceVersion counter over all resources (etcd's
//!   revision), bumped by every write; create sets `uid`,
//!   `creationTimestamp`, `generation` 1; `generation` grows when anything
//!   outside `metadata` and `status` changes; a write that changes nothing
//!   keeps the resourceVersion. Errors are `Status` objects: 404 NotFound,
//!   409 AlreadyExists, 409 Conflict (a stale `metadata.resourceVersion` in
//!   a PUT or PATCH, or DeleteOptions preconditions), 422 Invalid (missing
//!   or malformed name), 400 BadRequest (bad JSON, namespace mismatch, bad
//!   selector), 405, 415 (protobuf, server-side apply).
//! * Verbs: get, list, watch, create (201), update (PUT), patch, delete
//!   (returns the object; deleting a namespace deletes its objects).
//!   Lists: `limit` + `continue` from a snapshot taken at the first page
//!   (every page has the first page's resourceVersion), 410 Expired for a
//!   token older than [`ApiServer::compact`]; `labelSelector` (`a=b`,
//!   `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x,y)`) and
//!   `fieldSelector` (`=`, `==`, `!=` on `metadata.name`,
//!   `metadata.namespace` and the kind's own field labels, e.g. pods'
//!   `spec.nodeName`, `status.phase`); the `resourceVersion` of a list is
//!   ignored (always the current state).
//! * Patches: `application/merge-patch+json` (RFC 7386),
//!   `application/strategic-merge-patch+json` (merge keys of the served
//!   kinds, e.g. `status.conditions` by `type`, `spec.containers` by
//!   `name`, container `ports` by `containerPort`, Service `spec.ports` by
//!   `port`, node `status.addresses` by `type`; other lists replaced; the
//!   directives `$patch`, `$retainKeys`, `$setElementOrder/…`,
//!   `$deleteFromPrimitiveList/…`; see `patch.rs`),
//!   `application/json-patch+json` (RFC 6902). Server-side apply is 415.
//! * Watch: `watch=true|1` with `resourceVersion`, `allowWatchBookmarks`,
//!   `timeoutSeconds` (default 1800), selectors, `sendInitialEvents`. The
//!   response is `application/json`, chunked, one `{"type":…,"object":…}`
//!   per line. `resourceVersion` unset or `0`: an ADDED per current object,
//!   then live; a resourceVersion: every later event from the history,
//!   then live; older than the history: one ERROR event whose object is a
//!   `Status` with code 410, reason `Expired`, then the stream ends (inside
//!   a 200 response, as kube-apiserver does). An object that starts or
//!   stops matching the selectors is ADDED or DELETED to that watch.
//!   BOOKMARKs (object: kind, apiVersion, `metadata.resourceVersion`) every
//!   [`ApiServer::set_bookmark_interval`] (1 s) only when asked. Every
//!   watch reads the one ordered history from its own cursor: no gap, no
//!   reordering under concurrent writes.
//! * Discovery: `/version` (v1.35.0), `/api`, `/apis`, `/apis/{group}`,
//!   `/api/v1`, `/apis/{group}/v1` with kinds, verbs, scope and short
//!   names; legacy (not aggregated) discovery, which newer clients fall
//!   back to. `/openapi/v2` and `/openapi/v3` are 404: run kubectl with
//!   `--validate=false` (it then takes strategic merge keys from its own
//!   types, as it does for any server without OpenAPI). A GET or list
//!   asking for `as=Table` gets a `meta.k8s.io/v1` Table with Name and Age
//!   columns (not for watches).
//!
//! Not implemented: protobuf, YAML request bodies, server-side apply,
//! `dryRun`, graceful deletion and finalizers (deletion is immediate),
//! admission (no namespace existence check, no defaulting, little
//! validation), `deletecollection`, the `/watch/` path prefix, list at a
//! past resourceVersion, aggregated discovery, managedFields.
//!
//! # Test hooks
//!
//! The store is reachable directly ([`ApiServer::apply`], `get`, `list`,
//! `delete`, [`ApiServer::apply_all`] for bulk loads); watches see those
//! writes like any other. [`ApiServer::compact`] drops the history,
//! [`ApiServer::drop_watches`] aborts every open watch connection
//! mid-stream. [`ApiServer::requests`] records every resource request
//! (verb, resource, namespace, name, `resourceVersion` parameter, …) so a
//! test can check that an agent resumed its watch from a given
//! resourceVersion without a list; [`ApiServer::patches`] keeps the PATCH
//! bodies per object.
//!
//! # Lifetime
//!
//! The server runs on its own thread with its own tokio runtime and stops
//! when the handle drops (every connection closed, the thread joined).
//! Drop it before the [`World`] whose namespace it listens in: declare it
//! after the world (`let w = World::new(); let api = w.start_apiserver();`).

mod discovery;
mod http;
mod patch;
mod resources;
mod select;
mod store;
mod tls;
mod watch;

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde_json::Value;
use tokio::sync::{oneshot, watch as tokio_watch};

use crate::{Netns, World};
pub use store::ApiError;
use store::{Key, Store};

/// The port [`World::start_apiserver`] listens on.
pub const PORT: u16 = 6443;

/// A request verb, as the API server's audit log names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// GET of one object (or its status).
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE.
    Delete,
}

/// One resource request the server answered.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// The verb.
    pub verb: Verb,
    /// The resource's plural name (`nodes`).
    pub resource: &'static str,
    /// `status`, if the request was for the subresource.
    pub subresource: Option<String>,
    /// The namespace in the path, if any.
    pub namespace: Option<String>,
    /// The object's name, if any.
    pub name: Option<String>,
    /// The `resourceVersion` query parameter (where a watch started).
    pub resource_version: Option<String>,
    /// The `limit` query parameter.
    pub limit: Option<usize>,
    /// The `continue` query parameter was given.
    pub continued: bool,
    /// `labelSelector`.
    pub label_selector: Option<String>,
    /// `fieldSelector`.
    pub field_selector: Option<String>,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// The HTTP status answered (200 for a watch that started).
    pub code: u16,
    /// The `User-Agent` header.
    pub user_agent: String,
    /// It came over TLS.
    pub tls: bool,
}

/// One PATCH the server received.
#[derive(Debug, Clone)]
pub struct PatchRecord {
    /// The resource's plural name.
    pub resource: &'static str,
    /// Namespace (empty for cluster-scoped).
    pub namespace: String,
    /// Object name.
    pub name: String,
    /// `status` for the subresource.
    pub subresource: Option<String>,
    /// The request's `Content-Type`.
    pub content_type: String,
    /// The body (`Value::Null` if it was not JSON).
    pub body: Value,
    /// The HTTP status answered.
    pub code: u16,
}

/// State shared by the handle and the server thread.
#[derive(Debug)]
pub(crate) struct Shared {
    store: Mutex<Store>,
    /// The resourceVersion after the last write (wakes watches).
    rv_tx: tokio_watch::Sender<u64>,
    /// Bumped by [`ApiServer::drop_watches`].
    drop_tx: tokio_watch::Sender<u64>,
    tokens: Mutex<Vec<String>>,
    requests: Mutex<Vec<RequestRecord>>,
    patches: Mutex<Vec<PatchRecord>>,
    unauthorized: AtomicU64,
    bookmark_interval: Mutex<Duration>,
    /// Open watch streams per resource (index in `RESOURCES`).
    watching: Vec<AtomicUsize>,
    addr: SocketAddr,
}

/// Locks, ignoring poisoning (a panicked test thread must not wedge the
/// server for the others).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Runs a write on the store and wakes the watches.
    fn write<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        let mut store = lock(&self.store);
        let out = f(&mut store);
        self.rv_tx.send_replace(store.rv);
        out
    }
}

/// A running API server; stops when dropped.
#[derive(Debug)]
pub struct ApiServer {
    shared: Arc<Shared>,
    ca_pem: String,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The resource index of a name the hooks accept; panics on an unknown one.
fn res_index(resource: &str) -> usize {
    resources::lookup(resource).unwrap_or_else(|| {
        panic!(
            "the API server does not serve {resource:?} (plural, Kind or apiVersion/Kind of: {})",
            resources::RESOURCES
                .iter()
                .map(|r| r.plural)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

fn key_of(res: usize, ns: &str, name: &str) -> Key {
    if resources::RESOURCES[res].namespaced {
        (ns.to_string(), name.to_string())
    } else {
        (String::new(), name.to_string())
    }
}

impl ApiServer {
    /// Starts a server listening on `addr:port` inside `ns` (the listener
    /// is bound there; the server itself runs on a thread of its own).
    /// The first token is `rivet-test-token`.
    pub fn start(ns: &Netns, addr: Ipv4Addr, port: u16) -> Self {
        let listener = ns
            .exec(move || std::net::TcpListener::bind((addr, port)))
            .unwrap_or_else(|e| panic!("binding the API server to {addr}:{port}: {e}"));
        listener
            .set_nonblocking(true)
            .expect("API server listener non-blocking");
        let local = listener.local_addr().expect("API server listener address");
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new()),
            rv_tx: tokio_watch::Sender::new(1),
            drop_tx: tokio_watch::Sender::new(0),
            tokens: Mutex::new(vec!["rivet-test-token".to_string()]),
            requests: Mutex::new(Vec::new()),
            patches: Mutex::new(Vec::new()),
            unauthorized: AtomicU64::new(0),
            bookmark_interval: Mutex::new(Duration::from_secs(1)),
            watching: resources::RESOURCES
                .iter()
                .map(|_| AtomicUsize::new(0))
                .collect(),
            addr: local,
        });
        let tls = tls::Tls::new(addr).unwrap_or_else(|e| panic!("{e}"));
        let acceptor = tls.acceptor.clone();
        let (stop, stop_rx) = oneshot::channel();
        let server = shared.clone();
        let thread = std::thread::Builder::new()
            .name("apiserver".into())
            .spawn(move || http::run(server, listener, acceptor, stop_rx))
            .expect("spawning the API server thread");
        Self {
            shared,
            ca_pem: tls.ca_pem,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://<addr>:<port>` (plain HTTP; bearer tokens are accepted
    /// over it).
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// `https://<addr>:<port>`: the same port, with TLS.
    pub fn url_tls(&self) -> String {
        format!("https://{}", self.shared.addr)
    }

    /// The PEM of the CA that signed the server's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The first valid token.
    pub fn token(&self) -> String {
        lock(&self.shared.tokens)
            .first()
            .cloned()
            .unwrap_or_default()
    }

    /// Replaces the set of valid bearer tokens (rotation).
    pub fn set_tokens(&self, tokens: &[&str]) {
        *lock(&self.shared.tokens) = tokens.iter().map(|t| t.to_string()).collect();
    }

    /// Requests refused with 401 so far.
    pub fn unauthorized(&self) -> u64 {
        self.shared.unauthorized.load(Ordering::Relaxed)
    }

    /// Writes a kubeconfig for this server: `tls` picks `https://` with
    /// the CA in `certificate-authority-data` (client-go, hence kubectl,
    /// sends credentials only over TLS) or `http://`; the user has the
    /// current first token, or `tokenFile: <token_file>` (clients re-read
    /// it, so rotation is rewriting the file and [`Self::set_tokens`]).
    pub fn write_kubeconfig_with(&self, path: &Path, tls: bool, token_file: Option<&Path>) {
        use base64::Engine as _;
        let cluster = if tls {
            format!(
                "    server: {}\n    certificate-authority-data: {}\n",
                self.url_tls(),
                base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
            )
        } else {
            format!("    server: {}\n", self.url())
        };
        let user = match token_file {
            Some(f) => format!("    tokenFile: {}\n", f.display()),
            None => format!("    token: {}\n", self.token()),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: rivet-test\n  cluster:\n{cluster}contexts:\n- name: rivet-test\n  context:\n    cluster: rivet-test\n    user: rivet-test\n    namespace: default\ncurrent-context: rivet-test\nusers:\n- name: rivet-test\n  user:\n{user}"
        );
        std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// Writes a kubeconfig with `server: http://…` and the current first
    /// token (for clients that send tokens over plain HTTP, as kube-rs does).
    pub fn write_kubeconfig(&self, path: &Path) {
        self.write_kubeconfig_with(path, false, None);
    }

    /// Writes a kubeconfig with `server: http://…` and `tokenFile:`.
    pub fn write_kubeconfig_token_file(&self, path: &Path, token_file: &Path) {
        self.write_kubeconfig_with(path, false, Some(token_file));
    }

    /// Writes a kubeconfig with `server: https://…`, the CA and the
    /// current first token (what kubectl needs).
    pub fn write_kubeconfig_tls(&self, path: &Path) {
        self.write_kubeconfig_with(path, true, None);
    }

    /// Creates or replaces an object (whole, status included) directly in
    /// the store; returns it as stored. Panics if it is not a valid object
    /// of a served kind.
    pub fn apply(&self, value: Value) -> Value {
        let res = self.kind_of(&value);
        match self.shared.write(|s| s.apply(res, value)) {
            Ok(obj) => obj.value.clone(),
            Err(e) => panic!("apply: {}", e.message),
        }
    }

    /// Creates or replaces many objects at once (bulk loads); returns the
    /// resourceVersion after the last.
    pub fn apply_all(&self, values: impl IntoIterator<Item = Value>) -> u64 {
        let values: Vec<(usize, Value)> =
            values.into_iter().map(|v| (self.kind_of(&v), v)).collect();
        self.shared.write(|s| {
            for (res, v) in values {
                if let Err(e) = s.apply(res, v) {
                    panic!("apply_all: {}", e.message);
                }
            }
            s.rv
        })
    }

    fn kind_of(&self, value: &Value) -> usize {
        let av = value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        resources::by_kind(av, kind)
            .unwrap_or_else(|| panic!("the API server does not serve {av}/{kind}"))
    }

    /// An object (`resource`: plural, Kind or `apiVersion/Kind`; `ns` is
    /// ignored for cluster-scoped resources).
    pub fn get(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let res = res_index(resource);
        lock(&self.shared.store)
            .get(res, &key_of(res, ns, name))
            .map(|o| o.value.clone())
    }

    /// The objects of a resource, in one namespace or all.
    pub fn list(&self, resource: &str, ns: Option<&str>) -> Vec<Value> {
        let res = res_index(resource);
        let store = lock(&self.shared.store);
        store.maps[res]
            .iter()
            .filter(|(k, _)| ns.is_none_or(|ns| k.0 == ns))
            .map(|(_, o)| o.value.clone())
            .collect()
    }

    /// Deletes an object; returns it (None if there was none).
    pub fn delete(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let res = res_index(resource);
        let key = key_of(res, ns, name);
        self.shared
            .write(|s| s.delete(res, &key, None))
            .ok()
            .map(|o| o.value.clone())
    }

    /// The current resourceVersion (the last write's).
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).rv
    }

    /// Drops the history up to now: watches and continue tokens from an
    /// older resourceVersion get 410 Expired (and open watches whose
    /// cursor is older end with it).
    pub fn compact(&self) {
        self.shared.write(Store::compact);
    }

    /// Keeps at most `events` writes of history (default 1,000,000); older
    /// ones are compacted away.
    pub fn set_history_limit(&self, events: usize) {
        lock(&self.shared.store).history_limit = events.max(1);
    }

    /// Aborts every open watch connection now (a connection loss: the
    /// chunked response ends without its last chunk).
    pub fn drop_watches(&self) {
        self.shared.drop_tx.send_modify(|n| *n += 1);
    }

    /// Sets how often watches that asked for bookmarks get one (for
    /// watches started after the call).
    pub fn set_bookmark_interval(&self, every: Duration) {
        *lock(&self.shared.bookmark_interval) = every;
    }

    /// Watch streams open now on `resource`.
    pub fn watching(&self, resource: &str) -> usize {
        self.shared.watching[res_index(resource)].load(Ordering::SeqCst)
    }

    /// Every resource request so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.requests).clone()
    }

    /// Forgets the recorded requests and PATCH bodies.
    pub fn clear_requests(&self) {
        lock(&self.shared.requests).clear();
        lock(&self.shared.patches).clear();
    }

    /// How many requests of `verb` on `resource` (plural, Kind, …) so far.
    pub fn count(&self, resource: &str, verb: Verb) -> usize {
        let plural = resources::RESOURCES[res_index(resource)].plural;
        lock(&self.shared.requests)
            .iter()
            .filter(|r| r.resource == plural && r.verb == verb)
            .count()
    }

    /// The `resourceVersion` each watch of `resource` started from, in order
    /// (`None`: not given).
    pub fn watch_starts(&self, resource: &str) -> Vec<Option<String>> {
        let plural = resources::RESOURCES[res_index(resource)].plural;
        lock(&self.shared.requests)
            .iter()
            .filter(|r| r.resource == plural && r.verb == Verb::Watch)
            .map(|r| r.resource_version.clone())
            .collect()
    }

    /// The PATCH requests received for one object, in order.
    pub fn patches(&self, resource: &str, ns: &str, name: &str) -> Vec<PatchRecord> {
        let res = res_index(resource);
        let key = key_of(res, ns, name);
        let plural = resources::RESOURCES[res].plural;
        lock(&self.shared.patches)
            .iter()
            .filter(|p| p.resource == plural && p.namespace == key.0 && p.name == key.1)
            .cloned()
            .collect()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl World {
    /// Starts an API server in the underlay namespace at
    /// `192.168.<k>.1:6443`. Keep it declared after the world so it drops
    /// first.
    pub fn start_apiserver(&self) -> ApiServer {
        ApiServer::start(&self.underlay, Ipv4Addr::new(192, 168, self.k, 1), PORT)
    }

    /// Sets node `n`'s agent to take everything from `api` (`source =
    /// "kubernetes"`, a kubeconfig in the world's directory), in `mode`.
    pub fn use_apiserver(&mut self, api: &ApiServer, n: usize, mode: &str) {
        let kubeconfig = self.dir.join(format!("n{}.kubeconfig", n + 1));
        api.write_kubeconfig(&kubeconfig);
        self.nodes[n].agent_args.extra_args = vec![
            "--source".into(),
            "kubernetes".into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--mode".into(),
            mode.into(),
        ];
    }

    /// Adds a node whose Node object (named as the node, with its pod CIDR
    /// as `spec.podCIDR`, Ready) is in `api`, and starts its agent fed by
    /// `api`; returns once the agent is ready (pod CIDR read, every kind
    /// listed).
    pub fn add_kube_node(&mut self, api: &ApiServer, mode: &str) -> usize {
        let n = self.add_node();
        let (name, cidr) = (self.nodes[n].name.clone(), self.nodes[n].pod_cidr.clone());
        api.apply(node_object(&name, Some(&cidr)));
        self.use_apiserver(api, n, mode);
        self.start_agent(n);
        self.wait_agent_ready(n, Duration::from_secs(30));
        n
    }

    /// Waits until node `n`'s agent reports ready; panics with its reason
    /// and log after `limit`.
    pub fn wait_agent_ready(&self, n: usize, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        loop {
            // (Between an agent's not-ready answers and its own socket there
            // is an instant without a socket.)
            let s = match self.nodes[n]
                .agent()
                .client()
                .call(&rivet_api::Request::Status {})
            {
                Ok(rivet_api::Response::Status(s)) => Ok(s),
                other => Err(format!("{other:?}")),
            };
            if s.as_ref().is_ok_and(|s| s.ready) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} not ready: {:?}\nlog:\n{}",
                self.nodes[n].name,
                s.map(|s| s.not_ready),
                self.nodes[n].agent().log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A Node object as the kubelet registers it (Linux, Ready), with
/// `pod_cidr` as `spec.podCIDR(s)` when the controller-manager gave one.
pub fn node_object(name: &str, pod_cidr: Option<&str>) -> Value {
    let spec = match pod_cidr {
        Some(c) => serde_json::json!({"podCIDR": c, "podCIDRs": [c]}),
        None => serde_json::json!({}),
    };
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}},
        "spec": spec,
        "status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status"}
        ]},
    })
}
