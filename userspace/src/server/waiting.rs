//! What the agent answers before it can start: with the Kubernetes source
//! it needs its Node's pod CIDR first, and until then the API socket and the
//! health port say why. `status` answers not ready with the reason (so
//! `rivetctl status` shows it and the CNI plugin's STATUS answers 50), every
//! other request fails with `unavailable` (CNI: try again later),
//! `/healthz` answers 200 and `/readyz` 503 with the reason.

use std::{convert::Infallible, path::PathBuf, sync::Arc};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response as HttpResponse, StatusCode, header::CONTENT_TYPE};
use hyper_util::rt::TokioIo;
use rivet_api::{ApiError, ErrorKind, Request, Response};
use tokio::{io::AsyncWriteExt as _, net::TcpListener, task::JoinHandle};

use super::{REQUEST_TIMEOUT, bind, decode_request, read_request};
use crate::{
    agent::{AgentError, status::base_status},
    config::AgentConfig,
};

/// The not-ready answers, served until [`Waiting::stop`].
pub struct Waiting {
    reason: Arc<std::sync::Mutex<String>>,
    tasks: Vec<JoinHandle<()>>,
    socket: PathBuf,
}

impl Waiting {
    /// Binds the API socket and the metrics port (if configured) and
    /// answers on them with `reason` until stopped.
    pub async fn start(cfg: &AgentConfig, reason: String) -> Result<Self, AgentError> {
        let reason = Arc::new(std::sync::Mutex::new(reason));
        let listener = bind(&cfg.socket, cfg.socket_group.as_deref())?;
        let mut status = base_status(cfg, cfg.pod_cidr, 0, None);
        status.pod_cidr = String::new();
        status.store = "waiting".into();
        let api = {
            let reason = Arc::clone(&reason);
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let why = reason.lock().map(|r| r.clone()).unwrap_or_default();
                    let status = status.clone();
                    tokio::spawn(answer(stream, status, why));
                }
            })
        };
        let mut tasks = vec![api];
        if let Some(addr) = cfg.metrics_addr {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| AgentError::Metrics { addr, source })?;
            let reason = Arc::clone(&reason);
            tasks.push(tokio::spawn(health(listener, reason)));
        }
        Ok(Self {
            reason,
            tasks,
            socket: cfg.socket.clone(),
        })
    }

    /// The reason answered from now on.
    pub fn say(&self, why: String) {
        if let Ok(mut r) = self.reason.lock() {
            *r = why;
        }
    }

    /// Stops answering and frees the socket path and the port.
    pub async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

async fn answer(
    mut stream: tokio::net::UnixStream,
    mut status: rivet_api::AgentStatus,
    why: String,
) {
    let mut body = Vec::with_capacity(1024);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut stream, &mut body)).await;
    let response = match read {
        Ok(Ok(())) => match decode_request(&body) {
            Ok(Request::Status {}) => {
                status.not_ready = Some(why);
                Response::Status(status)
            }
            Ok(_) => Response::Error(ApiError::new(
                ErrorKind::Unavailable,
                format!("rivetd is not ready: {why}"),
            )),
            Err(e) => Response::Error(e),
        },
        _ => return,
    };
    if let Ok(bytes) = serde_json::to_vec(&response) {
        let _ = stream.write_all(&bytes).await;
        let _ = stream.shutdown().await;
    }
}

async fn health(listener: TcpListener, reason: Arc<std::sync::Mutex<String>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let reason = Arc::clone(&reason);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                let why = reason.lock().map(|r| r.clone()).unwrap_or_default();
                let (code, body) = match req.uri().path() {
                    "/healthz" => (StatusCode::OK, "ok\n".to_owned()),
                    _ => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                };
                let mut r = HttpResponse::new(Full::new(Bytes::from(body)));
                *r.status_mut() = code;
                if let Ok(v) = "text/plain; charset=utf-8".parse() {
                    r.headers_mut().insert(CONTENT_TYPE, v);
                }
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
