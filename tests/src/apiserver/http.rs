//! The HTTP side: the accept loop, authentication, routing, the verbs.

use std::{
    collections::HashMap,
    convert::Infallible,
    io,
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Frame, Incoming, SizeHint},
    header,
};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_rustls::TlsAcceptor;

use super::{
    PatchRecord, RequestRecord, Shared, Verb, discovery, lock, patch,
    resources::{self, RESOURCES, Resource},
    select::Filter,
    store::{ApiError, Key, Part, precondition},
    watch,
};

/// A response body: whole, or a stream of chunks (watches).
pub enum Body {
    /// The whole body (taken when sent).
    Full(Option<Bytes>),
    /// Chunks until the sender goes; fails (which aborts the connection)
    /// once the watch is dropped.
    Stream(watch::Stream),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            Self::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Self::Stream(w) => {
                if w.aborted.load(Ordering::SeqCst) {
                    return Poll::Ready(Some(Err(io::Error::other("watch dropped by the test"))));
                }
                w.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Self::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Self::Full(None) => SizeHint::with_exact(0),
            Self::Stream(_) => SizeHint::default(),
        }
    }
}

/// The server thread: a current-thread runtime serving until `stop`.
pub fn run(
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    tls: TlsAcceptor,
    stop: oneshot::Receiver<()>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("API server: no runtime: {e}");
            return;
        }
    };
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("API server: listener: {e}");
                return;
            }
        };
        let mut stop = stop;
        loop {
            tokio::select! {
                _ = &mut stop => break,
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(connection(shared.clone(), stream, tls.clone()));
                }
            }
        }
    });
    // Dropping the runtime cancels every connection and watch task.
    drop(rt);
}

/// Serves one connection: TLS if it starts with a TLS handshake record,
/// plain HTTP/1.1 otherwise.
async fn connection(shared: Arc<Shared>, stream: tokio::net::TcpStream, tls: TlsAcceptor) {
    let mut first = [0u8; 1];
    let is_tls = matches!(stream.peek(&mut first).await, Ok(1) if first[0] == 0x16);
    let svc = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(shared, req, is_tls).await) }
    });
    let http = hyper::server::conn::http1::Builder::new();
    if is_tls {
        if let Ok(stream) = tls.accept(stream).await {
            let _ = http.serve_connection(TokioIo::new(stream), svc).await;
        }
    } else {
        let _ = http.serve_connection(TokioIo::new(stream), svc).await;
    }
}

fn respond(code: u16, body: Bytes) -> Response<Body> {
    let mut r = Response::new(Body::Full(Some(body)));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    respond(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

fn error(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.status())
}

/// Decodes `%XX` and `+` in a query component.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                match s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(c) => {
                        out.push(c);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(uri: &hyper::Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (unescape(k), unescape(v)),
            None => (unescape(kv), String::new()),
        })
        .collect()
}

/// A request for a resource.
struct Target {
    res: usize,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

enum Route {
    Doc(Value),
    Resource(Target),
    NotFound,
}

fn route(shared: &Shared, path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let doc = |v: Option<Value>| v.map_or(Route::NotFound, Route::Doc);
    match segs.as_slice() {
        ["version"] => Route::Doc(discovery::version()),
        ["healthz" | "livez" | "readyz"] => Route::Doc(json!("ok")),
        ["api"] => Route::Doc(discovery::api(&shared.addr.to_string())),
        ["apis"] => Route::Doc(discovery::apis()),
        ["api", v] => doc(discovery::resource_list("", v)),
        ["apis", g] => doc(discovery::api_group(g)),
        ["apis", g, v] => doc(discovery::resource_list(g, v)),
        ["api", v, rest @ ..] => resource_route("", v, rest),
        ["apis", g, v, rest @ ..] => resource_route(g, v, rest),
        _ => Route::NotFound,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    let find = |plural: &str| resources::by_plural(group, version, plural);
    let (res, ns, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if find(plural).is_some_and(|i| RESOURCES[i].namespaced) =>
        {
            match find(plural) {
                Some(i) => (i, Some(ns.to_string()), tail),
                None => return Route::NotFound,
            }
        }
        [plural, tail @ ..] => match find(plural) {
            Some(i) => (i, None, tail),
            None => return Route::NotFound,
        },
        [] => return Route::NotFound,
    };
    let r = &RESOURCES[res];
    let (name, sub) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, "status"] if r.status => (Some(name.to_string()), Some("status".to_string())),
        _ => return Route::NotFound,
    };
    // A namespaced object is only reachable through its namespace.
    if r.namespaced && ns.is_none() && name.is_some() {
        return Route::NotFound;
    }
    Route::Resource(Target { res, ns, name, sub })
}

