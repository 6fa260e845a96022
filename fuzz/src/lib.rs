//! Helpers shared by the fuzz targets: the plain-text input framings (so that
//! the committed seeds are readable and written by hand), a scratch directory,
//! and a well-formed endpoint record.
//!
//! `fuzz/` is a cargo-fuzz workspace of its own (excluded from the main one,
//! own Cargo.lock, no eBPF build: `AYA_BUILD_SKIP=1`; no AddressSanitizer and
//! dependencies at opt-level 1, which keeps the from-scratch build at ~7 min on
//! 2 cores). Targets drive the real decoders:
//!
//! | target | what | invariant |
//! |---|---|---|
//! | `cni_config` | `KEY=VALUE` environment lines, a blank line, stdin: `rivet_cni::{decode_config, add_inputs, error_json}`, the ADD result on any prevResult, CHECK's address lookup, the GC list | no panic; every error carries its spec code (4; 1/6/7; 4/7 for ADD) in the config's version |
//! | `runtime_config` | portMappings, bandwidth, ips, `args.cni.ips`, `CNI_ARGS`, against an independent model of the rules | the `endpoint_add` the plugin would send decodes in the agent to exactly the same request |
//! | `agent_request` | raw bytes into `server::decode_request`; responses and monitor lines through the client's decoders | refusals are `bad_request`; accepted requests round-trip |
//! | `state_loader` | up to 16 `#FILE name` blocks for the endpoints directory and the IPAM hint: `RecordDir::load_all`, in-place rewrites over arbitrary old content, `Ipam::open` + allocation with any hint | every record loaded exactly or reported unreadable; rewrites read back as written; round-robin continues after a restart |
//! | `event_record` | ring-buffer bytes → `events::parse_record` → monitor event → client line | length check; fields at their ABI offsets; the line decodes back to the same event |
//!
//! The eBPF packet parsers run on kernel contexts and share no code with the
//! host; they are covered by the malformed-packet table instead. `cargo xtask
//! fuzz [--secs N] [target]` runs them (a crash fails and leaves its input in
//! `fuzz/artifacts/<target>/`); `cargo xtask test` runs each for 10 s.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use rivet_api::{Endpoint, EndpointState};

/// Splits a `cni_config` input into the environment and stdin: lines
/// `KEY=VALUE` up to the first empty line, then the configuration bytes.
/// Without an empty line the whole input is stdin (no environment).
pub fn split_env(data: &[u8]) -> (Vec<(String, String)>, &[u8]) {
    let Some(at) = data.windows(2).position(|w| w == b"\n\n") else {
        return (Vec::new(), data);
    };
    let env = String::from_utf8_lossy(&data[..at])
        .lines()
        .filter_map(|line| {
            let (k, v) = line.split_once('=')?;
            // The environment of a process cannot hold NUL bytes.
            (!k.contains('\0') && !v.contains('\0')).then(|| (k.to_owned(), v.to_owned()))
        })
        .collect();
    (env, &data[at + 2..])
}

/// One file of a `state_loader` input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateFile<'a> {
    /// File name (sanitized: `[A-Za-z0-9._-]`, at most 64 bytes, never
    /// `.`/`..`).
    pub name: String,
    /// Content.
    pub content: &'a [u8],
}

/// Marker that starts a file in a `state_loader` input.
pub const FILE_MARKER: &[u8] = b"#FILE ";

/// Splits a `state_loader` input into files: each starts with a line
/// `#FILE <name>` and holds the bytes up to the next such line. Bytes
/// before the first marker are a file named `orphan.json`.
pub fn split_files(data: &[u8]) -> Vec<StateFile<'_>> {
    let mut starts: Vec<usize> = (0..data.len())
        .filter(|&i| (i == 0 || data[i - 1] == b'\n') && data[i..].starts_with(FILE_MARKER))
        .collect();
    let mut files = Vec::new();
    let first = starts.first().copied().unwrap_or(data.len());
    if first > 0 {
        files.push(StateFile {
            name: "orphan.json".to_owned(),
            content: &data[..first],
        });
    }
    starts.push(data.len());
    for (i, pair) in starts.windows(2).enumerate() {
        let (start, end) = (pair[0], pair[1]);
        let header = &data[start + FILE_MARKER.len()..end];
        let line_end = header
            .iter()
            .position(|b| *b == b'\n')
            .unwrap_or(header.len());
        let content = header.get(line_end + 1..).unwrap_or_default();
        // The newline before the next marker belongs to the marker.
        let content = if end < data.len() {
            content.strip_suffix(b"\n").unwrap_or(content)
        } else {
            content
        };
        let name: String = String::from_utf8_lossy(&header[..line_end])
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            .take(64)
            .collect();
        let name = if name.is_empty() || name == "." || name == ".." {
            format!("f{i}.json")
        } else {
            name
        };
        files.push(StateFile { name, content });
    }
    files
}

/// A fresh, empty scratch directory for this process (on tmpfs when there
/// is one: the loader target writes and reads files on every run).
pub fn scratch_dir(tag: &str) -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("rivet-fuzz-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("creating the scratch directory {}: {e}", dir.display());
    }
    dir
}

/// A well-formed ready endpoint record.
pub fn endpoint(container_id: &str, ifname: &str, ip: Ipv4Addr) -> Endpoint {
    Endpoint {
        container_id: container_id.to_owned(),
        ifname: ifname.to_owned(),
        network: None,
        netns: format!("/run/netns/{container_id}"),
        ip,
        mac: "02:72:0a:f4:01:02".to_owned(),
        host_ifname: rivet_api::host_ifname(container_id, ifname),
        host_ifindex: 7,
        host_mac: "02:00:00:00:00:07".to_owned(),
        mtu: 1450,
        gateway: Ipv4Addr::new(169, 254, 1, 1),
        state: EndpointState::Ready,
        pod: None,
        port_mappings: Vec::new(),
        bandwidth: None,
        routes: Vec::new(),
        created: 1,
        netns_cookie: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_and_stdin() {
        let (env, stdin) = split_env(b"CNI_COMMAND=ADD\nX\nA=b=c\n\n{\"a\":1}\n\nrest");
        assert_eq!(
            env,
            vec![
                ("CNI_COMMAND".to_owned(), "ADD".to_owned()),
                ("A".to_owned(), "b=c".to_owned())
            ]
        );
        assert_eq!(stdin, b"{\"a\":1}\n\nrest");
        assert_eq!(split_env(b"{}"), (Vec::new(), &b"{}"[..]));
    }

    #[test]
    fn files() {
        let files = split_files(b"lead#FILE x\n#FILE a.json\n{}\n#FILE ../b\nxy\n\n#FILE \n");
        let got: Vec<(&str, &[u8])> = files.iter().map(|f| (f.name.as_str(), f.content)).collect();
        assert_eq!(
            got,
            vec![
                ("orphan.json", &b"lead#FILE x\n"[..]),
                ("a.json", b"{}"),
                ("..b", b"xy\n"),
                ("f2.json", b""),
            ]
        );
    }
}
