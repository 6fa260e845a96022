//! Objects, the resourceVersion counter, the event history and list
//! snapshots — the part of the API server that etcd and the watch cache
//! are in the real one.
//!
//! One counter numbers every write of every resource (etcd's revision).
//! Each object is kept serialized once per write ([`Obj::full`]); lists
//! and watch events are built by concatenating those bytes. The objects
//! of a resource are a persistent ordered map keyed by (namespace, name),
//! so a list snapshot for a `continue` token is an O(1) copy and a page is
//! a range read. The history is one ordered queue of every write; a watch
//! reads it from its own cursor, so it can neither miss nor reorder events.

use std::{
    collections::VecDeque,
    ops::Bound,
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use imbl::OrdMap;
use serde_json::{Map, Value, json};

use super::{
    resources::{RESOURCES, Resource},
    select::Filter,
};

/// (namespace, name); the namespace is empty for cluster-scoped objects.
pub type Key = (String, String);

/// An error the API answers with a `Status` object.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `reason` (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details`, if any.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, res: &Resource, name: &str) -> Self {
        let mut d = json!({"kind": res.plural});
        if !name.is_empty() {
            d["name"] = json!(name);
        }
        if !res.group.is_empty() {
            d["group"] = json!(res.group);
        }
        self.details = Some(d);
        self
    }

    /// 404 NotFound for an object.
    pub fn not_found(res: &Resource, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(res)),
        )
        .with_details(res, name)
    }

    /// 404 NotFound for a path.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 409 AlreadyExists.
    pub fn already_exists(res: &Resource, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(res)),
        )
        .with_details(res, name)
    }

    /// 409 Conflict: a stale resourceVersion.
    pub fn conflict(res: &Resource, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(res)
            ),
        )
        .with_details(res, name)
    }

    /// 422 Invalid with one cause.
    pub fn invalid(res: &Resource, name: &str, field: &str, message: &str) -> Self {
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {field}: {message}", res.kind),
        );
        let mut d = json!({"kind": res.kind, "causes": [
            {"reason": "FieldValueInvalid", "message": message, "field": field}
        ]});
        if !name.is_empty() {
            d["name"] = json!(name);
        }
        if !res.group.is_empty() {
            d["group"] = json!(res.group);
        }
        e.details = Some(d);
        e
    }

    /// 422 Invalid without a field (a patch that cannot be applied).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 410 Expired (a continue token or resourceVersion older than the
    /// retained history).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

/// `nodes` or `endpointslices.discovery.k8s.io`, as messages name them.
fn qualified(res: &Resource) -> String {
    if res.group.is_empty() {
        res.plural.to_string()
    } else {
        format!("{}.{}", res.plural, res.group)
    }
}

/// One stored version of an object.
#[derive(Debug)]
pub struct Obj {
    /// The object (with `kind` and `apiVersion`).
    pub value: Value,
    /// `value` serialized (keys sorted: `apiVersion`, `kind`, `metadata`, ...).
    pub full: Bytes,
    /// Offset in `full` of the first key after `kind`: a list item (which
    /// the API server sends without `kind` and `apiVersion`) is `{` +
    /// `full[item_at..]`.
    pub item_at: usize,
    /// Its resourceVersion.
    pub rv: u64,
}

impl Obj {
    fn new(res: &Resource, mut value: Value, rv: u64) -> Self {
        if let Some(m) = value.as_object_mut() {
            m.remove("kind");
            m.remove("apiVersion");
        }
        let body = serde_json::to_vec(&value).unwrap_or_else(|_| b"{}".to_vec());
        let head = format!(
            "{{\"apiVersion\":{},\"kind\":{}",
            Value::from(res.api_version()),
            Value::from(res.kind)
        );
        let mut full = Vec::with_capacity(head.len() + body.len() + 1);
        full.extend_from_slice(head.as_bytes());
        let item_at = if body.len() > 2 {
            full.push(b',');
            full.len()
        } else {
            full.len()
        };
        full.extend_from_slice(body.get(1..).unwrap_or(b"}"));
        if let Some(m) = value.as_object_mut() {
            m.insert("apiVersion".into(), Value::from(res.api_version()));
            m.insert("kind".into(), Value::from(res.kind));
        }
        Self {
            value,
            full: Bytes::from(full),
            item_at,
            rv,
        }
    }

