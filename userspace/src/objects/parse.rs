//! A document's text → objects: JSON (one object or a stream of them) or
//! YAML (documents separated by `---`; empty ones skipped); a `List` or a
//! `ServiceList`-style list is read item by item. Each object is read into
//! its `k8s-openapi` type through `serde_path_to_error`, so a type error
//! names its field path, then validated ([`super::validate`]).
//!
//! A JSON document that is one object, or one List of objects that each
//! carry `apiVersion` and `kind`, is read straight from its text: each
//! item's text is found without building a tree of the document
//! ([`RawValue`]), and read into its type from there. A 14.6 MiB List of
//! 10,000 Services and EndpointSlices (100,000 endpoints) took the agent's
//! heap to 267 MB at its peak through the tree (177 MB of it the tree;
//! valgrind massif, 2026-12-03). Every other document (YAML, nested Lists,
//! items without their type, a text that is not one JSON value) goes
//! through the tree, which also words the errors of what cannot be read.

use std::{borrow::Cow, collections::BTreeMap};

use serde::Deserialize as _;
use serde_json::{Map, Value, value::RawValue};

use super::{DocumentError, FieldError, Kind, Object, ObjectKey, validate};

/// How deep Lists may nest inside Lists.
const MAX_LIST_DEPTH: usize = 4;

/// One object of a document, its type not yet read.
struct Entry {
    /// The YAML document it is in, when the text holds several.
    document: Option<usize>,
    /// Its path from the document's root (`items[2]`; empty: the root).
    path: String,
    value: Value,
}

/// Every object of the document `text`, validated and defaulted, in
/// document order; or everything wrong with it (then none of its objects).
/// An object may appear once per document. A document without objects
/// yields an empty list.
pub fn parse_document(text: &str) -> Result<Vec<Object>, DocumentError> {
    let mut problems = Vec::new();
    let mut objects = Vec::new();
    let mut seen: BTreeMap<ObjectKey, String> = BTreeMap::new();
    let bodies: Vec<(Option<usize>, String, Body<'_>)> = match text_entries(text) {
        Some(items) => items
            .into_iter()
            .map(|(path, raw)| (None, path, Body::Text(raw)))
            .collect(),
        None => entries(text, &mut problems)?
            .into_iter()
            .map(|e| (e.document, e.path, Body::Tree(e.value)))
            .collect(),
    };
    for (document, path, body) in bodies {
        let at = |e: FieldError| FieldError {
            document,
            ..e.below(&path)
        };
        let parsed = match body {
            Body::Tree(value) => parse_object(value),
            Body::Text(raw) => parse_object_text(raw),
        };
        match parsed {
            Ok(object) => {
                let here = place(document, &path);
                match seen.get(&object.key()) {
                    Some(first) => problems.push(at(FieldError::new(
                        "",
                        format!("appears twice in the document (first at {first})"),
                    )
                    .of(object.key().to_string()))),
                    None => {
                        seen.insert(object.key(), here);
                        objects.push(object);
                    }
                }
            }
            Err(errors) => problems.extend(errors.into_iter().map(at)),
        }
    }
    if problems.is_empty() {
        Ok(objects)
    } else {
        Err(DocumentError::from_problems(problems))
    }
}

/// The keys of the objects in `text` (what `delete -f` needs): kind,
/// `apiVersion`, a valid name and namespace (`default` when absent); the
/// rest of each object is not read. Each key once, in document order.
pub fn parse_keys(text: &str) -> Result<Vec<ObjectKey>, DocumentError> {
    let mut problems = Vec::new();
    let mut keys = Vec::new();
    for entry in entries(text, &mut problems)? {
        let at = |e: FieldError| FieldError {
            document: entry.document,
            ..e.below(&entry.path)
        };
        match key_of(&entry.value) {
            Ok(key) if keys.contains(&key) => {}
            Ok(key) => keys.push(key),
            Err(e) => problems.push(at(e)),
        }
    }
    if problems.is_empty() {
        Ok(keys)
    } else {
        Err(DocumentError::from_problems(problems))
    }
}

/// One object from its JSON (as the API server or a document holds it):
/// its type read, then validated and defaulted. Errors name the object
/// and the field paths from its root.
pub fn parse_object(value: Value) -> Result<Object, Vec<FieldError>> {
    let id = Identity::of(&value)?;
    id.finish(typed(id.kind, value))
}

