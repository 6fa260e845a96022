//! The Kubernetes objects the agent keeps: `v1 Service`,
//! `discovery.k8s.io/v1 EndpointSlice`, `v1 Namespace`, `v1 Pod` and
//! `networking.k8s.io/v1 NetworkPolicy`, as Kubernetes serializes them
//! (the `k8s-openapi` types). Services and EndpointSlices feed the
//! Services datapath; the others are kept for NetworkPolicy.
//!
//! One parser for every source ([`parse`]): a document's text — JSON or
//! YAML, one object, a `List` (or `ServiceList`, …), several YAML documents
//! separated by `---` — becomes validated [`Object`]s ([`validate`]: names,
//! Service and EndpointSlice fields, the defaults the API server applies).
//! An error names the object and the field path
//! (`Service default/web: items[2].spec.ports[0].port: …`); a document with
//! any invalid object yields none.
//!
//! In memory an [`ObjectSet`] holds EndpointSlices packed ([`SliceObject`]:
//! their metadata typed, the rest as JSON text read again when their
//! Service is planned), the other kinds typed.
//!
//! [`ObjectStore`] ([`store`]) keeps them durably in the agent's state
//! directory, one file per object, the object as Kubernetes JSON:
//!
//! ```text
//! <state_dir>/objects/
//!   services/<namespace>/<name>.json
//!   endpointslices/<namespace>/<name>.json
//!   namespaces/<name>.json
//!   pods/<namespace>/<name>.json
//!   networkpolicies/<namespace>/<name>.json
//! ```
//!
//! Files are written atomically and synced (temporary file, fsync, rename,
//! directory fsync); a removal is an unlink and a directory fsync. At start
//! every file is read back; one that does not parse or validate is logged
//! and skipped. A change takes two steps, so that the agent can check it
//! against the datapath before anything is written: `stage_apply` /
//! `stage_delete` compute the resulting [`ObjectSet`] and each object's
//! [`Outcome`] (created, configured, unchanged, deleted, not found) without
//! touching the store; `commit` writes the files and swaps the set. An
//! object equal to the stored one is `unchanged` and not rewritten. Like the
//! API server, the store stamps `metadata.uid` and
//! `metadata.creationTimestamp` at creation and keeps them across
//! re-applies.

pub mod parse;
pub mod store;
pub mod validate;

use std::{borrow::Cow, fmt, sync::Arc};

use k8s_openapi::{
    api::{
        core::v1::{Namespace, Pod, Service},
        discovery::v1::EndpointSlice,
        networking::v1::NetworkPolicy,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

pub use self::{
    parse::{fit_lists, parse_document, parse_keys, parse_object, parse_object_text},
    store::{ObjectStore, ObjectStoreError, Outcome, Staged},
    validate::validate,
};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The kinds of object rivet keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `v1 Namespace` (cluster-scoped).
    Namespace,
    /// `v1 Service`.
    Service,
    /// `discovery.k8s.io/v1 EndpointSlice`.
    EndpointSlice,
    /// `v1 Pod`.
    Pod,
    /// `networking.k8s.io/v1 NetworkPolicy`.
    NetworkPolicy,
}

/// Names `rivetctl get` (and the API's `get`) accepts for a kind, as
/// kubectl does: plural, singular, short name, the kind itself (any case),
/// and `plural.group` for grouped kinds.
const USER_NAMES: &[(Kind, &[&str])] = &[
    (Kind::Namespace, &["namespaces", "namespace", "ns"]),
    (Kind::Service, &["services", "service", "svc"]),
    (
        Kind::EndpointSlice,
        &[
            "endpointslices",
            "endpointslice",
            "endpointslices.discovery.k8s.io",
        ],
    ),
    (Kind::Pod, &["pods", "pod", "po"]),
    (
        Kind::NetworkPolicy,
        &[
            "networkpolicies",
            "networkpolicy",
            "netpol",
            "networkpolicies.networking.k8s.io",
        ],
    ),
];

/// A kind name that is none of rivet's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown kind {0:?}: rivet keeps services (svc), endpointslices, namespaces (ns), pods (po) and networkpolicies (netpol)"
)]
pub struct UnknownKind(pub String);

