//! This node's Node object (its pod CIDR, the annotations and condition
//! rivet publishes on it) and other nodes read from theirs, in flannel's
//! annotation schema (what flanneld's kube subnet manager reads and writes).

use std::{net::Ipv4Addr, time::Duration};

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

use super::KubeError;
use crate::{
    cluster::{
        RemoteNode,
        flannel::{Backend, BackendData, SubnetLease, remote_node},
    },
    config::Mode,
    netlink::format_mac,
};

/// flannel's annotation prefix.
pub const ANNOTATION_PREFIX: &str = "flannel.alpha.coreos.com/";
/// `vxlan`, `host-gw`, `ipip`.
pub const BACKEND_TYPE: &str = "flannel.alpha.coreos.com/backend-type";
/// JSON: `{"VNI":1,"VtepMAC":"…"}` for vxlan, `null` otherwise.
pub const BACKEND_DATA: &str = "flannel.alpha.coreos.com/backend-data";
/// The address other nodes send to.
pub const PUBLIC_IP: &str = "flannel.alpha.coreos.com/public-ip";
/// Set by an operator: the address to publish instead of the uplink's.
pub const PUBLIC_IP_OVERWRITE: &str = "flannel.alpha.coreos.com/public-ip-overwrite";
/// `"true"`: the subnet came from the Node (not from etcd).
pub const KUBE_SUBNET_MANAGER: &str = "flannel.alpha.coreos.com/kube-subnet-manager";

/// The field manager rivet's patches carry.
pub const FIELD_MANAGER: &str = "rivet";

/// The Node's IPv4 pod CIDR (`spec.podCIDR`, else the first IPv4 one of
/// `spec.podCIDRs`).
pub fn pod_cidr(node: &Node) -> Option<Ipv4Net> {
    let spec = node.spec.as_ref()?;
    spec.pod_cidr
        .iter()
        .chain(spec.pod_cidrs.iter().flatten())
        .find_map(|c| c.parse::<Ipv4Net>().ok())
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// A Node as a peer: its pod CIDR and flannel's annotations (a Node
/// without them has no network agent yet, and is no peer).
pub fn remote(node: &Node, default_vni: u32) -> Option<RemoteNode> {
    let subnet = pod_cidr(node)?;
    let public_ip: Ipv4Addr = annotation(node, PUBLIC_IP_OVERWRITE)
        .or_else(|| annotation(node, PUBLIC_IP))?
        .trim()
        .parse()
        .ok()?;
    let backend_type = annotation(node, BACKEND_TYPE)?.to_owned();
    let backend_data = annotation(node, BACKEND_DATA)
        .and_then(|d| serde_json::from_str::<Option<BackendData>>(d).ok())
        .flatten();
    let lease = SubnetLease {
        public_ip,
        backend_type,
        backend_data,
    };
    Some(remote_node(subnet, &lease, default_vni))
}

/// What rivet publishes about its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// Its mode (the backend type).
    pub mode: Mode,
    /// VNI.
    pub vni: u32,
    /// VXLAN port.
    pub port: u16,
    /// The uplink address (published unless the Node carries
    /// `public-ip-overwrite`).
    pub node_ip: Ipv4Addr,
    /// The VTEP MAC.
    pub vtep_mac: [u8; 6],
}

impl Published {
    /// The annotations as flanneld writes them; `overwrite` is the Node's
    /// `public-ip-overwrite`, if any.
    pub fn annotations(
        &self,
        overwrite: Option<Ipv4Addr>,
    ) -> serde_json::Map<String, serde_json::Value> {
        let backend = Backend::for_mode(self.mode, self.vni, self.port);
        let data = match backend.kind.as_str() {
            "vxlan" => json!({"VNI": self.vni, "VtepMAC": format_mac(&self.vtep_mac)}).to_string(),
            _ => "null".to_owned(),
        };
        let mut out = serde_json::Map::new();
        out.insert(BACKEND_TYPE.into(), backend.kind.into());
        out.insert(BACKEND_DATA.into(), data.into());
        out.insert(
            PUBLIC_IP.into(),
            overwrite.unwrap_or(self.node_ip).to_string().into(),
        );
        out.insert(KUBE_SUBNET_MANAGER.into(), "true".into());
        out
    }

    /// Whether `node` carries these annotations already.
    pub fn is_on(&self, node: &Node) -> bool {
        let overwrite = overwrite_of(node);
        self.annotations(overwrite)
            .iter()
            .all(|(k, v)| annotation(node, k) == v.as_str())
    }
}

/// The Node's `public-ip-overwrite`, if it is an IPv4 address.
pub fn overwrite_of(node: &Node) -> Option<Ipv4Addr> {
    annotation(node, PUBLIC_IP_OVERWRITE).and_then(|a| a.trim().parse().ok())
}

/// This node's Node object in the API.
pub struct OwnNode {
    api: Api<Node>,
    name: String,
}

impl OwnNode {
    /// The Node named `name`.
    pub fn new(client: Client, name: &str) -> Self {
        Self {
            api: Api::all(client),
            name: name.to_owned(),
        }
    }

    fn request_err(&self, what: &str) -> impl FnOnce(kube::Error) -> KubeError {
        let what = format!("{what} Node {}", self.name);
        move |source| KubeError::Request { what, source }
    }

    /// Reads the Node (None: it does not exist).
    pub async fn get(&self) -> Result<Option<Node>, KubeError> {
        self.api
            .get_opt(&self.name)
            .await
            .map_err(self.request_err("reading"))
    }

