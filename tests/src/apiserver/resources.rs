//! The resources served: group, version, names, scope, subresources.

/// One resource type the server knows.
#[derive(Debug)]
pub struct Resource {
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// Version (`v1`).
    pub version: &'static str,
    /// Plural name, the URL segment (`nodes`).
    pub plural: &'static str,
    /// Singular name (`node`).
    pub singular: &'static str,
    /// Kind (`Node`).
    pub kind: &'static str,
    /// Namespaced (else cluster-scoped).
    pub namespaced: bool,
    /// Has a `/status` subresource (writes to the main resource keep
    /// `status`, writes to `/status` change only `status`).
    pub status: bool,
    /// Short names (`no`).
    pub short: &'static [&'static str],
}

impl Resource {
    /// `v1` or `group/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `/api/v1` or `/apis/group/v1`.
    pub fn prefix(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

/// Every resource served, in discovery order.
pub const RESOURCES: &[Resource] = &[
    Resource {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        status: true,
        short: &["ns"],
    },
    Resource {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        status: true,
        short: &["no"],
    },
    Resource {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        status: true,
        short: &["po"],
    },
    Resource {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        status: true,
        short: &["svc"],
    },
    Resource {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        status: false,
        short: &[],
    },
    Resource {
        group: "networking.k8s.io",
        version: "v1",
        plural: "networkpolicies",
        singular: "networkpolicy",
        kind: "NetworkPolicy",
        namespaced: true,
        status: false,
        short: &["netpol"],
    },
];

/// The API groups other than core, each with its one version.
pub const GROUPS: &[(&str, &str)] = &[("discovery.k8s.io", "v1"), ("networking.k8s.io", "v1")];

/// Index in [`RESOURCES`] of `plural` in `group`/`version`.
pub fn by_plural(group: &str, version: &str, plural: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Index in [`RESOURCES`] of `kind` served at `api_version` (`v1`,
/// `discovery.k8s.io/v1`).
pub fn by_kind(api_version: &str, kind: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.kind == kind && r.api_version() == api_version)
}

/// Index in [`RESOURCES`] of a resource named the way the test hooks
/// accept it: plural (`nodes`), kind (`Node`) or `apiVersion/Kind`
/// (`discovery.k8s.io/v1/EndpointSlice`, `v1/Node`).
pub fn lookup(name: &str) -> Option<usize> {
    if let Some((av, kind)) = name.rsplit_once('/') {
        return by_kind(av, kind);
    }
    RESOURCES
        .iter()
        .position(|r| r.plural == name || r.kind == name || r.singular == name)
}
