//! NetworkPolicy through the agent: after every change of the stored
//! objects (checked before the change is committed: a change the maps
//! cannot hold is refused whole) and of the node's pods (before a CNI ADD
//! answers, so a new pod is isolated before it can send), the policy maps
//! are brought to what the objects say ([`crate::policy`]).

use rivet_api::{ApiError, ErrorKind};

use super::{Agent, NodeState};
use crate::{
    endpoint::Endpoints,
    objects::ObjectSet,
    policy::{LocalPod, PolicyChanges, PolicyError},
};

impl From<PolicyError> for ApiError {
    fn from(e: PolicyError) -> Self {
        let kind = match &e {
            PolicyError::Datapath(crate::datapath::DatapathError::MapFull { .. }) => {
                ErrorKind::Exhausted
            }
            PolicyError::Compile(_) => ErrorKind::BadRequest,
            PolicyError::Datapath(_) => ErrorKind::Internal,
        };
        ApiError::new(kind, format!("network policy: {e}"))
    }
}

/// This node's pods with a Kubernetes identity.
pub(super) fn local_pods(endpoints: &Endpoints) -> Vec<LocalPod> {
    endpoints
        .list()
        .into_iter()
        .filter_map(|ep| {
            let pod = ep.pod?;
            Some(LocalPod {
                addr: ep.ip,
                namespace: pod.namespace,
                name: pod.name,
            })
        })
        .collect()
}

impl Agent {
    /// Makes the policy maps hold what `objects` (the stored objects when
    /// `None`) say for this node's pods.
    pub(super) fn sync_policies(
        &self,
        state: &mut NodeState,
        objects: Option<&ObjectSet>,
    ) -> Result<PolicyChanges, PolicyError> {
        let NodeState {
            dp,
            endpoints,
            objects: store,
            policies,
            ..
        } = state;
        let objects = objects.unwrap_or_else(|| store.objects());
        let pods = local_pods(endpoints);
        let changes = policies.sync(dp, objects, &pods)?;
        if changes != PolicyChanges::default() {
            tracing::debug!(?changes, "network policy synced");
        }
        self.events.set_policy_names(crate::events::PolicyNames {
            policies: policies.policy_names(),
            pods: policies.pod_names(),
        });
        Ok(changes)
    }

    /// After a pod was added or removed: its policy state before the
    /// request answers.
    pub fn pods_policy(&self, state: &mut NodeState) -> Result<(), ApiError> {
        self.sync_policies(state, None)?;
        Ok(())
    }
}