    /// Appends the object as a list item (without kind and apiVersion).
    pub fn write_item(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        out.extend_from_slice(self.full.get(self.item_at..).unwrap_or(b"}"));
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        self.value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Replaced or patched.
    Modified,
    /// Deleted.
    Deleted,
}

impl EventType {
    /// `ADDED`, `MODIFIED`, `DELETED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One write in the history.
#[derive(Debug, Clone)]
pub struct Event {
    /// The resourceVersion the write made.
    pub rv: u64,
    /// Index in [`RESOURCES`].
    pub res: usize,
    /// What happened.
    pub kind: EventType,
    /// The object after the write (for a deletion: the last version, with
    /// the deletion's resourceVersion).
    pub obj: Arc<Obj>,
    /// The object before the write (for selectors: an object that stops
    /// matching is a DELETED event to that watch).
    pub prev: Option<Arc<Obj>>,
}

/// Which part of an existing object a write replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Everything but `status` (the main resource of a resource with a
    /// status subresource).
    Main,
    /// Only `status` (the `/status` subresource).
    Status,
    /// Everything (the test hooks; resources without a status subresource).
    Whole,
}

/// One page of a list: items, the list's resourceVersion, the next
/// continue token.
pub type Page = (Vec<Arc<Obj>>, u64, Option<String>);

/// A frozen list for continue tokens.
#[derive(Debug)]
struct Snapshot {
    id: u64,
    rv: u64,
    res: usize,
    map: OrdMap<Key, Arc<Obj>>,
}

/// Snapshots kept for continue tokens (the oldest go first).
const MAX_SNAPSHOTS: usize = 64;

/// The objects and their history.
#[derive(Debug)]
pub struct Store {
    /// The current resourceVersion (the last write's).
    pub rv: u64,
    /// The history holds every write after this resourceVersion.
    pub oldest: u64,
    /// Objects per resource (index in [`RESOURCES`]).
    pub maps: Vec<OrdMap<Key, Arc<Obj>>>,
    /// Every write after `oldest`, in order.
    pub history: VecDeque<Event>,
    /// History entries kept at most (the oldest are compacted away).
    pub history_limit: usize,
    snapshots: VecDeque<Snapshot>,
    next_id: u64,
}

/// The current time as RFC 3339 (`2026-12-01T10:00:00Z`).
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_rfc3339(secs)
}

/// Seconds since the epoch as RFC 3339 in UTC.
pub fn format_rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parses `YYYY-MM-DDTHH:MM:SSZ` into seconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

/// A random-looking UUID (v4 layout) from the clock and a sequence.
fn uuid(seq: u64) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mix = |mut x: u64| {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    };
    let a = mix(nanos ^ seq.rotate_left(32));
    let b = mix(a ^ seq);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

/// Whether `name` is a valid object name (a DNS subdomain).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
        && name
            .bytes()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric())
}

/// `value` without `metadata` and `status`: what `generation` counts.
fn spec_of(value: &Value) -> Map<String, Value> {
    let mut m = value.as_object().cloned().unwrap_or_default();
    for k in ["metadata", "status", "kind", "apiVersion"] {
        m.remove(k);
    }
    m
}

