//! The CNI protocol frame (the shape of Go's `pkg/skel`): environment
//! variables, version negotiation, and errors as spec JSON on stdout.

use std::{cmp::Ordering, fmt};

/// Versions of the CNI spec this plugin speaks, oldest first.
pub const SUPPORTED_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
/// The version of the spec this plugin implements.
pub const CURRENT_VERSION: &str = "1.1.0";
/// Largest config accepted on stdin.
pub const MAX_STDIN: u64 = 1 << 20;

/// Well-known error codes (SPEC.md "Error" and libcni `types.go`), plus
/// rivet's own (100+).
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Invalid environment variables.
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure.
    pub const IO: u32 = 5;
    /// Failed to decode content.
    pub const DECODE: u32 = 6;
    /// Invalid network configuration.
    pub const INVALID_CONFIG: u32 = 7;
    /// Invalid network namespace.
    pub const INVALID_NETNS: u32 = 8;
    /// Try again later (the agent is unavailable).
    pub const TRY_AGAIN: u32 = 11;
    /// STATUS: the plugin cannot service ADD.
    pub const NOT_AVAILABLE: u32 = 50;
    /// Internal error.
    pub const INTERNAL: u32 = 999;
    /// rivet: the address pool is exhausted.
    pub const POOL_EXHAUSTED: u32 = 100;
    /// rivet: CHECK found a resource missing or wrong.
    pub const CHECK_FAILED: u32 = 101;
    /// rivet: the request conflicts with an existing attachment or mapping.
    pub const CONFLICT: u32 = 102;
}

/// A CNI error, printed as `{"cniVersion","code","msg","details"}` on stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    /// Error code.
    pub code: u32,
    /// Short message.
    pub msg: String,
    /// Longer explanation.
    pub details: String,
}

impl CniError {
    /// An error with a message and details.
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The JSON document for the given result version.
    pub fn to_json(&self, version: &str) -> serde_json::Value {
        let mut v = serde_json::json!({
            "cniVersion": version,
            "code": self.code,
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            v["details"] = serde_json::Value::String(self.details.clone());
        }
        v
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "code {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

/// The CNI verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Attach.
    Add,
    /// Detach (idempotent).
    Del,
    /// Verify.
    Check,
    /// Readiness (1.1.0).
    Status,
    /// Garbage-collect (1.1.0).
    Gc,
    /// Report versions.
    Version,
}

impl Command {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "STATUS" => Self::Status,
            "GC" => Self::Gc,
            "VERSION" => Self::Version,
            _ => return None,
        })
    }
}

/// The environment of one invocation, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The verb.
    pub command: Command,
    /// `CNI_CONTAINERID` (ADD, DEL, CHECK).
    pub container_id: String,
    /// `CNI_NETNS` (ADD, CHECK; optional for DEL).
    pub netns: Option<String>,
    /// `CNI_IFNAME` (ADD, DEL, CHECK).
    pub ifname: String,
    /// `CNI_ARGS`.
    pub cni_args: String,
    /// `CNI_PATH`, split on ':'.
    pub path: Vec<String>,
    /// `CNI_NETNS_OVERRIDE` set.
    pub netns_override: bool,
}

/// Container IDs (and network names) as libcni validates them:
/// [`rivet_api::CNI_ID_PATTERN`], the agent's rule too.
pub fn valid_id(id: &str) -> bool {
    rivet_api::check_cni_id("container ID", id).is_ok()
}

/// Interface names as libcni validates them.
pub fn ifname_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("is empty");
    }
    if name.len() > 15 {
        return Some("is longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return Some("cannot be '.' or '..'");
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Some("cannot contain '/', ':' or whitespace");
    }
    None
}