fn header_str(req: &Request<Incoming>, name: header::HeaderName) -> &str {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>, tls: bool) -> Response<Body> {
    let auth = header_str(&req, header::AUTHORIZATION);
    let authorized = auth.strip_prefix("Bearer ").is_some_and(|t| {
        let t = t.trim();
        !t.is_empty() && lock(&shared.tokens).iter().any(|k| k == t)
    });
    if !authorized {
        shared.unauthorized.fetch_add(1, Ordering::Relaxed);
        return error(&ApiError::unauthorized());
    }
    match route(&shared, req.uri().path()) {
        Route::NotFound => error(&ApiError::no_route()),
        Route::Doc(v) => {
            if req.method() == Method::GET {
                json_response(200, &v)
            } else {
                error(&ApiError::method_not_allowed())
            }
        }
        Route::Resource(t) => resource(shared, req, t, tls).await,
    }
}

/// What a handler answers, plus what the request log needs.
struct Answer {
    response: Response<Body>,
    verb: Verb,
}

async fn resource(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    t: Target,
    tls: bool,
) -> Response<Body> {
    let q = query(req.uri());
    let user_agent = header_str(&req, header::USER_AGENT).to_string();
    let record = |verb: Verb, code: u16| RequestRecord {
        verb,
        resource: RESOURCES[t.res].plural,
        subresource: t.sub.clone(),
        namespace: t.ns.clone(),
        name: t.name.clone(),
        resource_version: q.get("resourceVersion").cloned(),
        limit: q.get("limit").and_then(|l| l.parse().ok()),
        continued: q.get("continue").is_some_and(|c| !c.is_empty()),
        label_selector: q.get("labelSelector").cloned(),
        field_selector: q.get("fieldSelector").cloned(),
        bookmarks: q
            .get("allowWatchBookmarks")
            .is_some_and(|v| v == "true" || v == "1"),
        code,
        user_agent: user_agent.clone(),
        tls,
    };
    let answer = match dispatch(&shared, req, &t, &q).await {
        Ok(a) => a,
        Err((verb, e)) => Answer {
            response: error(&e),
            verb,
        },
    };
    let rec = record(answer.verb, answer.response.status().as_u16());
    lock(&shared.requests).push(rec);
    answer.response
}

fn is_true(q: &HashMap<String, String>, k: &str) -> bool {
    q.get(k).is_some_and(|v| v == "true" || v == "1")
}

fn wants_table(req: &Request<Incoming>) -> bool {
    header_str(req, header::ACCEPT).contains("as=Table")
}

async fn read_body(req: Request<Incoming>) -> Result<(String, Bytes), ApiError> {
    let ct = header_str(&req, header::CONTENT_TYPE).to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?
        .to_bytes();
    Ok((ct, body))
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json: {e}"
        ))
    })
}

fn object_response(code: u16, full: &Bytes) -> Response<Body> {
    respond(code, full.clone())
}

