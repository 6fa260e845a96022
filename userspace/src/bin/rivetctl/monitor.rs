//! `monitor` (datapath events as they come) and `stats --watch` (counter
//! rates).

use rivet_api::{Client, Request, Response};

use crate::cli::Output;

/// `monitor`: events, one per line (or one JSON object per line), until
/// `count` of them were shown.
pub fn monitor(
    client: &Client,
    output: Output,
    flows: bool,
    sample: Option<u32>,
    reason: Option<&str>,
    count: Option<u64>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut shown = 0;
    for event in client.monitor(flows, sample)? {
        let e = event?;
        if e.kind == "tick" || reason.is_some_and(|r| r != e.reason) {
            continue;
        }
        match output {
            Output::Json => println!("{}", serde_json::to_string(&e)?),
            Output::Table => println!("{}", monitor_line(&e)),
        }
        shown += 1;
        if count.is_some_and(|c| shown >= c) {
            break;
        }
    }
    Ok(())
}

/// One event as a line: time (UTC), kind, reason, interface, 5-tuple.
fn monitor_line(e: &rivet_api::MonitorEvent) -> String {
    let ms = (e.time * 1000.0) as u64 % 86_400_000;
    let when = format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    );
    let iface = format!("{}({})", e.ifname.as_deref().unwrap_or("?"), e.ifindex);
    let what = if e.proto.is_empty() {
        "non-IPv4".to_owned()
    } else {
        format!(
            "{} {} -> {}{}",
            e.proto,
            e.src,
            e.dst,
            e.icmp
                .as_ref()
                .map_or_else(String::new, |t| format!(" type/code {t}"))
        )
    };
    let service = e
        .service
        .as_ref()
        .map_or_else(String::new, |s| format!("  service {s}"));
    // NetworkPolicy verdicts: the pod judged and the policy that allowed
    // (a policy drop: nothing allowed).
    let verdict = match (&e.pod, &e.policy, e.kind.as_str()) {
        (pod, Some(policy), _) => format!(
            "  pod {}  allowed by {policy}",
            pod.as_deref().unwrap_or("?")
        ),
        (Some(pod), None, "policy") => format!("  pod {pod}  allowed (its own node)"),
        (Some(pod), None, _) => format!("  pod {pod}  no policy allows"),
        (None, None, _) => String::new(),
    };
    let lost = if e.lost > 0 {
        format!("  ({} earlier events lost)", e.lost)
    } else {
        String::new()
    };
    // A policy verdict is about a flow, not a packet: no length.
    let len = if e.kind == "policy" {
        String::new()
    } else {
        format!(" len {}", e.len)
    };
    format!(
        "{when} {:<4} {:<22} {:<22} {what}{len}{service}{verdict}{lost}",
        e.kind.to_uppercase(),
        e.reason,
        iface,
    )
}

/// `stats --watch`: per-second rates of every counter that moved.
pub fn watch_stats(
    client: &Client,
    secs: u64,
    count: Option<u64>,
    all: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let read = || -> Result<Vec<rivet_api::CounterValue>, Box<dyn std::error::Error>> {
        match client.call(&Request::Stats {})? {
            Response::Stats { counters, .. } => Ok(counters),
            other => Err(format!("unexpected answer: {other:?}").into()),
        }
    };
    let interval = std::time::Duration::from_secs(secs.max(1));
    let mut before = read()?;
    let mut at = std::time::Instant::now();
    let mut n = 0;
    while count.is_none_or(|c| n < c) {
        std::thread::sleep(interval);
        let now = read()?;
        let dt = at.elapsed().as_secs_f64();
        at = std::time::Instant::now();
        n += 1;
        println!(
            "{:<24} {:>12} {:>14} {:>14}",
            "COUNTER", "PACKETS/S", "BYTES/S", "PACKETS"
        );
        for (b, c) in before.iter().zip(&now) {
            let dp = c.packets.saturating_sub(b.packets);
            if dp == 0 && !all {
                continue;
            }
            println!(
                "{:<24} {:>12.1} {:>14.1} {:>14}",
                c.name,
                dp as f64 / dt,
                c.bytes.saturating_sub(b.bytes) as f64 / dt,
                c.packets
            );
        }
        println!();
        before = now;
    }
    Ok(())
}