/// An object's kind and its label for messages, from its head.
struct Identity {
    label: Option<String>,
    kind: Kind,
}

impl Identity {
    /// Read from the object's tree (or the small tree of its [`Head`]).
    fn of(value: &Value) -> Result<Self, Vec<FieldError>> {
        let label = label_of(value);
        let kind = kind_of(value).map_err(|e| vec![labelled(label.as_deref(), e)])?;
        Ok(Self { label, kind })
    }

    /// The object as read, validated and defaulted; errors labelled.
    fn finish(&self, read: Result<Object, FieldError>) -> Result<Object, Vec<FieldError>> {
        let mut object = read.map_err(|e| vec![labelled(self.label.as_deref(), e)])?;
        validate(&mut object)?;
        Ok(object)
    }
}

/// `e` said of the object `label` names, if any.
fn labelled(label: Option<&str>, e: FieldError) -> FieldError {
    match label {
        Some(l) => e.of(l.to_owned()),
        None => e,
    }
}

/// One object of a document: its tree, or its text.
enum Body<'a> {
    Tree(Value),
    Text(&'a str),
}

/// What an object's text says of itself, read without the rest.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(rename = "apiVersion", borrow, default)]
    api_version: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    metadata: Option<HeadMeta<'a>>,
    #[serde(borrow, default)]
    items: Option<&'a RawValue>,
}

/// The names in a [`Head`]'s metadata.
#[derive(serde::Deserialize)]
struct HeadMeta<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
}

impl Head<'_> {
    /// The fields the tree's checks read (`kind`, `apiVersion`,
    /// `metadata.name`, `metadata.namespace`), as a small tree.
    fn as_value(&self) -> Value {
        let mut root = Map::new();
        if let Some(k) = &self.kind {
            root.insert("kind".into(), Value::from(k.as_ref()));
        }
        if let Some(a) = &self.api_version {
            root.insert("apiVersion".into(), Value::from(a.as_ref()));
        }
        if let Some(m) = &self.metadata {
            let mut meta = Map::new();
            if let Some(n) = &m.name {
                meta.insert("name".into(), Value::from(n.as_ref()));
            }
            if let Some(n) = &m.namespace {
                meta.insert("namespace".into(), Value::from(n.as_ref()));
            }
            root.insert("metadata".into(), Value::Object(meta));
        }
        Value::Object(root)
    }
}

/// The objects of a JSON document read from its text (see the module
/// doc), with their paths; `None` when the document needs the tree.
fn text_entries(text: &str) -> Option<Vec<(String, &str)>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text).trim();
    if !text.starts_with('{') {
        return None;
    }
    let root: Head<'_> = serde_json::from_str(text).ok()?;
    let Value::Object(root_map) = root.as_value() else {
        return None;
    };
    let Some(_) = list_kind(&root_map) else {
        // One object: read from the text when it names its type.
        return (root.items.is_none() && root.kind.is_some() && root.api_version.is_some())
            .then(|| vec![(String::new(), text)]);
    };
    let items: Vec<&RawValue> = match root.items {
        None => Vec::new(),
        Some(raw) if raw.get() == "null" => Vec::new(),
        Some(raw) => serde_json::from_str(raw.get()).ok()?,
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let head: Head<'_> = serde_json::from_str(item.get()).ok()?;
        let Value::Object(map) = head.as_value() else {
            return None;
        };
        if head.items.is_some()
            || head.kind.is_none()
            || head.api_version.is_none()
            || list_kind(&map).is_some()
        {
            return None;
        }
        out.push((format!("items[{i}]"), item.get()));
    }
    Some(out)
}

/// One object from its JSON text: as [`parse_object`], without building
/// its tree.
pub fn parse_object_text(text: &str) -> Result<Object, Vec<FieldError>> {
    let head: Head<'_> = match serde_json::from_str(text) {
        Ok(head) => head,
        // Not an object, or names of the wrong type: the tree words it.
        Err(_) => {
            return serde_json::from_str::<Value>(text)
                .map_err(|e| vec![FieldError::new("", format!("invalid JSON: {e}"))])
                .and_then(parse_object);
        }
    };
    let id = Identity::of(&head.as_value())?;
    let mut de = serde_json::Deserializer::from_str(text);
    id.finish(typed(id.kind, &mut de).map(|mut object| {
        fit_lists(&mut object);
        object
    }))
}

