//! Running another IPAM plugin through the standard delegation protocol:
//! the same environment (with our verb), the same config on stdin, the
//! plugin found in CNI_PATH.

use std::{
    io::Write as _,
    path::PathBuf,
    process::{Command as Process, Stdio},
};

use crate::skel::{Args, CniError, code};

/// Finds `name` in the CNI_PATH directories.
fn find(name: &str, path: &[String]) -> Result<PathBuf, CniError> {
    path.iter()
        .map(|dir| PathBuf::from(dir).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::new(
                code::INVALID_CONFIG,
                format!("IPAM plugin {name:?} not found in CNI_PATH"),
                path.join(":"),
            )
        })
}

/// Runs the IPAM plugin `name` for `verb` with `stdin`; returns its stdout
/// parsed as JSON (`Null` when it printed nothing). An error result from the
/// plugin is passed through with its own code.
pub fn run(
    name: &str,
    verb: &str,
    args: &Args,
    stdin: &[u8],
) -> Result<serde_json::Value, CniError> {
    let bin = find(name, &args.path)?;
    let mut cmd = Process::new(&bin);
    cmd.env("CNI_COMMAND", verb)
        .env("CNI_CONTAINERID", &args.container_id)
        .env("CNI_IFNAME", &args.ifname)
        .env("CNI_ARGS", &args.cni_args)
        .env("CNI_PATH", args.path.join(":"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    match &args.netns {
        Some(ns) => cmd.env("CNI_NETNS", ns),
        None => cmd.env_remove("CNI_NETNS"),
    };
    let mut child = cmd.spawn().map_err(|e| {
        CniError::new(
            code::IO,
            format!("running IPAM plugin {}", bin.display()),
            e.to_string(),
        )
    })?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin).map_err(|e| {
            CniError::new(
                code::IO,
                format!("writing to IPAM plugin {name}"),
                e.to_string(),
            )
        })?;
    }
    let out = child.wait_with_output().map_err(|e| {
        CniError::new(
            code::IO,
            format!("waiting for IPAM plugin {name}"),
            e.to_string(),
        )
    })?;
    let value: serde_json::Value = if out.stdout.iter().all(u8::is_ascii_whitespace) {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&out.stdout).map_err(|e| {
            CniError::new(
                code::DECODE,
                format!("IPAM plugin {name} printed invalid JSON"),
                e.to_string(),
            )
        })?
    };
    if !out.status.success() {
        let code = value["code"]
            .as_u64()
            .and_then(|c| u32::try_from(c).ok())
            .unwrap_or(code::INTERNAL);
        let msg = value["msg"].as_str().unwrap_or("failed");
        return Err(CniError::new(
            code,
            format!("IPAM plugin {name} {verb}: {msg}"),
            value["details"].as_str().unwrap_or_default(),
        ));
    }
    Ok(value)
}
