//! `runtimeConfig` (portMappings, bandwidth, ips), `args.cni.ips` and
//! `CNI_ARGS`, structured: the input is a configuration built from
//! arbitrary values, checked against an independent model of the rules,
//! and then the plugin → agent contract: the `endpoint_add` request the
//! plugin would send decodes in the agent to exactly the same request.

#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::{
    arbitrary::{self, Arbitrary},
    fuzz_target,
};
use rivet_api::{EndpointSpec, PodMeta, Protocol, Request};
use rivet_cni::{
    conf::{NetConf, parse_cni_args},
    skel::code,
};
use serde_json::{Value, json};

#[derive(Arbitrary, Debug)]
enum Port {
    Valid(u16),
    Any(i64),
}

impl Port {
    fn value(&self) -> i64 {
        match self {
            Self::Valid(p) => i64::from(*p),
            Self::Any(p) => *p,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Text {
    Tcp,
    Udp,
    Sctp,
    Upper(bool),
    V4([u8; 4]),
    V6,
    Cidr([u8; 4], u8),
    Any(String),
}

impl Text {
    fn render(&self) -> String {
        match self {
            Self::Tcp => "tcp".into(),
            Self::Udp => "udp".into(),
            Self::Sctp => "sctp".into(),
            Self::Upper(udp) => if *udp { "UDP" } else { "Tcp" }.into(),
            Self::V4(o) => Ipv4Addr::from(*o).to_string(),
            Self::V6 => "fd00::1".into(),
            Self::Cidr(o, len) => format!("{}/{len}", Ipv4Addr::from(*o)),
            Self::Any(s) => s.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Mapping {
    host_port: Port,
    container_port: Port,
    protocol: Option<Text>,
    host_ip: Option<Text>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    mappings: Vec<Mapping>,
    bandwidth: Option<[Option<u64>; 4]>,
    ips: Vec<Text>,
    args_ips: Option<Vec<Text>>,
    cni_args: Vec<(Text, Text)>,
    /// A raw `runtimeConfig` value instead of the built one.
    raw: Option<String>,
    /// Capability keys spelled with Go field names (`HostPort`, …), as
    /// containerd sends them: the rules must not change.
    go_names: bool,
}

/// A capability key as the input spells it.
fn key(go_names: bool, camel: &'static str) -> String {
    if !go_names {
        return camel.to_owned();
    }
    let mut chars = camel.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// A mapping as the model sees it: hostPort, containerPort, protocol, hostIP.
type Modelled = (u16, u16, Protocol, Option<Ipv4Addr>);

/// The rules for one mapping: `Err(())` when invalid, `Ok(None)` when
/// skipped (IPv6 host address), else the mapping.
fn model(m: &Mapping) -> Result<Option<Modelled>, ()> {
    let protocol = match m
        .protocol
        .as_ref()
        .map_or_else(|| "tcp".to_owned(), Text::render)
        .to_ascii_lowercase()
        .as_str()
    {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        _ => return Err(()),
    };
    let host_ip = match m.host_ip.as_ref().map(Text::render) {
        None => None,
        Some(t) if t.is_empty() => None,
        Some(t) if t.contains(':') => return Ok(None),
        Some(t) => Some(t.parse::<Ipv4Addr>().map_err(|_| ())?),
    };
    let port = |p: &Port| u16::try_from(p.value()).ok().filter(|p| *p != 0).ok_or(());
    Ok(Some((
        port(&m.host_port)?,
        port(&m.container_port)?,
        protocol,
        host_ip,
    )))
}

fuzz_target!(|input: Input| {
    let mappings: Vec<Value> = input
        .mappings
        .iter()
        .map(|m| {
            let k = |camel| key(input.go_names, camel);
            let mut v = serde_json::Map::new();
            v.insert(k("hostPort"), json!(m.host_port.value()));
            v.insert(k("containerPort"), json!(m.container_port.value()));
            if let Some(p) = &m.protocol {
                v.insert(k("protocol"), json!(p.render()));
            }
            if let Some(ip) = &m.host_ip {
                v.insert(k("hostIP"), json!(ip.render()));
            }
            Value::Object(v)
        })
        .collect();
    let mut runtime = json!({
        "portMappings": mappings,
        "ips": input.ips.iter().map(Text::render).collect::<Vec<_>>(),
    });
    if let Some([a, b, c, d]) = input.bandwidth {
        let k = |camel| key(input.go_names, camel);
        let mut bw = serde_json::Map::new();
        for (name, v) in [
            ("ingressRate", a),
            ("ingressBurst", b),
            ("egressRate", c),
            ("egressBurst", d),
        ] {
            bw.insert(k(name), json!(v));
        }
        runtime["bandwidth"] = Value::Object(bw);
    }
    let runtime = match &input.raw {
        Some(raw) => match serde_json::from_str::<Value>(raw) {
            Ok(v) => v,
            Err(_) => return,
        },
        None => runtime,
    };
    let mut conf = json!({
        "cniVersion": "1.1.0", "name": "rivet", "type": "rivet-cni",
        "runtimeConfig": runtime,
    });
    if let Some(ips) = &input.args_ips {
        conf["args"] = json!({"cni": {"ips": ips.iter().map(Text::render).collect::<Vec<_>>()}});
    }
    let bytes = serde_json::to_vec(&conf).unwrap_or_default();
    let conf = match NetConf::parse(&bytes) {
        Ok(c) => c,
        Err(e) => {
            // Only a raw runtimeConfig of the wrong shape can fail here.
            assert!(input.raw.is_some(), "built config refused: {e}");
            assert_eq!(e.code, code::DECODE);
            return;
        }
    };

    // portMappings against the model.
    let got = conf.port_mappings();
    if input.raw.is_none() {
        let want: Result<Vec<_>, ()> = input
            .mappings
            .iter()
            .map(model)
            .filter_map(Result::transpose)
            .collect();
        match (&got, want) {
            (Ok(got), Ok(want)) => {
                let got: Vec<_> = got
                    .iter()
                    .map(|p| (p.host_port, p.container_port, p.protocol, p.host_ip))
                    .collect();
                assert_eq!(got, want);
            }
            (Err(e), Err(())) => assert_eq!(e.code, code::INVALID_CONFIG),
            (got, want) => panic!("portMappings: plugin {got:?}, model {want:?}"),
        }
        // The reference plugin's rules: a rate needs a burst and a burst a
        // rate, a burst under 4 GiB; and a rate of at least a byte/s.
        let valid = |rate: Option<u64>, burst: Option<u64>| {
            let (r, b) = (rate.unwrap_or(0), burst.unwrap_or(0));
            !((r != 0 && b == 0)
                || (r == 0 && b != 0)
                || b / 8 >= u64::from(u32::MAX)
                || (r != 0 && r < 8))
        };
        match (conf.bandwidth(), input.bandwidth) {
            (Ok(None), None) => {}
            (Ok(Some(b)), Some([ir, ib, er, eb])) => {
                assert!(valid(ir, ib) && valid(er, eb), "accepted: {b:?}");
                assert_eq!(
                    [
                        b.ingress_rate,
                        b.ingress_burst,
                        b.egress_rate,
                        b.egress_burst
                    ],
                    [ir, ib, er, eb]
                );
            }
            (Err(e), Some([ir, ib, er, eb])) => {
                assert_eq!(e.code, code::INVALID_CONFIG);
                assert!(!(valid(ir, ib) && valid(er, eb)), "refused: {e:?}");
            }
            (got, want) => panic!("bandwidth: plugin {got:?}, input {want:?}"),
        }
    }

    // The requested address: the first non-IPv6 entry of
    // runtimeConfig.ips, then args.cni.ips, must be an IPv4 address.
    let requested = conf.requested_ip();
    if input.raw.is_none() {
        let first = input
            .ips
            .iter()
            .chain(input.args_ips.iter().flatten())
            .map(Text::render)
            .find(|t| !t.split('/').next().unwrap_or_default().contains(':'));
        match (&requested, first) {
            (Ok(None), None) => {}
            (Ok(Some(ip)), Some(t)) => {
                assert_eq!(
                    t.split('/').next().map(str::parse::<Ipv4Addr>),
                    Some(Ok(*ip))
                );
            }
            (Err(e), Some(_)) => assert_eq!(e.code, code::INVALID_CONFIG),
            (r, f) => panic!("requested IP: plugin {r:?}, first entry {f:?}"),
        }
    }

    // CNI_ARGS: K=V;... (unknown keys allowed with IgnoreUnknown).
    let cni_args: String = input
        .cni_args
        .iter()
        .map(|(k, v)| format!("{}={}", k.render(), v.render()))
        .collect::<Vec<_>>()
        .join(";");
    let parsed = parse_cni_args(&cni_args);
    if let Err(e) = &parsed {
        assert_eq!(e.code, code::INVALID_ENV);
    }

    // The request ADD would send, and what the agent decodes from it.
    let (Ok(port_mappings), Ok(requested), Ok(cni_args), Ok(bandwidth)) =
        (got, requested, parsed, conf.bandwidth())
    else {
        return;
    };
    let spec = EndpointSpec {
        ip: cni_args.ip.or(requested),
        ranges: conf.ranges(),
        pod: cni_args.pod.map(|p| PodMeta {
            namespace: p.namespace,
            name: p.name,
        }),
        port_mappings,
        bandwidth,
        routes: conf.routes().unwrap_or_default(),
        ..EndpointSpec::new("c1", "/run/netns/p1")
    };
    let request = Request::EndpointAdd(spec);
    let body = serde_json::to_vec(&request).unwrap_or_default();
    match rivet::server::decode_request(&body) {
        Ok(decoded) => assert_eq!(decoded, request),
        Err(e) => panic!("the agent refuses what the plugin sends: {e}"),
    }
});
