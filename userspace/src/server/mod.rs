//! Serving the agent: the API socket (a request per connection, answered by one
//! handler per request kind, or a `monitor` stream), the metrics + health
//! endpoint ([`metrics`]) and the Services' `healthCheckNodePort`s
//! ([`health_checks`], started with the socket's server).
//!
//! The protocol (JSON over a unix stream socket, one request per connection,
//! each side acting on the other's document at its closing brace) is
//! `rivet_api`'s: one [`rivet_api::Request`] variant per operation (`"op"`),
//! one [`rivet_api::Response`] per answer (`"result"`), an error carrying its
//! kind (`bad_request`, `conflict`, `not_found`, `exhausted`, …) and message.
//! Unknown fields are rejected. A connection closed without an answer means
//! "try again". Requests are bounded (`MAX_MESSAGE`, 64 MiB: a document of
//! 10,000 Services fits; 5 s to send);
//! mutations are serialized by one lock (`dispatch`).
//!
//! `monitor {flows, sample}` is the one request that streams: the connection
//! stays open and receives one JSON event per line (see `crate::events`), plus
//! a keep-alive line each second (how a client that left is noticed); a client
//! too slow for the broadcast is told how many events it lost.

mod dispatch;
pub mod health_checks;
pub mod metrics;
pub mod waiting;

use std::{
    os::unix::fs::PermissionsExt as _,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use rivet_api::{ApiError, ErrorKind, MAX_MESSAGE, Request, Response};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{UnixListener, UnixStream},
};

use crate::{
    agent::{Agent, AgentError},
    store,
};

/// Longest a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Answers one request.
pub async fn handle(agent: &Arc<Agent>, request: Request) -> Response {
    let started = Instant::now();
    let verb = verb_of(&request);
    let response = match dispatch::dispatch(agent, request).await {
        Ok(r) => r,
        Err(e) => Response::Error(e),
    };
    agent.request_metrics().observe(verb, started.elapsed());
    response
}

/// Name of a socket directory that is the agent's own (see [`bind`]).
const OWN_SOCKET_DIR: &str = "rivet";

/// Binds the API socket: stale socket replaced (the pin lock proves no
/// other agent owns it), socket 0600 — root only. With `group` (config
/// `socket_group`) the socket is 0660 and owned by that group: its members
/// may connect. The parent directory is restricted only when it is the
/// agent's own — one it creates, or one named `rivet` (the default
/// `/run/rivet`, kept across restarts): 0700, or 0710 owned by the group,
/// so nobody else can even reach the path. Any other directory that already
/// exists (`/run`, `/tmp`, a shared runtime directory) is never changed;
/// the socket's own mode guards it there.
pub fn bind(path: &Path, group: Option<&str>) -> Result<UnixListener, AgentError> {
    let sock_err = |source| AgentError::Socket {
        path: path.display().to_string(),
        source,
    };
    let gid = match group {
        None => None,
        Some(name) => Some(
            nix::unistd::Group::from_name(name)
                .map_err(|e| sock_err(std::io::Error::from(e)))?
                .ok_or_else(|| {
                    sock_err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("socket_group {name:?}: no such group"),
                    ))
                })?
                .gid,
        ),
    };
    let own_dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) if !dir.exists() || dir.file_name() == Some(OWN_SOCKET_DIR.as_ref()) => {
            store::create_private_dir(dir)?;
            Some(dir)
        }
        Some(dir) => {
            tracing::debug!(dir = %dir.display(), "socket directory exists; its mode is left alone");
            None
        }
        None => None,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(sock_err(e)),
    }
    let listener = UnixListener::bind(path).map_err(sock_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(sock_err)?;
    if let Some(gid) = gid {
        let chgrp = |p: &Path, mode: u32| {
            nix::unistd::chown(p, None, Some(gid)).map_err(|e| sock_err(e.into()))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(sock_err)
        };
        chgrp(path, 0o660)?;
        if let Some(dir) = own_dir {
            chgrp(dir, 0o710)?;
        }
    }
    Ok(listener)
}

