//! The CNI plugin's decoding of one invocation: environment (`CNI_COMMAND`,
//! `CNI_CONTAINERID`, `CNI_IFNAME`, `CNI_ARGS`, ...) and the configuration
//! on stdin, then everything each verb derives from them before it talks
//! to the agent (ADD inputs, the agent's IPAM ranges, prevResult, the GC
//! list, the ADD result built on a previous one).
//!
//! Input: `KEY=VALUE` lines, an empty line, then stdin (see `split_env`).
//! Invariants: no panic; every failure is a CNI error with the code the
//! spec gives its kind (4 environment, 1 version, 6 decode, 7 config) and
//! an error document in a version the plugin speaks.

#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use rivet_cni::{
    conf::NetConf,
    result,
    skel::{self, CniError, Command, code},
};

fn check_error_doc(e: &CniError, stdin: &[u8], codes: &[u32]) {
    assert!(codes.contains(&e.code), "unexpected code for {e}");
    let doc = rivet_cni::error_json(e, stdin);
    assert_eq!(doc["code"], e.code);
    let version = doc["cniVersion"].as_str().unwrap_or_default();
    // The version comes from the config when it has one (even an unknown
    // one: the runtime reads errors in the version it asked for).
    assert!(
        NetConf::version_of(stdin).as_deref() == Some(version) || version == skel::CURRENT_VERSION,
        "error document in version {version:?}"
    );
    assert!(serde_json::to_string(&doc).is_ok());
}

fuzz_target!(|data: &[u8]| {
    let (env, stdin) = rivet_fuzz::split_env(data);
    let env: HashMap<String, String> = env.into_iter().collect();
    let get = |k: &str| env.get(k).cloned();

    let args = match skel::parse_env(&get) {
        Ok(args) => args,
        Err(e) => return check_error_doc(&e, stdin, &[code::INVALID_ENV]),
    };
    if args.command == Command::Version {
        assert_eq!(skel::version_json()["cniVersion"], skel::CURRENT_VERSION);
        return;
    }
    if matches!(args.command, Command::Add | Command::Del | Command::Check) {
        assert!(skel::valid_id(&args.container_id));
        assert!(skel::ifname_problem(&args.ifname).is_none());
    }

    let conf = match rivet_cni::decode_config(&args, stdin) {
        Ok(conf) => conf,
        Err(e) => {
            return check_error_doc(
                &e,
                stdin,
                &[
                    code::INCOMPATIBLE_VERSION,
                    code::DECODE,
                    code::INVALID_CONFIG,
                ],
            );
        }
    };
    assert!(skel::SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()));
    assert!(skel::valid_id(&conf.name));
    let _ = conf.socket();
    if let Some(name) = conf.delegated_ipam() {
        // A delegated plugin is looked up by name in CNI_PATH: never a path.
        assert!(!name.is_empty() && !name.contains('/'));
    }

    match args.command {
        Command::Add => {
            let inputs = match rivet_cni::add_inputs(&args, &conf) {
                Ok(inputs) => inputs,
                Err(e) => {
                    return check_error_doc(&e, stdin, &[code::INVALID_ENV, code::INVALID_CONFIG]);
                }
            };
            assert!(
                inputs
                    .port_mappings
                    .iter()
                    .all(|p| p.host_port != 0 && p.container_port != 0)
            );
            // What the agent does with the ranges the plugin forwards.
            let ranges = conf.ranges();
            assert!(ranges.iter().all(|r| !r.subnet.contains(':')));
            let pod_cidr: ipnet::Ipv4Net = "10.244.1.0/24"
                .parse()
                .unwrap_or_else(|e| panic!("pod CIDR: {e}"));
            if let Ok(set) = rivet::ipam::RangeSet::for_request(&ranges, pod_cidr) {
                assert!(set.size() <= 254);
                for r in &set.0 {
                    assert!(pod_cidr.contains(&r.subnet) && r.start <= r.end);
                }
            }
            let ep = rivet_fuzz::endpoint(
                &args.container_id,
                &args.ifname,
                inputs
                    .requested
                    .unwrap_or(std::net::Ipv4Addr::new(10, 244, 1, 2)),
            );
            let res = result::add_result(
                &conf.cni_version,
                &ep,
                &inputs.routes,
                conf.dns.as_ref(),
                conf.prev_result.as_ref(),
            );
            // CHECK finds an address in every ADD result; ours when no
            // previous plugin's result is merged in.
            let found = result::ip_of(&res, &args.ifname);
            assert!(found.is_some());
            if conf.prev_result.is_none() {
                assert_eq!(found, Some(ep.ip));
            }
            assert!(serde_json::to_string(&res).is_ok());
        }
        Command::Check | Command::Del => {
            if let Some(prev) = &conf.prev_result {
                let _ = result::ip_of(prev, &args.ifname);
                let _ = result::ipam_address(prev);
            }
        }
        Command::Gc => {
            let keep = conf.gc_keep();
            let listed = conf.valid_attachments.as_ref().map_or(0, Vec::len)
                + conf.attachments.as_ref().map_or(0, Vec::len);
            assert_eq!(keep.len(), listed);
        }
        Command::Status | Command::Version => {}
    }
});
