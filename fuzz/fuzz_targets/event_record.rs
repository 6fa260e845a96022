//! Datapath events: ring-buffer records (bytes the BPF programs write, in
//! the `rivet-common` ABI) → `Event` → the `MonitorEvent` the agent
//! streams → the line `rivetctl monitor` decodes.
//!
//! Invariants: no panic; records shorter than an `Event` are skipped; a
//! record's fields are its bytes at the ABI's offsets; the reason names
//! the counter (or `counter_<n>` for an index this build does not know);
//! the JSON line decodes back to the same event.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rivet_api::MonitorEvent;
use rivet_common::{Counter, Event, event_kind};

fn ne16(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn ne32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fuzz_target!(|data: &[u8]| {
    let Some(ev) = rivet::events::parse_record(data) else {
        assert!(data.len() < size_of::<Event>());
        return;
    };
    assert_eq!(
        size_of::<Event>(),
        24,
        "the ABI changed: update this target"
    );
    assert_eq!(
        (ev.kind, ev.proto, ev.counter, ev.ifindex),
        (data[0], data[1], ne16(data, 2), ne32(data, 4))
    );
    assert_eq!(
        (ev.src, ev.dst, ev.sport, ev.dport, ev.len),
        (
            ne32(data, 8),
            ne32(data, 12),
            ne16(data, 16),
            ne16(data, 18),
            ne32(data, 20)
        )
    );

    let decoded = rivet::events::decode(&ev);
    match ev.kind {
        event_kind::POLICY => {
            // A NetworkPolicy verdict: the direction in the counter field,
            // the policy number where a packet's length would be.
            assert_eq!(decoded.kind, "policy");
            let dir = if ev.counter == u16::from(rivet_common::policy_dir::INGRESS) {
                "allow_ingress"
            } else {
                "allow_egress"
            };
            assert_eq!(decoded.reason, dir);
            assert_eq!((decoded.ifindex, decoded.len), (ev.ifindex, 0));
        }
        kind => {
            assert_eq!(
                decoded.kind,
                if kind == event_kind::DROP {
                    "drop"
                } else {
                    "flow"
                }
            );
            match Counter::from_index(u32::from(ev.counter)) {
                Some(c) => {
                    assert_eq!(c.index(), u32::from(ev.counter));
                    assert!(c.name().ends_with(decoded.reason.as_str()));
                }
                None => assert_eq!(decoded.reason, format!("counter_{}", ev.counter)),
            }
            assert_eq!((decoded.ifindex, decoded.len), (ev.ifindex, ev.len));
        }
    }
    if matches!(ev.proto, 6 | 17) {
        assert!(
            decoded
                .src
                .ends_with(&format!(":{}", u16::from_be(ev.sport)))
        );
    }

    // The line the agent writes and the client reads.
    let line = serde_json::to_string(&decoded).unwrap_or_else(|e| panic!("encoding: {e}"));
    assert!(!line.contains('\n'));
    match serde_json::from_str::<MonitorEvent>(&line) {
        Ok(mut back) => {
            back.time = decoded.time;
            assert_eq!(back, decoded);
        }
        Err(e) => panic!("the client cannot read {line}: {e}"),
    }
});
