//! Answers as tables (the default output).

use rivet_api::Response;

/// Prints `response` for a person; `show_all`: counters that are zero too.
pub fn print_table(response: &Response, show_all: bool) {
    match response {
        Response::Endpoint(ep) => {
            println!(
                "added {} ({} {}) on {} mac {}",
                ep.ip, ep.container_id, ep.ifname, ep.host_ifname, ep.mac
            );
        }
        Response::Endpoints { endpoints } => {
            println!(
                "{:<15} {:<24} {:<6} {:<15} {:>7} {:<17} {:<5} BANDWIDTH",
                "IP", "CONTAINER", "IFNAME", "HOST-IF", "IFINDEX", "MAC", "MTU"
            );
            for ep in endpoints {
                println!(
                    "{:<15} {:<24} {:<6} {:<15} {:>7} {:<17} {:<5} {}",
                    ep.ip.to_string(),
                    ep.container_id,
                    ep.ifname,
                    ep.host_ifname,
                    ep.host_ifindex,
                    ep.mac,
                    ep.mtu,
                    bandwidth_text(ep.bandwidth.as_ref())
                );
            }
        }
        Response::Checked {} => println!("ok: every resource is in place"),
        Response::Nodes { nodes } => {
            println!(
                "{:<18} {:<15} {:<17} {:>8} ROUTE",
                "SUBNET", "NODE-IP", "VTEP-MAC", "VNI"
            );
            for n in nodes {
                println!(
                    "{:<18} {:<15} {:<17} {:>8} {}",
                    n.subnet,
                    n.node_ip.to_string(),
                    n.vtep_mac.as_deref().unwrap_or("-"),
                    n.vni.map_or_else(|| "-".to_owned(), |v| v.to_string()),
                    n.route.as_deref().unwrap_or("-")
                );
            }
        }
        Response::Collected { removed } => {
            println!("removed {} attachment(s)", removed.len());
            for r in removed {
                println!("  {} {}", r.container_id, r.ifname);
            }
        }
        Response::Deleted { existed } => {
            println!(
                "{}",
                if *existed {
                    "deleted"
                } else {
                    "nothing to delete"
                }
            );
        }
        Response::Stats {
            counters,
            bandwidth,
        } => {
            println!("{:<24} {:>14} {:>16}", "COUNTER", "PACKETS", "BYTES");
            for c in counters.iter().filter(|c| show_all || c.packets > 0) {
                println!("{:<24} {:>14} {:>16}", c.name, c.packets, c.bytes);
            }
            if !bandwidth.is_empty() {
                println!();
                println!(
                    "{:<32} {:<8} {:>8} {:>16} {:>10} {:>10} {:>10}",
                    "BANDWIDTH POD", "DIR", "LIMIT", "SENT-BYTES", "DROPPED", "DELAYED", "QUEUED"
                );
                for b in bandwidth {
                    println!(
                        "{:<32} {:<8} {:>8} {:>16} {:>10} {:>10} {:>10}",
                        b.pod,
                        b.direction,
                        si_bits(b.rate),
                        b.sent_bytes,
                        b.dropped,
                        b.delayed,
                        b.backlog_bytes
                    );
                }
            }
        }
        Response::Status(s) => {
            println!(
                "rivetd {}  node {}  up {}s  (status gathered {} ms ago)",
                s.version, s.node_name, s.uptime_secs, s.age_ms
            );
            println!(
                "mode {}  cluster {}  node IP {}  remote nodes {}  store {}",
                s.mode,
                s.cluster_cidr,
                s.node_ip
                    .map_or_else(|| "-".to_owned(), |ip| ip.to_string()),
                s.nodes,
                s.store
            );
            println!(
                "pod CIDR {}  gateway {}  MTU {}",
                s.pod_cidr, s.gateway, s.mtu
            );
            println!(
                "ready: {}",
                if s.ready {
                    "yes".to_owned()
                } else {
                    format!("NO ({})", s.not_ready.as_deref().unwrap_or("?"))
                }
            );
            if let Some(e) = &s.last_error {
                println!("last error: {e}");
            }
            println!("pins {}  endpoints {}", s.pin_dir, s.endpoints);
            if !s.ebpf.source.is_empty() {
                println!(
                    "eBPF object {}  stamp {}  hash {}  ({} bytes)",
                    s.ebpf.source,
                    s.ebpf.stamp.as_deref().unwrap_or("-"),
                    s.ebpf.hash,
                    s.ebpf.bytes
                );
            }
            println!("maps:");
            for m in &s.maps {
                println!(
                    "  {:<13} {:>8} of {:>8} entries  {:>7.1} MiB  refused when full: {}",
                    m.name,
                    m.entries,
                    m.capacity,
                    m.memory_bytes as f64 / (1024.0 * 1024.0),
                    m.full_refusals
                );
            }
            for w in &s.warnings {
                println!("WARNING: {w}");
            }
            println!(
                "address pool: {} used of {} ({} free)",
                s.pool.used,
                s.pool.size,
                s.pool.free()
            );
            let n = s.nat;
            if n.masquerade {
                println!(
                    "masquerade: ports {}-{}  NAT table {} of {} entries  expired {}  evicted {} (+{} half-evicted)  spared {}",
                    n.port_min,
                    n.port_max,
                    n.entries,
                    n.max_entries,
                    n.expired,
                    n.evicted,
                    n.orphaned,
                    n.spared
                );
            } else {
                println!(
                    "masquerade: off  NAT table {} of {} entries",
                    n.entries, n.max_entries
                );
            }
            println!("attachments:");
            for a in &s.attachments {
                println!(
                    "  {:<15} {:<12} program {:>5}  link {:>5}",
                    a.interface, a.program, a.program_id, a.link_id
                );
            }
        }
        Response::Nat {
            entries,
            total,
            next,
        } => {
            println!(
                "{:<5} {:<7} {:<22} {:<22} {:<22} {:<16} IDLE",
                "PROTO", "DIR", "SOURCE", "DESTINATION", "TRANSLATED", "FLAGS"
            );
            for e in entries {
                println!(
                    "{:<5} {:<7} {:<22} {:<22} {:<22} {:<16} {}s",
                    e.proto,
                    e.dir,
                    e.src,
                    e.dst,
                    e.translated,
                    e.flags.join(","),
                    e.idle_secs
                );
            }
            println!("{} shown, {} in the table", entries.len(), total);
            if let Some(next) = next {
                println!("more: --offset {next}");
            }
        }
        Response::PortmapPage { mappings, next } => {
            print_portmaps(mappings);
            if let Some(next) = next {
                println!("more: --offset {next}");
            }
        }
        Response::Portmaps { mappings } => print_portmaps(mappings),
        Response::Applied { results } => {
            for r in results.iter().filter(|r| r.outcome != "not found") {
                println!("{}/{} {}", resource_of(&r.kind), r.name, r.outcome);
            }
        }
        Response::Objects { items } => print_objects(items),
        Response::Services(list) => print_services(list),
        Response::Bgp(status) => print_bgp(status),
        Response::Policy(list) => print_policy(list),
        Response::Error(e) => println!("error: {e}"),
    }
}

