//! Label and field selectors, parsed like the API server parses them.

use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    /// `key=value`, `key==value`.
    Eq(String, String),
    /// `key!=value` (also true when the label is absent).
    Ne(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also true when the label is absent).
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    NotExists(String),
}

/// A field requirement: `path=value` or `path!=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldReq {
    path: String,
    value: String,
    eq: bool,
}

/// A label selector and a field selector together (both empty = all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a set in parentheses, found {rest:?}"))?;
    let values: Vec<String> = inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if values.iter().any(|v| !valid_value(v)) {
        return Err(format!("invalid value in set {rest:?}"));
    }
    Ok(values)
}

fn parse_label_req(term: &str) -> Result<LabelReq, String> {
    let t = term.trim();
    if let Some(k) = t.strip_prefix('!') {
        let k = k.trim();
        return valid_key(k)
            .then(|| LabelReq::NotExists(k.to_string()))
            .ok_or_else(|| format!("invalid label key {k:?}"));
    }
    if let Some((k, v)) = t.split_once("!=") {
        let (k, v) = (k.trim(), v.trim());
        if !valid_key(k) || !valid_value(v) {
            return Err(format!("invalid requirement {t:?}"));
        }
        return Ok(LabelReq::Ne(k.into(), v.into()));
    }
    if let Some((k, v)) = t.split_once('=') {
        let v = v.strip_prefix('=').unwrap_or(v);
        let (k, v) = (k.trim(), v.trim());
        if !valid_key(k) || !valid_value(v) {
            return Err(format!("invalid requirement {t:?}"));
        }
        return Ok(LabelReq::Eq(k.into(), v.into()));
    }
    if let Some((k, rest)) = t.split_once(" notin ") {
        let k = k.trim();
        if !valid_key(k) {
            return Err(format!("invalid label key {k:?}"));
        }
        return Ok(LabelReq::NotIn(k.into(), parse_set(rest)?));
    }
    if let Some((k, rest)) = t.split_once(" in ") {
        let k = k.trim();
        if !valid_key(k) {
            return Err(format!("invalid label key {k:?}"));
        }
        return Ok(LabelReq::In(k.into(), parse_set(rest)?));
    }
    valid_key(t)
        .then(|| LabelReq::Exists(t.to_string()))
        .ok_or_else(|| format!("unable to parse requirement {t:?}"))
}

/// The fields a field selector may name for a kind (besides
/// `metadata.name` and `metadata.namespace`), like the API server's
/// field label conversion functions.
fn field_allowed(kind: &str, path: &str) -> bool {
    matches!(path, "metadata.name" | "metadata.namespace")
        || match kind {
            "Pod" => matches!(
                path,
                "spec.nodeName"
                    | "spec.restartPolicy"
                    | "spec.schedulerName"
                    | "spec.serviceAccountName"
                    | "spec.hostNetwork"
                    | "status.phase"
                    | "status.podIP"
                    | "status.nominatedNodeName"
            ),
            "Node" => path == "spec.unschedulable",
            "Namespace" => path == "status.phase",
            "Service" => matches!(path, "spec.clusterIP" | "spec.type"),
            "EndpointSlice" => path == "addressType",
            _ => false,
        }
}

impl Filter {
    /// Parses `labelSelector` and `fieldSelector` (either may be empty)
    /// for objects of `kind`; the error is the API server's message.
    pub fn parse(kind: &str, labels: &str, fields: &str) -> Result<Self, String> {
        let mut f = Self::default();
        if !labels.trim().is_empty() {
            for term in split_top(labels) {
                f.labels.push(parse_label_req(term)?);
            }
        }
        if !fields.trim().is_empty() {
            for term in fields.split(',') {
                let t = term.trim();
                let (path, value, eq) = if let Some((p, v)) = t.split_once("!=") {
                    (p, v, false)
                } else if let Some((p, v)) = t.split_once("==") {
                    (p, v, true)
                } else if let Some((p, v)) = t.split_once('=') {
                    (p, v, true)
                } else {
                    return Err(format!("invalid field selector: {t:?}"));
                };
                let path = path.trim();
                if !field_allowed(kind, path) {
                    return Err(format!(
                        "field label not supported: {path} (for {kind}: metadata.name, metadata.namespace and the kind's own field labels)"
                    ));
                }
                f.fields.push(FieldReq {
                    path: path.to_string(),
                    value: value.trim().to_string(),
                    eq,
                });
            }
        }
        Ok(f)
    }

    /// Selects everything.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// Whether `obj` (with `metadata`) is selected.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        let labels_ok = self.labels.iter().all(|r| match r {
            LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelReq::Ne(k, v) => label(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
        });
        labels_ok
            && self.fields.iter().all(|r| {
                let pointer = format!("/{}", r.path.replace('.', "/"));
                let actual = match obj.pointer(&pointer) {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                };
                (actual == r.value) == r.eq
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_and_fields() {
        let pod = json!({"metadata": {"name": "a", "namespace": "x", "labels": {"app": "web", "tier": "fe"}},
            "spec": {"nodeName": "n1"}});
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app",
            "!missing",
            "tier in (fe,be)",
            "tier notin (be)",
            "app=web,tier in (fe)",
            "missing!=x",
        ];
        for s in yes {
            assert!(Filter::parse("Pod", s, "").expect(s).matches(&pod), "{s}");
        }
        let no = [
            "app=db",
            "!app",
            "missing",
            "tier in (be)",
            "tier notin (fe,x)",
        ];
        for s in no {
            assert!(!Filter::parse("Pod", s, "").expect(s).matches(&pod), "{s}");
        }
        let f = Filter::parse("Pod", "", "spec.nodeName=n1,metadata.namespace=x").expect("fields");
        assert!(f.matches(&pod));
        let f = Filter::parse("Pod", "", "spec.nodeName!=n1").expect("fields");
        assert!(!f.matches(&pod));
        assert!(Filter::parse("Node", "", "spec.nodeName=n1").is_err());
        assert!(Filter::parse("Pod", "a in b", "").is_err());
    }
}
