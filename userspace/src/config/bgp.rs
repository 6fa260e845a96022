//! The BGP section (`mode = "bgp"`): AS number, who this node peers with
//! (the node-to-node mesh, route reflectors, external peers), session
//! timers, and how next hops outside the uplink's subnet are reached.

use std::{net::Ipv4Addr, path::PathBuf};

use ipnet::Ipv4Net;

use super::{ConfigError, FileConfig, Mode, invalid};

/// Default AS number (private range; Calico's default too).
pub const DEFAULT_BGP_AS: u32 = 64512;
/// Default hold time, seconds.
pub const DEFAULT_BGP_HOLD_TIME: u16 = 30;
/// Default graceful restart time, seconds.
pub const DEFAULT_BGP_GRACEFUL_RESTART: u16 = 120;
/// Default kernel table of learned routes.
pub const DEFAULT_BGP_TABLE: u32 = 4242;
/// Default speaker binary (Debian's `bird2`).
pub const DEFAULT_BGP_SPEAKER: &str = "/usr/sbin/bird";

/// How a learned route whose next hop is outside the uplink's subnet is
/// reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CrossSubnet {
    /// Routed natively: sent to the uplink's gateway toward the next hop.
    #[default]
    None,
    /// VXLAN to the next hop (Calico's `vxlanMode: CrossSubnet`).
    Vxlan,
    /// IP-in-IP to the next hop (Calico's `ipipMode: CrossSubnet`).
    Ipip,
}

impl CrossSubnet {
    /// Name as in the configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Vxlan => "vxlan",
            Self::Ipip => "ipip",
        }
    }

    /// Bytes the tunnel adds (pod MTU = uplink − this).
    pub const fn overhead(self) -> u32 {
        match self {
            Self::None => 0,
            Self::Vxlan => rivet_common::VXLAN_OVERHEAD,
            Self::Ipip => rivet_common::IPIP_OVERHEAD,
        }
    }
}

/// An external peer (a top-of-rack router).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpPeer {
    /// Its address.
    pub address: Ipv4Addr,
    /// Its AS number: eBGP when it differs from this node's.
    pub asn: u32,
    /// TCP MD5 password, if any.
    pub password: Option<String>,
}

impl std::str::FromStr for BgpPeer {
    type Err = String;

    /// `ADDRESS:AS` or `ADDRESS:AS:PASSWORD`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.splitn(3, ':');
        let address = parts
            .next()
            .and_then(|a| a.parse().ok())
            .ok_or("expected ADDRESS:AS[:PASSWORD] with an IPv4 address")?;
        let asn = parts
            .next()
            .and_then(|a| a.parse().ok())
            .filter(|a| valid_asn(*a))
            .ok_or("expected ADDRESS:AS[:PASSWORD] with an AS number 1..=4294967294")?;
        let password = parts.next().map(str::to_owned);
        if password.as_deref().is_some_and(|p| !valid_password(p)) {
            return Err("a password is 1..=80 printable characters without quotes".into());
        }
        Ok(Self {
            address,
            asn,
            password,
        })
    }
}

/// The BGP settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpSettings {
    /// This node's AS number.
    pub asn: u32,
    /// Peer with every other node of the cluster.
    pub mesh: bool,
    /// Route reflectors to peer with.
    pub reflectors: Vec<Ipv4Addr>,
    /// This node reflects routes, with this cluster ID.
    pub cluster_id: Option<Ipv4Addr>,
    /// External peers.
    pub peers: Vec<BgpPeer>,
    /// TCP MD5 password of node-to-node sessions.
    pub password: Option<String>,
    /// Hold time, seconds.
    pub hold_time: u16,
    /// Graceful restart time, seconds (0 = off).
    pub graceful_restart: u16,
    /// How next hops outside the uplink's subnet are reached.
    pub cross_subnet: CrossSubnet,
    /// Prefixes announced besides the pod CIDR.
    pub advertise: Vec<Ipv4Net>,
    /// Damp flapping routes.
    pub damping: bool,
    /// The speaker binary.
    pub speaker: PathBuf,
    /// Kernel table of learned routes.
    pub table: u32,
}

const fn valid_asn(asn: u32) -> bool {
    // 0 and 65535/4294967295 are reserved; 23456 is AS_TRANS.
    asn != 0 && asn != 23456 && asn != 65535 && asn != u32::MAX
}

fn valid_password(p: &str) -> bool {
    (1..=80).contains(&p.len())
        && p.chars()
            .all(|c| c.is_ascii_graphic() && c != '"' && c != '\\')
}