/// The Services, one line per Service port (kubectl-like columns), then
/// the totals and the Service maps' fill.
/// Each pod: the policies selecting it, then per direction its rules (or
/// "not isolated").
fn print_policy(list: &rivet_api::PolicyList) {
    if list.pods.is_empty() {
        eprintln!("No pod with a Kubernetes identity on this node.");
    }
    for pod in &list.pods {
        let by = if pod.policies.is_empty() {
            "no policy".to_owned()
        } else {
            pod.policies.join(", ")
        };
        println!(
            "{}/{} {} selected by: {by}",
            pod.namespace, pod.name, pod.ip
        );
        for (dir, rules) in [("ingress", &pod.ingress), ("egress", &pod.egress)] {
            match rules {
                None => println!("  {dir}: not isolated"),
                Some(rules) if rules.is_empty() => println!("  {dir}: isolated, nothing allowed"),
                Some(rules) => {
                    println!("  {dir}: isolated, allowed:");
                    for r in rules {
                        let side = if dir == "ingress" { "from" } else { "to" };
                        println!(
                            "    {} {side} {} ({})",
                            r.ports.join(", "),
                            r.peers.join(", "),
                            r.from_policies.join(", ")
                        );
                    }
                }
            }
        }
    }
}

fn print_bgp(status: &rivet_api::BgpStatus) {
    let mut rows: Vec<Vec<String>> = vec![
        [
            "PEER",
            "AS",
            "ROLE",
            "STATE",
            "SINCE",
            "RECEIVED",
            "ADVERTISED",
            "CHANGES",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for s in &status.sessions {
        rows.push(vec![
            s.peer.map_or_else(|| s.name.clone(), |p| p.to_string()),
            s.peer_as.map_or_else(|| "-".into(), |a| a.to_string()),
            s.role.clone(),
            match &s.last_error {
                Some(e) if s.state != "Established" => format!("{} ({e})", s.state),
                _ => s.state.clone(),
            },
            s.uptime_secs.map_or_else(|| "-".into(), duration_text),
            s.received.to_string(),
            s.advertised.to_string(),
            s.changes.to_string(),
        ]);
    }
    println!(
        "AS {}  router ID {}{}  speaker {}{}",
        status.asn,
        status.router_id,
        status.cluster_id.map_or_else(String::new, |c| format!(
            "  route reflector (cluster ID {c})"
        )),
        if status.speaker_up {
            "up"
        } else {
            "NOT ANSWERING"
        },
        match status.speaker_restarts {
            0 => String::new(),
            n => format!(" (restarted {n} time(s))"),
        }
    );
    if status.sessions.is_empty() {
        eprintln!("No BGP sessions.");
    } else {
        print_columns(&rows);
    }
    println!(
        "announced {}  learned {} route(s)  suppressed by damping {} ({} so far)",
        status.announced.join(","),
        status.learned,
        status.suppressed,
        status.suppressions
    );
}

/// `3d4h`, `5m12s`, `42s`.
fn duration_text(secs: u64) -> String {
    match secs {
        s if s >= 86_400 => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
        s if s >= 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

fn print_services(list: &rivet_api::ServiceList) {
    use rivet_api::ServiceFrontendKind;
    let mut rows: Vec<Vec<String>> = vec![
        [
            "NAMESPACE",
            "NAME",
            "PORT",
            "FRONTENDS",
            "BACKENDS",
            "SOCKETS",
            "FLOWS",
            "REJECTED",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for p in &list.services {
        let proto = p.protocol.to_string().to_uppercase();
        let port = match (p.port_name.as_str(), p.port) {
            ("", Some(n)) => format!("{n}/{proto}"),
            ("", None) => proto,
            (name, Some(n)) => format!("{name}:{n}/{proto}"),
            (name, None) => format!("{name}/{proto}"),
        };
        // Each address once (its internal and external scopes are one
        // frontend to a person); a NodePort on every node address.
        let mut frontends: Vec<String> = Vec::new();
        for f in &p.frontends {
            let text = match f.kind {
                ServiceFrontendKind::NodePort => format!("*:{}", f.port),
                _ => format!("{}:{}", f.address, f.port),
            };
            if !frontends.contains(&text) {
                frontends.push(text);
            }
        }
        let frontends = match frontends.len() {
            0 => "<none>".to_owned(),
            n if n <= 3 => frontends.join(","),
            n => format!("{} + {} more...", frontends[..3].join(","), n - 3),
        };
        // As kubectl shows endpoints: three, and how many more.
        let backends: Vec<String> = p
            .backends
            .iter()
            .map(|b| format!("{}:{}", b.address, b.port))
            .collect();
        let backends = match backends.len() {
            0 => "<none>".to_owned(),
            n if n <= 3 => backends.join(","),
            n => format!("{} + {} more...", backends[..3].join(","), n - 3),
        };
        rows.push(vec![
            p.namespace.clone(),
            p.name.clone(),
            port,
            frontends,
            backends,
            p.counters.sockets.to_string(),
            p.counters.flows.to_string(),
            p.counters.rejected.to_string(),
        ]);
    }
    if list.services.is_empty() {
        eprintln!("No Services served.");
    } else {
        print_columns(&rows);
    }
    let t = list.totals;
    println!(
        "{} Service port(s)  sockets {}  flows {}  rejected {}  affinity hits {}",
        list.services.len(),
        t.sockets,
        t.flows,
        t.rejected,
        t.affinity_hits
    );
    println!(
        "SVC_FRONTENDS {} of {} entries  SVC_BACKENDS {} of {} entries",
        list.frontend_entries, list.frontend_capacity, list.backend_entries, list.backend_capacity
    );
}

/// hostPort mappings, one a line.
fn print_portmaps(mappings: &[rivet_api::PortmapEntry]) {
    println!(
        "{:<15} {:>6} {:<5} {:<15} {:>6} CONTAINER",
        "HOST-IP", "PORT", "PROTO", "POD-IP", "TO"
    );
    for m in mappings {
        println!(
            "{:<15} {:>6} {:<5} {:<15} {:>6} {}",
            m.host_ip
                .map_or_else(|| "*".to_owned(), |ip| ip.to_string()),
            m.host_port,
            m.protocol,
            m.pod_ip.to_string(),
            m.container_port,
            m.container_id.as_deref().unwrap_or("-")
        );
    }
}

/// kubectl's name of a kind's resource: `service`,
/// `endpointslice.discovery.k8s.io`.
fn resource_of(kind: &str) -> String {
    let group = rivet::objects::Kind::from_name(kind)
        .and_then(|k| k.api_version().split_once('/'))
        .map(|(group, _)| group);
    match group {
        Some(group) => format!("{}.{group}", kind.to_ascii_lowercase()),
        None => kind.to_ascii_lowercase(),
    }
}

/// Rows in columns as wide as their widest cell, three spaces apart.
fn print_columns(rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let w = cell.chars().count();
            match widths.get_mut(i) {
                Some(width) => *width = (*width).max(w),
                None => widths.push(w),
            }
        }
    }
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths.get(i).copied().unwrap_or(0) + 3;
                line.push_str(&format!("{cell:<pad$}"));
            }
        }
        println!("{line}");
    }
}

/// A string field of `v` at the JSON pointer `at`.
fn text<'a>(v: &'a serde_json::Value, at: &str) -> Option<&'a str> {
    v.pointer(at).and_then(serde_json::Value::as_str)
}

