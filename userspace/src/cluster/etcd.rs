//! Cluster state in etcd v3, in flannel's schema so that a flannel cluster's
//! state reads the same way (and a flannel node's lease is a rivet peer; the
//! interop test runs one). Default prefix `/rivet.io/network`:
//!
//! ```text
//! <prefix>/config                       {"Network": "10.244.0.0/16", "SubnetLen": 24,
//!                                        "Backend": {"Type": "vxlan", "VNI": 1, "Port": 8472,
//!                                                    "DirectRouting": false}}
//! <prefix>/subnets/10.244.1.0-24        {"PublicIP": "192.168.1.11", "BackendType": "vxlan",
//!                                        "BackendData": {"VNI": 1, "VtepMAC": "0e:72:…"}}
//!                                        attached to the node's lease (TTL, kept alive)
//! ```
//!
//! Backend types: `vxlan` (+ `DirectRouting` = rivet's hybrid), `ipip`,
//! `host-gw` (= native).
//!
//! - The first agent seeds `config` from its own settings with a
//!   create-if-absent transaction; every agent then adopts what etcd holds
//!   (network, subnet length, mode, VNI, port), as flanneld does; a malformed
//!   config is refused with the key and the reason.
//! - Subnet lease: the subnet remembered in `<state_dir>/subnet` if still free
//!   or already ours (same PublicIP: a node that comes back takes its key
//!   over), else a random free one, created with a transaction
//!   (`create_revision == 0`) under an etcd lease (TTL `etcd_lease_ttl`,
//!   default 10 s) kept alive every TTL/3. Two agents can never hold one
//!   subnet.
//! - Every agent watches `<prefix>/subnets/` (from the revision of its initial
//!   read) and mirrors the other nodes into its ROUTES and PEERS maps; entries
//!   for nodes that vanished are removed. An agent's restart (SIGTERM) keeps
//!   its registration (no churn on the other nodes); a node that stops is
//!   removed everywhere when its lease expires, and `rivetd unload` deletes its
//!   key at once.
//! - etcd unreachable: the datapath keeps forwarding with the last known maps;
//!   the agent reconnects every second, re-creates its key if the lease expired
//!   meanwhile, and resyncs the whole view before watching again.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    WatchOptions,
};
use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use super::flannel::{Backend, BackendData, SubnetLease, remote_node};
pub use crate::cluster::ClusterSink;
use crate::{
    cluster::{RemoteNode, StoreReport},
    config::{EtcdSettings, Mode},
    netlink::format_mac,
};

/// etcd problems.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The client failed (connect, request).
    #[error("etcd {what}: {source}")]
    Client {
        /// What was being done.
        what: &'static str,
        /// Cause.
        source: Box<etcd_client::Error>,
    },
    /// A stored value is not what the schema says.
    #[error("etcd key {key}: {reason}")]
    Schema {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// No subnet could be leased.
    #[error("no free /{len} subnet left in {network}")]
    NoSubnet {
        /// Cluster network.
        network: Ipv4Net,
        /// Subnet length.
        len: u8,
    },
}

fn client_err(what: &'static str) -> impl FnOnce(etcd_client::Error) -> EtcdError {
    move |e| EtcdError::Client {
        what,
        source: Box::new(e),
    }
}

/// `<prefix>/config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkConfig {
    /// Cluster CIDR.
    #[serde(rename = "Network")]
    pub network: String,
    /// Length of each node's subnet.
    #[serde(rename = "SubnetLen", default = "default_subnet_len")]
    pub subnet_len: u8,
    /// How nodes reach each other.
    #[serde(rename = "Backend", default)]
    pub backend: Backend,
}

const fn default_subnet_len() -> u8 {
    24
}

/// The key of a subnet.
pub fn subnet_key(prefix: &str, net: Ipv4Net) -> String {
    format!("{prefix}/subnets/{}-{}", net.network(), net.prefix_len())
}

/// The subnet of a key (`…/subnets/10.244.1.0-24`).
pub fn parse_subnet_key(key: &str) -> Option<Ipv4Net> {
    let last = key.rsplit('/').next()?;
    let (ip, len) = last.rsplit_once('-')?;
    Ipv4Net::new(ip.parse().ok()?, len.parse().ok()?).ok()
}

