//! The agent's persisted state as it is read at start: endpoint records
//! (the leases, `<state_dir>/endpoints/*.json`, `RecordDir::load_all`) and
//! the IPAM round-robin hint (`ipam-last.json`, `Ipam::open`), from
//! arbitrary file contents — corrupted, truncated, padded, huge — then
//! rewritten the way the agent rewrites them.
//!
//! Input: files, each `#FILE <name>` + newline + content (see
//! `split_files`); `ipam-last.json` goes to the state directory, every
//! other name to `endpoints/`.
//!
//! Invariants: no panic; every `*.json` record is either loaded (exactly
//! what it parses to) or reported as unreadable, never both, never lost;
//! interrupted temporary files are removed; a record rewritten in place
//! over any old content reads back as written; an allocation works with
//! any hint, and the hint it writes survives a restart (round-robin goes on
//! after the address handed out last).

#![no_main]

use std::{collections::BTreeMap, net::Ipv4Addr};

use libfuzzer_sys::fuzz_target;
use rivet::{
    ipam::{Ipam, RangeSet},
    store::RecordDir,
};
use rivet_api::{Endpoint, EndpointState};

const MAX_FILES: usize = 16;
const MAX_REWRITES: usize = 4;

fn expect<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

fuzz_target!(|data: &[u8]| {
    let state = rivet_fuzz::scratch_dir("state");
    let dir = state.join("endpoints");
    let store = expect(RecordDir::open(&dir), "opening the record directory");

    // Write the files (a later file of the same name replaces an earlier).
    let mut files: BTreeMap<String, &[u8]> = BTreeMap::new();
    let mut hint: Option<&[u8]> = None;
    for f in rivet_fuzz::split_files(data).into_iter().take(MAX_FILES) {
        if f.name == "ipam-last.json" {
            expect(std::fs::write(state.join(&f.name), f.content), "hint");
            hint = Some(f.content);
        } else {
            expect(std::fs::write(dir.join(&f.name), f.content), "record");
            files.insert(f.name, f.content);
        }
    }

    // Load the records as the agent does at start.
    let (good, bad) = expect(store.load_all::<Endpoint>(), "loading the records");
    let mut want_good = Vec::new();
    let mut want_bad = Vec::new();
    for (name, content) in &files {
        if name.starts_with('.') && name.ends_with(".tmp") {
            assert!(!dir.join(name).exists(), "temporary file {name} left");
            continue;
        }
        let Some(key) = name.strip_suffix(".json") else {
            continue;
        };
        match serde_json::from_slice::<Endpoint>(content) {
            Ok(ep) => want_good.push((key.to_owned(), ep)),
            Err(_) => want_bad.push(dir.join(name)),
        }
    }
    want_good.sort_by(|a, b| a.0.cmp(&b.0));
    let mut bad_sorted = bad.clone();
    bad_sorted.sort();
    want_bad.sort();
    assert_eq!(good, want_good);
    assert_eq!(bad_sorted, want_bad);

    // Rewrite records in place, as ADD turns a pending record ready (good
    // ones) or as a new ADD replaces a garbled one (bad ones).
    let mut rewritten = Vec::new();
    for (key, ep) in &good {
        let mut next = ep.clone();
        next.state = match ep.state {
            EndpointState::Pending => EndpointState::Ready,
            EndpointState::Ready => EndpointState::Pending,
        };
        rewritten.push((key.clone(), next));
    }
    for path in &bad {
        let key = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
            .unwrap_or_default()
            .to_owned();
        let ep = rivet_fuzz::endpoint("c1", "eth0", Ipv4Addr::new(10, 244, 1, 9));
        rewritten.push((key, ep));
    }
    rewritten.truncate(MAX_REWRITES);
    for (key, ep) in &rewritten {
        expect(store.rewrite_volatile(key, ep), "rewriting a record");
    }
    if !rewritten.is_empty() {
        let (again, _) = expect(store.load_all::<Endpoint>(), "reloading the records");
        for (key, ep) in &rewritten {
            let found = again.iter().find(|(k, _)| k == key).map(|(_, e)| e);
            assert_eq!(found, Some(ep), "record {key:?} after an in-place rewrite");
        }
    }

    // The IPAM hint: any content is at worst "no hint".
    let cidr: ipnet::Ipv4Net = expect("10.244.1.0/24".parse(), "pod CIDR");
    let set = expect(RangeSet::for_request(&[], cidr), "range set");
    let taken: Vec<Ipv4Addr> = good.iter().map(|(_, e)| e.ip).collect();
    let mut ipam = Ipam::open(&state, cidr);
    let first = match ipam.allocate(&set, |ip| taken.contains(&ip).then(String::new)) {
        Ok(ip) => ip,
        Err(e) => panic!("allocating with hint {hint:?}: {e}"),
    };
    assert!(set.contains(first) && !taken.contains(&first));
    // The hint just written reads back after a restart.
    let mut ipam = Ipam::open(&state, cidr);
    let second = expect(ipam.allocate(&set, |_| None), "allocating after a restart");
    let next = if first == Ipv4Addr::new(10, 244, 1, 254) {
        Ipv4Addr::new(10, 244, 1, 1)
    } else {
        Ipv4Addr::from(u32::from(first) + 1)
    };
    assert_eq!(second, next, "round-robin position lost (hint {hint:?})");
});