/// Gives the object's long lists the length they hold. Read from a text
/// (a document, a store file, an API server's answer), a list grows by
/// doubling (a text tells no length ahead, a tree does): 10
/// endpoints held 16 places, and 10,000 EndpointSlices of 10 endpoints
/// held 35 MiB more than read from their trees (agent RSS after a restart,
/// 2026-12-03).
pub fn fit_lists(object: &mut Object) {
    match object {
        Object::EndpointSlice(slice) => {
            let slice = slice.open_mut();
            for endpoint in &mut slice.endpoints {
                endpoint.addresses.shrink_to_fit();
            }
            slice.endpoints.shrink_to_fit();
            if let Some(ports) = &mut slice.ports {
                ports.shrink_to_fit();
            }
        }
        Object::Service(service) => {
            if let Some(spec) = &mut service.spec {
                for list in [&mut spec.cluster_ips, &mut spec.external_ips]
                    .into_iter()
                    .flatten()
                {
                    list.shrink_to_fit();
                }
                if let Some(ports) = &mut spec.ports {
                    ports.shrink_to_fit();
                }
            }
        }
        Object::NetworkPolicy(policy) => {
            if let Some(spec) = &mut policy.spec {
                for rule in spec.ingress.iter_mut().flatten() {
                    if let Some(from) = &mut rule.from {
                        from.shrink_to_fit();
                    }
                    if let Some(ports) = &mut rule.ports {
                        ports.shrink_to_fit();
                    }
                }
                for rule in spec.egress.iter_mut().flatten() {
                    if let Some(to) = &mut rule.to {
                        to.shrink_to_fit();
                    }
                    if let Some(ports) = &mut rule.ports {
                        ports.shrink_to_fit();
                    }
                }
                if let Some(rules) = &mut spec.ingress {
                    rules.shrink_to_fit();
                }
                if let Some(rules) = &mut spec.egress {
                    rules.shrink_to_fit();
                }
            }
        }
        Object::Namespace(_) | Object::Pod(_) => {}
    }
}

/// The entries of a document (Lists flattened), or the reason it cannot
/// be read at all. Entries that are no objects or bad Lists go to
/// `problems`.
fn entries(text: &str, problems: &mut Vec<FieldError>) -> Result<Vec<Entry>, DocumentError> {
    let docs = documents(text)?;
    let several = docs.len() > 1;
    let mut out = Vec::new();
    for (i, value) in docs.into_iter().enumerate() {
        if value.is_null() {
            continue;
        }
        let document = several.then_some(i + 1);
        flatten(value, String::new(), document, 0, &mut out, problems);
    }
    Ok(out)
}

/// The documents of `text`: JSON when it starts like JSON (`{`, `[`) and
/// parses as JSON, else YAML.
fn documents(text: &str) -> Result<Vec<Value>, DocumentError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let trimmed = text.trim_start();
    let json_error = if trimmed.starts_with(['{', '[']) {
        match serde_json::Deserializer::from_str(trimmed)
            .into_iter::<Value>()
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(values) => return Ok(values),
            Err(e) => Some(e),
        }
    } else {
        None
    };
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        match Value::deserialize(doc) {
            Ok(v) => docs.push(v),
            // A text that looked like JSON: its JSON error says more.
            Err(_) if json_error.is_some() => {
                let e = json_error.map(|e| e.to_string()).unwrap_or_default();
                return Err(DocumentError::one(FieldError::new(
                    "",
                    format!("invalid JSON: {e}"),
                )));
            }
            Err(e) => {
                return Err(DocumentError::one(FieldError {
                    document: Some(i + 1),
                    ..FieldError::new("", format!("invalid YAML: {e}"))
                }));
            }
        }
    }
    Ok(docs)
}

/// Where an entry is, for messages: `document 2, items[3]`, `the document`.
fn place(document: Option<usize>, path: &str) -> String {
    match (document, path.is_empty()) {
        (Some(d), true) => format!("document {d}"),
        (Some(d), false) => format!("document {d}, {path}"),
        (None, true) => "the document's root".to_owned(),
        (None, false) => path.to_owned(),
    }
}

