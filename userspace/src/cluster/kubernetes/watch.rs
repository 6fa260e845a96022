//! The watches: Nodes → the cluster's peers, and the object kinds rivet
//! keeps → the object store. Each runs until its task is aborted; a watch
//! the server refuses with 401 starts over with a new client.

use std::{collections::BTreeMap, fmt::Debug, sync::Arc, time::Duration};

use futures_util::StreamExt as _;
use ipnet::Ipv4Net;
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, Service},
    discovery::v1::EndpointSlice,
    networking::v1::NetworkPolicy,
};
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt as _, watcher},
};
use serde::de::DeserializeOwned;

use super::{
    ObjectSink, connect, is_unauthorized,
    node::{OwnNode, Published, remote},
};
use crate::{
    cluster::{ClusterSink, RemoteNode, StoreReport},
    config::KubeSettings,
    objects::{self, Kind, Object, ObjectKey},
};

/// Watch events handled as one batch at most (one store commit).
const BATCH: usize = 512;

/// Pause before a new client after a failure to build one.
const RECONNECT: Duration = Duration::from_secs(1);

/// A client, retried every second until the configuration yields one.
async fn client(settings: &KubeSettings, what: &str) -> Client {
    loop {
        match connect(settings).await {
            Ok(c) => return c,
            Err(e) => {
                tracing::warn!(error = %e, watch = what, "no Kubernetes client");
                tokio::time::sleep(RECONNECT).await;
            }
        }
    }
}

/// This node's settings for the Node watch.
#[derive(Debug, Clone)]
pub struct NodeWatch {
    /// The Node's name (this node: not a peer).
    pub node_name: String,
    /// What this node publishes (re-published when the Node loses it).
    pub published: Published,
    /// VNI of peers whose backend data names none.
    pub default_vni: u32,
}