fn meta_str<'a>(value: &'a Value, field: &str) -> &'a str {
    value
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The resourceVersion a write carries as a precondition, if any.
pub fn precondition(value: &Value) -> Result<Option<u64>, ApiError> {
    match meta_str(value, "resourceVersion") {
        "" => Ok(None),
        s => s.parse().map(Some).map_err(|_| {
            ApiError::bad_request(format!("invalid resourceVersion {s:?} in metadata"))
        }),
    }
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    /// An empty store at resourceVersion 1.
    pub fn new() -> Self {
        Self {
            rv: 1,
            oldest: 1,
            maps: RESOURCES.iter().map(|_| OrdMap::new()).collect(),
            history: VecDeque::new(),
            history_limit: 1_000_000,
            snapshots: VecDeque::new(),
            next_id: 1,
        }
    }

    /// The object `key` of resource `res`.
    pub fn get(&self, res: usize, key: &Key) -> Option<&Arc<Obj>> {
        self.maps.get(res)?.get(key)
    }

    /// Records a write: new resourceVersion, object stored (or removed),
    /// history appended.
    fn commit(
        &mut self,
        res: usize,
        key: Key,
        mut value: Value,
        kind: EventType,
        prev: Option<Arc<Obj>>,
    ) -> Arc<Obj> {
        self.rv += 1;
        let rv = self.rv;
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::from(rv.to_string()));
        }
        let obj = Arc::new(Obj::new(&RESOURCES[res], value, rv));
        if kind == EventType::Deleted {
            self.maps[res].remove(&key);
        } else {
            self.maps[res].insert(key, obj.clone());
        }
        self.history.push_back(Event {
            rv,
            res,
            kind,
            obj: obj.clone(),
            prev,
        });
        while self.history.len() > self.history_limit {
            if let Some(e) = self.history.pop_front() {
                self.oldest = e.rv;
            }
        }
        obj
    }

    /// Checks and completes `value` (an object of `res` in namespace `ns`)
    /// for storage; returns its key.
    fn prepare(&self, res: usize, ns: &str, value: &mut Value) -> Result<Key, ApiError> {
        let r = &RESOURCES[res];
        let Some(obj) = value.as_object_mut() else {
            return Err(ApiError::bad_request("the object is not a JSON object"));
        };
        for (field, want) in [
            ("kind", r.kind.to_string()),
            ("apiVersion", r.api_version()),
        ] {
            match obj.get(field).and_then(Value::as_str) {
                None => {}
                Some(s) if s == want => {}
                Some(s) => {
                    return Err(ApiError::bad_request(format!(
                        "the {field} of the object ({s}) does not match the resource ({want})"
                    )));
                }
            }
        }
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        let Some(meta) = meta.as_object_mut() else {
            return Err(ApiError::bad_request("metadata is not an object"));
        };
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            return Err(ApiError::invalid(
                r,
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            ));
        }
        if !valid_name(&name) {
            return Err(ApiError::invalid(
                r,
                &name,
                "metadata.name",
                &format!(
                    "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            ));
        }
        if r.namespaced {
            let body_ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            if ns.is_empty() {
                return Err(ApiError::bad_request(
                    "a namespaced object needs a namespace",
                ));
            }
            meta.insert("namespace".into(), Value::from(ns));
            Ok((ns.to_string(), name))
        } else {
            meta.remove("namespace");
            Ok((String::new(), name))
        }
    }

    /// Creates an object; 409 AlreadyExists if it exists.
    pub fn create(&mut self, res: usize, ns: &str, mut value: Value) -> Result<Arc<Obj>, ApiError> {
        let r = &RESOURCES[res];
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            let name = meta.get("name").and_then(Value::as_str).unwrap_or("");
            let generate = meta
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if name.is_empty() && !generate.is_empty() {
                let suffix: String = uuid(self.next_id)
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .take(5)
                    .collect();
                meta.insert("name".into(), Value::from(format!("{generate}{suffix}")));
            }
        }
        let key = self.prepare(res, ns, &mut value)?;
        if self.maps[res].contains_key(&key) {
            return Err(ApiError::already_exists(r, &key.1));
        }
        self.next_id += 1;
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("uid".into(), Value::from(uuid(self.next_id)));
            meta.insert("creationTimestamp".into(), Value::from(now_rfc3339()));
            meta.insert("generation".into(), Value::from(1));
            meta.remove("deletionTimestamp");
        }
        Ok(self.commit(res, key, value, EventType::Added, None))
    }

    /// Replaces `part` of an existing object (404 if there is none; 409
    /// if `expect_rv` is not its resourceVersion).
    pub fn replace(
        &mut self,
        res: usize,
        ns: &str,
        mut value: Value,
        part: Part,
        expect_rv: Option<u64>,
    ) -> Result<Arc<Obj>, ApiError> {
        let r = &RESOURCES[res];
        let key = self.prepare(res, ns, &mut value)?;
        let Some(old) = self.maps[res].get(&key).cloned() else {
            return Err(ApiError::not_found(r, &key.1));
        };
        if expect_rv.is_some_and(|rv| rv != old.rv) {
            return Err(ApiError::conflict(r, &key.1));
        }
        let mut new = match part {
            Part::Status => {
                let mut v = old.value.clone();
                match value.get("status") {
                    Some(s) => v["status"] = s.clone(),
                    None => {
                        if let Some(m) = v.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                v
            }
            Part::Main | Part::Whole => {
                if part == Part::Main
                    && r.status
                    && let Some(m) = value.as_object_mut()
                {
                    match old.value.get("status") {
                        Some(s) => m.insert("status".into(), s.clone()),
                        None => m.remove("status"),
                    };
                }
                // Fields the server owns.
                for field in ["uid", "creationTimestamp", "generation"] {
                    if let Some(v) = old.value.get("metadata").and_then(|m| m.get(field)) {
                        value["metadata"][field] = v.clone();
                    }
                }
                value
            }
        };
        let generation = old
            .value
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let generation = if spec_of(&new) != spec_of(&old.value) {
            generation + 1
        } else {
            generation
        };
        new["metadata"]["generation"] = Value::from(generation);
        new["metadata"]["resourceVersion"] = Value::from(old.rv.to_string());
        new["kind"] = Value::from(r.kind);
        new["apiVersion"] = Value::from(r.api_version());
        if new == old.value {
            // A write that changes nothing does not make a new version.
            return Ok(old);
        }
        Ok(self.commit(res, key, new, EventType::Modified, Some(old)))
    }

    /// Creates or replaces the whole object (test hooks).
    pub fn apply(&mut self, res: usize, value: Value) -> Result<Arc<Obj>, ApiError> {
        let ns = meta_str(&value, "namespace").to_string();
        let ns = if RESOURCES[res].namespaced && ns.is_empty() {
            "default".to_string()
        } else {
            ns
        };
        let key: Key = if RESOURCES[res].namespaced {
            (ns.clone(), meta_str(&value, "name").to_string())
        } else {
            (String::new(), meta_str(&value, "name").to_string())
        };
        if self.maps[res].contains_key(&key) {
            self.replace(res, &ns, value, Part::Whole, None)
        } else {
            self.create(res, &ns, value)
        }
    }

    /// Deletes an object (404 if there is none; 409 if `expect_rv` is not
    /// its resourceVersion). Deleting a namespace deletes what is in it.
    pub fn delete(
        &mut self,
        res: usize,
        key: &Key,
        expect_rv: Option<u64>,
    ) -> Result<Arc<Obj>, ApiError> {
        let r = &RESOURCES[res];
        let Some(old) = self.maps[res].get(key).cloned() else {
            return Err(ApiError::not_found(r, &key.1));
        };
        if expect_rv.is_some_and(|rv| rv != old.rv) {
            return Err(ApiError::conflict(r, &key.1));
        }
        if r.kind == "Namespace" {
            for (i, inner) in RESOURCES.iter().enumerate() {
                if !inner.namespaced {
                    continue;
                }
                let keys: Vec<Key> = self.maps[i]
                    .range((
                        Bound::Included((key.1.clone(), String::new())),
                        Bound::Unbounded,
                    ))
                    .take_while(|(k, _)| k.0 == key.1)
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in keys {
                    if let Some(o) = self.maps[i].get(&k).cloned() {
                        self.commit(i, k, o.value.clone(), EventType::Deleted, Some(o));
                    }
                }
            }
        }
        Ok(self.commit(
            res,
            key.clone(),
            old.value.clone(),
            EventType::Deleted,
            Some(old),
        ))
    }

    /// Drops the history up to now: a watch or continue token from an
    /// older resourceVersion gets 410 Expired.
    pub fn compact(&mut self) {
        self.history.clear();
        self.snapshots.clear();
        self.oldest = self.rv;
    }

    /// One page of a list: the objects of `res` (in namespace `ns`, or all)
    /// that `filter` selects, at most `limit` (0: all), after the position
    /// a `continue` token names. Returns the items, the list's
    /// resourceVersion and the next continue token.
    pub fn list(
        &mut self,
        res: usize,
        ns: Option<&str>,
        filter: &Filter,
        limit: usize,
        cont: Option<&str>,
    ) -> Result<Page, ApiError> {
        let (id, rv, map, after) = match cont {
            Some(token) => {
                let (rv, id, key) = decode_continue(token)?;
                if rv < self.oldest {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    ));
                }
                let snap = self
                    .snapshots
                    .iter()
                    .find(|s| s.id == id && s.res == res)
                    .ok_or_else(|| {
                        ApiError::expired(
                            "The provided continue parameter is too old to display a consistent list result.",
                        )
                    })?;
                (id, snap.rv, snap.map.clone(), Some(key))
            }
            None => (0, self.rv, self.maps[res].clone(), None),
        };
        let lower = match (&after, ns) {
            (Some(k), _) => Bound::Excluded(k.clone()),
            (None, Some(ns)) => Bound::Included((ns.to_string(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut items = Vec::new();
        let mut next = None;
        let mut iter = map
            .range((lower, Bound::Unbounded))
            .take_while(|(k, _)| ns.is_none_or(|ns| k.0 == ns));
        for (k, o) in iter.by_ref() {
            if filter.is_empty() || filter.matches(&o.value) {
                items.push(o.clone());
                if limit > 0 && items.len() == limit {
                    next = Some(k.clone());
                    break;
                }
            }
        }
        let token = match next {
            Some(k) if iter.next().is_some() => {
                let id = if id == 0 {
                    self.next_id += 1;
                    let id = self.next_id;
                    self.snapshots.push_back(Snapshot { id, rv, res, map });
                    if self.snapshots.len() > MAX_SNAPSHOTS {
                        self.snapshots.pop_front();
                    }
                    id
                } else {
                    id
                };
                Some(encode_continue(rv, id, &k))
            }
            _ => None,
        };
        Ok((items, rv, token))
    }
}

fn encode_continue(rv: u64, id: u64, key: &Key) -> String {
    let raw = format!("{rv}:{id}:{}:{}", key.0, key.1);
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Result<(u64, u64, Key), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..token.len())
        .step_by(2)
        .map(|i| {
            token
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    let raw = String::from_utf8(bytes).map_err(|_| bad())?;
    let mut parts = raw.splitn(4, ':');
    let rv = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let id = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let ns = parts.next().ok_or_else(bad)?.to_string();
    let name = parts.next().ok_or_else(bad)?.to_string();
    Ok((rv, id, (ns, name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_round_trip() {
        let s = format_rfc3339(1_795_000_000);
        assert_eq!(parse_rfc3339(&s), Some(1_795_000_000), "{s}");
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(parse_rfc3339("2026-12-01T00:00:00Z"), Some(1_796_083_200));
    }

    #[test]
    fn item_bytes_drop_kind() {
        let o = Obj::new(
            &RESOURCES[1],
            json!({"kind": "Node", "metadata": {"name": "a"}}),
            5,
        );
        let full: Value = serde_json::from_slice(&o.full).expect("full");
        assert_eq!(full["kind"], "Node");
        assert_eq!(full["apiVersion"], "v1");
        let mut item = Vec::new();
        o.write_item(&mut item);
        let item: Value = serde_json::from_slice(&item).expect("item");
        assert_eq!(item, json!({"metadata": {"name": "a"}}));
    }

    #[test]
    fn continue_token_round_trip() {
        let t = encode_continue(7, 3, &("ns".into(), "a.b".into()));
        let (rv, id, k) = decode_continue(&t).expect("decode");
        assert_eq!((rv, id, k), (7, 3, ("ns".to_string(), "a.b".to_string())));
        assert!(decode_continue("zz").is_err());
    }
}
