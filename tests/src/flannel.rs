//! A node set up the way flanneld's vxlan backend sets one up — the kernel
//! `vxlan` device `flannel.1` (VNI 1, port 8472, learning off, the subnet's
//! `.0` address), and per peer an onlink route via the peer subnet's `.0`,
//! a permanent neighbour entry and an FDB entry — with pods behind the
//! reference `bridge` plugin (`cni0`), as flannel's CNI plugin delegates.
//! Used for the interop test and as the kernel-vxlan baseline of the
//! overlay benchmark.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde_json::{Value, json};

use crate::{
    Netns, World,
    cni::{Plugin, result_ip},
};

/// A flannel-style node.
#[derive(Debug, Clone)]
pub struct FlannelNode {
    /// Index in `World::nodes`.
    pub node: usize,
    /// Its pod subnet.
    pub subnet: Ipv4Net,
    /// MAC of `flannel.1`.
    pub vtep_mac: String,
}

/// A pod behind `cni0`.
#[derive(Debug)]
pub struct FlannelPod {
    /// Its address.
    pub ip: Ipv4Addr,
    conf: Value,
    plugin: Plugin,
    /// Its namespace.
    pub ns: Netns,
}

impl Drop for FlannelPod {
    fn drop(&mut self) {
        let _ = self.plugin.del("fpod", Some(&self.ns.path()), &self.conf);
    }
}

/// Creates `flannel.1` on node `n` (which runs no rivet agent).
pub fn setup_node(w: &World, n: usize, subnet: Ipv4Net) -> FlannelNode {
    let ns = &w.nodes[n].ns;
    let ip = w.nodes[n].ip.to_string();
    ns.run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    ns.ip(&[
        "link",
        "add",
        "flannel.1",
        "type",
        "vxlan",
        "id",
        "1",
        "local",
        &ip,
        "dev",
        "eth0",
        "dstport",
        "8472",
        "nolearning",
    ]);
    ns.ip(&["link", "set", "flannel.1", "mtu", "1450", "up"]);
    ns.ip(&[
        "addr",
        "add",
        &format!("{}/32", subnet.network()),
        "dev",
        "flannel.1",
    ]);
    let link = ns.run("ip", &["-o", "link", "show", "flannel.1"]);
    let vtep_mac = link
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .expect("flannel.1 MAC")
        .to_owned();
    FlannelNode {
        node: n,
        subnet,
        vtep_mac,
    }
}

/// What flanneld writes on `f` for a peer (its subnet, VTEP MAC, address).
pub fn add_peer(w: &World, f: &FlannelNode, subnet: Ipv4Net, vtep_mac: &str, node_ip: Ipv4Addr) {
    let ns = &w.nodes[f.node].ns;
    let gw = subnet.network().to_string();
    ns.ip(&[
        "route",
        "add",
        &subnet.to_string(),
        "via",
        &gw,
        "dev",
        "flannel.1",
        "onlink",
    ]);
    ns.ip(&[
        "neigh",
        "add",
        &gw,
        "lladdr",
        vtep_mac,
        "dev",
        "flannel.1",
        "nud",
        "permanent",
    ]);
    ns.run(
        "bridge",
        &[
            "fdb",
            "add",
            vtep_mac,
            "dev",
            "flannel.1",
            "dst",
            &node_ip.to_string(),
        ],
    );
}

/// A pod on flannel node `f` through the reference bridge plugin.
pub fn add_pod(w: &World, f: &FlannelNode, tag: &str) -> FlannelPod {
    let node_ns = w.nodes[f.node].ns.path();
    let ns = Netns::new(format!("{}-{tag}", w.prefix));
    let plugin = Plugin::reference("bridge", &node_ns);
    let conf = json!({
        "cniVersion": "1.0.0", "name": "cbr0", "type": "bridge", "bridge": "cni0",
        "isGateway": true, "ipMasq": false, "mtu": 1450,
        "ipam": {"type": "host-local", "subnet": f.subnet.to_string(),
                 "dataDir": w.dir().join(format!("fl-ipam-{tag}")),
                 "routes": [{"dst": "0.0.0.0/0"}]},
    });
    let res = plugin
        .add("fpod", &ns.path(), &conf)
        .expect_ok("bridge ADD on a flannel node");
    let ip = result_ip(&res.json).expect("pod address");
    FlannelPod {
        ip,
        conf,
        plugin,
        ns,
    }
}

/// Makes the underlay behave like real NICs: no TSO and no checksum offload
/// on the node uplinks and the bridge ports (GSO is done in software, frames
/// on the wire are MTU-sized), NAPI GRO on the receiving uplinks.
pub fn nic_like(w: &World) {
    for n in &w.nodes {
        n.ns.run(
            "ethtool",
            &["-K", "eth0", "tso", "off", "tx", "off", "gro", "on"],
        );
    }
    for (i, _) in w.nodes.iter().enumerate() {
        w.underlay.run(
            "ethtool",
            &["-K", &format!("n{}", i + 1), "tso", "off", "tx", "off"],
        );
    }
}