/// Reads and validates the environment. Only VERSION needs nothing but
/// `CNI_COMMAND`.
pub fn parse_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Args, CniError> {
    let command_text = get("CNI_COMMAND").ok_or_else(|| {
        CniError::new(
            code::INVALID_ENV,
            "required env variables [CNI_COMMAND] missing",
            "",
        )
    })?;
    let command = Command::parse(&command_text).ok_or_else(|| {
        CniError::new(
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND: {command_text}"),
            "",
        )
    })?;
    let var = |name: &str| get(name).filter(|v| !v.is_empty());
    let needs: &[&str] = match command {
        Command::Add | Command::Check => {
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]
        }
        Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
        Command::Status | Command::Gc => &["CNI_PATH"],
        Command::Version => &[],
    };
    let missing: Vec<&str> = needs.iter().copied().filter(|n| var(n).is_none()).collect();
    if !missing.is_empty() {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("required env variables [{}] missing", missing.join(",")),
            "",
        ));
    }
    let container_id = var("CNI_CONTAINERID").unwrap_or_default();
    if needs.contains(&"CNI_CONTAINERID") && !valid_id(&container_id) {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("invalid CNI_CONTAINERID {container_id:?}"),
            format!("must match {}", rivet_api::CNI_ID_PATTERN),
        ));
    }
    let ifname = var("CNI_IFNAME").unwrap_or_default();
    if needs.contains(&"CNI_IFNAME")
        && let Some(problem) = ifname_problem(&ifname)
    {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("invalid CNI_IFNAME {ifname:?}: {problem}"),
            "",
        ));
    }
    Ok(Args {
        command,
        container_id,
        netns: var("CNI_NETNS"),
        ifname,
        cni_args: get("CNI_ARGS").unwrap_or_default(),
        path: var("CNI_PATH")
            .map(|p| {
                p.split(':')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        netns_override: var("CNI_NETNS_OVERRIDE").is_some(),
    })
}

/// Compares dotted versions numerically ("0.10.0" > "0.4.0").
pub fn version_cmp(a: &str, b: &str) -> Ordering {
    let parse = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(a).cmp(&parse(b))
}

/// Checks that the config's version is supported, and that the verb exists
/// in it (CHECK ≥ 0.4.0, STATUS and GC ≥ 1.1.0).
pub fn check_version(command: Command, version: &str) -> Result<(), CniError> {
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "incompatible CNI versions; config is {version:?}, plugin supports {SUPPORTED_VERSIONS:?}"
            ),
            "",
        ));
    }
    let min = match command {
        Command::Check => "0.4.0",
        Command::Status | Command::Gc => "1.1.0",
        _ => "0.0.0",
    };
    if version_cmp(version, min) == Ordering::Less {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("config version {version} does not allow {command:?} (needs {min} or later)"),
            "",
        ));
    }
    Ok(())
}

/// The VERSION answer.
pub fn version_json() -> serde_json::Value {
    serde_json::json!({
        "cniVersion": CURRENT_VERSION,
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    const ADD: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    #[test]
    fn good_add_env() {
        let a = parse_env(&env(ADD)).expect("valid");
        assert_eq!(a.command, Command::Add);
        assert_eq!(a.path, ["/opt/cni/bin", "/usr/lib/cni"]);
    }

    #[test]
    fn missing_and_bad_env_is_code_4_naming_the_variable() {
        for drop in [
            "CNI_COMMAND",
            "CNI_CONTAINERID",
            "CNI_NETNS",
            "CNI_IFNAME",
            "CNI_PATH",
        ] {
            let pairs: Vec<_> = ADD.iter().copied().filter(|(k, _)| *k != drop).collect();
            let e = parse_env(&env(&pairs)).expect_err(drop);
            assert_eq!(e.code, code::INVALID_ENV);
            assert!(e.msg.contains(drop), "{e}");
        }
        for (k, v) in [
            ("CNI_COMMAND", "FROB"),
            ("CNI_CONTAINERID", "-bad"),
            ("CNI_CONTAINERID", "a/b"),
            ("CNI_IFNAME", "0123456789abcdef"),
            ("CNI_IFNAME", "."),
            ("CNI_IFNAME", "a/b"),
            ("CNI_IFNAME", "a b"),
            ("CNI_IFNAME", "a:b"),
        ] {
            let pairs: Vec<_> = ADD
                .iter()
                .copied()
                .map(|(kk, vv)| if kk == k { (kk, v) } else { (kk, vv) })
                .collect();
            let e = parse_env(&env(&pairs)).expect_err(v);
            assert_eq!(e.code, code::INVALID_ENV, "{k}={v}");
        }
    }

    #[test]
    fn del_without_netns_and_version_alone_are_fine() {
        let pairs: Vec<_> = ADD
            .iter()
            .copied()
            .filter(|(k, _)| *k != "CNI_NETNS")
            .map(|(k, v)| {
                if k == "CNI_COMMAND" {
                    (k, "DEL")
                } else {
                    (k, v)
                }
            })
            .collect();
        assert!(parse_env(&env(&pairs)).expect("del").netns.is_none());
        assert_eq!(
            parse_env(&env(&[("CNI_COMMAND", "VERSION")]))
                .expect("version")
                .command,
            Command::Version
        );
    }

    #[test]
    fn versions() {
        assert!(check_version(Command::Add, "0.3.1").is_ok());
        assert_eq!(
            check_version(Command::Add, "9.9.9")
                .expect_err("9.9.9")
                .code,
            1
        );
        assert_eq!(
            check_version(Command::Check, "0.3.1")
                .expect_err("check")
                .code,
            1
        );
        assert!(check_version(Command::Check, "0.4.0").is_ok());
        assert_eq!(check_version(Command::Gc, "1.0.0").expect_err("gc").code, 1);
        assert_eq!(
            check_version(Command::Status, "1.0.0")
                .expect_err("status")
                .code,
            1
        );
        assert!(check_version(Command::Status, "1.1.0").is_ok());
        assert_eq!(version_cmp("0.10.0", "0.4.0"), Ordering::Greater);
    }

    #[test]
    fn error_json_shape() {
        let e = CniError::new(11, "try again", "agent down");
        let v = e.to_json("1.0.0");
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["code"], 11);
        assert_eq!(v["msg"], "try again");
        assert_eq!(v["details"], "agent down");
        assert!(
            CniError::new(1, "x", "")
                .to_json("1.1.0")
                .get("details")
                .is_none()
        );
    }
}