/// `value` as entries: itself, or the items of a List (recursively).
fn flatten(
    value: Value,
    path: String,
    document: Option<usize>,
    depth: usize,
    out: &mut Vec<Entry>,
    problems: &mut Vec<FieldError>,
) {
    let problem = |p: &str, message: String| FieldError {
        document,
        ..FieldError::new(p, message).below(&path)
    };
    let Value::Object(mut map) = value else {
        problems.push(problem(
            "",
            format!(
                "expected an object (a mapping with apiVersion and kind), found {}",
                type_name(&value)
            ),
        ));
        return;
    };
    let Some(item_kind) = list_kind(&map) else {
        out.push(Entry {
            document,
            path,
            value: Value::Object(map),
        });
        return;
    };
    if depth >= MAX_LIST_DEPTH {
        problems.push(problem(
            "",
            format!("Lists nested deeper than {MAX_LIST_DEPTH}"),
        ));
        return;
    }
    let items = match map.remove("items") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items,
        Some(other) => {
            problems.push(problem(
                "items",
                format!("expected a list, found {}", type_name(&other)),
            ));
            return;
        }
    };
    let prefix = if path.is_empty() {
        "items".to_owned()
    } else {
        format!("{path}.items")
    };
    for (i, mut item) in items.into_iter().enumerate() {
        // A typed list's items may leave their type out (the API server's
        // list answers do).
        if let (Some(kind), Value::Object(fields)) = (item_kind, &mut item) {
            fields
                .entry("apiVersion")
                .or_insert_with(|| kind.api_version().into());
            fields.entry("kind").or_insert_with(|| kind.name().into());
        }
        flatten(
            item,
            format!("{prefix}[{i}]"),
            document,
            depth + 1,
            out,
            problems,
        );
    }
}