impl Kind {
    /// Every kind, in the order listings show them.
    pub const ALL: [Self; 5] = [
        Self::Namespace,
        Self::Service,
        Self::EndpointSlice,
        Self::Pod,
        Self::NetworkPolicy,
    ];

    /// Its `kind` field.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Namespace => "Namespace",
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Pod => "Pod",
            Self::NetworkPolicy => "NetworkPolicy",
        }
    }

    /// Its `apiVersion` field.
    pub const fn api_version(self) -> &'static str {
        match self {
            Self::Namespace | Self::Service | Self::Pod => "v1",
            Self::EndpointSlice => "discovery.k8s.io/v1",
            Self::NetworkPolicy => "networking.k8s.io/v1",
        }
    }

    /// Its resource name (plural, lowercase): the directory of its files.
    pub const fn plural(self) -> &'static str {
        match self {
            Self::Namespace => "namespaces",
            Self::Service => "services",
            Self::EndpointSlice => "endpointslices",
            Self::Pod => "pods",
            Self::NetworkPolicy => "networkpolicies",
        }
    }

    /// Whether its objects live in a namespace.
    pub const fn namespaced(self) -> bool {
        !matches!(self, Self::Namespace)
    }

    /// The kind of `kind` (the field), in any `apiVersion`.
    pub fn from_name(kind: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == kind)
    }

    /// The kind a user named (see [`USER_NAMES`]); the error lists the
    /// names accepted.
    pub fn from_user(name: &str) -> Result<Self, UnknownKind> {
        let lower = name.to_ascii_lowercase();
        USER_NAMES
            .iter()
            .find(|(kind, names)| {
                names.contains(&lower.as_str()) || kind.name().eq_ignore_ascii_case(name)
            })
            .map(|(kind, _)| *kind)
            .ok_or_else(|| UnknownKind(name.to_owned()))
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What names an object: kind, namespace (empty for a Namespace), name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace; empty for cluster-scoped kinds.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ObjectKey {
    /// A key; `namespace` is dropped for cluster-scoped kinds.
    pub fn new(kind: Kind, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        let namespace = if kind.namespaced() {
            namespace.into()
        } else {
            String::new()
        };
        Self {
            kind,
            namespace,
            name: name.into(),
        }
    }
}

/// `Service default/web`, `Namespace prod`.
impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind.namespaced() {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        } else {
            write!(f, "{} {}", self.kind, self.name)
        }
    }
}

/// One object of a kind rivet keeps.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// A Namespace.
    Namespace(Box<Namespace>),
    /// A Service.
    Service(Box<Service>),
    /// An EndpointSlice (packed once it is in an [`ObjectSet`]).
    EndpointSlice(SliceObject),
    /// A Pod.
    Pod(Box<Pod>),
    /// A NetworkPolicy.
    NetworkPolicy(Box<NetworkPolicy>),
}

impl Object {
    /// Its kind.
    pub const fn kind(&self) -> Kind {
        match self {
            Self::Namespace(_) => Kind::Namespace,
            Self::Service(_) => Kind::Service,
            Self::EndpointSlice(_) => Kind::EndpointSlice,
            Self::Pod(_) => Kind::Pod,
            Self::NetworkPolicy(_) => Kind::NetworkPolicy,
        }
    }

