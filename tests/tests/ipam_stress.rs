//! IPAM under load and under crashes: concurrent ADDs through the real CNI
//! binary never hand out an address twice, DELs leave nothing, and a
//! SIGKILLed agent reclaims interrupted ADDs at start-up.

use std::{
    collections::HashSet,
    net::Ipv4Addr,
    sync::{Arc, Mutex},
    time::Duration,
};

use rivet_tests::{
    Netns, World,
    cni::{Plugin, rivet_conf},
    traffic::assert_ping,
};
use serde_json::Value;

/// Runs `f(i)` for `0..n` on `threads` threads; returns the results in order.
fn parallel<T: Send + 'static>(
    n: usize,
    threads: usize,
    f: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let next = Arc::new(Mutex::new(0usize));
    let out: Arc<Mutex<Vec<Option<T>>>> = Arc::new(Mutex::new((0..n).map(|_| None).collect()));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (f, next, out) = (Arc::clone(&f), Arc::clone(&next), Arc::clone(&out));
            std::thread::spawn(move || {
                loop {
                    let i = {
                        let mut g = next.lock().expect("lock");
                        let i = *g;
                        *g += 1;
                        i
                    };
                    if i >= n {
                        break;
                    }
                    let r = f(i);
                    out.lock().expect("lock")[i] = Some(r);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker");
    }
    Arc::try_unwrap(out)
        .ok()
        .expect("sole owner")
        .into_inner()
        .expect("lock")
        .into_iter()
        .map(|r| r.expect("every index ran"))
        .collect()
}

fn ip_of(v: &Value) -> Option<Ipv4Addr> {
    v["ips"][0]["address"]
        .as_str()?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// 200 concurrent ADDs into a /24, then 200 concurrent DELs.
#[test]
fn concurrent_adds_never_duplicate_and_dels_leave_nothing() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let plugin = Arc::new(Plugin::rivet(&w.nodes[n].ns.path()));
    let conf = Arc::new(rivet_conf("1.0.0", w.nodes[n].agent().socket()));
    let spaces: Arc<Vec<Netns>> = Arc::new(
        (0..200)
            .map(|i| Netns::new(format!("{}-s{i}", w.prefix)))
            .collect(),
    );

    let results = {
        let (plugin, conf, spaces) = (Arc::clone(&plugin), Arc::clone(&conf), Arc::clone(&spaces));
        parallel(200, 8, move |i| {
            plugin.add(&format!("s{i}"), &spaces[i].path(), &conf)
        })
    };
    let mut ips = HashSet::new();
    for (i, r) in results.iter().enumerate() {
        assert!(r.ok, "ADD s{i}: {} {}", r.stdout, r.stderr);
        let ip = ip_of(&r.json).expect("address");
        assert!(ips.insert(ip), "duplicate address {ip}");
    }
    let node = &w.nodes[n];
    assert_eq!(node.records().len(), 200);
    assert_eq!(node.veths().len(), 200);
    assert_eq!(node.map_entries().into_iter().collect::<HashSet<_>>(), ips);
    for i in [0, 99, 199] {
        assert_ping(&spaces[i], node.ip, 1);
    }

    let dels = {
        let (plugin, conf, spaces) = (Arc::clone(&plugin), Arc::clone(&conf), Arc::clone(&spaces));
        parallel(200, 8, move |i| {
            plugin.del(&format!("s{i}"), Some(&spaces[i].path()), &conf)
        })
    };
    for (i, r) in dels.iter().enumerate() {
        assert!(r.ok, "DEL s{i}: {} {}", r.stdout, r.stderr);
    }
    w.nodes[n].assert_no_pod_state("after 200 concurrent DELs");
}

/// SIGKILL the agent in the middle of an ADD storm. After the
/// restart: no pending lease, no duplicate, records == veths == map entries;
/// the runtime's DELs for the failed ADDs succeed and everything can be
/// removed.
#[test]
fn agent_killed_during_add_storm_reclaims_pending_leases() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let plugin = Arc::new(Plugin::rivet(&w.nodes[n].ns.path()));
    let conf = Arc::new(rivet_conf("1.0.0", w.nodes[n].agent().socket()));
    let spaces: Arc<Vec<Netns>> = Arc::new(
        (0..80)
            .map(|i| Netns::new(format!("{}-k{i}", w.prefix)))
            .collect(),
    );

    // The kill lands once a few ADDs have succeeded (not after a fixed
    // time: a busy machine may not have finished one by then).
    let succeeded = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let storm = {
        let (plugin, conf, spaces) = (Arc::clone(&plugin), Arc::clone(&conf), Arc::clone(&spaces));
        let succeeded = Arc::clone(&succeeded);
        std::thread::spawn(move || {
            parallel(80, 8, move |i| {
                let r = plugin.add(&format!("k{i}"), &spaces[i].path(), &conf);
                if r.ok {
                    succeeded.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                r
            })
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while succeeded.load(std::sync::atomic::Ordering::SeqCst) < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "no ADD succeeded within 60 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    w.nodes[n]
        .agent_mut()
        .stop_with(nix::sys::signal::Signal::SIGKILL);
    let results = storm.join().expect("storm");
    let ok: Vec<usize> = (0..80).filter(|&i| results[i].ok).collect();
    let failed: Vec<usize> = (0..80).filter(|&i| !results[i].ok).collect();
    assert!(
        !ok.is_empty() && !failed.is_empty(),
        "the kill should land mid-storm: {} ok, {} failed",
        ok.len(),
        failed.len()
    );
    for &i in &failed {
        assert_eq!(
            results[i].code(),
            Some(11),
            "failed ADD k{i} is 'try again later': {}",
            results[i].stdout
        );
    }

    w.nodes[n].agent_mut().restart();
    let node = &w.nodes[n];
    let host_of = |i: usize| rivet_api::host_ifname(&format!("k{i}"), "eth0");
    let records: HashSet<String> = node
        .records()
        .into_iter()
        .map(|r| r.trim_end_matches(".json").to_owned())
        .collect();
    let ok_hosts: HashSet<String> = ok.iter().map(|&i| host_of(i)).collect();
    let failed_hosts: HashSet<String> = failed.iter().map(|&i| host_of(i)).collect();
    // Every answered ADD kept its lease; pending leases are gone. An ADD the
    // agent finished but could not answer before the kill is kept too (its
    // veth is live and ready): the runtime saw it fail and DELs it below.
    assert!(
        ok_hosts.is_subset(&records),
        "answered ADDs lost their lease: {:?}",
        ok_hosts.difference(&records).collect::<Vec<_>>()
    );
    let unanswered: Vec<&String> = records.difference(&ok_hosts).collect();
    assert!(
        unanswered.iter().all(|h| failed_hosts.contains(*h)) && unanswered.len() <= 8,
        "records after restart beyond the answered ADDs: {unanswered:?} (at most the 8 in flight)"
    );
    let veths: HashSet<String> = node.veths().into_iter().collect();
    assert_eq!(veths, records, "veths == records after restart");
    let map_list = node.map_entries();
    let map: HashSet<Ipv4Addr> = map_list.iter().copied().collect();
    assert_eq!(map.len(), map_list.len(), "duplicate map entries");
    assert_eq!(
        map.len(),
        records.len(),
        "map entries == records after restart"
    );
    let ips: HashSet<Ipv4Addr> = ok
        .iter()
        .map(|&i| ip_of(&results[i].json).expect("ip"))
        .collect();
    assert_eq!(
        ips.len(),
        ok.len(),
        "duplicate addresses among successful ADDs"
    );
    assert!(ips.is_subset(&map), "answered addresses in the map");
    for &i in ok.iter().take(3) {
        assert_ping(&spaces[i], node.ip, 1);
    }

    // The runtime DELs the failed ADDs, then everything.
    for &i in &failed {
        assert!(
            plugin
                .del(&format!("k{i}"), Some(&spaces[i].path()), &conf)
                .ok
        );
    }
    let left: HashSet<String> = node
        .records()
        .into_iter()
        .map(|r| r.trim_end_matches(".json").to_owned())
        .collect();
    assert_eq!(
        left, ok_hosts,
        "after the runtime's DELs of the failed ADDs"
    );
    for i in 0..80 {
        assert!(
            plugin
                .del(&format!("k{i}"), Some(&spaces[i].path()), &conf)
                .ok
        );
    }
    node.assert_no_pod_state("after DEL of the storm");
}
