//! The three patch formats of the API server: JSON merge patch (RFC 7386),
//! strategic merge patch and JSON patch (RFC 6902).
//!
//! Strategic merge patch needs each list's patch strategy, which the real
//! server takes from the Go types' `patchMergeKey` / `patchStrategy` tags.
//! Here they are a table keyed by the field path ([`MERGE_KEYS`],
//! [`MERGE_PRIMITIVES`]) covering the lists of the served kinds that have
//! one; every other list is replaced whole, as the real server does for
//! lists without a strategy. Directives kubectl sends are honoured:
//! `$patch: replace|delete|merge` (in maps and list elements),
//! `$retainKeys`, `$setElementOrder/<list>`, `$deleteFromPrimitiveList/<list>`.

use serde_json::{Map, Value};

/// Lists merged by a key, by field path (map keys from the root, list
/// levels not counted), as the Go types of the served kinds tag them.
pub const MERGE_KEYS: &[(&str, &str)] = &[
    ("status.conditions", "type"),
    ("status.addresses", "type"),
    ("status.podIPs", "ip"),
    ("status.hostIPs", "ip"),
    ("status.volumesAttached", "name"),
    ("spec.containers", "name"),
    ("spec.initContainers", "name"),
    ("spec.ephemeralContainers", "name"),
    ("spec.containers.ports", "containerPort"),
    ("spec.initContainers.ports", "containerPort"),
    ("spec.containers.env", "name"),
    ("spec.initContainers.env", "name"),
    ("spec.containers.volumeMounts", "mountPath"),
    ("spec.initContainers.volumeMounts", "mountPath"),
    ("spec.containers.volumeDevices", "devicePath"),
    ("spec.volumes", "name"),
    ("spec.imagePullSecrets", "name"),
    ("spec.hostAliases", "ip"),
    ("spec.ports", "port"),
    ("metadata.ownerReferences", "uid"),
];

/// Lists of scalars merged as sets (`patchStrategy:"merge"`).
pub const MERGE_PRIMITIVES: &[&str] = &["metadata.finalizers", "spec.podCIDRs"];

/// Applies a JSON merge patch (RFC 7386).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Some(t) = target.as_object_mut() {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Applies a strategic merge patch.
pub fn strategic_merge_patch(target: &Value, patch: &Value) -> Result<Value, String> {
    let Some(p) = patch.as_object() else {
        return Err("a strategic merge patch must be a JSON object".into());
    };
    let mut out = target.as_object().cloned().unwrap_or_default();
    match merge_map(&mut out, p, &mut Vec::new())? {
        MapOutcome::Delete => Ok(Value::Object(Map::new())),
        MapOutcome::Keep => Ok(Value::Object(out)),
    }
}

/// What a map patch asks of its parent.
enum MapOutcome {
    Keep,
    Delete,
}

fn path_key(path: &[String], field: &str) -> String {
    let mut s = path.join(".");
    if !s.is_empty() {
        s.push('.');
    }
    s.push_str(field);
    s
}

/// The value with every `$` directive removed (a new element inserted as is).
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|e| e.get("$patch").is_none())
                .map(strip)
                .collect(),
        ),
        other => other.clone(),
    }
}

