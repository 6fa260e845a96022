//! The Kubernetes source's objects into the node's store: the same store,
//! the same checks and the same map writes as `rivetctl apply`
//! ([`super::objects`]). With `source = "kubernetes"` the API server is the
//! objects' only writer: `rivetctl apply` and `delete` are refused (one
//! source of truth per node; the store keeps the API's objects durably, so
//! an agent restarted while the API server is away still has them).
//!
//! A list replaces its kind (only what differs is written: a relist or a
//! restart moves nothing that did not change); a batch of watch events is
//! one commit. The node is ready once every kind was listed once.
//!
//! A pod's ADD waits (up to [`POD_WAIT`]) for its Pod object, so that its
//! labels are in the NetworkPolicy maps before the runtime starts the pod's
//! processes; without it the ADD fails with "try again later" (the kubelet
//! retries), never with a pod that policies would not see.

use std::{collections::BTreeSet, time::Duration};

use rivet_api::{ApiError, ErrorKind};

use super::Agent;
use crate::{
    cluster::kubernetes::ObjectSink,
    objects::{Kind, Object, ObjectKey},
};

/// Lists at least this long are followed by a heap trim.
const TRIM_AFTER_OBJECTS: usize = 1000;

/// How long an ADD waits for its Pod object from the API server.
pub const POD_WAIT: Duration = Duration::from_secs(10);

/// What the object watches have done so far.
#[derive(Debug, Default)]
pub struct KubeObjects {
    /// Kinds listed at least once.
    listed: BTreeSet<Kind>,
    /// The latest watch failure per kind, until that kind lists again.
    lost: std::collections::BTreeMap<Kind, String>,
}

impl KubeObjects {
    /// Why the objects are not in sync yet (None: every kind listed).
    pub fn not_synced(&self) -> Option<String> {
        let missing: Vec<&str> = Kind::ALL
            .iter()
            .filter(|k| !self.listed.contains(k))
            .map(|k| k.plural())
            .collect();
        if missing.is_empty() {
            return None;
        }
        let lost: Vec<String> = self
            .lost
            .iter()
            .map(|(k, why)| format!("{}: {why}", k.plural()))
            .collect();
        let mut why = format!("waiting for the first list of {}", missing.join(", "));
        if !lost.is_empty() {
            why.push_str(&format!(" ({})", lost.join("; ")));
        }
        Some(why)
    }
}

impl Agent {
    /// Why the Kubernetes objects are not in sync (None when they are, or
    /// when the node has another source).
    pub fn kube_not_synced(&self) -> Option<String> {
        self.cfg.kubernetes.as_ref()?;
        self.kube_objects.lock().ok()?.not_synced()
    }

    /// The refusal of `rivetctl apply`/`delete` on a node whose objects
    /// come from the API server.
    pub(super) fn refuse_local_objects(&self) -> Result<(), ApiError> {
        if self.cfg.kubernetes.is_some() {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                "this node's objects come from the Kubernetes API (source = \"kubernetes\"): change them with kubectl",
            ));
        }
        Ok(())
    }

    /// Waits until the store holds Pod `namespace/name` (at once with
    /// another source, or when it is already there).
    pub async fn await_pod_object(&self, namespace: &str, name: &str) -> Result<(), ApiError> {
        if self.cfg.kubernetes.is_none() {
            return Ok(());
        }
        let key = ObjectKey::new(Kind::Pod, namespace, name);
        let mut changed = self.objects_changed.subscribe();
        let deadline = tokio::time::Instant::now() + POD_WAIT;
        let mut said = false;
        loop {
            if self.lock().await.objects.objects().get(&key).is_some() {
                return Ok(());
            }
            if !said {
                tracing::info!(pod = %key, "ADD waits for the Pod object from the Kubernetes API");
                said = true;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => {
                    return Err(ApiError::new(
                        ErrorKind::Unavailable,
                        format!(
                            "Pod {namespace}/{name} not seen from the Kubernetes API within {} s: its NetworkPolicy would be unknown (try again)",
                            POD_WAIT.as_secs()
                        ),
                    ));
                }
            }
        }
    }

    fn objects_committed(&self) {
        self.objects_changed.send_modify(|n| *n += 1);
    }
}

impl ObjectSink for Agent {
    async fn replace(&self, kind: Kind, objects: Vec<Object>) {
        let count = objects.len();
        // A large list's transient copies (the client's pages, the typed
        // objects) go back to the system once it is stored.
        let _trim = (count >= TRIM_AFTER_OBJECTS).then_some(super::heap::TrimHeap);
        let result = {
            let mut state = self.lock().await;
            let staged = state.objects.stage_replace(kind, objects);
            let changes = staged.changes();
            self.commit_staged(&mut state, staged).map(|()| changes)
        };
        match result {
            Ok(changes) => {
                tracing::info!(
                    kind = kind.plural(),
                    objects = count,
                    changes,
                    "listed from the Kubernetes API"
                );
                if let Ok(mut k) = self.kube_objects.lock() {
                    k.listed.insert(kind);
                    k.lost.remove(&kind);
                }
            }
            Err(e) => {
                tracing::error!(kind = kind.plural(), error = %e, "the listed objects are not in the datapath");
                self.note_error(format!("{} from the Kubernetes API: {e}", kind.plural()));
            }
        }
        self.objects_committed();
    }

    async fn change(&self, applied: Vec<Object>, deleted: Vec<ObjectKey>) {
        let (a, d) = (applied.len(), deleted.len());
        let result = {
            let mut state = self.lock().await;
            let staged = state.objects.stage_changes(applied, deleted);
            self.commit_staged(&mut state, staged)
        };
        match result {
            Ok(()) => tracing::debug!(applied = a, deleted = d, "watched changes stored"),
            Err(e) => {
                tracing::error!(applied = a, deleted = d, error = %e, "watched changes not in the datapath");
                self.note_error(format!("objects from the Kubernetes API: {e}"));
            }
        }
        self.objects_committed();
    }

    async fn lost(&self, kind: Kind, reason: String) {
        if let Ok(mut k) = self.kube_objects.lock() {
            k.lost.insert(kind, reason);
        }
    }
}
