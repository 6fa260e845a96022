//! rivet-cni: the CNI plugin named by `"type": "rivet-cni"` in a conflist.
//!
//! A thin, synchronous client of rivetd (serde + std; no async runtime): every
//! verb becomes one request on the agent's unix socket (default
//! /run/rivet/rivetd.sock, or the config's `socket`). One function per verb;
//! errors are spec JSON on stdout with exit status 1, logs go to stderr. When
//! the agent is down, ADD fails fast with code 11, STATUS reports 50 (also when
//! the agent answers but is not ready, with its reason), and DEL still succeeds
//! after removing what it can locally (the agent reconciles the rest when it
//! returns). DEL never fails because its configuration does not decode: it
//! removes the attachment its container ID and ifname name.
//!
//! | verb | what it asks the agent | agent unreachable |
//! |---|---|---|
//! | VERSION | nothing | — |
//! | ADD | `endpoint_add` (after a delegated IPAM ADD if `ipam.type` is not `rivet`; its DEL if the agent fails) | code 11 at once (connect refused), or 11 after the 30 s bound |
//! | DEL | `endpoint_del` (+ delegated IPAM DEL) | deletes the host veth itself over netlink (name derived from container ID + ifname); the agent releases the lease when it returns |
//! | CHECK | `endpoint_check` with the prevResult's address (+ delegated CHECK) | code 11 |
//! | STATUS | `status`: 50 if the pool is exhausted | code 50 |
//! | GC | `gc` with `cni.dev/valid-attachments` ∪ `cni.dev/attachments` | code 11 |
//!
//! Every request names the network (the conflist's `name`): the CNI attachment
//! key is (network, container ID, ifname), and GC of one network never touches
//! another's attachments. Before touching anything ADD/DEL refuse a `CNI_NETNS`
//! that is the plugin's own namespace (code 8) unless `CNI_NETNS_OVERRIDE` is
//! set. Results follow the config's version (0.3.x/0.4.0: `ips[].version`;
//! 1.1.0: interface `mtu`) and, when chained after another plugin, append to
//! its `prevResult`. The installed conflist says `cniVersion` 1.0.0 with
//! `cniVersions` `[0.3.1, 0.4.0, 1.0.0, 1.1.0]`: podman 4.3's libcni reads
//! 1.0.0, newer runtimes pick 1.1.0.
//!
//! Shipped as a static-pie binary: `cargo xtask build/install` link it with `-C
//! target-feature=+crt-static` for an explicit `--target`, so proc macros and
//! build scripts are unaffected; `cargo xtask test` drives that binary and
//! checks it has no ELF interpreter.

use std::{
    io::{Read as _, Write as _},
    os::unix::fs::MetadataExt as _,
    process::ExitCode,
    time::Duration,
};

use rivet_api::{
    Client, ClientError, EndpointCheck, EndpointRef, EndpointSpec, ErrorKind, GcRequest, Request,
    Response,
};
use rivet_cni::{
    AddInputs,
    conf::NetConf,
    delegate, local, result,
    skel::{self, Args, CniError, Command, code},
};