/// Mirrors the other Nodes into `sink`, and keeps this node's annotations
/// on its Node.
pub async fn nodes<S: ClusterSink>(settings: KubeSettings, watch: NodeWatch, sink: Arc<S>) {
    // Peers by Node name: a Node deleted or changed is found by its name.
    let mut known: BTreeMap<String, Ipv4Net> = BTreeMap::new();
    loop {
        let client = client(&settings, "nodes").await;
        let own = OwnNode::new(client.clone(), &watch.node_name);
        let stream = watcher(Api::<Node>::all(client), watcher::Config::default())
            .default_backoff()
            .ready_chunks(BATCH);
        futures_util::pin_mut!(stream);
        let mut listing: Option<Vec<Node>> = None;
        while let Some(batch) = stream.next().await {
            let mut refused = false;
            for event in batch {
                match event {
                    Ok(watcher::Event::Init) => listing = Some(Vec::new()),
                    Ok(watcher::Event::InitApply(n)) => {
                        listing.get_or_insert_with(Vec::new).push(n)
                    }
                    Ok(watcher::Event::InitDone) => {
                        let listed = listing.take().unwrap_or_default();
                        let mut peers = Vec::new();
                        known.clear();
                        for n in &listed {
                            match node_name(n) {
                                Some(name) if name == watch.node_name => {
                                    keep_published(&own, &watch.published, n).await;
                                }
                                Some(name) => {
                                    if let Some(r) = remote(n, watch.default_vni) {
                                        known.insert(name.to_owned(), r.subnet);
                                        peers.push(r);
                                    }
                                }
                                None => {}
                            }
                        }
                        let count = peers.len();
                        sink.replace(peers).await;
                        sink.state(StoreReport::Synced { peers: count }).await;
                    }
                    Ok(watcher::Event::Apply(n)) => {
                        let Some(name) = node_name(&n) else { continue };
                        if name == watch.node_name {
                            keep_published(&own, &watch.published, &n).await;
                            continue;
                        }
                        let now = remote(&n, watch.default_vni);
                        apply_peer(&*sink, &mut known, name, now).await;
                        let peers = known.len();
                        sink.state(StoreReport::Synced { peers }).await;
                    }
                    Ok(watcher::Event::Delete(n)) => {
                        if let Some(name) = node_name(&n) {
                            apply_peer(&*sink, &mut known, name, None).await;
                        }
                        let peers = known.len();
                        sink.state(StoreReport::Synced { peers }).await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "watching Nodes");
                        sink.state(StoreReport::Lost {
                            reason: format!("watching Nodes: {e}"),
                        })
                        .await;
                        refused |= is_unauthorized(&e);
                    }
                }
            }
            if refused {
                tracing::info!("the API server refused the credentials: new client for Nodes");
                break;
            }
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

fn node_name(n: &Node) -> Option<&str> {
    n.metadata.name.as_deref()
}

/// One Node's peer entry now (`None`: no longer a peer).
async fn apply_peer<S: ClusterSink>(
    sink: &S,
    known: &mut BTreeMap<String, Ipv4Net>,
    name: &str,
    now: Option<RemoteNode>,
) {
    let before = known.get(name).copied();
    if let Some(old) = before
        && now.as_ref().is_none_or(|r| r.subnet != old)
    {
        known.remove(name);
        sink.remove(old).await;
    }
    if let Some(r) = now {
        known.insert(name.to_owned(), r.subnet);
        sink.upsert(r).await;
    }
}

/// Puts this node's annotations back when the Node lacks them.
async fn keep_published(own: &OwnNode, published: &Published, node: &Node) {
    if published.is_on(node) {
        return;
    }
    match own.publish(published, node).await {
        Ok(()) => tracing::info!("flannel annotations published on the Node"),
        Err(e) => tracing::warn!(error = %e, "publishing the Node's annotations"),
    }
}

/// Watches every kind rivet keeps into `sink`, concurrently.
pub async fn objects<S: ObjectSink>(settings: KubeSettings, sink: Arc<S>) {
    tokio::join!(
        kind::<Namespace, S>(&settings, Kind::Namespace, &sink, |o| Object::Namespace(
            Box::new(o)
        )),
        kind::<Service, S>(&settings, Kind::Service, &sink, |o| Object::Service(
            Box::new(o)
        )),
        kind::<EndpointSlice, S>(&settings, Kind::EndpointSlice, &sink, |o| {
            Object::EndpointSlice(o.into())
        }),
        kind::<Pod, S>(&settings, Kind::Pod, &sink, |o| Object::Pod(Box::new(o))),
        kind::<NetworkPolicy, S>(&settings, Kind::NetworkPolicy, &sink, |o| {
            Object::NetworkPolicy(Box::new(o))
        }),
    );
}

/// An API object as the store keeps it: without the server's field
/// bookkeeping (`managedFields`, kubectl's last-applied copy), its lists
/// fitted to their length, validated and defaulted like `rivetctl apply`
/// input. `Err`: what rivet cannot use (the key, so a stored older version
/// goes).
fn admit(mut object: Object) -> Result<Object, (ObjectKey, String)> {
    objects::fit_lists(&mut object);
    let meta = object.metadata_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
        if a.is_empty() {
            meta.annotations = None;
        }
    }
    match objects::validate(&mut object) {
        // Packed as the store keeps it, so a list of 10,000 EndpointSlices
        // is held lean while it is read.
        Ok(()) => Ok(object.packed()),
        Err(problems) => {
            let why = problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            Err((object.key(), why))
        }
    }
}

async fn kind<K, S>(settings: &KubeSettings, kind: Kind, sink: &Arc<S>, wrap: fn(K) -> Object)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
    S: ObjectSink,
{
    let admitted = |o: K| -> Result<Object, (ObjectKey, String)> {
        admit(wrap(o)).inspect_err(|(key, why)| {
            tracing::warn!(object = %key, reason = %why, "API object not usable by rivet: left out");
        })
    };
    loop {
        let client = client(settings, kind.plural()).await;
        let stream = watcher(Api::<K>::all(client), watcher::Config::default())
            .default_backoff()
            .ready_chunks(BATCH);
        futures_util::pin_mut!(stream);
        let mut listing: Option<Vec<Object>> = None;
        while let Some(batch) = stream.next().await {
            let mut changes = Changes::default();
            let mut refused = false;
            for event in batch {
                match event {
                    Ok(watcher::Event::Init) => listing = Some(Vec::new()),
                    Ok(watcher::Event::InitApply(o)) => {
                        if let Ok(o) = admitted(o) {
                            listing.get_or_insert_with(Vec::new).push(o);
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        // What came before the list goes first.
                        flush(&**sink, &mut changes).await;
                        sink.replace(kind, listing.take().unwrap_or_default()).await;
                    }
                    Ok(watcher::Event::Apply(o)) => match admitted(o) {
                        Ok(o) => changes.apply(o),
                        Err((key, _)) => changes.delete(key),
                    },
                    Ok(watcher::Event::Delete(o)) => changes.delete(wrap(o).key()),
                    Err(e) => {
                        tracing::warn!(error = %e, kind = kind.plural(), "watching");
                        sink.lost(kind, e.to_string()).await;
                        refused |= is_unauthorized(&e);
                    }
                }
            }
            flush(&**sink, &mut changes).await;
            if refused {
                tracing::info!(
                    kind = kind.plural(),
                    "the API server refused the credentials: new client"
                );
                break;
            }
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

async fn flush<S: ObjectSink>(sink: &S, changes: &mut Changes) {
    let Changes { applied, deleted } = std::mem::take(changes);
    if applied.is_empty() && deleted.is_empty() {
        return;
    }
    sink.change(applied, deleted).await;
}

/// One batch of watch events in order: the last event of a key wins.
#[derive(Default)]
struct Changes {
    applied: Vec<Object>,
    deleted: Vec<ObjectKey>,
}

impl Changes {
    fn apply(&mut self, o: Object) {
        let key = o.key();
        self.deleted.retain(|k| *k != key);
        self.applied.retain(|a| a.key() != key);
        self.applied.push(o);
    }

    fn delete(&mut self, key: ObjectKey) {
        self.applied.retain(|a| a.key() != key);
        if !self.deleted.contains(&key) {
            self.deleted.push(key);
        }
    }
}