/// If `map` is a List: `Some(None)` for a `v1 List`, `Some(Some(kind))`
/// for a list of one kind (`ServiceList`, …).
fn list_kind(map: &Map<String, Value>) -> Option<Option<Kind>> {
    let kind = map.get("kind")?.as_str()?;
    let api = map.get("apiVersion").and_then(Value::as_str);
    if kind == "List" && api.is_none_or(|a| a == "v1") {
        return Some(None);
    }
    let item = Kind::from_name(kind.strip_suffix("List")?)?;
    api.is_none_or(|a| a == item.api_version())
        .then_some(Some(item))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The kinds rivet keeps, for messages.
fn kinds_kept() -> String {
    let kinds: Vec<String> = Kind::ALL
        .iter()
        .map(|k| format!("{} {}", k.api_version(), k.name()))
        .collect();
    format!("rivet keeps {} (and Lists of them)", kinds.join(", "))
}

/// The kind of an object, checked against its `apiVersion`.
fn kind_of(value: &Value) -> Result<Kind, FieldError> {
    let field = |name: &str| value.get(name);
    let kind = match field("kind") {
        Some(Value::String(k)) if !k.is_empty() => k.as_str(),
        None | Some(Value::Null) => {
            return Err(FieldError::new(
                "kind",
                format!("required: {}", kinds_kept()),
            ));
        }
        Some(other) => {
            return Err(FieldError::new(
                "kind",
                format!("expected a string, found {}", type_name(other)),
            ));
        }
    };
    let api = match field("apiVersion") {
        Some(Value::String(a)) if !a.is_empty() => a.as_str(),
        None | Some(Value::Null) => {
            return Err(FieldError::new(
                "apiVersion",
                format!("required (the {kind}'s group/version)"),
            ));
        }
        Some(other) => {
            return Err(FieldError::new(
                "apiVersion",
                format!("expected a string, found {}", type_name(other)),
            ));
        }
    };
    let Some(known) = Kind::from_name(kind) else {
        return Err(FieldError::new(
            "kind",
            format!(
                "unknown kind {kind:?} (apiVersion {api:?}): {}",
                kinds_kept()
            ),
        ));
    };
    if api != known.api_version() {
        return Err(FieldError::new(
            "apiVersion",
            format!(
                "{api:?} is not a version rivet takes for {kind}: use {}",
                known.api_version()
            ),
        ));
    }
    Ok(known)
}

/// `Service default/web` from an object's JSON, before its type is read
/// (the namespace defaulted as validation will).
fn label_of(value: &Value) -> Option<String> {
    let kind = value.get("kind")?.as_str()?;
    let meta = value.get("metadata");
    let text = |field: &str| {
        meta.and_then(|m| m.get(field))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let Some(name) = text("name") else {
        return Some(kind.to_owned());
    };
    match Kind::from_name(kind) {
        Some(k) if !k.namespaced() => Some(format!("{kind} {name}")),
        _ => Some(format!(
            "{kind} {}/{name}",
            text("namespace").unwrap_or("default")
        )),
    }
}

/// An object read into the type of `kind` from a tree or a text; a
/// mismatch names its path (a text's line and column left out, so both
/// word it alike).
fn typed<'de, D: serde::Deserializer<'de>>(kind: Kind, de: D) -> Result<Object, FieldError> {
    fn read<'de, T: serde::Deserialize<'de>, D: serde::Deserializer<'de>>(
        de: D,
    ) -> Result<Box<T>, FieldError> {
        serde_path_to_error::deserialize::<_, T>(de)
            .map(Box::new)
            .map_err(|e| {
                let path = e.path().to_string();
                let path = if path == "." { String::new() } else { path };
                let message = e.into_inner().to_string();
                let message = match message.rsplit_once(" at line ") {
                    Some((m, _)) => m.to_owned(),
                    None => message,
                };
                FieldError::new(path, message)
            })
    }
    Ok(match kind {
        Kind::Namespace => Object::Namespace(read(de)?),
        Kind::Service => Object::Service(read(de)?),
        Kind::EndpointSlice => Object::EndpointSlice(super::SliceObject::Open(read(de)?)),
        Kind::Pod => Object::Pod(read(de)?),
        Kind::NetworkPolicy => Object::NetworkPolicy(read(de)?),
    })
}

/// The key of an object's JSON, its name and namespace checked.
fn key_of(value: &Value) -> Result<ObjectKey, FieldError> {
    let label = label_of(value);
    let with_label = |e: FieldError| labelled(label.as_deref(), e);
    let kind = kind_of(value).map_err(with_label)?;
    let text = |field: &str| -> Result<Option<String>, FieldError> {
        match value.get("metadata").and_then(|m| m.get(field)) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone()).filter(|s| !s.is_empty())),
            Some(other) => Err(with_label(FieldError::new(
                format!("metadata.{field}"),
                format!("expected a string, found {}", type_name(other)),
            ))),
        }
    };
    let name = text("name")?;
    let namespace = text("namespace")?;
    let name = validate::check_name(kind, name.as_deref()).map_err(with_label)?;
    let namespace = if kind.namespaced() {
        let ns = namespace.unwrap_or_else(|| validate::DEFAULT_NAMESPACE.to_owned());
        validate::check_namespace(&ns).map_err(with_label)?;
        ns
    } else {
        String::new()
    };
    Ok(ObjectKey::new(kind, namespace, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVICE_YAML: &str = "\
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
  - name: http
    port: 80
    targetPort: 8080
  - name: dns
    port: 53
    protocol: UDP
";

    fn error_of(text: &str) -> String {
        parse_document(text)
            .expect_err("the document must be refused")
            .to_string()
    }

    #[test]
    fn a_yaml_service_with_defaults() {
        let objects = parse_document(SERVICE_YAML).expect("parse");
        assert_eq!(objects.len(), 1);
        let svc = objects[0].as_service().expect("a Service");
        assert_eq!(svc.metadata.namespace.as_deref(), Some("default"));
        let spec = svc.spec.as_ref().expect("spec");
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        let ports = spec.ports.as_ref().expect("ports");
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
        assert_eq!(ports[1].protocol.as_deref(), Some("UDP"));
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        assert_eq!(ports[0].target_port, Some(IntOrString::Int(8080)));
        assert_eq!(ports[1].target_port, Some(IntOrString::Int(53)));
        assert_eq!(objects[0].key().to_string(), "Service default/web");
    }

    #[test]
    fn json_object_json_stream_and_bom() {
        let one = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"prod"}}"#;
        let objects = parse_document(one).expect("one");
        assert_eq!(objects[0].key().to_string(), "Namespace prod");
        let two = format!("\u{feff}{one}\n{}", one.replace("prod", "dev"));
        let keys: Vec<String> = parse_document(&two)
            .expect("stream")
            .iter()
            .map(|o| o.key().to_string())
            .collect();
        assert_eq!(keys, ["Namespace prod", "Namespace dev"]);
        // A YAML flow mapping is not JSON, but YAML.
        let flow = "{apiVersion: v1, kind: Namespace, metadata: {name: flow}}";
        assert_eq!(parse_document(flow).expect("flow").len(), 1);
        // Broken JSON says so, with its position.
        let e = error_of(r#"{"apiVersion":"v1","kind":"Namespace","#);
        assert!(
            e.starts_with("invalid JSON: ") && e.contains("line 1"),
            "{e}"
        );
    }

    #[test]
    fn multi_document_yaml_skips_empty_documents() {
        let text = format!(
            "---\n{SERVICE_YAML}---\n# only a comment\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: prod\nspec:\n  containers: [{{name: c, image: busybox}}]\n---\n"
        );
        let objects = parse_document(&text).expect("parse");
        let keys: Vec<String> = objects.iter().map(|o| o.key().to_string()).collect();
        assert_eq!(keys, ["Service default/web", "Pod prod/p"]);
        // An error names its document.
        let bad = format!(
            "{SERVICE_YAML}---\n{}",
            SERVICE_YAML.replace("port: 53", "port: x")
        );
        let e = error_of(&bad);
        assert!(
            e.starts_with("document 2: Service default/web: spec.ports[1].port: invalid type: string \"x\", expected i32"),
            "{e}"
        );
        let e = error_of("a: [1, 2\n");
        assert!(e.contains("invalid YAML"), "{e}");
        assert!(parse_document("").expect("empty").is_empty());
        assert!(parse_document("---\n---\n").expect("empty").is_empty());
    }

    #[test]
    fn lists_and_typed_lists() {
        let list = serde_json::json!({
            "apiVersion": "v1", "kind": "List",
            "items": [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
                {"apiVersion": "v1", "kind": "ServiceList", "items": [
                    {"metadata": {"name": "s1", "namespace": "a"}, "spec": {"ports": [{"port": 1}]}}
                ]},
            ]
        });
        let objects = parse_document(&list.to_string()).expect("list");
        let keys: Vec<String> = objects.iter().map(|o| o.key().to_string()).collect();
        assert_eq!(keys, ["Namespace a", "Service a/s1"]);

        let typed = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSliceList\nitems:\n- metadata:\n    name: web-1\n    labels: {kubernetes.io/service-name: web}\n  addressType: IPv4\n  endpoints:\n  - addresses: [10.0.0.1]\n";
        let objects = parse_document(typed).expect("typed list");
        assert_eq!(objects[0].key().to_string(), "EndpointSlice default/web-1");
        assert!(
            parse_document("apiVersion: v1\nkind: List\nitems: []\n")
                .expect("empty list")
                .is_empty()
        );

        // The path of a bad item runs from the document's root.
        let mut bad = list.clone();
        bad["items"][1]["items"][0]["spec"]["ports"][0]["port"] = "x".into();
        let e = error_of(&bad.to_string());
        assert_eq!(
            e,
            "Service a/s1: items[1].items[0].spec.ports[0].port: invalid type: string \"x\", expected i32"
        );
        let e = error_of("apiVersion: v1\nkind: List\nitems: 3\n");
        assert_eq!(e, "items: expected a list, found a number");
        let e = error_of("apiVersion: v1\nkind: List\nitems: [3]\n");
        assert!(e.starts_with("items[0]: expected an object"), "{e}");
    }

    #[test]
    fn a_json_list_read_from_its_text_equals_the_tree() {
        let items = serde_json::json!([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a", "labels": {"team": "x"}}},
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "web", "namespace": "a"},
             "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
                      "sessionAffinity": "ClientIP"}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "web-1", "namespace": "a", "labels": {"kubernetes.io/service-name": "web"}},
             "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
             "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "nodeName": "n1"}]},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a", "labels": {"app": "web"}},
             "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]}},
            {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
             "metadata": {"name": "deny-all", "namespace": "a"},
             "spec": {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]}]}},
        ]);
        let list =
            serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
        assert_eq!(
            text_entries(&list).map(|e| e.len()),
            Some(5),
            "read from the text"
        );
        let from_text = parse_document(&list).expect("list");
        let Value::Array(items) = items else {
            panic!("an array")
        };
        let from_tree: Vec<Object> = items
            .into_iter()
            .map(|v| parse_object(v).expect("valid"))
            .collect();
        assert_eq!(from_text, from_tree);
        // Escaped names are read as the tree reads them.
        let escaped = parse_object_text(
            r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"n\u0073"}}"#,
        )
        .expect("escaped");
        assert_eq!(escaped.key().name, "ns");

        // One object, and a store file's text, read the same way.
        let one = serde_json::to_string(&from_tree[1]).expect("json");
        assert_eq!(text_entries(&one).map(|e| e.len()), Some(1));
        assert_eq!(parse_object_text(&one).expect("one"), from_tree[1]);
        // What needs the tree: YAML, items without their type, nested Lists.
        assert!(text_entries("kind: List\nitems: []\n").is_none());
        assert!(
            text_entries(
                r#"{"kind":"ServiceList","apiVersion":"v1","items":[{"metadata":{"name":"s"}}]}"#
            )
            .is_none()
        );
        assert!(
            text_entries(
                r#"{"kind":"List","items":[{"kind":"List","apiVersion":"v1","items":[]}]}"#
            )
            .is_none()
        );
        assert!(parse_object_text("[1]").is_err(), "not an object");
        assert!(parse_object_text("{").is_err(), "torn");
    }

    #[test]
    fn a_bad_item_among_good_ones_refuses_the_whole_list() {
        let mut items: Vec<Value> = (0..5)
            .map(|i| {
                serde_json::json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": format!("s{i}")}, "spec": {"ports": [{"port": 80}]}})
            })
            .collect();
        items[2]["spec"]["ports"][0]["port"] = "x".into();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        let e = parse_document(&list.to_string()).expect_err("one bad item");
        assert_eq!(e.problems.len(), 1);
        assert_eq!(
            e.to_string(),
            "Service default/s2: items[2].spec.ports[0].port: invalid type: string \"x\", expected i32"
        );
    }

    #[test]
    fn unknown_kinds_and_versions_are_named() {
        let e = error_of("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n");
        assert!(
            e.starts_with("Deployment default/d: kind: unknown kind \"Deployment\" (apiVersion \"apps/v1\"): rivet keeps v1 Namespace, v1 Service"),
            "{e}"
        );
        let e = error_of(
            "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: s}\n",
        );
        assert!(
            e.contains("apiVersion: \"discovery.k8s.io/v1beta1\" is not a version rivet takes for EndpointSlice: use discovery.k8s.io/v1"),
            "{e}"
        );
        let e = error_of("apiVersion: v1\nkind: DeploymentList\nitems: []\n");
        assert!(e.contains("unknown kind \"DeploymentList\""), "{e}");
        let e = error_of("metadata: {name: x}\n");
        assert!(e.starts_with("kind: required"), "{e}");
        let e = error_of("kind: Service\nmetadata: {name: x}\n");
        assert!(e.contains("apiVersion: required"), "{e}");
        let e = error_of("- a\n- b\n");
        assert!(e.starts_with("expected an object"), "{e}");
    }

    /// What `kubectl get svc,endpointslices -n kube-system -o yaml` prints
    /// for kube-dns (server-set fields and all).
    const KUBECTL_YAML: &str = r#"apiVersion: v1
