//! A rivetd process owned by a guard.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use rivet_api::{Client, Request, Response};

/// How long an agent may take to answer its first status request.
const READY_TIMEOUT_SECS: u64 = 30;

/// How to start an agent for a node.
#[derive(Debug, Clone)]
pub struct AgentArgs {
    /// Node name (pin dir name).
    pub node_name: String,
    /// Node namespace path.
    pub netns: PathBuf,
    /// Uplink inside the node namespace.
    pub uplink: Option<String>,
    /// Pod CIDR.
    pub pod_cidr: String,
    /// Cluster CIDR.
    pub cluster_cidr: String,
    /// State directory.
    pub state_dir: PathBuf,
    /// Socket path.
    pub socket: PathBuf,
    /// Log file.
    pub log: PathBuf,
    /// Extra environment (e.g. `RIVET_TEST_FAULTS=1`, which lets rivetd
    /// take the test-only `--test-fault-add-at`).
    pub env: Vec<(String, String)>,
    /// Extra rivetd flags (e.g. `--pod-attach tcx`).
    pub extra_args: Vec<String>,
    /// A command rivetd runs under (its path and arguments follow), e.g.
    /// `unshare --mount …` to give it a mount namespace of its own.
    pub wrapper: Vec<String>,
}

impl AgentArgs {
    /// The rivetd command line (without subcommand).
    pub fn command(&self) -> Command {
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(crate::bin("rivetd"));
                c
            }
            None => Command::new(crate::bin("rivetd")),
        };
        cmd.arg("--netns")
            .arg(&self.netns)
            .arg("--node-name")
            .arg(&self.node_name)
            .arg("--pod-cidr")
            .arg(&self.pod_cidr)
            .arg("--cluster-cidr")
            .arg(&self.cluster_cidr)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--log")
            .arg("info,rivet=debug");
        if let Some(u) = &self.uplink {
            cmd.arg("--uplink").arg(u);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.args(&self.extra_args);
        cmd
    }

    /// Pin directory (default layout).
    pub fn pin_dir(&self) -> PathBuf {
        PathBuf::from("/sys/fs/bpf/rivet").join(&self.node_name)
    }
}

/// A running rivetd; SIGTERM (then SIGKILL) on drop.
#[derive(Debug)]
pub struct AgentProc {
    args: AgentArgs,
    child: Option<Child>,
}

impl AgentProc {
    /// Starts rivetd and waits until its socket answers (10 s at most).
    pub fn start(args: AgentArgs) -> Self {
        let mut agent = Self { args, child: None };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.args.log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.args.log.display()));
        let log2 = log.try_clone().expect("dup log fd");
        let child = self
            .args
            .command()
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .unwrap_or_else(|e| panic!("starting rivetd: {e}"));
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        // Loading and verifying the programs takes ~1 s on a quiet machine;
        // on a loaded one (parallel tests, builds) several times that.
        let deadline = Instant::now() + Duration::from_secs(READY_TIMEOUT_SECS);
        loop {
            if let Ok(Response::Status(_)) = self.client().call(&Request::Status {}) {
                return;
            }
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "rivetd exited during start-up ({status}); log:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "rivetd not ready after {READY_TIMEOUT_SECS} s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.args.log).unwrap_or_default()
    }

    /// A client for its socket.
    pub fn client(&self) -> Client {
        Client::new(&self.args.socket).with_timeout(Duration::from_secs(20))
    }

    /// Socket path.
    pub fn socket(&self) -> &Path {
        &self.args.socket
    }

    /// Start arguments.
    pub fn args(&self) -> &AgentArgs {
        &self.args
    }

    /// Process ID, if running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` and waits for the exit (5 s, then SIGKILL).
    pub fn stop_with(
        &mut self,
        signal: nix::sys::signal::Signal,
    ) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, signal);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match child.try_wait() {
                Ok(Some(st)) => return Some(st),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = child.kill();
                    return child.wait().ok();
                }
            }
        }
    }

    /// Graceful stop (SIGTERM).
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        self.stop_with(nix::sys::signal::Signal::SIGTERM)
    }

    /// Starts it again after a stop.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "agent still running");
        self.spawn();
    }

    /// Runs `rivetd unload` for this node (after stopping it).
    pub fn unload(&mut self) {
        self.stop();
        let out = self
            .args
            .command()
            .arg("unload")
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "warning: rivetd unload for {}: {}",
                self.args.node_name,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => eprintln!("warning: rivetd unload: {e}"),
        }
    }

    /// Leaves the process running when the guard drops (demo `--keep`).
    pub fn detach(&mut self) {
        self.child = None;
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.stop();
    }
}