async fn dispatch(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    t: &Target,
    q: &HashMap<String, String>,
) -> Result<Answer, (Verb, ApiError)> {
    let r = &RESOURCES[t.res];
    let ns = t.ns.clone().unwrap_or_default();
    let method = req.method().clone();
    match (&method, &t.name) {
        (&Method::GET, None) if is_true(q, "watch") => {
            watch_collection(shared, t, q).map_err(|e| (Verb::Watch, e))
        }
        (&Method::GET, None) => {
            let table = wants_table(&req);
            list(shared, t, q, table).map_err(|e| (Verb::List, e))
        }
        (&Method::GET, Some(name)) => {
            let key = key(r, &ns, name);
            let store = lock(&shared.store);
            let obj = store
                .get(t.res, &key)
                .cloned()
                .ok_or_else(|| (Verb::Get, ApiError::not_found(r, name)))?;
            drop(store);
            let response = if wants_table(&req) {
                json_response(200, &discovery::table(r, &[&obj], obj.rv, None))
            } else {
                object_response(200, &obj.full)
            };
            Ok(Answer {
                response,
                verb: Verb::Get,
            })
        }
        (&Method::POST, None) => {
            let (ct, body) = read_body(req).await.map_err(|e| (Verb::Create, e))?;
            check_json_type(&ct).map_err(|e| (Verb::Create, e))?;
            let value = parse_json(&body).map_err(|e| (Verb::Create, e))?;
            if r.namespaced && t.ns.is_none() {
                return Err((Verb::Create, ApiError::method_not_allowed()));
            }
            let obj = shared
                .write(|s| s.create(t.res, &ns, value))
                .map_err(|e| (Verb::Create, e))?;
            Ok(Answer {
                response: object_response(201, &obj.full),
                verb: Verb::Create,
            })
        }
        (&Method::PUT, Some(name)) => {
            let (ct, body) = read_body(req).await.map_err(|e| (Verb::Update, e))?;
            check_json_type(&ct).map_err(|e| (Verb::Update, e))?;
            let value = parse_json(&body).map_err(|e| (Verb::Update, e))?;
            let body_name = value
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if !body_name.is_empty() && body_name != *name {
                return Err((
                    Verb::Update,
                    ApiError::bad_request(format!(
                        "the name of the object ({body_name}) does not match the name on the URL ({name})"
                    )),
                ));
            }
            let mut value = value;
            if body_name.is_empty() {
                value["metadata"]["name"] = json!(name);
            }
            let expect = precondition(&value).map_err(|e| (Verb::Update, e))?;
            let part = part(r, t);
            let obj = shared
                .write(|s| s.replace(t.res, &ns, value, part, expect))
                .map_err(|e| (Verb::Update, e))?;
            Ok(Answer {
                response: object_response(200, &obj.full),
                verb: Verb::Update,
            })
        }
        (&Method::PATCH, Some(name)) => {
            let (ct, body) = read_body(req).await.map_err(|e| (Verb::Patch, e))?;
            let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let result = patch_object(shared, t, &ns, name, &ct, &body);
            lock(&shared.patches).push(PatchRecord {
                resource: r.plural,
                namespace: if r.namespaced {
                    ns.clone()
                } else {
                    String::new()
                },
                name: name.clone(),
                subresource: t.sub.clone(),
                content_type: ct,
                body: parsed,
                code: result.as_ref().map_or_else(|e| e.code, |_| 200),
            });
            let full = result.map_err(|e| (Verb::Patch, e))?;
            Ok(Answer {
                response: object_response(200, &full),
                verb: Verb::Patch,
            })
        }
        (&Method::DELETE, Some(name)) if t.sub.is_none() => {
            let (_, body) = read_body(req).await.map_err(|e| (Verb::Delete, e))?;
            let expect = if body.is_empty() {
                None
            } else {
                let opts = parse_json(&body).map_err(|e| (Verb::Delete, e))?;
                match opts
                    .pointer("/preconditions/resourceVersion")
                    .and_then(Value::as_str)
                {
                    Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
                        (Verb::Delete, ApiError::bad_request("invalid precondition"))
                    })?),
                    None => None,
                }
            };
            let key = key(r, &ns, name);
            let obj = shared
                .write(|s| s.delete(t.res, &key, expect))
                .map_err(|e| (Verb::Delete, e))?;
            Ok(Answer {
                response: object_response(200, &obj.full),
                verb: Verb::Delete,
            })
        }
        _ => Err((verb_of(&method, t), ApiError::method_not_allowed())),
    }
}

fn verb_of(method: &Method, t: &Target) -> Verb {
    match (method.as_str(), t.name.is_some()) {
        ("GET", true) => Verb::Get,
        ("GET", false) => Verb::List,
        ("POST", _) => Verb::Create,
        ("PUT", _) => Verb::Update,
        ("PATCH", _) => Verb::Patch,
        _ => Verb::Delete,
    }
}

fn key(r: &Resource, ns: &str, name: &str) -> Key {
    if r.namespaced {
        (ns.to_string(), name.to_string())
    } else {
        (String::new(), name.to_string())
    }
}

fn part(r: &Resource, t: &Target) -> Part {
    match (&t.sub, r.status) {
        (Some(_), _) => Part::Status,
        (None, true) => Part::Main,
        (None, false) => Part::Whole,
    }
}

fn check_json_type(ct: &str) -> Result<(), ApiError> {
    let base = ct.split(';').next().unwrap_or("").trim();
    match base {
        "" | "application/json" | "*/*" => Ok(()),
        other => Err(ApiError::unsupported_media(format!(
            "the body of the request was in an unknown format ({other}) - accepted media types include: application/json"
        ))),
    }
}