items:
- apiVersion: v1
  kind: Service
  metadata:
    annotations:
      prometheus.io/port: "9153"
      prometheus.io/scrape: "true"
    creationTimestamp: "2026-11-02T09:14:03Z"
    labels:
      k8s-app: kube-dns
      kubernetes.io/cluster-service: "true"
      kubernetes.io/name: CoreDNS
    managedFields:
    - apiVersion: v1
      fieldsType: FieldsV1
      fieldsV1:
        f:spec:
          f:ports: {}
      manager: kubeadm
      operation: Update
      time: "2026-11-02T09:14:03Z"
    name: kube-dns
    namespace: kube-system
    resourceVersion: "234"
    uid: 2f1c7e0e-53a4-4f5e-9c1b-0c9f3b1a2d11
  spec:
    clusterIP: 10.96.0.10
    clusterIPs:
    - 10.96.0.10
    internalTrafficPolicy: Cluster
    ipFamilies:
    - IPv4
    ipFamilyPolicy: SingleStack
    ports:
    - name: dns
      port: 53
      protocol: UDP
      targetPort: 53
    - name: dns-tcp
      port: 53
      protocol: TCP
      targetPort: 53
    - name: metrics
      port: 9153
      protocol: TCP
      targetPort: 9153
    selector:
      k8s-app: kube-dns
    sessionAffinity: None
    type: ClusterIP
  status:
    loadBalancer: {}
