//! The Services' `healthCheckNodePort`s, answered as kube-proxy answers
//! them, so a cloud load balancer in front of a Service with
//! `externalTrafficPolicy: Local` sends clients only to nodes that hold
//! one of its endpoints.
//!
//! For every [`HealthCheck`] of the plan last synced (the agent publishes
//! them after each sync: [`Agent::health_checks`]) the agent listens on TCP
//! `0.0.0.0:<port>` — every address of the node's network namespace, which
//! the agent runs in — and answers any request, whatever its method and
//! path, with
//!
//! - `200` when the Service has at least one ready endpoint on this node
//!   and the datapath is attached (the uplink runs rivet's program),
//!   `503` otherwise;
//! - `Content-Type: application/json`, `X-Content-Type-Options: nosniff`,
//!   `X-Load-Balancing-Endpoint-Weight: <local endpoints>`;
//! - the body `{"service":{"namespace":"ns","name":"n"},"localEndpoints":N,"serviceProxyHealthy":true}`.
//!
//! The listeners follow the plan: a new port is bound, a port no longer
//! planned is closed (new connections are refused), and a changed count
//! or Service is answered from the next request on without rebinding. A
//! port that cannot be bound (another process holds it) is logged, shown
//! among the warnings of `rivetctl status` and tried again every
//! [`RETRY`] until it is bound or no longer planned.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::Ipv4Addr,
    sync::{Arc, RwLock},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Response, StatusCode,
    header::{CONTENT_TYPE, HeaderValue},
};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, task::JoinHandle};

use crate::{agent::Agent, services::HealthCheck};

/// How often ports that could not be bound are tried again.
pub const RETRY: Duration = Duration::from_secs(5);

/// A bound health-check port: what it answers for, and its accept loop
/// (aborted when dropped: the port closes).
struct Listener {
    check: Arc<RwLock<HealthCheck>>,
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves the planned health-check ports until the task is aborted (the
/// listeners close with it).
pub async fn serve(agent: Arc<Agent>) {
    let mut wanted = agent.health_checks();
    let mut listeners: BTreeMap<u16, Listener> = BTreeMap::new();
    let mut failed: BTreeMap<u16, String> = BTreeMap::new();
    let mut retry = tokio::time::interval(RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let checks = wanted.borrow_and_update().clone();
        follow(&agent, &checks, &mut listeners, &mut failed).await;
        tokio::select! {
            changed = wanted.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = retry.tick(), if !failed.is_empty() => {}
        }
    }
}

/// Makes the listeners those of `checks`: binds new ports, updates the
/// ones kept, closes the others.
async fn follow(
    agent: &Arc<Agent>,
    checks: &[HealthCheck],
    listeners: &mut BTreeMap<u16, Listener>,
    failed: &mut BTreeMap<u16, String>,
) {
    let mut planned: BTreeMap<u16, &HealthCheck> = BTreeMap::new();
    for check in checks {
        if let Some(first) = planned.get(&check.port) {
            tracing::warn!(
                port = check.port,
                service = %format_args!("{}/{}", check.namespace, check.name),
                served_for = %format_args!("{}/{}", first.namespace, first.name),
                "healthCheckNodePort claimed twice: answered for the first Service"
            );
            continue;
        }
        planned.insert(check.port, check);
    }
    let gone: Vec<u16> = listeners
        .keys()
        .chain(failed.keys())
        .filter(|p| !planned.contains_key(p))
        .copied()
        .collect();
    for port in gone {
        if listeners.remove(&port).is_some() {
            tracing::info!(port, "healthCheckNodePort closed");
        }
        failed.remove(&port);
        agent.health_check_bound(port, Ok(()));
    }
    for (port, check) in planned {
        if let Some(l) = listeners.get(&port) {
            let mut held = match l.check.write() {
                Ok(h) => h,
                Err(e) => e.into_inner(),
            };
            if *held != *check {
                held.clone_from(check);
            }
            continue;
        }
        let service = format!("{}/{}", check.namespace, check.name);
        match TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).await {
            Ok(socket) => {
                let shared = Arc::new(RwLock::new(check.clone()));
                let task = tokio::spawn(accept(Arc::clone(agent), socket, Arc::clone(&shared)));
                listeners.insert(
                    port,
                    Listener {
                        check: shared,
                        task,
                    },
                );
                failed.remove(&port);
                agent.health_check_bound(port, Ok(()));
                tracing::info!(port, %service, "healthCheckNodePort served");
            }
            Err(e) => {
                let why = format!("binding 0.0.0.0:{port} for {service}: {e}");
                if failed.get(&port) != Some(&why) {
                    tracing::warn!(port, %service, error = %e, "healthCheckNodePort not served (tried again every {}s)", RETRY.as_secs());
                }
                agent.health_check_bound(port, Err(why.clone()));
                failed.insert(port, why);
            }
        }
    }
}

/// Accepts connections on one health-check port.
async fn accept(agent: Arc<Agent>, socket: TcpListener, check: Arc<RwLock<HealthCheck>>) {
    loop {
        let stream = match socket.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "accepting a health-check connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let agent = Arc::clone(&agent);
        let check = Arc::clone(&check);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_req| {
                let healthy = agent.published().not_attached.is_none();
                let answer = {
                    let held = match check.read() {
                        Ok(h) => h,
                        Err(e) => e.into_inner(),
                    };
                    answer(&held, healthy)
                };
                async move { Ok::<_, Infallible>(answer) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "health-check connection");
            }
        });
    }
}

/// kube-proxy's body for `check` (`proxy_healthy`: the datapath is
/// attached).
pub fn body(check: &HealthCheck, proxy_healthy: bool) -> String {
    let quoted = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned());
    format!(
        r#"{{"service":{{"namespace":{},"name":{}}},"localEndpoints":{},"serviceProxyHealthy":{}}}"#,
        quoted(&check.namespace),
        quoted(&check.name),
        check.local_endpoints,
        proxy_healthy
    )
}

/// The answer to any request on `check`'s port.
fn answer(check: &HealthCheck, proxy_healthy: bool) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body(check, proxy_healthy))));
    *r.status_mut() = if check.local_endpoints > 0 && proxy_healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let headers = r.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        "x-load-balancing-endpoint-weight",
        HeaderValue::from(check.local_endpoints),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(local_endpoints: usize) -> HealthCheck {
        HealthCheck {
            port: 32000,
            namespace: "prod".into(),
            name: "web \"a\"".into(),
            local_endpoints,
        }
    }

    #[test]
    fn answers_like_kube_proxy() {
        let r = answer(&check(2), true);
        assert_eq!(r.status(), StatusCode::OK);
        let h = r.headers();
        assert_eq!(h[CONTENT_TYPE], "application/json");
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["x-load-balancing-endpoint-weight"], "2");
        assert_eq!(
            body(&check(2), true),
            r#"{"service":{"namespace":"prod","name":"web \"a\""},"localEndpoints":2,"serviceProxyHealthy":true}"#
        );
        let parsed: serde_json::Value =
            serde_json::from_str(&body(&check(0), false)).expect("the body is JSON");
        assert_eq!(parsed["service"]["name"], "web \"a\"");
        assert_eq!(parsed["localEndpoints"], 0);
        assert_eq!(parsed["serviceProxyHealthy"], false);
    }

    #[test]
    fn unavailable_without_local_endpoints_or_datapath() {
        let r = answer(&check(0), true);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()["x-load-balancing-endpoint-weight"], "0");
        assert_eq!(
            answer(&check(3), false).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