/// Bound on every exchange with the agent. ADDs are serialized in the agent,
/// so under a storm one may wait for others; it never waits forever.
const AGENT_TIMEOUT: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    let get = |k: &str| std::env::var(k).ok();
    let mut stdin = Vec::new();
    let outcome = skel::parse_env(&get).and_then(|args| {
        if args.command != Command::Version {
            std::io::stdin()
                .take(skel::MAX_STDIN + 1)
                .read_to_end(&mut stdin)
                .map_err(|e| CniError::new(code::IO, "reading stdin", e.to_string()))?;
            if stdin.len() as u64 > skel::MAX_STDIN {
                return Err(CniError::new(
                    code::DECODE,
                    "network configuration too large",
                    format!("more than {} bytes on stdin", skel::MAX_STDIN),
                ));
            }
        }
        run(&args, &stdin)
    });
    let mut out = std::io::stdout().lock();
    match outcome {
        Ok(Some(value)) => {
            let _ = writeln!(out, "{value}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rivet-cni: {e}");
            let _ = writeln!(out, "{}", rivet_cni::error_json(&e, &stdin));
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args, stdin: &[u8]) -> Result<Option<serde_json::Value>, CniError> {
    if args.command == Command::Version {
        return Ok(Some(skel::version_json()));
    }
    let conf = match rivet_cni::decode_config(args, stdin) {
        Ok(conf) => conf,
        Err(e) if args.command == Command::Del && e.code != code::INCOMPATIBLE_VERSION => {
            // DEL never fails because its configuration cannot be decoded:
            // a runtime whose DEL fails keeps the sandbox forever. Clean up
            // what the container ID and ifname name, on whatever network.
            let lenient = DelFallback::read(stdin);
            eprintln!(
                "rivet-cni: DEL with an undecodable configuration ({e}); removing container {} interface {} through {}",
                args.container_id,
                args.ifname,
                lenient.socket.display()
            );
            let client = Client::new(&lenient.socket).with_timeout(AGENT_TIMEOUT);
            return del_attachment(args, None, &client).map(|()| None);
        }
        Err(e) => return Err(e),
    };
    let client = Client::new(conf.socket()).with_timeout(AGENT_TIMEOUT);
    match args.command {
        Command::Add => cmd_add(args, &conf, stdin, &client).map(Some),
        Command::Del => cmd_del(args, &conf, stdin, &client).map(|()| None),
        Command::Check => cmd_check(args, &conf, stdin, &client).map(|()| None),
        Command::Status => cmd_status(args, &conf, stdin, &client).map(|()| None),
        Command::Gc => cmd_gc(args, &conf, stdin, &client).map(|()| None),
        Command::Version => Ok(Some(skel::version_json())),
    }
}

/// Maps a failed agent call to a CNI error.
fn agent_error(e: ClientError) -> CniError {
    match e {
        ClientError::Connect { path, source } => CniError::new(
            code::TRY_AGAIN,
            "rivetd is not reachable; try again later",
            format!("{}: {source}", path.display()),
        ),
        ClientError::Io { path, source } => CniError::new(
            code::TRY_AGAIN,
            "rivetd did not answer; try again later",
            format!("{}: {source}", path.display()),
        ),
        ClientError::Decode { path, source } => CniError::new(
            code::INTERNAL,
            "invalid answer from rivetd",
            format!("{}: {source}", path.display()),
        ),
        ClientError::Api(e) => {
            let code = match e.kind {
                ErrorKind::BadRequest => code::INVALID_CONFIG,
                ErrorKind::Conflict => code::CONFLICT,
                ErrorKind::NotFound => code::INVALID_NETNS,
                ErrorKind::Exhausted => code::POOL_EXHAUSTED,
                ErrorKind::Missing => code::CHECK_FAILED,
                ErrorKind::Internal => code::INTERNAL,
                ErrorKind::Unavailable => code::TRY_AGAIN,
            };
            CniError::new(code, e.message, "")
        }
    }
}

/// ADD and DEL must not act on the plugin's own namespace: checked before
/// anything is touched.
fn refuse_own_netns(args: &Args) -> Result<(), CniError> {
    let Some(ns) = &args.netns else {
        return Ok(());
    };
    if args.netns_override {
        return Ok(());
    }
    let (Ok(target), Ok(own)) = (
        std::fs::metadata(ns),
        std::fs::metadata("/proc/self/ns/net"),
    ) else {
        return Ok(());
    };
    if target.dev() == own.dev() && target.ino() == own.ino() {
        return Err(CniError::new(
            code::INVALID_NETNS,
            "CNI_NETNS is the plugin's own network namespace",
            ns.clone(),
        ));
    }
    Ok(())
}

fn cmd_add(
    args: &Args,
    conf: &NetConf,
    stdin: &[u8],
    client: &Client,
) -> Result<serde_json::Value, CniError> {
    refuse_own_netns(args)?;
    let netns = args.netns.clone().unwrap_or_default();
    if !std::path::Path::new(&netns).exists() {
        return Err(CniError::new(
            code::INVALID_NETNS,
            format!("network namespace {netns} does not exist"),
            "",
        ));
    }
    let AddInputs {
        cni_args,
        port_mappings,
        routes,
        requested,
    } = rivet_cni::add_inputs(args, conf)?;
    let bandwidth = conf.bandwidth()?;

    // Delegated IPAM chooses the address; rivet's IPAM is the agent.
    let delegated = conf.delegated_ipam();
    let ip = match delegated {
        Some(name) => {
            let res = delegate::run(name, "ADD", args, stdin)?;
            Some(result::ipam_address(&res).ok_or_else(|| {
                CniError::new(
                    code::INTERNAL,
                    format!("IPAM plugin {name} returned no IPv4 address"),
                    res.to_string(),
                )
            })?)
        }
        None => requested,
    };
    let spec = EndpointSpec {
        network: Some(conf.name.clone()),
        ifname: args.ifname.clone(),
        ip,
        ranges: if delegated.is_some() {
            Vec::new()
        } else {
            conf.ranges()
        },
        pod: cni_args.pod,
        port_mappings,
        bandwidth,
        routes,
        ..EndpointSpec::new(&args.container_id, &netns)
    };
    let response = client.call(&Request::EndpointAdd(spec));
    let ep = match response {
        Ok(Response::Endpoint(ep)) => ep,
        other => {
            // Release what the delegated plugin reserved before failing.
            if let Some(name) = delegated
                && let Err(e) = delegate::run(name, "DEL", args, stdin)
            {
                eprintln!("rivet-cni: releasing the delegated lease: {e}");
            }
            return Err(match other {
                Err(e) => agent_error(e),
                Ok(r) => CniError::new(
                    code::INTERNAL,
                    "unexpected answer from rivetd",
                    format!("{r:?}"),
                ),
            });
        }
    };
    Ok(result::add_result(
        &conf.cni_version,
        &ep,
        &conf.routes()?,
        conf.dns.as_ref(),
        conf.prev_result.as_ref(),
    ))
}

/// What DEL can still read from a configuration that does not decode.
struct DelFallback {
    /// The config's `socket` if it is a JSON object with a string there,
    /// else the default.
    socket: std::path::PathBuf,
}

impl DelFallback {
    fn read(stdin: &[u8]) -> Self {
        let socket = serde_json::from_slice::<serde_json::Value>(stdin)
            .ok()
            .and_then(|v| v.get("socket")?.as_str().map(std::path::PathBuf::from))
            .unwrap_or_else(|| std::path::PathBuf::from(rivet_cni::conf::DEFAULT_SOCKET));
        Self { socket }
    }
}

fn cmd_del(args: &Args, conf: &NetConf, stdin: &[u8], client: &Client) -> Result<(), CniError> {
    del_attachment(args, Some(&conf.name), client)?;
    if let Some(name) = conf.delegated_ipam() {
        delegate::run(name, "DEL", args, stdin)?;
    }
    Ok(())
}

/// Removes the attachment (container ID, ifname) of `network` (of any
/// network when `None`) through the agent, or the veth locally when the
/// agent is down.
fn del_attachment(args: &Args, network: Option<&str>, client: &Client) -> Result<(), CniError> {
    refuse_own_netns(args)?;
    let mut r = EndpointRef::new(&args.container_id, &args.ifname);
    r.network = network.map(str::to_owned);
    match client.call(&Request::EndpointDel(r)) {
        Ok(_) => {}
        Err(ClientError::Connect { path, source }) => {
            // The agent is down (or not yet up after a reboot): remove the
            // veth ourselves; the agent releases the lease when it returns.
            let host = rivet_api::host_ifname(&args.container_id, &args.ifname);
            match local::delete_link(&host) {
                Ok(existed) => eprintln!(
                    "rivet-cni: rivetd unreachable at {} ({source}); {} {host} locally",
                    path.display(),
                    if existed { "deleted" } else { "no veth" }
                ),
                Err(e) => {
                    return Err(CniError::new(
                        code::TRY_AGAIN,
                        "rivetd is not reachable and the local cleanup failed",
                        format!("deleting {host}: {e}"),
                    ));
                }
            }
        }
        Err(e) => return Err(agent_error(e)),
    }
    Ok(())
}

fn cmd_check(args: &Args, conf: &NetConf, stdin: &[u8], client: &Client) -> Result<(), CniError> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        CniError::new(
            code::INVALID_CONFIG,
            "CHECK needs prevResult",
            "the runtime must pass the ADD result",
        )
    })?;
    let ip = result::ip_of(prev, &args.ifname);
    match client.call(&Request::EndpointCheck(EndpointCheck {
        container_id: args.container_id.clone(),
        ifname: args.ifname.clone(),
        ip,
        network: Some(conf.name.clone()),
    })) {
        Ok(Response::Checked {}) => {}
        Ok(r) => {
            return Err(CniError::new(
                code::INTERNAL,
                "unexpected answer from rivetd",
                format!("{r:?}"),
            ));
        }
        Err(e) => return Err(agent_error(e)),
    }
    if let Some(name) = conf.delegated_ipam() {
        delegate::run(name, "CHECK", args, stdin)?;
    }
    Ok(())
}

