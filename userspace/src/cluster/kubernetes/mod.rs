//! The Kubernetes API as the cluster's source (`source = "kubernetes"`, the
//! default inside a pod), with kube-rs:
//!
//! - **Client**: the pod's service account (token, CA,
//!   `KUBERNETES_SERVICE_HOST`) or a kubeconfig file (`kubeconfig`). The
//!   token file is re-read by the client every minute, and a watch that the
//!   server answers with 401 makes a new client (re-reading the file at
//!   once), so a rotated token is picked up.
//! - **This node's subnet** ([`node`]): its `Node.spec.podCIDR` (the
//!   controller-manager's `--allocate-node-cidrs`); until it is set the agent
//!   waits and says why. Then flannel's annotations are published on the Node
//!   (`flannel.alpha.coreos.com/backend-type`, `backend-data`, `public-ip`,
//!   `kube-subnet-manager`; `public-ip-overwrite` honoured) and its
//!   `NetworkUnavailable` condition set to False, as flanneld's kube subnet
//!   manager does: flannel nodes and rivet nodes in one cluster reach each
//!   other's pods.
//! - **Peers** ([`watch::nodes`]): every other Node with a podCIDR and
//!   flannel's annotations is a [`RemoteNode`] reported to the
//!   [`ClusterSink`]; a Node deleted, or losing its podCIDR or annotations,
//!   is removed.
//! - **Objects** ([`watch::objects`]): Services, EndpointSlices, Namespaces,
//!   Pods and NetworkPolicies are watched and handed to an [`ObjectSink`],
//!   which keeps them in the same store as `rivetctl apply`.
//!
//! Every watch is kube-rs' watcher: a LIST (in pages), then a WATCH from its
//! resourceVersion with bookmarks, resumed from the last resourceVersion seen
//! when the connection drops, and a new LIST when the server answers `410
//! Gone`. A LIST's result replaces the kind whole: only what differs from
//! what the node holds is written, so a relist (or an agent restart) moves
//! no route and no map entry that did not change. Errors back off (kube-rs'
//! default: exponential from 800 ms to 30 s, with jitter); meanwhile the
//! datapath keeps the last state.

pub mod node;
pub mod watch;

use std::future::Future;

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

pub use crate::cluster::ClusterSink;
use crate::{
    config::KubeSettings,
    objects::{Kind, Object, ObjectKey},
};

/// Problems reaching the API server.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig file cannot be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Not in a pod (no service account or `KUBERNETES_SERVICE_HOST`).
    #[error(
        "the kubernetes source without a kubeconfig needs a pod's service account: {0} (set kubeconfig = \"/path\" outside a pod)"
    )]
    InCluster(#[source] kube::config::InClusterError),
    /// The client cannot be built from the configuration.
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// A request failed.
    #[error("{what}: {source}")]
    Request {
        /// What was asked.
        what: String,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
}

/// A client for the configured API server.
pub async fn connect(settings: &KubeSettings) -> Result<Client, KubeError> {
    let config = match &settings.kubeconfig {
        Some(path) => {
            let err = |source| KubeError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let file = Kubeconfig::read_from(path).map_err(err)?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        None => Config::incluster().map_err(KubeError::InCluster)?,
    };
    Client::try_from(config).map_err(KubeError::Client)
}

/// Whether the server refused the client's credentials (a rotated token):
/// the caller makes a new client.
pub fn is_unauthorized(e: &kube::runtime::watcher::Error) -> bool {
    use kube::runtime::watcher::Error as W;
    let status = match e {
        W::InitialListFailed(kube::Error::Api(s))
        | W::WatchStartFailed(kube::Error::Api(s))
        | W::WatchFailed(kube::Error::Api(s)) => s,
        W::WatchError(s) => s,
        _ => return false,
    };
    status.code == 401
}

/// Where the watched objects go (the agent: its object store, then the
/// Service and NetworkPolicy maps).
pub trait ObjectSink: Send + Sync + 'static {
    /// The complete set of `kind` (a LIST): what the node holds of that
    /// kind is replaced, changing only what differs.
    fn replace(&self, kind: Kind, objects: Vec<Object>) -> impl Future<Output = ()> + Send;
    /// Objects added or changed, and objects deleted (one batch of watch
    /// events).
    fn change(
        &self,
        applied: Vec<Object>,
        deleted: Vec<ObjectKey>,
    ) -> impl Future<Output = ()> + Send;
    /// The watch of `kind` failed (it is retried): the reason.
    fn lost(&self, kind: Kind, reason: String) -> impl Future<Output = ()> + Send;
}
