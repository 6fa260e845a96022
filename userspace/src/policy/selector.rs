//! Kubernetes label selectors (`matchLabels` and `matchExpressions`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Labels of an object.
pub type Labels = BTreeMap<String, String>;

/// Whether `selector` selects an object with `labels`: every `matchLabels`
/// pair present, every expression true (`In`, `NotIn`, `Exists`,
/// `DoesNotExist`; an unknown operator selects nothing). The empty
/// selector selects everything.
pub fn matches(selector: &LabelSelector, labels: &Labels) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    pairs
        && selector.match_expressions.iter().flatten().all(|e| {
            let value = labels.get(&e.key);
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
            }]),
        }
    }

    #[test]
    fn operators() {
        let web = labels(&[("app", "web")]);
        let none = labels(&[]);
        assert!(matches(&LabelSelector::default(), &none));
        assert!(matches(&expr("app", "In", &["web", "db"]), &web));
        assert!(!matches(&expr("app", "In", &["db"]), &web));
        assert!(!matches(&expr("app", "In", &["web"]), &none));
        assert!(matches(&expr("app", "NotIn", &["db"]), &web));
        assert!(matches(&expr("app", "NotIn", &["db"]), &none));
        assert!(!matches(&expr("app", "NotIn", &["web"]), &web));
        assert!(matches(&expr("app", "Exists", &[]), &web));
        assert!(!matches(&expr("app", "Exists", &[]), &none));
        assert!(matches(&expr("app", "DoesNotExist", &[]), &none));
        assert!(!matches(&expr("app", "Bogus", &[]), &web));
        let both = LabelSelector {
            match_labels: Some(labels(&[("tier", "front")])),
            ..expr("app", "Exists", &[])
        };
        assert!(!matches(&both, &web));
        assert!(matches(&both, &labels(&[("app", "x"), ("tier", "front")])));
    }
}