- addressType: IPv4
  apiVersion: discovery.k8s.io/v1
  endpoints:
  - addresses:
    - 10.244.0.3
    conditions:
      ready: true
      serving: true
      terminating: false
    nodeName: cp-1
    targetRef:
      kind: Pod
      name: coredns-7db6d8ff4d-x2x9q
      namespace: kube-system
      uid: 8d3e5f0a-9d1c-4b59-8a0f-7c2b5e9d4a01
  kind: EndpointSlice
  metadata:
    annotations:
      endpoints.kubernetes.io/last-change-trigger-time: "2026-11-02T09:15:11Z"
    creationTimestamp: "2026-11-02T09:14:19Z"
    generateName: kube-dns-
    generation: 3
    labels:
      endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
      k8s-app: kube-dns
      kubernetes.io/service-name: kube-dns
    name: kube-dns-8lkjw
    namespace: kube-system
    ownerReferences:
    - apiVersion: v1
      blockOwnerDeletion: true
      controller: true
      kind: Service
      name: kube-dns
      uid: 2f1c7e0e-53a4-4f5e-9c1b-0c9f3b1a2d11
    resourceVersion: "412"
    uid: 4b0a9c37-7b42-4b6c-93a5-2a4a8f0c6e22
  ports:
  - name: dns-tcp
    port: 53
    protocol: TCP
  - name: dns
    port: 53
    protocol: UDP
  - name: metrics
    port: 9153
    protocol: TCP