fn patch_object(
    shared: &Shared,
    t: &Target,
    ns: &str,
    name: &str,
    ct: &str,
    body: &[u8],
) -> Result<Bytes, ApiError> {
    let r = &RESOURCES[t.res];
    let base = ct.split(';').next().unwrap_or("").trim().to_string();
    if !matches!(
        base.as_str(),
        "application/merge-patch+json"
            | "application/strategic-merge-patch+json"
            | "application/json-patch+json"
    ) {
        return Err(ApiError::unsupported_media(format!(
            "the body of the request was in an unknown format ({base}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
        )));
    }
    let patch = parse_json(body)?;
    let key = key(r, ns, name);
    shared.write(|s| {
        let current = s
            .get(t.res, &key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(r, name))?;
        let mut value = current.value.clone();
        match base.as_str() {
            "application/merge-patch+json" => patch::merge_patch(&mut value, &patch),
            "application/strategic-merge-patch+json" => {
                value =
                    patch::strategic_merge_patch(&value, &patch).map_err(ApiError::bad_request)?;
            }
            _ => patch::json_patch(&mut value, &patch).map_err(|e| {
                ApiError::unprocessable(format!(
                    "the server rejected our request due to an error in our request: {e}"
                ))
            })?,
        }
        if !value.get("metadata").is_some_and(Value::is_object) {
            value["metadata"] = json!({});
        }
        value["metadata"]["name"] = json!(name);
        if r.namespaced {
            value["metadata"]["namespace"] = json!(ns);
        }
        let expect = precondition(&value)?;
        let obj = s.replace(t.res, ns, value, part(r, t), expect)?;
        Ok(obj.full.clone())
    })
}

fn list(
    shared: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
    table: bool,
) -> Result<Answer, ApiError> {
    let r = &RESOURCES[t.res];
    let filter = filter(r, q)?;
    let limit = match q.get("limit").map(String::as_str) {
        None | Some("") => 0,
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
    };
    let cont = q
        .get("continue")
        .map(String::as_str)
        .filter(|c| !c.is_empty());
    let (items, rv, next) =
        lock(&shared.store).list(t.res, t.ns.as_deref(), &filter, limit, cont)?;
    if table {
        let objs: Vec<&super::store::Obj> = items.iter().map(|o| o.as_ref()).collect();
        return Ok(Answer {
            response: json_response(200, &discovery::table(r, &objs, rv, next.as_deref())),
            verb: Verb::List,
        });
    }
    let size: usize = items.iter().map(|o| o.full.len()).sum();
    let mut out = Vec::with_capacity(size + 256);
    out.extend_from_slice(b"{\"apiVersion\":");
    out.extend_from_slice(Value::from(r.api_version()).to_string().as_bytes());
    out.extend_from_slice(b",\"items\":[");
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        o.write_item(&mut out);
    }
    out.extend_from_slice(b"],\"kind\":");
    out.extend_from_slice(
        Value::from(format!("{}List", r.kind))
            .to_string()
            .as_bytes(),
    );
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = next {
        meta["continue"] = json!(c);
    }
    out.extend_from_slice(b",\"metadata\":");
    out.extend_from_slice(meta.to_string().as_bytes());
    out.push(b'}');
    Ok(Answer {
        response: respond(200, Bytes::from(out)),
        verb: Verb::List,
    })
}

fn filter(r: &Resource, q: &HashMap<String, String>) -> Result<Filter, ApiError> {
    Filter::parse(
        r.kind,
        q.get("labelSelector").map_or("", String::as_str),
        q.get("fieldSelector").map_or("", String::as_str),
    )
    .map_err(ApiError::bad_request)
}

fn watch_collection(
    shared: &Arc<Shared>,
    t: &Target,
    q: &HashMap<String, String>,
) -> Result<Answer, ApiError> {
    let r = &RESOURCES[t.res];
    let filter = filter(r, q)?;
    let start = match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => watch::Start::Current,
        Some(rv) => watch::Start::After(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?,
        ),
    };
    let timeout = match q.get("timeoutSeconds").map(String::as_str) {
        None | Some("") => Duration::from_secs(1800),
        Some(s) => Duration::from_secs(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {s:?}")))?,
        ),
    };
    let initial = is_true(q, "sendInitialEvents");
    let start = if initial {
        watch::Start::Current
    } else {
        start
    };
    let stream = watch::spawn(
        shared.clone(),
        watch::Params {
            res: t.res,
            ns: t.ns.clone(),
            filter,
            start,
            bookmarks: is_true(q, "allowWatchBookmarks"),
            initial_events_end: initial && is_true(q, "allowWatchBookmarks"),
            timeout,
        },
    );
    let mut response = Response::new(Body::Stream(stream));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(Answer {
        response,
        verb: Verb::Watch,
    })
}
