//! Driving CNI plugins the way a runtime does: environment variables, the
//! network configuration on stdin, the result (or error) on stdout.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::{Value, json};

/// Where the reference plugins live (Debian's containernetworking-plugins).
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

/// One plugin invocation's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Exit status was 0.
    pub ok: bool,
    /// stdout parsed as JSON (`Null` when empty).
    pub json: Value,
    /// Raw stdout.
    pub stdout: String,
    /// stderr (logs).
    pub stderr: String,
}

impl Outcome {
    /// The error code, if this is a CNI error.
    pub fn code(&self) -> Option<u64> {
        self.json["code"].as_u64()
    }

    /// Panics unless the call succeeded.
    pub fn expect_ok(self, what: &str) -> Self {
        assert!(
            self.ok,
            "{what} failed: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }

    /// Panics unless the call failed with `code`; returns the message.
    pub fn expect_code(self, code: u64, what: &str) -> String {
        assert!(
            !self.ok,
            "{what}: expected error {code}, got success: {}",
            self.stdout
        );
        assert_eq!(
            self.code(),
            Some(code),
            "{what}: stdout {} stderr {}",
            self.stdout,
            self.stderr
        );
        assert!(
            self.json["msg"].is_string() && self.json["cniVersion"].is_string(),
            "{what}: error JSON shape: {}",
            self.stdout
        );
        format!(
            "{} {}",
            self.json["msg"].as_str().unwrap_or_default(),
            self.json["details"].as_str().unwrap_or_default()
        )
    }
}

/// A plugin binary and the environment common to its invocations.
#[derive(Debug, Clone)]
pub struct Plugin {
    /// Binary.
    pub bin: PathBuf,
    /// CNI_PATH.
    pub path: String,
    /// Namespace to run the binary in (the node), if not the caller's.
    pub run_in: Option<PathBuf>,
}

/// Per-call environment.
#[derive(Debug, Clone, Default)]
pub struct Call<'a> {
    /// CNI_COMMAND.
    pub command: &'a str,
    /// CNI_CONTAINERID.
    pub container_id: Option<&'a str>,
    /// CNI_NETNS.
    pub netns: Option<&'a str>,
    /// CNI_IFNAME.
    pub ifname: Option<&'a str>,
    /// CNI_ARGS.
    pub args: Option<&'a str>,
    /// Variables to leave unset even though the defaults would set them.
    pub unset: &'a [&'a str],
    /// Raw stdin (instead of `conf`).
    pub raw_stdin: Option<&'a [u8]>,
}

impl Plugin {
    /// rivet-cni (from the build) with rivet-cni's directory and the
    /// reference plugins in CNI_PATH, run inside the node namespace.
    pub fn rivet(node_ns: &Path) -> Self {
        let bin = crate::cni_bin();
        let dir = bin.parent().map(Path::to_path_buf).unwrap_or_default();
        Self {
            bin,
            path: format!("{}:{REFERENCE_PLUGINS}", dir.display()),
            run_in: Some(node_ns.to_owned()),
        }
    }

    /// A reference plugin from /usr/lib/cni, run inside the node namespace.
    pub fn reference(name: &str, node_ns: &Path) -> Self {
        Self {
            bin: Path::new(REFERENCE_PLUGINS).join(name),
            path: REFERENCE_PLUGINS.to_owned(),
            run_in: Some(node_ns.to_owned()),
        }
    }

    /// Invokes the plugin.
    pub fn call(&self, c: &Call<'_>, conf: &Value) -> Outcome {
        let mut cmd = match &self.run_in {
            Some(ns) => {
                let mut cmd = Command::new("nsenter");
                cmd.arg(format!("--net={}", ns.display()))
                    .arg("--")
                    .arg(&self.bin);
                cmd
            }
            None => Command::new(&self.bin),
        };
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", c.command)
            .env("CNI_PATH", &self.path);
        for (k, v) in [
            ("CNI_CONTAINERID", c.container_id),
            ("CNI_NETNS", c.netns),
            ("CNI_IFNAME", c.ifname),
            ("CNI_ARGS", c.args),
        ] {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        for k in c.unset {
            cmd.env_remove(k);
        }
        let stdin = c
            .raw_stdin
            .map_or_else(|| conf.to_string().into_bytes(), <[u8]>::to_vec);
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", self.bin.display()));
        if let Some(mut input) = child.stdin.take() {
            // The plugin may exit before reading (VERSION): ignore EPIPE.
            let _ = input.write_all(&stdin);
        }
        let out = child.wait_with_output().expect("plugin output");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        Outcome {
            ok: out.status.success(),
            json: serde_json::from_str(&stdout).unwrap_or(Value::Null),
            stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// ADD with the usual variables.
    pub fn add(&self, id: &str, netns: &Path, conf: &Value) -> Outcome {
        let ns = netns.display().to_string();
        self.call(
            &Call {
                command: "ADD",
                container_id: Some(id),
                netns: Some(&ns),
                ifname: Some("eth0"),
                ..Default::default()
            },
            conf,
        )
    }

    /// DEL with the usual variables (`netns` optional).
    pub fn del(&self, id: &str, netns: Option<&Path>, conf: &Value) -> Outcome {
        let ns = netns.map(|n| n.display().to_string());
        self.call(
            &Call {
                command: "DEL",
                container_id: Some(id),
                netns: ns.as_deref(),
                ifname: Some("eth0"),
                ..Default::default()
            },
            conf,
        )
    }

    /// CHECK with the usual variables.
    pub fn check(&self, id: &str, netns: &Path, conf: &Value) -> Outcome {
        let ns = netns.display().to_string();
        self.call(
            &Call {
                command: "CHECK",
                container_id: Some(id),
                netns: Some(&ns),
                ifname: Some("eth0"),
                ..Default::default()
            },
            conf,
        )
    }

    /// A verb that needs only CNI_PATH (STATUS, GC, VERSION).
    pub fn simple(&self, command: &str, conf: &Value) -> Outcome {
        self.call(
            &Call {
                command,
                ..Default::default()
            },
            conf,
        )
    }
}

/// rivet's plugin configuration at `version` for an agent socket.
pub fn rivet_conf(version: &str, socket: &Path) -> Value {
    json!({
        "cniVersion": version,
        "name": "rivet",
        "type": "rivet-cni",
        "socket": socket,
    })
}

/// The first address of a result (`ips[0].address` without the prefix).
pub fn result_ip(r: &Value) -> Option<std::net::Ipv4Addr> {
    r["ips"][0]["address"]
        .as_str()?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// `conf` with `key` set to `value`.
pub fn with(mut conf: Value, key: &str, value: Value) -> Value {
    conf[key] = value;
    conf
}