/// Stored objects as kubectl's tables show them (all of one kind).
fn print_objects(items: &[serde_json::Value]) {
    let Some(kind) = items.first().and_then(|o| text(o, "/kind")) else {
        eprintln!("No resources found.");
        return;
    };
    let meta = |o: &serde_json::Value| {
        (
            text(o, "/metadata/namespace").unwrap_or("").to_owned(),
            text(o, "/metadata/name").unwrap_or("").to_owned(),
        )
    };
    let mut rows: Vec<Vec<String>> = Vec::new();
    match kind {
        "Service" => {
            rows.push(
                ["NAMESPACE", "NAME", "TYPE", "CLUSTER-IP", "PORT(S)"]
                    .map(String::from)
                    .to_vec(),
            );
            for o in items {
                let (ns, name) = meta(o);
                let ports: Vec<String> = o
                    .pointer("/spec/ports")
                    .and_then(serde_json::Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        let port = p.get("port").map_or_else(String::new, ToString::to_string);
                        let proto = text(p, "/protocol").unwrap_or("TCP");
                        match p.get("nodePort").and_then(serde_json::Value::as_i64) {
                            Some(node) if node != 0 => format!("{port}:{node}/{proto}"),
                            _ => format!("{port}/{proto}"),
                        }
                    })
                    .collect();
                rows.push(vec![
                    ns,
                    name,
                    text(o, "/spec/type").unwrap_or("ClusterIP").to_owned(),
                    text(o, "/spec/clusterIP")
                        .filter(|ip| !ip.is_empty())
                        .unwrap_or("<none>")
                        .to_owned(),
                    if ports.is_empty() {
                        "<none>".to_owned()
                    } else {
                        ports.join(",")
                    },
                ]);
            }
        }
        "EndpointSlice" => {
            rows.push(
                ["NAMESPACE", "NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS"]
                    .map(String::from)
                    .to_vec(),
            );
            for o in items {
                let (ns, name) = meta(o);
                let ports: Vec<String> = o
                    .pointer("/ports")
                    .and_then(serde_json::Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p.get("port").map(ToString::to_string))
                    .collect();
                let addresses: Vec<&str> = o
                    .pointer("/endpoints")
                    .and_then(serde_json::Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.get("addresses").and_then(serde_json::Value::as_array))
                    .flatten()
                    .filter_map(serde_json::Value::as_str)
                    .collect();
                // kubectl shows three addresses and counts the others.
                let endpoints = match addresses.len() {
                    0 => "<unset>".to_owned(),
                    n if n <= 3 => addresses.join(","),
                    n => format!("{} + {} more...", addresses[..3].join(","), n - 3),
                };
                rows.push(vec![
                    ns,
                    name,
                    text(o, "/addressType").unwrap_or("").to_owned(),
                    if ports.is_empty() {
                        "<unset>".to_owned()
                    } else {
                        ports.join(",")
                    },
                    endpoints,
                ]);
            }
        }
        "Namespace" => {
            rows.push(vec!["NAME".to_owned()]);
            rows.extend(items.iter().map(|o| vec![meta(o).1]));
        }
        _ => {
            rows.push(vec!["NAMESPACE".to_owned(), "NAME".to_owned()]);
            rows.extend(items.iter().map(|o| {
                let (ns, name) = meta(o);
                vec![ns, name]
            }));
        }
    }
    print_columns(&rows);
}

/// Bits with an SI suffix when it is exact (`10M`, `1500`).
fn si_bits(bits: u64) -> String {
    match bits {
        b if b >= 1_000_000_000 && b % 1_000_000_000 == 0 => format!("{}G", b / 1_000_000_000),
        b if b >= 1_000_000 && b % 1_000_000 == 0 => format!("{}M", b / 1_000_000),
        b if b >= 1_000 && b % 1_000 == 0 => format!("{}k", b / 1_000),
        b => b.to_string(),
    }
}

/// A pod's limits as `in 10M/1M out 5M/500k` (rate/burst), `-` for none.
fn bandwidth_text(bw: Option<&rivet_api::Bandwidth>) -> String {
    let si = si_bits;
    let Some(bw) = bw.filter(|b| b.limits_any()) else {
        return "-".to_owned();
    };
    let mut parts = Vec::new();
    for (dir, rate, burst) in [
        ("in", bw.ingress_rate, bw.ingress_burst),
        ("out", bw.egress_rate, bw.egress_burst),
    ] {
        if let Some(rate) = rate.filter(|r| *r != 0) {
            parts.push(format!("{dir} {}/{}", si(rate), si(burst.unwrap_or(0))));
        }
    }
    parts.join(" ")
}