fn cmd_status(args: &Args, conf: &NetConf, stdin: &[u8], client: &Client) -> Result<(), CniError> {
    let status = match client.call(&Request::Status {}) {
        Ok(Response::Status(s)) => s,
        Ok(r) => {
            return Err(CniError::new(
                code::NOT_AVAILABLE,
                "unexpected answer from rivetd",
                format!("{r:?}"),
            ));
        }
        Err(e) => {
            return Err(CniError::new(
                code::NOT_AVAILABLE,
                "rivetd is not available",
                e.to_string(),
            ));
        }
    };
    if !status.ready {
        return Err(CniError::new(
            code::NOT_AVAILABLE,
            "rivetd is not ready",
            status
                .not_ready
                .unwrap_or_else(|| "the agent reports not ready".into()),
        ));
    }
    if conf.delegated_ipam().is_none() && status.pool.free() == 0 {
        return Err(CniError::new(
            code::NOT_AVAILABLE,
            "no IP addresses available",
            format!(
                "the pool of {} ({} addresses) is exhausted",
                status.pod_cidr, status.pool.size
            ),
        ));
    }
    if let Some(name) = conf.delegated_ipam()
        && let Err(e) = delegate::run(name, "STATUS", args, stdin)
    {
        // Plugins without STATUS (host-local, static) answer "unsupported".
        if e.code != code::INCOMPATIBLE_VERSION && e.code != code::INVALID_ENV {
            return Err(CniError::new(code::NOT_AVAILABLE, e.msg, e.details));
        }
    }
    Ok(())
}

fn cmd_gc(args: &Args, conf: &NetConf, stdin: &[u8], client: &Client) -> Result<(), CniError> {
    match client.call(&Request::Gc(GcRequest {
        network: conf.name.clone(),
        valid: conf.gc_keep(),
    })) {
        Ok(_) => {}
        Err(e) => return Err(agent_error(e)),
    }
    if let Some(name) = conf.delegated_ipam()
        && let Err(e) = delegate::run(name, "GC", args, stdin)
        && e.code != code::INCOMPATIBLE_VERSION
        && e.code != code::INVALID_ENV
    {
        return Err(e);
    }
    Ok(())
}