    /// Its metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Self::Namespace(o) => &o.metadata,
            Self::Service(o) => &o.metadata,
            Self::EndpointSlice(o) => o.metadata(),
            Self::Pod(o) => &o.metadata,
            Self::NetworkPolicy(o) => &o.metadata,
        }
    }

    /// Its metadata, to change.
    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Namespace(o) => &mut o.metadata,
            Self::Service(o) => &mut o.metadata,
            Self::EndpointSlice(o) => o.metadata_mut(),
            Self::Pod(o) => &mut o.metadata,
            Self::NetworkPolicy(o) => &mut o.metadata,
        }
    }

    /// Its key (a validated object has its name and, when namespaced, its
    /// namespace; missing ones are empty here).
    pub fn key(&self) -> ObjectKey {
        let meta = self.metadata();
        ObjectKey::new(
            self.kind(),
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    }

    /// As Kubernetes serializes it (with `apiVersion` and `kind`).
    pub fn to_json(&self) -> serde_json::Value {
        // The k8s-openapi types serialize to JSON without failing (string
        // keys only); Null would only stand for a broken type.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// The Service, if it is one.
    pub fn as_service(&self) -> Option<&Service> {
        match self {
            Self::Service(s) => Some(s),
            _ => None,
        }
    }

    /// The EndpointSlice, if it is one (read from its text when packed).
    pub fn as_endpoint_slice(&self) -> Option<Cow<'_, EndpointSlice>> {
        match self {
            Self::EndpointSlice(s) => Some(s.open()),
            _ => None,
        }
    }

    /// The same object as an [`ObjectSet`] keeps it (an EndpointSlice
    /// packed).
    #[must_use]
    pub fn packed(self) -> Self {
        match self {
            Self::EndpointSlice(s) => Self::EndpointSlice(s.pack()),
            other => other,
        }
    }

    /// The Namespace, if it is one.
    pub fn as_namespace(&self) -> Option<&Namespace> {
        match self {
            Self::Namespace(n) => Some(n),
            _ => None,
        }
    }

    /// The Pod, if it is one.
    pub fn as_pod(&self) -> Option<&Pod> {
        match self {
            Self::Pod(p) => Some(p),
            _ => None,
        }
    }

    /// The NetworkPolicy, if it is one.
    pub fn as_network_policy(&self) -> Option<&NetworkPolicy> {
        match self {
            Self::NetworkPolicy(p) => Some(p),
            _ => None,
        }
    }
}

/// An EndpointSlice as the agent holds it. Read from a document or the
/// API server it is the typed object (`Open`: validated, defaulted);
/// kept in an [`ObjectSet`] it is `Packed`: its metadata typed (keys,
/// the Service label and the store's stamps read it) and the rest as the
/// JSON text the typed object serializes to, read again when the Service
/// is planned. A typed `Endpoint` takes 352 bytes before its strings; 10
/// endpoints as text take about 700. 10,000 EndpointSlices of 10 endpoints
/// held 40 MB of the agent's heap typed (heaptrack, 2026-12-03).
#[derive(Clone, Debug)]
pub enum SliceObject {
    /// The typed object.
    Open(Box<EndpointSlice>),
    /// Its metadata and the rest as JSON text.
    Packed(Box<PackedSlice>),
}

/// A packed EndpointSlice: see [`SliceObject`].
#[derive(Clone, Debug, PartialEq)]
pub struct PackedSlice {
    metadata: ObjectMeta,
    /// The object serialized with empty metadata.
    body: Box<str>,
}

impl SliceObject {
    /// Its metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Self::Open(s) => &s.metadata,
            Self::Packed(p) => &p.metadata,
        }
    }

    /// Its metadata, to change.
    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Open(s) => &mut s.metadata,
            Self::Packed(p) => &mut p.metadata,
        }
    }

    /// The typed object: borrowed when open, read from the text when
    /// packed.
    pub fn open(&self) -> Cow<'_, EndpointSlice> {
        match self {
            Self::Open(s) => Cow::Borrowed(s),
            Self::Packed(p) => Cow::Owned(p.unpack()),
        }
    }

    /// The typed object, to change (a packed one is opened).
    pub fn open_mut(&mut self) -> &mut EndpointSlice {
        if let Self::Packed(p) = self {
            *self = Self::Open(Box::new(p.unpack()));
        }
        match self {
            Self::Open(s) => s,
            Self::Packed(_) => unreachable!("opened above"),
        }
    }

    /// The packed form.
    #[must_use]
    pub fn pack(self) -> Self {
        match self {
            Self::Open(mut s) => {
                let metadata = std::mem::take(&mut s.metadata);
                Self::Packed(Box::new(PackedSlice {
                    metadata,
                    body: serde_json::to_string(&*s)
                        .unwrap_or_default()
                        .into_boxed_str(),
                }))
            }
            packed => packed,
        }
    }
}

