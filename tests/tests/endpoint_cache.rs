//! The endpoint cache (`ENDPOINT_SLOTS`) as the agent keeps it: written
//! after the `ENDPOINTS` entry, cleared before the entry goes, a colliding
//! address left to the hash, and rebuilt from `ENDPOINTS` at start
//! (`Datapath::sync_endpoint_slots`). Runs the agent's own datapath code on
//! a private copy of the object pinned under its own directory.

use std::{net::Ipv4Addr, path::PathBuf};

use aya::maps::{HashMap, MapData};
use rivet::{datapath::Datapath, pins::PinLayout};
use rivet_common::{EndpointInfo, EndpointKey, EndpointSlot, endpoint_flags, ipv4_key};
use rivet_tests::unique_prefix;

/// Removes the private pins, also when the test fails.
struct Unload(PinLayout);

impl Drop for Unload {
    fn drop(&mut self) {
        if let Err(e) = rivet::datapath::unload(&self.0) {
            eprintln!("warning: removing {}: {e}", self.0.root().display());
        }
    }
}

fn info(n: u8) -> EndpointInfo {
    EndpointInfo {
        ifindex: 100 + u32::from(n),
        flags: endpoint_flags::READY,
        mac: [2, 0, 0, 0, 0xa, n],
        host_mac: [2, 0, 0, 0, 0xb, n],
    }
}

fn holds(dp: &Datapath, ip: Ipv4Addr) -> Option<(Ipv4Addr, EndpointInfo)> {
    let slot: EndpointSlot = dp.endpoint_slot(ip).expect("reading the slot");
    (slot.addr != 0).then(|| (Ipv4Addr::from(slot.addr.to_ne_bytes()), slot.info))
}

#[test]
fn agent_keeps_the_endpoint_cache_in_step_with_the_endpoints_map() {
    let layout = PinLayout::new(
        PathBuf::from("/sys/fs/bpf/rivet").join(format!("{}-slots", unique_prefix())),
    );
    let _unload = Unload(layout.clone());
    let mut dp = Datapath::load(&layout).expect("loading a private datapath");
    let a = Ipv4Addr::new(10, 9, 1, 2);
    // Same low 14 bits as `a`: the same slot.
    let c = Ipv4Addr::new(10, 77, 1, 2);
    assert_eq!(
        rivet_common::endpoint_slot(ipv4_key(a.octets())),
        rivet_common::endpoint_slot(ipv4_key(c.octets()))
    );

    dp.put_endpoint(a, info(1)).expect("put a");
    assert_eq!(
        holds(&dp, a),
        Some((a, info(1))),
        "slot written with the entry"
    );
    dp.put_endpoint(c, info(2)).expect("put c");
    assert_eq!(
        holds(&dp, c),
        Some((a, info(1))),
        "a colliding address keeps out"
    );
    assert_eq!(
        dp.endpoint(c).expect("lookup"),
        Some(info(2)),
        "c in the hash"
    );
    dp.put_endpoint(a, info(3)).expect("update a");
    assert_eq!(
        holds(&dp, a),
        Some((a, info(3))),
        "an update refreshes the slot"
    );

    assert!(dp.remove_endpoint(a).expect("remove a"));
    assert_eq!(holds(&dp, a), None, "slot cleared with the entry");
    assert_eq!(dp.sync_endpoint_slots().expect("sync"), 1);
    assert_eq!(
        holds(&dp, c),
        Some((c, info(2))),
        "sync gives the slot to c"
    );
    assert_eq!(
        dp.sync_endpoint_slots().expect("sync"),
        0,
        "nothing left to do"
    );

    // An entry removed behind the agent's back (no agent running, or an
    // older agent without the cache): the start-up sync empties its slot.
    endpoints(&layout)
        .remove(&EndpointKey {
            addr: ipv4_key(c.octets()),
        })
        .expect("remove c by hand");
    assert_eq!(dp.sync_endpoint_slots().expect("sync"), 1);
    assert_eq!(holds(&dp, c), None, "a slot without its entry is emptied");

    // The slots survive a restart (pinned).
    dp.put_endpoint(a, info(4)).expect("put a");
    drop(dp);
    let mut dp = Datapath::load(&layout).expect("reloading");
    assert_eq!(
        holds(&dp, a),
        Some((a, info(4))),
        "the pinned slot survives"
    );
    assert_eq!(dp.sync_endpoint_slots().expect("sync"), 0);

    // An entry without a slot (an upgrade from an agent without the cache,
    // or a crash between the two writes): the sync writes its slot.
    let d = Ipv4Addr::new(10, 9, 1, 5);
    endpoints(&layout)
        .insert(
            EndpointKey {
                addr: ipv4_key(d.octets()),
            },
            info(5),
            0,
        )
        .expect("insert d by hand");
    assert_eq!(holds(&dp, d), None);
    assert_eq!(dp.sync_endpoint_slots().expect("sync"), 1);
    assert_eq!(holds(&dp, d), Some((d, info(5))), "the sync fills the slot");
}

/// The pinned `ENDPOINTS`, opened behind the datapath's back.
fn endpoints(layout: &PinLayout) -> HashMap<MapData, EndpointKey, EndpointInfo> {
    HashMap::try_from(aya::maps::Map::HashMap(
        MapData::from_pin(layout.map(rivet_common::map_names::ENDPOINTS))
            .expect("pinned ENDPOINTS"),
    ))
    .expect("hash")
}
