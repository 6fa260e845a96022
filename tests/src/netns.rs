//! A named network namespace owned by a guard.

use std::{
    path::PathBuf,
    process::{Command, Output, Stdio},
};

/// A network namespace under /run/netns, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
    keep: bool,
}

fn ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running ip {args:?}: {e}"))
}

impl Netns {
    /// Creates the namespace with `lo` up. Panics on failure (tests).
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        let out = ip(&["netns", "add", &name]);
        assert!(
            out.status.success(),
            "ip netns add {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ns = Self { name, keep: false };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Leave the namespace behind on drop (demo `--keep`).
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// A command that runs inside the namespace (`nsenter --net=...`; unlike
    /// `ip netns exec` it keeps /sys, so bpffs stays visible).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        cmd
    }

    /// Runs a command inside and returns its output (does not check status).
    pub fn output(&self, program: &str, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {program} {args:?} in {}: {e}", self.name))
    }

    /// Runs a command inside; panics with its stderr if it fails. Returns stdout.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let out = self.output(program, args);
        assert!(
            out.status.success(),
            "{program} {args:?} in {} failed: {}{}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `ip <args>` inside the namespace; panics on failure.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        let out = ip(&full);
        assert!(
            out.status.success(),
            "ip {full:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `f` on a dedicated thread inside the namespace (setns) and
    /// returns its result; panics in `f` propagate.
    pub fn exec<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        rivet::netns::run_in(&self.path(), f)
            .unwrap_or_else(|e| panic!("running a closure in {}: {e}", self.name))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let out = ip(&["netns", "del", &self.name]);
        if !out.status.success() {
            eprintln!(
                "warning: ip netns del {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
}