/// Serves connections until `shutdown` resolves.
pub async fn serve(
    agent: Arc<Agent>,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let publisher = tokio::spawn(Arc::clone(&agent).publish_status());
    let health_checks = tokio::spawn(health_checks::serve(Arc::clone(&agent)));
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let agent = Arc::clone(&agent);
                    tokio::spawn(async move {
                        if let Err(e) = handle_connection(&agent, stream).await {
                            tracing::debug!(error = %e, "API connection");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an API connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    publisher.abort();
    health_checks.abort();
}

/// Decodes one API request (the bytes a client sent: a complete document,
/// or all of them up to its shutdown, at most `MAX_MESSAGE`); a malformed
/// one becomes the `bad_request` error that is answered.
pub fn decode_request(body: &[u8]) -> Result<Request, ApiError> {
    serde_json::from_slice::<Request>(body)
        .map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("invalid request: {e}")))
}

/// Reads one request into `body`: until it is a complete JSON document
/// (the request is served without waiting for the client's shutdown, EOF,
/// behind it), EOF, or `MAX_MESSAGE` bytes.
async fn read_request(stream: &mut UnixStream, body: &mut Vec<u8>) -> std::io::Result<()> {
    let mut limited = stream.take(MAX_MESSAGE);
    loop {
        if limited.read_buf(body).await? == 0 {
            return Ok(());
        }
        // A request is an object: only a buffer ending in `}` can hold all
        // of it (which bounds the parse attempts of a large one).
        if body.trim_ascii_end().last() == Some(&b'}')
            && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
        {
            return Ok(());
        }
    }
}

async fn handle_connection(agent: &Arc<Agent>, mut stream: UnixStream) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    let mut body = Vec::with_capacity(4096);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut stream, &mut body)).await;
    let read_ms = started.elapsed().as_secs_f64() * 1e3;
    let response = match read {
        Err(_) => Response::Error(ApiError::new(
            ErrorKind::BadRequest,
            "timed out reading the request",
        )),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(_)) => match decode_request(&body) {
            Ok(Request::Monitor { flows, sample }) => {
                return stream_events(agent, stream, flows.then(|| sample.unwrap_or(1))).await;
            }
            Ok(request) => handle(agent, request).await,
            Err(e) => Response::Error(e),
        },
    };
    let handled_ms = started.elapsed().as_secs_f64() * 1e3;
    let bytes = serde_json::to_vec(&response).map_err(std::io::Error::other)?;
    stream.write_all(&bytes).await?;
    stream.shutdown().await?;
    tracing::debug!(
        ms = started.elapsed().as_secs_f64() * 1e3,
        read_ms,
        handled_ms,
        "API request answered"
    );
    Ok(())
}

/// Streams events to a `monitor` client, one JSON object per line, with a
/// keep-alive line every second (how a client that went away is noticed).
async fn stream_events(
    agent: &Arc<Agent>,
    mut stream: UnixStream,
    flows: Option<u32>,
) -> std::io::Result<()> {
    use tokio::sync::broadcast::error::RecvError;
    let mut sub = agent.events().subscribe(flows);
    // Labels for the Services, gathered lazily (nobody watching, nobody
    // pays for them).
    agent.refresh_service_names().await;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut lost = 0u64;
    loop {
        let event = tokio::select! {
            ev = sub.rx.recv() => match ev {
                Ok(mut ev) => {
                    ev.lost = std::mem::take(&mut lost);
                    ev
                }
                Err(RecvError::Lagged(n)) => {
                    lost += n;
                    continue;
                }
                Err(RecvError::Closed) => return Ok(()),
            },
            _ = tick.tick() => rivet_api::MonitorEvent {
                kind: "tick".into(),
                reason: String::new(),
                ifindex: 0,
                ifname: None,
                service: None,
                pod: None,
                policy: None,
                proto: String::new(),
                src: String::new(),
                dst: String::new(),
                icmp: None,
                len: 0,
                time: 0.0,
                lost: 0,
            },
        };
        // One write for this event and every one already waiting.
        let mut lines = serde_json::to_vec(&event).map_err(std::io::Error::other)?;
        lines.push(b'\n');
        while lines.len() < 64 * 1024 {
            let Ok(mut ev) = sub.rx.try_recv() else {
                break;
            };
            ev.lost = std::mem::take(&mut lost);
            serde_json::to_writer(&mut lines, &ev).map_err(std::io::Error::other)?;
            lines.push(b'\n');
        }
        stream.write_all(&lines).await?;
    }
}

/// The label of a request in the latency metrics: the CNI verb it serves,
/// else its own name.
const fn verb_of(request: &Request) -> &'static str {
    match request {
        Request::EndpointAdd(_) => "ADD",
        Request::EndpointDel(_) => "DEL",
        Request::EndpointCheck(_) => "CHECK",
        Request::Gc(_) => "GC",
        Request::Status {} => "STATUS",
        Request::EndpointList {} => "endpoint_list",
        Request::EndpointBandwidth(_) => "endpoint_bandwidth",
        Request::NodeSet(_) => "node_set",
        Request::NodeDel { .. } => "node_del",
        Request::NodeList {} => "node_list",
        Request::Stats {} => "stats",
        Request::NatList { .. } => "nat_list",
        Request::PortmapList {} => "portmap_list",
        Request::NatPage { .. } => "nat_page",
        Request::PortmapPage { .. } => "portmap_page",
        Request::Monitor { .. } => "monitor",
        Request::Apply { .. } => "apply",
        Request::Delete { .. } => "delete",
        Request::Get { .. } => "get",
        Request::Services {} => "services",
        Request::Policy { .. } => "policy",
        Request::Bgp {} => "bgp",
    }
}