fn merge_map(
    orig: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
) -> Result<MapOutcome, String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("delete") => return Ok(MapOutcome::Delete),
        Some("replace") => {
            if let Value::Object(m) = strip(&Value::Object(patch.clone())) {
                *orig = m;
            }
            return Ok(MapOutcome::Keep);
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch directive $patch: {other}")),
    }
    let mut orders = Vec::new();
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let drop = v.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = orig.get_mut(field) {
                list.retain(|e| !drop.contains(e));
            }
        } else if let Some(field) = k.strip_prefix("$setElementOrder/") {
            orders.push((field.to_string(), v.as_array().cloned().unwrap_or_default()));
        } else if k.starts_with('$') {
            // $patch handled above, $retainKeys below.
        } else if v.is_null() {
            orig.remove(k);
        } else if let Some(pm) = v.as_object() {
            match orig.get_mut(k) {
                Some(Value::Object(om)) => {
                    path.push(k.clone());
                    let outcome = merge_map(om, pm, path);
                    path.pop();
                    if let MapOutcome::Delete = outcome? {
                        orig.remove(k);
                    }
                }
                _ => {
                    if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                        orig.remove(k);
                    } else {
                        orig.insert(k.clone(), strip(v));
                    }
                }
            }
        } else if let Some(pl) = v.as_array() {
            let full = path_key(path, k);
            let key = MERGE_KEYS.iter().find(|(p, _)| *p == full).map(|(_, k)| *k);
            let merged = match (key, orig.get(k)) {
                (Some(key), Some(Value::Array(ol))) => {
                    path.push(k.clone());
                    let r = merge_keyed(ol, pl, key, path);
                    path.pop();
                    r?
                }
                (None, Some(Value::Array(ol))) if MERGE_PRIMITIVES.contains(&full.as_str()) => {
                    let mut out = ol.clone();
                    for e in pl {
                        if !out.contains(e) {
                            out.push(e.clone());
                        }
                    }
                    out
                }
                _ => match strip(v) {
                    Value::Array(a) => a,
                    _ => Vec::new(),
                },
            };
            orig.insert(k.clone(), Value::Array(merged));
        } else {
            orig.insert(k.clone(), v.clone());
        }
    }
    for (field, order) in orders {
        let full = path_key(path, &field);
        let key = MERGE_KEYS.iter().find(|(p, _)| *p == full).map(|(_, k)| *k);
        if let Some(Value::Array(list)) = orig.get_mut(&field) {
            let pos = |e: &Value| {
                order.iter().position(|o| match key {
                    Some(key) => o.get(key).is_some() && o.get(key) == e.get(key),
                    None => o == e,
                })
            };
            let (mut ordered, rest): (Vec<Value>, Vec<Value>) =
                list.drain(..).partition(|e| pos(e).is_some());
            ordered.sort_by_key(|e| pos(e).unwrap_or(usize::MAX));
            ordered.extend(rest);
            *list = ordered;
        }
    }
    if let Some(retain) = patch.get("$retainKeys") {
        let keep: Vec<&str> = retain
            .as_array()
            .ok_or("$retainKeys must be a list")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        orig.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(MapOutcome::Keep)
}

fn merge_keyed(
    orig: &[Value],
    patch: &[Value],
    key: &str,
    path: &mut Vec<String>,
) -> Result<Vec<Value>, String> {
    if patch
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(patch
            .iter()
            .filter(|e| e.get("$patch").is_none())
            .map(strip)
            .collect());
    }
    let mut out = orig.to_vec();
    for p in patch {
        let Some(pm) = p.as_object() else {
            out.push(p.clone());
            continue;
        };
        let Some(kv) = pm.get(key) else {
            return Err(format!(
                "map: {p} does not contain declared merge key: {key}"
            ));
        };
        let idx = out.iter().position(|e| e.get(key) == Some(kv));
        if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
            out.retain(|e| e.get(key) != Some(kv));
            continue;
        }
        match idx.and_then(|i| out.get_mut(i).map(|e| (i, e))) {
            Some((i, Value::Object(om))) => {
                if let MapOutcome::Delete = merge_map(om, pm, path)? {
                    out.remove(i);
                }
            }
            _ => out.push(strip(p)),
        }
    }
    Ok(out)
}

/// Applies a JSON patch (RFC 6902: add, remove, replace, move, copy, test).
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch must be a list of operations")?;
    for op in ops {
        let name = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or("operation without \"op\"")?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or("operation without \"path\"")?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or("operation without \"value\"")
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or("operation without \"from\"")
        };
        match name {
            "add" => add(target, path, value()?)?,
            "remove" => {
                remove(target, path)?;
            }
            "replace" => {
                remove(target, path)?;
                add(target, path, value()?)?;
            }
            "move" => {
                let v = remove(target, from()?)?;
                add(target, path, v)?;
            }
            "copy" => {
                let v = target
                    .pointer(from()?)
                    .cloned()
                    .ok_or_else(|| format!("copy from a missing path {path}"))?;
                add(target, path, v)?;
            }
            "test" => {
                if target.pointer(path) != Some(&value()?) {
                    return Err(format!("test at {path} failed"));
                }
            }
            other => return Err(format!("unknown JSON patch operation {other:?}")),
        }
    }
    Ok(())
}