    /// Waits until the Node has an IPv4 pod CIDR inside `cluster_cidr`,
    /// telling `waiting` (log, status, readiness) why it is not there yet
    /// each time the reason changes; reads every second.
    pub async fn wait_for_pod_cidr(
        &self,
        cluster_cidr: Ipv4Net,
        waiting: &(dyn Fn(String) + Send + Sync),
    ) -> (Ipv4Net, Node) {
        let mut said = String::new();
        loop {
            let why = match self.get().await {
                Ok(Some(node)) => match pod_cidr(&node) {
                    Some(cidr) if cluster_cidr.contains(&cidr) => return (cidr, node),
                    Some(cidr) => format!(
                        "Node {} has podCIDR {cidr}, outside the cluster CIDR {cluster_cidr} (cluster_cidr must be the controller-manager's --cluster-cidr)",
                        self.name
                    ),
                    None => format!(
                        "waiting for Node {}'s spec.podCIDR (the controller-manager allocates it with --allocate-node-cidrs)",
                        self.name
                    ),
                },
                Ok(None) => format!("waiting for Node {} to exist", self.name),
                Err(e) => format!("waiting for the API server: {e}"),
            };
            if why != said {
                tracing::warn!(reason = %why, "no pod CIDR yet");
                waiting(why.clone());
                said = why;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Publishes flannel's annotations (a merge patch of the metadata,
    /// leaving every other annotation as it is).
    pub async fn publish(&self, published: &Published, node: &Node) -> Result<(), KubeError> {
        let patch = json!({"metadata": {"annotations": published.annotations(overwrite_of(node))}});
        self.api
            .patch(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(self.request_err("annotating"))?;
        Ok(())
    }

    /// Sets the Node's `NetworkUnavailable` condition to False (a
    /// strategic merge patch of `status.conditions`, merged by `type`: the
    /// kubelet's conditions stay), as flanneld does.
    pub async fn set_network_available(&self) -> Result<(), KubeError> {
        let now = jiff_now();
        let patch = json!({"status": {"conditions": [{
            "type": "NetworkUnavailable",
            "status": "False",
            "reason": "RivetIsUp",
            "message": "rivet is running on this node",
            "lastTransitionTime": now,
            "lastHeartbeatTime": now,
        }]}});
        self.api
            .patch_status(
                &self.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
            .map_err(self.request_err("setting NetworkUnavailable=False on"))?;
        Ok(())
    }
}

/// Now, as Kubernetes writes times (RFC 3339, whole seconds, UTC).
fn jiff_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let secs = i64::try_from(secs).unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{api::core::v1::NodeSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};

    use super::*;

    fn node(cidr: Option<&str>, annotations: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: cidr.map(str::to_owned),
                ..NodeSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn reads_a_flannel_node() {
        let n = node(
            Some("10.244.3.0/24"),
            &[
                (BACKEND_TYPE, "vxlan"),
                (BACKEND_DATA, r#"{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}"#),
                (PUBLIC_IP, "192.168.1.13"),
                (KUBE_SUBNET_MANAGER, "true"),
            ],
        );
        let r = remote(&n, 7).expect("a peer");
        assert_eq!(r.subnet, "10.244.3.0/24".parse::<Ipv4Net>().expect("cidr"));
        assert_eq!(r.node_ip, Ipv4Addr::new(192, 168, 1, 13));
        assert_eq!(r.vtep_mac, [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]);
        assert_eq!(r.vni, 1);
    }

    #[test]
    fn overwrite_wins_and_missing_parts_make_no_peer() {
        let n = node(
            Some("10.244.3.0/24"),
            &[
                (BACKEND_TYPE, "host-gw"),
                (BACKEND_DATA, "null"),
                (PUBLIC_IP, "192.168.1.13"),
                (PUBLIC_IP_OVERWRITE, "192.168.9.9"),
            ],
        );
        let r = remote(&n, 7).expect("a peer");
        assert_eq!(r.node_ip, Ipv4Addr::new(192, 168, 9, 9));
        assert_eq!(r.vni, 7, "no backend data: the default VNI");
        assert!(
            remote(
                &node(None, &[(BACKEND_TYPE, "vxlan"), (PUBLIC_IP, "1.2.3.4")]),
                1
            )
            .is_none()
        );
        assert!(remote(&node(Some("10.244.3.0/24"), &[(BACKEND_TYPE, "vxlan")]), 1).is_none());
        assert!(remote(&node(Some("10.244.3.0/24"), &[(PUBLIC_IP, "1.2.3.4")]), 1).is_none());
    }

    #[test]
    fn publishes_what_it_reads_back() {
        let p = Published {
            mode: Mode::Vxlan,
            vni: 1,
            port: 8472,
            node_ip: Ipv4Addr::new(192, 168, 1, 11),
            vtep_mac: [0x0e, 0x72, 192, 168, 1, 11],
        };
        let pairs: Vec<(String, String)> = p
            .annotations(None)
            .into_iter()
            .map(|(k, v)| (k, v.as_str().expect("strings").to_owned()))
            .collect();
        let refs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let n = node(Some("10.244.1.0/24"), &refs);
        assert!(p.is_on(&n));
        let r = remote(&n, 9).expect("a peer");
        assert_eq!((r.node_ip, r.vtep_mac, r.vni), (p.node_ip, p.vtep_mac, 1));
        let native = Published {
            mode: Mode::Native,
            ..p.clone()
        };
        let a = native.annotations(Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(a[BACKEND_TYPE], "host-gw");
        assert_eq!(a[BACKEND_DATA], "null");
        assert_eq!(a[PUBLIC_IP], "10.0.0.1");
        assert!(!native.is_on(&n), "a changed backend is not on the node");
    }
}
