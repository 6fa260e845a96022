//! rivet-cni: the CNI plugin named by `"type": "rivet-cni"` in a conflist.
//!
//! This first version answers VERSION; ADD/DEL/CHECK/STATUS/GC arrive with
//! the CNI issue as a thin client of rivetd (crate `rivet-api`). Every other
//! command gets a spec error on stdout and exit status 1.

use std::{io::Write as _, process::ExitCode};

/// CNI spec versions this plugin speaks.
const SUPPORTED_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
const CURRENT_VERSION: &str = "1.1.0";

fn print_json(value: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
}

fn error(code: u32, msg: &str, details: &str) -> ExitCode {
    print_json(&serde_json::json!({
        "cniVersion": CURRENT_VERSION,
        "code": code,
        "msg": msg,
        "details": details,
    }));
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    match std::env::var("CNI_COMMAND").as_deref() {
        Ok("VERSION") => {
            print_json(&serde_json::json!({
                "cniVersion": CURRENT_VERSION,
                "supportedVersions": SUPPORTED_VERSIONS,
            }));
            ExitCode::SUCCESS
        }
        Ok(cmd @ ("ADD" | "DEL" | "CHECK" | "STATUS" | "GC")) => error(
            50,
            "plugin not available",
            &format!("CNI_COMMAND {cmd} is not implemented by this rivet-cni build"),
        ),
        Ok(other) => error(
            4,
            "invalid CNI_COMMAND",
            &format!("unknown CNI_COMMAND {other:?}"),
        ),
        Err(_) => {
            eprintln!(
                "rivet-cni: a CNI plugin; run by a container runtime with CNI_COMMAND set. \
                 CNI protocol versions supported: {}",
                SUPPORTED_VERSIONS.join(", ")
            );
            error(4, "required env variables [CNI_COMMAND] missing", "")
        }
    }
}