kind: List
metadata:
  resourceVersion: ""
"#;

    #[test]
    fn what_kubectl_prints_is_taken_as_it_is() {
        let objects = parse_document(KUBECTL_YAML).expect("kubectl's own output");
        let keys: Vec<String> = objects.iter().map(|o| o.key().to_string()).collect();
        assert_eq!(
            keys,
            [
                "Service kube-system/kube-dns",
                "EndpointSlice kube-system/kube-dns-8lkjw"
            ]
        );
        // Server-set fields are kept (the uid, the creation time).
        let meta = objects[0].metadata();
        assert_eq!(
            meta.uid.as_deref(),
            Some("2f1c7e0e-53a4-4f5e-9c1b-0c9f3b1a2d11")
        );
        assert!(meta.creation_timestamp.is_some() && meta.managed_fields.is_some());
        let set: crate::objects::ObjectSet = objects.into_iter().collect();
        assert_eq!(set.slices_of_service("kube-system", "kube-dns").count(), 1);
        // The same as JSON, as `-o json` prints it.
        let value: Value = serde_yaml::from_str(KUBECTL_YAML).expect("yaml");
        let again = parse_document(&serde_json::to_string_pretty(&value).expect("json"))
            .expect("kubectl's JSON");
        let set_again: crate::objects::ObjectSet = again.into_iter().collect();
        assert_eq!(set, set_again);
    }

    #[test]
    fn an_object_appears_once() {
        let text = format!("{SERVICE_YAML}---\n{SERVICE_YAML}");
        let e = error_of(&text);
        assert_eq!(
            e,
            "document 2: Service default/web: appears twice in the document (first at document 1)"
        );
    }

    #[test]
    fn keys_for_delete_read_only_names() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: x}]}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: prod, namespace: ignored}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\n";
        let keys = parse_keys(text).expect("keys");
        assert_eq!(
            keys,
            [
                ObjectKey::new(Kind::Service, "default", "web"),
                ObjectKey::new(Kind::Namespace, "", "prod"),
            ]
        );
        let e = parse_keys("apiVersion: v1\nkind: Service\nmetadata: {name: Web}\n")
            .expect_err("bad name")
            .to_string();
        assert!(e.starts_with("Service default/Web: metadata.name: "), "{e}");
        let e = parse_keys("apiVersion: v1\nkind: Service\nmetadata: {namespace: a}\n")
            .expect_err("no name")
            .to_string();
        assert_eq!(e, "Service: metadata.name: required");
        let e = parse_keys("apiVersion: v1\nkind: Gadget\nmetadata: {name: g}\n")
            .expect_err("unknown kind")
            .to_string();
        assert!(e.contains("unknown kind \"Gadget\""), "{e}");
    }
}