/// `None` unless the mode is `bgp`; any `bgp_*` key with another mode is
/// refused (it would silently do nothing).
pub(super) fn bgp(file: &FileConfig, mode: Mode) -> Result<Option<BgpSettings>, ConfigError> {
    if mode != Mode::Bgp {
        let set: [(&'static str, bool); 13] = [
            ("bgp_as", file.bgp_as.is_some()),
            ("bgp_mesh", file.bgp_mesh.is_some()),
            ("bgp_reflectors", file.bgp_reflectors.is_some()),
            (
                "bgp_reflector_cluster_id",
                file.bgp_reflector_cluster_id.is_some(),
            ),
            ("bgp_peers", file.bgp_peers.is_some()),
            ("bgp_password", file.bgp_password.is_some()),
            ("bgp_hold_time", file.bgp_hold_time.is_some()),
            ("bgp_graceful_restart", file.bgp_graceful_restart.is_some()),
            ("bgp_cross_subnet", file.bgp_cross_subnet.is_some()),
            ("bgp_advertise", file.bgp_advertise.is_some()),
            ("bgp_damping", file.bgp_damping.is_some()),
            ("bgp_speaker", file.bgp_speaker.is_some()),
            ("bgp_table", file.bgp_table.is_some()),
        ];
        if let Some((key, _)) = set.iter().find(|(_, s)| *s) {
            return Err(invalid(
                key,
                "…",
                format!(
                    "BGP settings need mode = \"bgp\" (mode is {})",
                    mode.as_str()
                ),
            ));
        }
        return Ok(None);
    }
    let asn = file.bgp_as.unwrap_or(DEFAULT_BGP_AS);
    if !valid_asn(asn) {
        return Err(invalid(
            "bgp_as",
            asn,
            "must be 1..=4294967294, not 23456 or 65535",
        ));
    }
    let reflectors = file.bgp_reflectors.clone().unwrap_or_default();
    let mesh = file.bgp_mesh.unwrap_or(reflectors.is_empty());
    let peers = file
        .bgp_peers
        .iter()
        .flatten()
        .map(|p| p.parse::<BgpPeer>().map_err(|e| invalid("bgp_peers", p, e)))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(p) = &file.bgp_password
        && !valid_password(p)
    {
        return Err(invalid(
            "bgp_password",
            "…",
            "must be 1..=80 printable characters without quotes",
        ));
    }
    let hold_time = file.bgp_hold_time.unwrap_or(DEFAULT_BGP_HOLD_TIME);
    if hold_time < 3 {
        return Err(invalid(
            "bgp_hold_time",
            hold_time,
            "must be at least 3 seconds",
        ));
    }
    let cross_subnet = match file.bgp_cross_subnet.as_deref() {
        None | Some("none") => CrossSubnet::None,
        Some("vxlan") => CrossSubnet::Vxlan,
        Some("ipip") => CrossSubnet::Ipip,
        Some(other) => {
            return Err(invalid(
                "bgp_cross_subnet",
                other,
                "one of none, vxlan, ipip",
            ));
        }
    };
    let advertise = file
        .bgp_advertise
        .iter()
        .flatten()
        .map(|a| {
            a.parse::<Ipv4Net>()
                .ok()
                .filter(|n| n.network() == n.addr())
                .ok_or_else(|| invalid("bgp_advertise", a, "not an IPv4 network like 10.96.0.0/12"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let table = file.bgp_table.unwrap_or(DEFAULT_BGP_TABLE);
    // 0 is unspecified, 253-255 are the kernel's default/main/local.
    if table == 0 || (253..=255).contains(&table) {
        return Err(invalid(
            "bgp_table",
            table,
            "must not be 0 or one of the kernel's own tables (253, 254, 255)",
        ));
    }
    Ok(Some(BgpSettings {
        asn,
        mesh,
        reflectors,
        cluster_id: file.bgp_reflector_cluster_id,
        peers,
        password: file.bgp_password.clone(),
        hold_time,
        graceful_restart: file
            .bgp_graceful_restart
            .unwrap_or(DEFAULT_BGP_GRACEFUL_RESTART),
        cross_subnet,
        advertise,
        damping: file.bgp_damping.unwrap_or(true),
        speaker: file
            .bgp_speaker
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_BGP_SPEAKER)),
        table,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_with_and_without_a_password() {
        let p: BgpPeer = "192.168.1.1:65001".parse().expect("valid");
        assert_eq!(p.address, Ipv4Addr::new(192, 168, 1, 1));
        assert_eq!(p.asn, 65001);
        assert_eq!(p.password, None);
        let p: BgpPeer = "10.0.0.1:64512:s3cr:t".parse().expect("valid");
        assert_eq!(p.password.as_deref(), Some("s3cr:t"));
        for bad in [
            "10.0.0.1",
            "10.0.0.1:0",
            "host:65001",
            "10.0.0.1:65001:a\"b",
            "10.0.0.1:x",
        ] {
            assert!(bad.parse::<BgpPeer>().is_err(), "{bad}");
        }
    }
}