impl PackedSlice {
    /// The typed object again. The text is what a validated object
    /// serialized to, so it reads back; if it ever did not, the slice is
    /// said in the log and serves no endpoint.
    fn unpack(&self) -> EndpointSlice {
        let mut slice = serde_json::from_str::<EndpointSlice>(&self.body).unwrap_or_else(|e| {
            tracing::error!(error = %e, name = ?self.metadata.name, "a packed EndpointSlice does not read back");
            EndpointSlice::default()
        });
        slice.metadata = self.metadata.clone();
        slice
    }
}

impl From<EndpointSlice> for SliceObject {
    fn from(slice: EndpointSlice) -> Self {
        Self::Open(Box::new(slice))
    }
}

/// Equal when they hold the same object, packed or not.
impl PartialEq for SliceObject {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Open(a), Self::Open(b)) => a == b,
            (Self::Packed(a), Self::Packed(b)) => a == b,
            (open @ Self::Open(_), Self::Packed(p)) | (Self::Packed(p), open @ Self::Open(_)) => {
                match open.clone().pack() {
                    Self::Packed(q) => *q == **p,
                    Self::Open(_) => false,
                }
            }
        }
    }
}

impl serde::Serialize for SliceObject {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.open().serialize(s)
    }
}

impl serde::Serialize for Object {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Namespace(o) => o.serialize(s),
            Self::Service(o) => o.serialize(s),
            Self::EndpointSlice(o) => o.serialize(s),
            Self::Pod(o) => o.serialize(s),
            Self::NetworkPolicy(o) => o.serialize(s),
        }
    }
}

/// A set of objects by key, in key order (kind, namespace, name). Its maps
/// are persistent: a clone shares them and costs O(1) (copying 20,000 keys
/// took 10 ms), a change copies only the path it touches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObjectSet {
    objects: imbl::OrdMap<ObjectKey, Arc<Object>>,
    /// EndpointSlices by the Service they name: (namespace, service, slice).
    by_service: imbl::OrdSet<(String, String, String)>,
}

