//! Discovery documents (`/version`, `/api`, `/apis`, resource lists) and
//! the `meta.k8s.io/v1` Table kubectl asks for when it prints.

use serde_json::{Value, json};

use super::{
    resources::{GROUPS, RESOURCES, Resource},
    store::{Obj, parse_rfc3339},
};

/// The version the server reports (`/version`).
pub const GIT_VERSION: &str = "v1.35.0";

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "gitVersion": GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-12-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `/api`: the core group's versions.
pub fn api(server: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}]
    })
}

fn group(name: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{name}/{version}"), "version": version});
    json!({"name": name, "versions": [gv], "preferredVersion": gv})
}

/// `/apis`: the other groups.
pub fn apis() -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": GROUPS.iter().map(|(g, v)| group(g, v)).collect::<Vec<_>>()
    })
}

/// `/apis/<group>`, if served.
pub fn api_group(name: &str) -> Option<Value> {
    let (g, v) = GROUPS.iter().find(|(g, _)| *g == name)?;
    let mut doc = group(g, v);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

/// `/api/v1` or `/apis/<group>/<version>`: an APIResourceList, if served.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let served: Vec<&Resource> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if served.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for r in served {
        resources.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            "shortNames": r.short,
        }));
        if r.status {
            resources.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources
    }))
}

/// A duration the way kubectl prints ages (`42s`, `5m`, `3h`, `2d`).
fn age(secs: u64) -> String {
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// A `meta.k8s.io/v1` Table of `objs` (columns Name and Age; each row
/// carries the object's metadata as a PartialObjectMetadata).
pub fn table(res: &Resource, objs: &[&Obj], rv: u64, cont: Option<&str>) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let created = o
                .value
                .pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .and_then(parse_rfc3339)
                .unwrap_or(now);
            json!({
                "cells": [o.name(), age(now.saturating_sub(created))],
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.value.get("metadata").cloned().unwrap_or(Value::Null)
                }
            })
        })
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": format!("Name of the {}", res.singular), "priority": 0},
            {"name": "Age", "type": "string", "format": "", "description": "Time since creation", "priority": 0}
        ],
        "rows": rows
    })
}