fn split_pointer(path: &str) -> Result<(String, String), String> {
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    Ok((
        parent.to_string(),
        last.replace("~1", "/").replace("~0", "~"),
    ))
}

fn add(target: &mut Value, path: &str, v: Value) -> Result<(), String> {
    if path.is_empty() {
        *target = v;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    match target.pointer_mut(&parent) {
        Some(Value::Object(m)) => {
            m.insert(last, v);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>()
                    .ok()
                    .filter(|i| *i <= a.len())
                    .ok_or_else(|| format!("invalid index in {path}"))?
            };
            a.insert(i, v);
            Ok(())
        }
        _ => Err(format!("add: no such path {path}")),
    }
}

fn remove(target: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_pointer(path)?;
    match target.pointer_mut(&parent) {
        Some(Value::Object(m)) => m
            .remove(&last)
            .ok_or_else(|| format!("no such path {path}")),
        Some(Value::Array(a)) => {
            let i = last
                .parse::<usize>()
                .ok()
                .filter(|i| *i < a.len())
                .ok_or_else(|| format!("invalid index in {path}"))?;
            Ok(a.remove(i))
        }
        _ => Err(format!("no such path {path}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn strategic_conditions_and_directives() {
        let node = json!({
            "metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
            "spec": {"taints": [{"key": "k"}]},
            "status": {"conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "MemoryPressure", "status": "False"}
            ]}
        });
        let patch = json!({
            "metadata": {"labels": {"a": null, "c": "3"}, "finalizers": ["y"]},
            "spec": {"taints": []},
            "status": {
                "$setElementOrder/conditions": [{"type": "MemoryPressure"}, {"type": "Ready"}],
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "PIDPressure", "$patch": "delete"}]
            }
        });
        let out = strategic_merge_patch(&node, &patch).expect("patch");
        assert_eq!(
            out,
            json!({
                "metadata": {"labels": {"b": "2", "c": "3"}, "finalizers": ["x", "y"]},
                "spec": {"taints": []},
                "status": {"conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": "True"}
                ]}
            })
        );
        let del = json!({"status": {"conditions": [{"type": "Ready", "$patch": "delete"}]}});
        let out = strategic_merge_patch(&node, &del).expect("delete");
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "MemoryPressure", "status": "False"}])
        );
        let rep = json!({"status": {"conditions": [{"$patch": "replace"}, {"type": "X"}]},
            "metadata": {"$patch": "replace", "name": "n"},
            "$deleteFromPrimitiveList/none": ["q"]});
        let out = strategic_merge_patch(&node, &rep).expect("replace");
        assert_eq!(out["status"]["conditions"], json!([{"type": "X"}]));
        assert_eq!(out["metadata"], json!({"name": "n"}));
        let svc = json!({"spec": {"ports": [{"port": 80, "name": "a"}, {"port": 81}], "x": 1}});
        let p = json!({"spec": {"$retainKeys": ["ports"], "ports": [{"port": 80, "name": "b"}]}});
        let out = strategic_merge_patch(&svc, &p).expect("svc");
        assert_eq!(
            out,
            json!({"spec": {"ports": [{"port": 80, "name": "b"}, {"port": 81}]}})
        );
        let fin = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}});
        let out = strategic_merge_patch(&node, &fin).expect("fin");
        assert_eq!(out["metadata"]["finalizers"], json!([]));
    }

    #[test]
    fn json_patch_ops() {
        let mut t = json!({"a": [1, 2], "b": {"c": 1}});
        json_patch(
            &mut t,
            &json!([
                {"op": "add", "path": "/a/-", "value": 3},
                {"op": "replace", "path": "/b/c", "value": 2},
                {"op": "copy", "from": "/b", "path": "/d"},
                {"op": "remove", "path": "/a/0"},
                {"op": "test", "path": "/d/c", "value": 2}
            ]),
        )
        .expect("patch");
        assert_eq!(t, json!({"a": [2, 3], "b": {"c": 2}, "d": {"c": 2}}));
        assert!(json_patch(&mut t, &json!([{"op": "test", "path": "/a/0", "value": 9}])).is_err());
    }
}