impl ObjectSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Objects in the set.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// The object `key` names.
    pub fn get(&self, key: &ObjectKey) -> Option<&Arc<Object>> {
        self.objects.get(key)
    }

    /// Every object, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&ObjectKey, &Arc<Object>)> {
        self.objects.iter()
    }

    /// The objects of `kind`, in key order.
    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &Arc<Object>> {
        self.objects
            .range(ObjectKey::new(kind, "", "")..)
            .take_while(move |(k, _)| k.kind == kind)
            .map(|(_, o)| o)
    }

    /// The objects of `kind` in `namespace`, in name order.
    pub fn in_namespace<'a>(
        &'a self,
        kind: Kind,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a Arc<Object>> {
        self.objects
            .range(ObjectKey::new(kind, namespace, "")..)
            .take_while(move |(k, _)| k.kind == kind && k.namespace == namespace)
            .map(|(_, o)| o)
    }

    /// The Services.
    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.of_kind(Kind::Service).filter_map(|o| o.as_service())
    }

    /// The EndpointSlices.
    pub fn endpoint_slices(&self) -> impl Iterator<Item = Cow<'_, EndpointSlice>> {
        self.of_kind(Kind::EndpointSlice)
            .filter_map(|o| o.as_endpoint_slice())
    }

    /// The EndpointSlices of Service `namespace/name` (their
    /// `kubernetes.io/service-name` label), by slice name; from an index,
    /// not a scan.
    pub fn slices_of_service<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> impl Iterator<Item = Cow<'a, EndpointSlice>> {
        self.slice_objects_of_service(namespace, name)
            .filter_map(|o| o.as_endpoint_slice())
    }

    /// [`Self::slices_of_service`] as the stored objects (an unchanged
    /// object keeps its `Arc` from one set to the next).
    pub fn slice_objects_of_service<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> impl Iterator<Item = &'a Arc<Object>> {
        self.by_service
            .range((namespace.to_owned(), name.to_owned(), String::new())..)
            .take_while(move |(ns, svc, _)| ns == namespace && svc == name)
            .filter_map(move |(ns, _, slice)| {
                self.objects.get(&ObjectKey::new(
                    Kind::EndpointSlice,
                    ns.as_str(),
                    slice.as_str(),
                ))
            })
    }

    /// The Namespaces.
    pub fn namespaces(&self) -> impl Iterator<Item = &Namespace> {
        self.of_kind(Kind::Namespace)
            .filter_map(|o| o.as_namespace())
    }

    /// The Pods.
    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.of_kind(Kind::Pod).filter_map(|o| o.as_pod())
    }

    /// The NetworkPolicies.
    pub fn network_policies(&self) -> impl Iterator<Item = &NetworkPolicy> {
        self.of_kind(Kind::NetworkPolicy)
            .filter_map(|o| o.as_network_policy())
    }

    /// Adds or replaces an object (under its [`Object::key`]; an
    /// EndpointSlice [packed](Object::packed)); returns the one it
    /// replaced.
    pub fn insert(&mut self, object: Arc<Object>) -> Option<Arc<Object>> {
        let object = match &*object {
            Object::EndpointSlice(SliceObject::Open(_)) => {
                Arc::new(Arc::unwrap_or_clone(object).packed())
            }
            _ => object,
        };
        let key = object.key();
        let old = self.remove(&key);
        if let Some(service) = service_of_slice(&object) {
            self.by_service
                .insert((key.namespace.clone(), service.to_owned(), key.name.clone()));
        }
        self.objects.insert(key, object);
        old
    }

    /// Removes the object `key` names; returns it.
    pub fn remove(&mut self, key: &ObjectKey) -> Option<Arc<Object>> {
        let old = self.objects.remove(key)?;
        if let Some(service) = service_of_slice(&old) {
            self.by_service
                .remove(&(key.namespace.clone(), service.to_owned(), key.name.clone()));
        }
        Some(old)
    }
}

impl FromIterator<Object> for ObjectSet {
    fn from_iter<I: IntoIterator<Item = Object>>(iter: I) -> Self {
        let mut set = Self::new();
        for object in iter {
            set.insert(Arc::new(object));
        }
        set
    }
}

/// The Service an EndpointSlice names, if it is one and names one.
pub fn service_of_slice(object: &Object) -> Option<&str> {
    if object.kind() != Kind::EndpointSlice {
        return None;
    }
    object
        .metadata()
        .labels
        .as_ref()?
        .get(SERVICE_NAME_LABEL)
        .map(String::as_str)
}

/// One thing wrong with a document: where (the document, the object, the
/// field path) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The YAML document (1-based) when the text holds several.
    pub document: Option<usize>,
    /// The object, when known: `Service default/web`.
    pub object: Option<String>,
    /// The field path from the document's root: `items[2].spec.ports[0].port`
    /// (empty: the document itself).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    /// An error at `path` of no object yet.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            document: None,
            object: None,
            path: path.into(),
            message: message.into(),
        }
    }

    /// The same error, about `object`.
    #[must_use]
    pub fn of(mut self, object: impl Into<String>) -> Self {
        self.object = Some(object.into());
        self
    }

    /// The same error, its path below `prefix` (`items[2]`).
    #[must_use]
    pub fn below(mut self, prefix: &str) -> Self {
        if !prefix.is_empty() {
            self.path = if self.path.is_empty() {
                prefix.to_owned()
            } else if self.path.starts_with('[') {
                format!("{prefix}{}", self.path)
            } else {
                format!("{prefix}.{}", self.path)
            };
        }
        self
    }
}

