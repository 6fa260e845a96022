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
                "{:<15} {:<24} {:<6} {:<15} {:>7} {:<17} MTU",
                "IP", "CONTAINER", "IFNAME", "HOST-IF", "IFINDEX", "MAC"
            );
            for ep in endpoints {
                println!(
                    "{:<15} {:<24} {:<6} {:<15} {:>7} {:<17} {}",
                    ep.ip.to_string(),
                    ep.container_id,
                    ep.ifname,
                    ep.host_ifname,
                    ep.host_ifindex,
                    ep.mac,
                    ep.mtu
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
        Response::Stats { counters } => {
            println!("{:<24} {:>14} {:>16}", "COUNTER", "PACKETS", "BYTES");
            for c in counters.iter().filter(|c| show_all || c.packets > 0) {
                println!("{:<24} {:>14} {:>16}", c.name, c.packets, c.bytes);
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
                    "  {:<10} {:>8} of {:>8} entries  {:>7.1} MiB  refused when full: {}",
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
        Response::Error(e) => println!("error: {e}"),
    }
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
