//! Watch streams: one task per watch, reading the store's ordered history
//! from its own cursor and writing one JSON event per line.

use std::{
    ops::Bound,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::{sync::mpsc, time::Instant};

use super::{
    Shared, lock,
    resources::RESOURCES,
    select::Filter,
    store::{Event, EventType, Obj},
};

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// `resourceVersion` unset or `0`: ADDED for every current object first.
    Current,
    /// After this resourceVersion, from the history.
    After(u64),
}

/// What a watch asked for.
#[derive(Debug)]
pub struct Params {
    /// Index in `RESOURCES`.
    pub res: usize,
    /// Only this namespace.
    pub ns: Option<String>,
    /// Selectors.
    pub filter: Filter,
    /// Start point.
    pub start: Start,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: a bookmark annotated
    /// `k8s.io/initial-events-end` after the initial ADDED events.
    pub initial_events_end: bool,
    /// `timeoutSeconds`.
    pub timeout: Duration,
}

/// Decrements the open-watch gauge when the task ends however it ends.
struct Gauge(Arc<Shared>, usize);

impl Drop for Gauge {
    fn drop(&mut self) {
        self.0.watching[self.1].fetch_sub(1, Ordering::SeqCst);
    }
}

fn line(out: &mut Vec<u8>, kind: &str, obj: &Obj) {
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(&obj.full);
    out.extend_from_slice(b"}\n");
}

fn value_line(kind: &str, object: Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn expired(rv: u64, oldest: u64) -> Bytes {
    value_line(
        "ERROR",
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("too old resource version: {rv} ({oldest})"),
            "reason": "Expired",
            "code": 410
        }),
    )
}

fn bookmark(res: usize, rv: u64, initial_end: bool) -> Bytes {
    let r = &RESOURCES[res];
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    value_line(
        "BOOKMARK",
        json!({"kind": r.kind, "apiVersion": r.api_version(), "metadata": meta}),
    )
}

/// How an event looks to a watch with `filter` in `ns` (None: not sent).
fn visible(p: &Params, e: &Event) -> Option<&'static str> {
    if e.res != p.res {
        return None;
    }
    let in_ns = |o: &Obj| {
        p.ns.as_deref().is_none_or(|ns| {
            o.value
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                == Some(ns)
        })
    };
    if !in_ns(&e.obj) {
        return None;
    }
    if p.filter.is_empty() {
        return Some(e.kind.as_str());
    }
    let now = p.filter.matches(&e.obj.value);
    let before = e.prev.as_ref().is_some_and(|o| p.filter.matches(&o.value));
    match e.kind {
        EventType::Added => now.then_some("ADDED"),
        EventType::Deleted => before.then_some("DELETED"),
        EventType::Modified => match (before, now) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        },
    }
}

/// The receiving end of a watch: its chunks, and a flag set when the test
/// drops the watch (the body then fails, which aborts the connection).
pub struct Stream {
    /// Chunks (each whole lines).
    pub rx: mpsc::Receiver<Bytes>,
    /// Set by [`super::ApiServer::drop_watches`].
    pub aborted: Arc<AtomicBool>,
}

/// Starts the watch task; returns the receiving end of its stream.
pub fn spawn(shared: Arc<Shared>, p: Params) -> Stream {
    let (tx, rx) = mpsc::channel(16);
    let aborted = Arc::new(AtomicBool::new(false));
    shared.watching[p.res].fetch_add(1, Ordering::SeqCst);
    let gauge = Gauge(shared.clone(), p.res);
    // Subscribed before the response goes out: a drop_watches() after
    // the client saw the headers always reaches this watch.
    let drop_rx = shared.drop_tx.subscribe();
    let flag = aborted.clone();
    tokio::spawn(async move {
        let _gauge = gauge;
        let mut out = Out { tx, drop_rx };
        if run(&shared, &p, &mut out).await == Flow::Aborted {
            flag.store(true, Ordering::SeqCst);
        }
    });
    Stream { rx, aborted }
}

#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Go,
    Stop,
    Aborted,
}

/// The sending side, which gives up when the test drops watches.
struct Out {
    tx: mpsc::Sender<Bytes>,
    drop_rx: tokio::sync::watch::Receiver<u64>,
}

impl Out {
    async fn send(&mut self, data: Bytes) -> Flow {
        if data.is_empty() {
            return Flow::Go;
        }
        tokio::select! {
            r = self.tx.send(data) => if r.is_ok() { Flow::Go } else { Flow::Stop },
            _ = self.drop_rx.changed() => Flow::Aborted,
        }
    }
}

macro_rules! send {
    ($out:expr, $data:expr) => {
        match $out.send($data).await {
            Flow::Go => {}
            other => return other,
        }
    };
}

async fn run(shared: &Shared, p: &Params, out: &mut Out) -> Flow {
    let mut rv_rx = shared.rv_tx.subscribe();
    let deadline = Instant::now() + p.timeout;
    let every = *lock(&shared.bookmark_interval);
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    // The initial state.
    let (first, mut cursor) = {
        rv_rx.borrow_and_update();
        let store = lock(&shared.store);
        match p.start {
            Start::After(rv) if rv < store.oldest => (Err(expired(rv, store.oldest)), rv),
            Start::After(rv) => (Ok(Vec::new()), rv),
            Start::Current => {
                let lower = match &p.ns {
                    Some(ns) => Bound::Included((ns.clone(), String::new())),
                    None => Bound::Unbounded,
                };
                let mut out = Vec::new();
                for (k, o) in store.maps[p.res].range((lower, Bound::Unbounded)) {
                    if p.ns.as_deref().is_some_and(|ns| k.0 != ns) {
                        break;
                    }
                    if p.filter.is_empty() || p.filter.matches(&o.value) {
                        line(&mut out, "ADDED", o);
                    }
                }
                (Ok(out), store.rv)
            }
        }
    };
    match first {
        Err(e) => {
            send!(out, e);
            return Flow::Stop;
        }
        Ok(bytes) => send!(out, Bytes::from(bytes)),
    }
    if p.initial_events_end {
        send!(out, bookmark(p.res, cursor, true));
    }

    loop {
        let chunk = {
            rv_rx.borrow_and_update();
            let store = lock(&shared.store);
            if cursor < store.oldest {
                Err(expired(cursor, store.oldest))
            } else {
                let from = store.history.partition_point(|e| e.rv <= cursor);
                let mut bytes = Vec::new();
                for e in store.history.range(from..) {
                    if let Some(kind) = visible(p, e) {
                        line(&mut bytes, kind, &e.obj);
                    }
                }
                cursor = cursor.max(store.rv);
                Ok(bytes)
            }
        };
        match chunk {
            Err(e) => {
                send!(out, e);
                return Flow::Stop;
            }
            Ok(bytes) => send!(out, Bytes::from(bytes)),
        }
        tokio::select! {
            changed = rv_rx.changed() => {
                if changed.is_err() {
                    return Flow::Stop;
                }
            }
            _ = tick.tick(), if p.bookmarks => send!(out, bookmark(p.res, cursor, false)),
            () = tokio::time::sleep_until(deadline) => return Flow::Stop,
            _ = out.drop_rx.changed() => return Flow::Aborted,
            () = out.tx.closed() => return Flow::Stop,
        }
    }
}
