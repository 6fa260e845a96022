//! ADD results in the format of the config's version, merged with a
//! previous result when rivet runs chained after another plugin.

use std::net::Ipv4Addr;

use rivet_api::Endpoint;
use serde_json::{Value, json};

use crate::skel::version_cmp;

/// Builds the ADD result for `version`.
///
/// - 0.3.x/0.4.0: `ips[].version = "4"`;
/// - 1.1.0: interfaces carry `mtu`;
/// - a previous result (chaining) keeps its entries; ours are appended and
///   interface indexes shifted.
pub fn add_result(
    version: &str,
    ep: &Endpoint,
    extra_routes: &[String],
    dns: Option<&Value>,
    prev: Option<&Value>,
) -> Value {
    let old = version_cmp(version, "1.0.0").is_lt();
    let with_mtu = version_cmp(version, "1.1.0").is_ge();

    let mut interfaces: Vec<Value> = prev
        .and_then(|p| p["interfaces"].as_array().cloned())
        .unwrap_or_default();
    let mut ips: Vec<Value> = prev
        .and_then(|p| p["ips"].as_array().cloned())
        .unwrap_or_default();
    let mut routes: Vec<Value> = prev
        .and_then(|p| p["routes"].as_array().cloned())
        .unwrap_or_default();

    let mut host = json!({"name": ep.host_ifname, "mac": ep.host_mac});
    let mut pod = json!({"name": ep.ifname, "mac": ep.mac, "sandbox": ep.netns});
    if with_mtu {
        host["mtu"] = json!(ep.mtu);
        pod["mtu"] = json!(ep.mtu);
    }
    interfaces.push(host);
    let pod_index = interfaces.len();
    interfaces.push(pod);

    let mut ip = json!({
        "address": format!("{}/32", ep.ip),
        "gateway": ep.gateway.to_string(),
        "interface": pod_index,
    });
    if old {
        ip["version"] = json!("4");
    }
    ips.push(ip);
    routes.push(json!({"dst": "0.0.0.0/0", "gw": ep.gateway.to_string()}));
    for dst in extra_routes {
        routes.push(json!({"dst": dst, "gw": ep.gateway.to_string()}));
    }

    let mut result = json!({
        "cniVersion": version,
        "interfaces": interfaces,
        "ips": ips,
        "routes": routes,
    });
    match (dns, prev.and_then(|p| p.get("dns"))) {
        (Some(d), _) if !d.is_null() => result["dns"] = d.clone(),
        (_, Some(d)) => result["dns"] = d.clone(),
        _ => {}
    }
    result
}

/// The IPv4 address of `ifname` in a (previous) result: the entry whose
/// `interface` index names a sandbox interface called `ifname`, else the
/// first IPv4 entry.
pub fn ip_of(result: &Value, ifname: &str) -> Option<Ipv4Addr> {
    let interfaces = result["interfaces"].as_array();
    let ips = result["ips"].as_array()?;
    let parse =
        |v: &Value| -> Option<Ipv4Addr> { v["address"].as_str()?.split('/').next()?.parse().ok() };
    let ours = ips.iter().find(|ip| {
        let idx = ip["interface"].as_u64();
        interfaces
            .zip(idx)
            .and_then(|(ifs, i)| ifs.get(usize::try_from(i).ok()?))
            .is_some_and(|iface| iface["name"] == ifname && iface.get("sandbox").is_some())
    });
    ours.and_then(parse).or_else(|| ips.iter().find_map(parse))
}

/// Converts a result from a delegated IPAM plugin into an address.
pub fn ipam_address(result: &Value) -> Option<Ipv4Addr> {
    result["ips"]
        .as_array()?
        .iter()
        .find_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use rivet_api::EndpointState;

    use super::*;

    fn ep() -> Endpoint {
        Endpoint {
            container_id: "c".into(),
            ifname: "eth0".into(),
            network: None,
            netns: "/run/netns/p".into(),
            ip: "10.1.0.5".parse().expect("ip"),
            mac: "02:00:00:00:00:01".into(),
            host_ifname: "rv0000000000001".into(),
            host_ifindex: 9,
            host_mac: "02:00:00:00:00:02".into(),
            mtu: 1450,
            gateway: "169.254.1.1".parse().expect("ip"),
            state: EndpointState::Ready,
            pod: None,
            port_mappings: Vec::new(),
            bandwidth: None,
            routes: Vec::new(),
            created: 0,
            netns_cookie: None,
        }
    }

    #[test]
    fn result_shape_per_version() {
        let r = add_result("1.1.0", &ep(), &[], None, None);
        assert_eq!(r["cniVersion"], "1.1.0");
        assert_eq!(r["interfaces"][1]["sandbox"], "/run/netns/p");
        assert_eq!(r["interfaces"][1]["mtu"], 1450);
        assert_eq!(r["ips"][0]["address"], "10.1.0.5/32");
        assert_eq!(r["ips"][0]["interface"], 1);
        assert!(r["ips"][0].get("version").is_none());
        assert_eq!(r["routes"][0]["dst"], "0.0.0.0/0");

        let r = add_result("1.0.0", &ep(), &[], None, None);
        assert!(r["interfaces"][1].get("mtu").is_none());
        let r = add_result(
            "0.3.1",
            &ep(),
            &["10.96.0.0/12".into()],
            Some(&json!({"nameservers":["10.96.0.10"]})),
            None,
        );
        assert_eq!(r["ips"][0]["version"], "4");
        assert_eq!(r["routes"][1]["dst"], "10.96.0.0/12");
        assert_eq!(r["dns"]["nameservers"][0], "10.96.0.10");
    }

    #[test]
    fn chaining_appends_and_shifts_indexes() {
        let prev = json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "other0"}],
            "ips": [{"address": "192.0.2.9/24", "interface": 0}],
            "dns": {"nameservers": ["192.0.2.53"]}
        });
        let r = add_result("1.0.0", &ep(), &[], None, Some(&prev));
        assert_eq!(r["interfaces"].as_array().map(Vec::len), Some(3));
        assert_eq!(r["ips"][1]["interface"], 2);
        assert_eq!(r["dns"]["nameservers"][0], "192.0.2.53");
        assert_eq!(ip_of(&r, "eth0"), Some("10.1.0.5".parse().expect("ip")));
    }

    #[test]
    fn ipam_results() {
        let r = json!({"ips":[{"address":"fd00::5/64"},{"address":"10.1.0.7/24","gateway":"10.1.0.1"}]});
        assert_eq!(
            ipam_address(&r),
            Some("10.1.0.7".parse().expect("ip")),
            "IPv6 entries are skipped"
        );
        assert_eq!(ipam_address(&json!({"ips": []})), None);
    }
}