/// What the agent's start-up needs from the cluster store.
#[derive(Debug, Clone)]
pub struct Registration {
    /// The cluster-wide network config.
    pub network: Ipv4Net,
    /// Mode, VNI, port from the backend section.
    pub mode: Mode,
    /// VNI.
    pub vni: u32,
    /// Port.
    pub port: u16,
    /// This node's subnet.
    pub subnet: Ipv4Net,
    /// Its lease ID.
    pub lease: i64,
}

/// An etcd session of one node.
pub struct EtcdCluster {
    client: Client,
    settings: EtcdSettings,
    node_ip: Ipv4Addr,
    registration: Registration,
    value: String,
}

fn state_file(state_dir: &Path) -> PathBuf {
    state_dir.join("subnet")
}

impl EtcdCluster {
    /// Connects, reads (or seeds) the network config and leases this node's
    /// subnet. `local` seeds the config when the cluster has none.
    pub async fn register(
        settings: &EtcdSettings,
        node_ip: Ipv4Addr,
        seed: (Ipv4Net, Mode, u32, u16),
        state_dir: &Path,
    ) -> Result<Self, EtcdError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(5));
        let mut client = Client::connect(&settings.endpoints, Some(options))
            .await
            .map_err(client_err("connect"))?;
        let config_key = format!("{}/config", settings.prefix);
        let seed_config = NetworkConfig {
            network: seed.0.to_string(),
            subnet_len: 24,
            backend: Backend::for_mode(seed.1, seed.2, seed.3),
        };
        let seed_text = serde_json::to_string(&seed_config).unwrap_or_default();
        client
            .txn(
                Txn::new()
                    .when([Compare::create_revision(
                        config_key.clone(),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then([TxnOp::put(config_key.clone(), seed_text, None)]),
            )
            .await
            .map_err(client_err("seeding the network config"))?;
        let resp = client
            .get(config_key.clone(), None)
            .await
            .map_err(client_err("reading the network config"))?;
        let text = resp
            .kvs()
            .first()
            .map(|kv| kv.value().to_vec())
            .unwrap_or_default();
        let config: NetworkConfig =
            serde_json::from_slice(&text).map_err(|e| EtcdError::Schema {
                key: config_key.clone(),
                reason: e.to_string(),
            })?;
        let network: Ipv4Net = config.network.parse().map_err(|_| EtcdError::Schema {
            key: config_key.clone(),
            reason: format!("Network {:?} is not an IPv4 CIDR", config.network),
        })?;
        if config.subnet_len <= network.prefix_len() || config.subnet_len > 30 {
            return Err(EtcdError::Schema {
                key: config_key,
                reason: format!("SubnetLen {} does not fit in {network}", config.subnet_len),
            });
        }
        let mode = config.backend.mode();
        let vni = config.backend.vni.unwrap_or(seed.2);
        let port = config.backend.port.unwrap_or(seed.3);
        let value = serde_json::to_string(&SubnetLease {
            public_ip: node_ip,
            backend_type: config.backend.kind.clone(),
            backend_data: Some(BackendData {
                vni: Some(vni),
                vtep_mac: Some(format_mac(&crate::cluster::node::vtep_mac_for(node_ip))),
            }),
        })
        .unwrap_or_default();

        let lease = client
            .lease_grant(settings.lease_ttl as i64, None)
            .await
            .map_err(client_err("granting the node lease"))?
            .id();
        let remembered = std::fs::read_to_string(state_file(state_dir))
            .ok()
            .and_then(|s| s.trim().parse::<Ipv4Net>().ok())
            .filter(|s| network.contains(s) && s.prefix_len() == config.subnet_len);
        let mut me = Self {
            client,
            settings: settings.clone(),
            node_ip,
            registration: Registration {
                network,
                mode,
                vni,
                port,
                subnet: network,
                lease,
            },
            value,
        };
        let subnet = me.acquire(remembered, config.subnet_len).await?;
        me.registration.subnet = subnet;
        if let Err(e) = std::fs::write(state_file(state_dir), subnet.to_string()) {
            tracing::warn!(error = %e, "could not remember the node subnet");
        }
        tracing::info!(%subnet, %node_ip, lease, mode = mode.as_str(), "registered in etcd");
        Ok(me)
    }

    /// The registration.
    pub fn registration(&self) -> &Registration {
        &self.registration
    }

    /// All current subnet leases: (subnet, lease, revision of the read).
    async fn leases(&mut self) -> Result<(Vec<(Ipv4Net, SubnetLease)>, i64), EtcdError> {
        let prefix = format!("{}/subnets/", self.settings.prefix);
        let resp = self
            .client
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(client_err("listing subnets"))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut out = Vec::new();
        for kv in resp.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            match (
                parse_subnet_key(&key),
                serde_json::from_slice::<SubnetLease>(kv.value()),
            ) {
                (Some(net), Ok(lease)) => out.push((net, lease)),
                _ => tracing::warn!(%key, "ignoring an unreadable subnet lease"),
            }
        }
        Ok((out, revision))
    }

    /// Takes this node's subnet: the one it already holds (same PublicIP),
    /// the remembered one if free, else a free one chosen at random.
    async fn acquire(
        &mut self,
        remembered: Option<Ipv4Net>,
        len: u8,
    ) -> Result<Ipv4Net, EtcdError> {
        let (leases, _) = self.leases().await?;
        let mine = leases
            .iter()
            .find(|(_, l)| l.public_ip == self.node_ip)
            .map(|(n, _)| *n);
        for candidate in mine.into_iter().chain(remembered) {
            let key = subnet_key(&self.settings.prefix, candidate);
            let holder = leases
                .iter()
                .find(|(n, _)| *n == candidate)
                .map(|(_, l)| l.public_ip);
            let free_or_ours = holder.is_none_or(|ip| ip == self.node_ip);
            if free_or_ours && self.put_subnet(&key, holder.is_none()).await? {
                return Ok(candidate);
            }
        }
        let taken: Vec<Ipv4Net> = leases.iter().map(|(n, _)| *n).collect();
        let mut free: Vec<Ipv4Net> = self
            .registration
            .network
            .subnets(len)
            .map_err(|_| EtcdError::NoSubnet {
                network: self.registration.network,
                len,
            })?
            .filter(|s| !taken.contains(s))
            .collect();
        // Random order: a subnet a node just lost (lease expired) is not
        // the next one handed to a newcomer.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as usize)
            ^ (u32::from(self.node_ip) as usize);
        if !free.is_empty() {
            let k = seed % free.len();
            free.rotate_left(k);
        }
        for candidate in free {
            let key = subnet_key(&self.settings.prefix, candidate);
            if self.put_subnet(&key, true).await? {
                return Ok(candidate);
            }
        }
        Err(EtcdError::NoSubnet {
            network: self.registration.network,
            len,
        })
    }

    /// Writes the subnet key with our lease: only if absent (`create`), or
    /// unconditionally when we already hold it.
    async fn put_subnet(&mut self, key: &str, create: bool) -> Result<bool, EtcdError> {
        let put = TxnOp::put(
            key.to_owned(),
            self.value.clone(),
            Some(PutOptions::new().with_lease(self.registration.lease)),
        );
        let txn = if create {
            Txn::new()
                .when([Compare::create_revision(
                    key.to_owned(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([put])
        } else {
            Txn::new().and_then([put])
        };
        Ok(self
            .client
            .txn(txn)
            .await
            .map_err(client_err("leasing a subnet"))?
            .succeeded())
    }

    /// Keeps the lease alive and mirrors the other nodes into `sink`, for
    /// ever, reconnecting and resyncing after any failure.
    pub async fn run<S: ClusterSink>(mut self, sink: Arc<S>) {
        loop {
            if let Err(e) = self.session(&sink).await {
                tracing::warn!(error = %e, "etcd session ended; resyncing in 1 s");
                sink.state(StoreReport::Lost {
                    reason: e.to_string(),
                })
                .await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn session<S: ClusterSink>(&mut self, sink: &Arc<S>) -> Result<(), EtcdError> {
        // Our key must exist (a long outage may have expired the lease).
        let key = subnet_key(&self.settings.prefix, self.registration.subnet);
        let alive = self
            .client
            .lease_time_to_live(self.registration.lease, None)
            .await
            .is_ok_and(|r| r.ttl() > 0);
        if !alive {
            self.registration.lease = self
                .client
                .lease_grant(self.settings.lease_ttl as i64, None)
                .await
                .map_err(client_err("granting the node lease"))?
                .id();
        }
        if !self.put_subnet(&key, false).await? {
            return Err(EtcdError::Schema {
                key,
                reason: "could not re-register".into(),
            });
        }

        let (mut keeper, mut acks) = self
            .client
            .lease_keep_alive(self.registration.lease)
            .await
            .map_err(client_err("keeping the lease alive"))?;
        let (leases, revision) = self.leases().await?;
        let own = self.registration.subnet;
        let vni = self.registration.vni;
        let nodes: Vec<RemoteNode> = leases
            .iter()
            .filter(|(n, _)| *n != own)
            .map(|(n, l)| remote_node(*n, l, vni))
            .collect();
        let peers = nodes.len();
        sink.replace(nodes).await;
        sink.state(StoreReport::Synced { peers }).await;

        let prefix = format!("{}/subnets/", self.settings.prefix);
        let mut watch = self
            .client
            .watch(
                prefix,
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revision + 1),
                ),
            )
            .await
            .map_err(client_err("watching subnets"))?;
        let period = Duration::from_secs((self.settings.lease_ttl / 3).max(1));
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    keeper.keep_alive().await.map_err(client_err("keepalive"))?;
                }
                ack = acks.message() => {
                    match ack.map_err(client_err("keepalive stream"))? {
                        Some(r) if r.ttl() > 0 => {}
                        _ => return Err(EtcdError::Schema { key: "lease".into(), reason: "expired".into() }),
                    }
                }
                msg = watch.message() => {
                    let Some(resp) = msg.map_err(client_err("watch stream"))? else {
                        return Err(EtcdError::Schema { key: "watch".into(), reason: "closed".into() });
                    };
                    if resp.canceled() {
                        return Err(EtcdError::Schema { key: "watch".into(), reason: "canceled".into() });
                    }
                    for event in resp.events() {
                        let Some(kv) = event.kv() else { continue };
                        let key = String::from_utf8_lossy(kv.key()).into_owned();
                        let Some(net) = parse_subnet_key(&key) else { continue };
                        if net == own {
                            continue;
                        }
                        match event.event_type() {
                            EventType::Put => match serde_json::from_slice::<SubnetLease>(kv.value()) {
                                Ok(lease) => sink.upsert(remote_node(net, &lease, vni)).await,
                                Err(e) => tracing::warn!(%key, error = %e, "ignoring an unreadable subnet lease"),
                            },
                            EventType::Delete => sink.remove(net).await,
                        }
                    }
                }
            }
        }
    }
}

/// Deletes this node's registration (`rivetd unload`: the node leaves).
pub async fn leave(
    settings: &EtcdSettings,
    state_dir: &Path,
) -> Result<Option<Ipv4Net>, EtcdError> {
    let Some(subnet) = std::fs::read_to_string(state_file(state_dir))
        .ok()
        .and_then(|s| s.trim().parse::<Ipv4Net>().ok())
    else {
        return Ok(None);
    };
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_timeout(Duration::from_secs(5));
    let mut client = Client::connect(&settings.endpoints, Some(options))
        .await
        .map_err(client_err("connect"))?;
    client
        .delete(subnet_key(&settings.prefix, subnet), None)
        .await
        .map_err(client_err("deleting the node's subnet"))?;
    Ok(Some(subnet))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let net: Ipv4Net = "10.244.3.0/24".parse().expect("net");
        let key = subnet_key("/coreos.com/network", net);
        assert_eq!(key, "/coreos.com/network/subnets/10.244.3.0-24");
        assert_eq!(parse_subnet_key(&key), Some(net));
        assert_eq!(parse_subnet_key("/x/subnets/garbage"), None);
    }

    #[test]
    fn reads_flannel_values() {
        let config: NetworkConfig = serde_json::from_str(
            r#"{"Network":"10.244.0.0/16","SubnetLen":24,"Backend":{"Type":"vxlan","DirectRouting":true}}"#,
        )
        .expect("flannel config");
        assert_eq!(config.backend.mode(), Mode::Hybrid);
        let hostgw: NetworkConfig =
            serde_json::from_str(r#"{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}"#)
                .expect("host-gw");
        assert_eq!(hostgw.backend.mode(), Mode::Native);
        assert_eq!(hostgw.subnet_len, 24);
        let lease: SubnetLease = serde_json::from_str(
            r#"{"PublicIP":"192.168.1.11","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}}"#,
        )
        .expect("flannel lease");
        let node = remote_node("10.244.1.0/24".parse().expect("net"), &lease, 1);
        assert_eq!(node.vtep_mac, [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]);
        assert_eq!(node.node_ip, Ipv4Addr::new(192, 168, 1, 11));
    }

    #[test]
    fn modes_round_trip_through_backends() {
        for mode in [Mode::Vxlan, Mode::Ipip, Mode::Native, Mode::Hybrid] {
            assert_eq!(Backend::for_mode(mode, 1, 8472).mode(), mode);
        }
    }
}