/// `document 2: Service default/web: spec.ports[0].port: must be …`
impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(d) = self.document {
            write!(f, "document {d}: ")?;
        }
        if let Some(o) = &self.object {
            write!(f, "{o}: ")?;
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

/// Problems a refused document reports at most (the rest are counted).
pub const MAX_REPORTED: usize = 20;

/// Why a document was refused: what is wrong with it, one line each.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct DocumentError {
    /// The problems (at most [`MAX_REPORTED`]).
    pub problems: Vec<FieldError>,
    /// Further problems not listed.
    pub more: usize,
}

impl DocumentError {
    /// A document error from every problem found.
    pub fn from_problems(mut problems: Vec<FieldError>) -> Self {
        let more = problems.len().saturating_sub(MAX_REPORTED);
        problems.truncate(MAX_REPORTED);
        Self { problems, more }
    }

    /// One problem.
    pub fn one(problem: FieldError) -> Self {
        Self::from_problems(vec![problem])
    }
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{p}")?;
        }
        if self.more > 0 {
            write!(f, "\n… and {} more", self.more)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(ns: &str, name: &str, service: &str) -> Object {
        parse_object(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": ns, "name": name,
                         "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": "IPv4", "endpoints": []
        }))
        .expect("slice")
    }

    fn service(ns: &str, name: &str) -> Object {
        parse_object(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": ns, "name": name},
            "spec": {"ports": [{"port": 80}]}
        }))
        .expect("service")
    }

    #[test]
    fn kinds_by_the_names_kubectl_takes() {
        for (name, kind) in [
            ("svc", Kind::Service),
            ("Services", Kind::Service),
            ("service", Kind::Service),
            ("endpointslices", Kind::EndpointSlice),
            ("EndpointSlice", Kind::EndpointSlice),
            ("endpointslices.discovery.k8s.io", Kind::EndpointSlice),
            ("ns", Kind::Namespace),
            ("po", Kind::Pod),
            ("netpol", Kind::NetworkPolicy),
            ("networkpolicies", Kind::NetworkPolicy),
        ] {
            assert_eq!(Kind::from_user(name), Ok(kind), "{name}");
        }
        let e = Kind::from_user("deployments").expect_err("not ours");
        let text = e.to_string();
        assert!(
            text.contains("\"deployments\"") && text.contains("services (svc)"),
            "{text}"
        );
        assert!(
            Kind::from_user("ep").is_err(),
            "ep names Endpoints, not slices"
        );
    }

    #[test]
    fn keys_display_and_order() {
        assert_eq!(
            ObjectKey::new(Kind::Service, "default", "web").to_string(),
            "Service default/web"
        );
        assert_eq!(
            ObjectKey::new(Kind::Namespace, "ignored", "prod").to_string(),
            "Namespace prod"
        );
        assert!(ObjectKey::new(Kind::Namespace, "", "z") < ObjectKey::new(Kind::Service, "a", "a"));
    }

    #[test]
    fn sets_answer_by_kind_namespace_and_service() {
        let mut set: ObjectSet = [
            service("default", "web"),
            service("prod", "web"),
            slice("default", "web-1", "web"),
            slice("default", "web-2", "web"),
            slice("default", "db-1", "db"),
            slice("prod", "web-1", "web"),
        ]
        .into_iter()
        .collect();
        assert_eq!(set.len(), 6);
        assert_eq!(set.services().count(), 2);
        assert_eq!(set.endpoint_slices().count(), 4);
        let names = |set: &ObjectSet, ns, svc| -> Vec<String> {
            set.slices_of_service(ns, svc)
                .map(|s| s.metadata.name.clone().unwrap_or_default())
                .collect()
        };
        assert_eq!(names(&set, "default", "web"), ["web-1", "web-2"]);
        assert_eq!(names(&set, "prod", "web"), ["web-1"]);
        assert_eq!(names(&set, "default", "db"), ["db-1"]);
        assert!(names(&set, "default", "none").is_empty());
        assert_eq!(set.in_namespace(Kind::Service, "prod").count(), 1);

        // A slice moved to another Service leaves the old one's index.
        set.insert(Arc::new(slice("default", "web-2", "db")));
        assert_eq!(names(&set, "default", "web"), ["web-1"]);
        assert_eq!(names(&set, "default", "db"), ["db-1", "web-2"]);
        let removed = set.remove(&ObjectKey::new(Kind::EndpointSlice, "default", "db-1"));
        assert!(removed.is_some());
        assert_eq!(names(&set, "default", "db"), ["web-2"]);
        assert_eq!(set.len(), 5);
        assert!(set.namespaces().next().is_none());
        assert!(set.pods().next().is_none() && set.network_policies().next().is_none());
    }

    #[test]
    fn a_slice_in_a_set_is_packed_and_reads_back_whole() {
        let text = serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "prod", "name": "web-1",
                         "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
            "endpoints": [
                {"addresses": ["10.244.1.5"], "conditions": {"ready": true},
                 "nodeName": "n1", "zone": "a",
                 "targetRef": {"kind": "Pod", "namespace": "prod", "name": "web-0"}},
                {"addresses": ["10.244.2.7"], "conditions": {"ready": false, "serving": true, "terminating": true}}
            ]
        });
        let open = parse_object(text).expect("slice");
        assert!(matches!(open, Object::EndpointSlice(SliceObject::Open(_))));
        let set: ObjectSet = [open.clone()].into_iter().collect();
        let key = ObjectKey::new(Kind::EndpointSlice, "prod", "web-1");
        let stored = set.get(&key).expect("stored");
        assert!(
            matches!(&**stored, Object::EndpointSlice(SliceObject::Packed(_))),
            "a set keeps slices packed"
        );
        // Equal either way round, the same text for `get`, the same fields.
        assert_eq!(**stored, open);
        assert_eq!(open, **stored);
        assert_eq!(stored.to_json(), open.to_json());
        assert_eq!(
            stored.as_endpoint_slice().expect("slice").into_owned(),
            open.as_endpoint_slice().expect("slice").into_owned()
        );
        assert_eq!(service_of_slice(stored), Some("web"));
        assert_eq!(set.slices_of_service("prod", "web").count(), 1);
        // A change anywhere is a difference, in the metadata or the body.
        let mut other = open.clone();
        if let Object::EndpointSlice(s) = &mut other {
            s.open_mut().endpoints[1].conditions = None;
        }
        assert_ne!(**stored, other);
        let mut relabelled = (**stored).clone();
        relabelled.metadata_mut().labels = None;
        assert_ne!(**stored, relabelled);
        assert_eq!(service_of_slice(&relabelled), None);
    }

    #[test]
    fn errors_join_their_parts() {
        let e = FieldError::new("spec.ports[0].port", "must be between 1 and 65535")
            .of("Service default/web")
            .below("items[2]");
        assert_eq!(
            e.to_string(),
            "Service default/web: items[2].spec.ports[0].port: must be between 1 and 65535"
        );
        let e = FieldError::new("[3]", "x").below("items");
        assert_eq!(e.path, "items[3]");
        let many = DocumentError::from_problems(vec![FieldError::new("a", "b"); MAX_REPORTED + 3]);
        assert_eq!(many.problems.len(), MAX_REPORTED);
        assert!(many.to_string().ends_with("… and 3 more"), "{many}");
    }
}
