//! The agent's socket protocol: the bytes a client sends become a
//! `Request` through `rivet::server::decode_request` (what the agent runs on
//! every connection), and the bytes the agent answers become a `Response`
//! or a monitor event line in `rivet-api`'s client (what `rivet-cni` and
//! `rivetctl` run).
//!
//! Invariants: no panic; a refused request is a `bad_request` error; an
//! accepted request re-encodes to bytes that decode to the same request
//! (what the agent acts on is what the bytes said, whatever their
//! spelling); responses and events that decode re-encode.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rivet_api::{ErrorKind, MonitorEvent, Response};

fuzz_target!(|data: &[u8]| {
    match rivet::server::decode_request(data) {
        Ok(request) => {
            let again = serde_json::to_vec(&request)
                .unwrap_or_else(|e| panic!("re-encoding {request:?}: {e}"));
            match rivet::server::decode_request(&again) {
                Ok(decoded) => assert_eq!(decoded, request),
                Err(e) => panic!("{request:?} re-encoded does not decode: {e}"),
            }
        }
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::BadRequest);
            assert!(e.message.starts_with("invalid request: "));
        }
    }

    if let Ok(response) = serde_json::from_slice::<Response>(data) {
        let again = serde_json::to_vec(&response)
            .unwrap_or_else(|e| panic!("re-encoding {response:?}: {e}"));
        assert!(serde_json::from_slice::<Response>(&again).is_ok());
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(event) = serde_json::from_str::<MonitorEvent>(text)
    {
        let again =
            serde_json::to_string(&event).unwrap_or_else(|e| panic!("re-encoding {event:?}: {e}"));
        assert!(serde_json::from_str::<MonitorEvent>(&again).is_ok());
    }
});
