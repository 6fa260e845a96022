//! `cargo xtask`: the project's one entry point for setup, build, test,
//! load/unload, demo, bench and the program-size guard. Every command runs
//! `setup` first (idempotent, seconds when everything is present).
//!
//! xtask depends on nothing of the project itself, so it builds on a fresh
//! machine before the eBPF toolchain exists.

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

mod setup;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "rivet's developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the project needs (apt packages, nightly rust-src,
    /// bpf-linker, bpffs). Idempotent.
    Setup,
    /// Build the eBPF object, the agent, the CLI and the CNI plugin (release).
    Build,
    /// fmt check, clippy -D warnings (host and BPF), unit tests, BPF program
    /// tests and network-namespace integration tests.
    Test {
        /// Only run tests whose name contains this string.
        filter: Option<String>,
        /// Skip fmt and clippy.
        #[arg(long)]
        no_lint: bool,
    },
    /// Attach the datapath inside a network namespace and print what is
    /// attached and pinned (developer tool; the datapath stays loaded).
    Load {
        /// Network namespace name (under /run/netns).
        #[arg(long)]
        netns: String,
        /// Uplink interface inside that namespace.
        #[arg(long)]
        uplink: Option<String>,
        /// Node name (pin directory); defaults to the namespace name.
        #[arg(long)]
        node_name: Option<String>,
    },
    /// Remove everything `load` (or an agent) made in the namespace.
    Unload {
        /// Network namespace name (under /run/netns).
        #[arg(long)]
        netns: String,
        /// Node name (pin directory); defaults to the namespace name.
        #[arg(long)]
        node_name: Option<String>,
    },
    /// Build, then run the demo: etcd, two nodes with two pods each, ping
    /// and iperf3 same-node and cross-node, the agents' view, then clean up.
    Demo {
        /// Leave the namespaces, agents and etcd running for poking.
        #[arg(long)]
        keep: bool,
        /// Cross-node mode: vxlan, ipip, native, hybrid, bgp (two racks
        /// behind top-of-rack routers).
        #[arg(long, default_value = "vxlan")]
        mode: String,
        /// Number of nodes.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// Where the cluster lives: etcd, or kubernetes (nodes, the Service
        /// and the policy fed through the test Kubernetes API server).
        #[arg(long, default_value = "etcd")]
        source: String,
    },
    /// Build, then install this machine as a rivet node (`rivetctl
    /// install`): rivetd and rivetctl in /usr/local/bin, rivet-cni and its
    /// conflist, the systemd unit, /etc/rivet/rivet.toml (paths
    /// configurable; extra arguments go to `rivetctl install`).
    Install {
        /// CNI binary directory.
        #[arg(long, default_value = "/opt/cni/bin")]
        bin_dir: String,
        /// CNI configuration directory.
        #[arg(long, default_value = "/etc/cni/net.d")]
        conf_dir: String,
        /// Agent socket named in the conflist.
        #[arg(long, default_value = "/run/rivet/rivetd.sock")]
        socket: String,
        /// More arguments for `rivetctl install` (--bin-dir, --unit-dir, ...).
        #[arg(last = true)]
        rest: Vec<String>,
    },
    /// Undo `install` (`rivetctl uninstall`): stop the service, unload the
    /// datapath (pod veths, programs, links, pins, state), remove the files.
    Uninstall {
        /// CNI binary directory.
        #[arg(long, default_value = "/opt/cni/bin")]
        bin_dir: String,
        /// CNI configuration directory.
        #[arg(long, default_value = "/etc/cni/net.d")]
        conf_dir: String,
        /// More arguments for `rivetctl uninstall`.
        #[arg(last = true)]
        rest: Vec<String>,
    },
    /// Benchmarks (see BENCHMARKS.md), run by `rivet-bench` (bench/).
    /// `--check`: the program-size guard instead (`cargo xtask guard`).
    Bench {
        /// Arguments for the bench runner (e.g. `same-node --pairs 5`;
        /// `cargo run -p rivet-bench -- --help` lists them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The program-size regression guard (also `bench --check`; run by
    /// `test` before the tests): each program's verified instructions and
    /// xlated size vs tests/bench-baseline.json, failing on growth over
    /// 15 % (seconds). `--update-baseline --reason "why"` rewrites the
    /// baseline.
    Guard {
        /// Arguments for `rivet-guard` (`--update-baseline`, `--reason`,
        /// `--baseline`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the fuzz targets (fuzz/, cargo-fuzz + libFuzzer on nightly),
    /// each for a bounded time; any crash fails (its input is saved under
    /// fuzz/artifacts/<target>/).
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 20)]
        secs: u64,
        /// Only this target (default: all).
        target: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let started = Instant::now();
    let result = run(cli.command);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "xtask: error after {:.0}s: {e:#}",
                started.elapsed().as_secs_f64()
            );
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (xtask lives in `<root>/xtask`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Runs a command in the workspace root, echoing it; fails on non-zero exit.
fn run_cmd(cmd: &mut Command) -> Result<()> {
    cmd.current_dir(root());
    eprintln!("\n==> {}", describe(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program().to_string_lossy().into_owned())
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn run(cmd: Cmd) -> Result<()> {
    setup::run()?;
    match cmd {
        Cmd::Setup => Ok(()),
        Cmd::Build => build(),
        Cmd::Test { filter, no_lint } => test(filter.as_deref(), no_lint),
        Cmd::Load {
            netns,
            uplink,
            node_name,
        } => {
            build()?;
            let mut cmd = Command::new(root().join("target/release/rivetd"));
            cmd.arg("--netns")
                .arg(&netns)
                .arg("--node-name")
                .arg(node_name.as_deref().unwrap_or(&netns))
                .arg("--state-dir")
                .arg(format!(
                    "/var/lib/rivet/{}",
                    node_name.as_deref().unwrap_or(&netns)
                ))
                .arg("--socket")
                .arg(format!(
                    "/run/rivet/{}.sock",
                    node_name.as_deref().unwrap_or(&netns)
                ));
            if let Some(u) = uplink {
                cmd.arg("--uplink").arg(u);
            }
            run_cmd(cmd.arg("load"))
        }
        Cmd::Unload { netns, node_name } => {
            build()?;
            let node = node_name.as_deref().unwrap_or(&netns);
            run_cmd(
                Command::new(root().join("target/release/rivetd"))
                    .arg("--netns")
                    .arg(&netns)
                    .arg("--node-name")
                    .arg(node)
                    .arg("--state-dir")
                    .arg(format!("/var/lib/rivet/{node}"))
                    .arg("--socket")
                    .arg(format!("/run/rivet/{node}.sock"))
                    .arg("unload"),
            )
        }
        Cmd::Demo {
            keep,
            mode,
            nodes,
            source,
        } => {
            build()?;
            let mut cmd = cargo();
            cmd.env("RIVET_CNI_BIN", static_cni(true)?);
            cmd.args([
                "run",
                "--release",
                "--quiet",
                "-p",
                "rivet-tests",
                "--bin",
                "rivet-demo",
                "--",
            ]);
            cmd.args([
                "--mode",
                &mode,
                "--nodes",
                &nodes.to_string(),
                "--source",
                &source,
            ]);
            if keep {
                cmd.arg("--keep");
            }
            run_cmd(&mut cmd)
        }
        Cmd::Install {
            bin_dir,
            conf_dir,
            socket,
            rest,
        } => {
            build()?;
            let cni = static_cni(true)?;
            run_cmd(
                Command::new(root().join("target/release/rivetctl"))
                    .args(["--socket", &socket, "install", "--from"])
                    .arg(root().join("target/release"))
                    .arg("--cni-binary")
                    .arg(&cni)
                    .args(["--cni-bin-dir", &bin_dir, "--cni-conf-dir", &conf_dir])
                    .args(&rest),
            )
        }
        Cmd::Uninstall {
            bin_dir,
            conf_dir,
            rest,
        } => {
            build()?;
            run_cmd(
                Command::new(root().join("target/release/rivetctl"))
                    .args([
                        "uninstall",
                        "--cni-bin-dir",
                        &bin_dir,
                        "--cni-conf-dir",
                        &conf_dir,
                    ])
                    .args(&rest),
            )
        }
        Cmd::Guard { args } => guard(&args),
        Cmd::Bench { args } if args.iter().any(|a| a == "--check") => {
            let rest: Vec<String> = args.into_iter().filter(|a| a != "--check").collect();
            guard(&rest)
        }
        Cmd::Bench { args } => {
            build()?;
            run_cmd(
                cargo()
                    .env("RIVET_CNI_BIN", static_cni(true)?)
                    .args(["run", "--release", "--quiet", "-p", "rivet-bench", "--"])
                    .args(args),
            )
        }
        Cmd::Fuzz { secs, target } => fuzz(secs, target.as_deref()),
    }
}

/// The program-size guard: `rivet-guard` (xtask/guard), a crate of its
/// own because xtask itself depends on nothing of the project. It needs
/// only the embedded object, so the debug build does (seconds once rivet
/// is built), not the release build of everything.
fn guard(args: &[String]) -> Result<()> {
    run_cmd(
        cargo()
            .args(["run", "--quiet", "-p", "rivet-guard", "--"])
            .args(args),
    )
}

fn build() -> Result<()> {
    run_cmd(cargo().args(["build", "--release", "-p", "rivet", "-p", "rivet-cni"]))?;
    static_cni(true).map(|_| ())
}

/// The host's target triple (`rustc -vV`).
fn host_triple() -> Result<String> {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .context("no host line in rustc -vV")
}

/// Builds the shipped plugin: rivet-cni linked statically (static-pie, no
/// dynamic loader, runs on any node whatever its libc). Built with an
/// explicit `--target` so the flag reaches neither build scripts nor proc
/// macros, into its own directory so the workspace's dynamic build and this
/// one do not rebuild each other. Returns the binary's path.
fn static_cni(release: bool) -> Result<PathBuf> {
    let triple = host_triple()?;
    let mut cmd = cargo();
    cmd.args(["build", "-p", "rivet-cni", "--target", &triple])
        .env("RUSTFLAGS", "-C target-feature=+crt-static");
    if release {
        cmd.arg("--release");
    }
    run_cmd(&mut cmd)?;
    let profile = if release { "release" } else { "debug" };
    Ok(root()
        .join("target")
        .join(&triple)
        .join(profile)
        .join("rivet-cni"))
}

fn test(filter: Option<&str>, no_lint: bool) -> Result<()> {
    if !no_lint {
        run_cmd(cargo().args(["fmt", "--all", "--", "--check"]))?;
        run_cmd(cargo().args([
            "clippy",
            "--workspace",
            "--exclude",
            "rivet-ebpf",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
        // The eBPF crate only builds for the BPF target, with nightly.
        run_cmd(
            Command::new("rustup")
                .args(["run", "nightly", "cargo", "clippy", "-p", "rivet-ebpf"])
                .args([
                    "--release",
                    "--target",
                    "bpfel-unknown-none",
                    "-Z",
                    "build-std=core",
                ])
                .args(["--target-dir", "target/ebpf-clippy", "--", "-D", "warnings"]),
        )?;
    }
    // Binaries the integration tests drive (rivetd, rivetctl, rivet-cni);
    // the plugin tests run the static build, the one that ships.
    run_cmd(cargo().args(["build", "-p", "rivet", "-p", "rivet-cni"]))?;
    let cni = static_cni(false)?;
    // Gate on program size (verified instructions, xlated bytes) before
    // the tests: deterministic, seconds (see `cargo xtask guard`).
    guard(&[])?;
    let mut cmd = cargo();
    cmd.env("RIVET_CNI_BIN", &cni);
    cmd.args([
        "test",
        "--workspace",
        "--exclude",
        "rivet-ebpf",
        "--no-fail-fast",
    ]);
    cmd.args(["--", "--test-threads=2"]);
    if let Some(f) = filter {
        cmd.arg(f);
    }
    run_cmd(&mut cmd)?;
    // The whole suite also fuzzes every target briefly (zero crashes).
    if filter.is_none() {
        fuzz(FUZZ_CI_SECS, None)?;
    }
    Ok(())
}

/// Seconds per fuzz target in `cargo xtask test`.
const FUZZ_CI_SECS: u64 = 10;

/// The fuzz targets and their libFuzzer options (dictionaries, input size).
const FUZZ_TARGETS: &[(&str, &[&str])] = &[
    ("cni_config", &["-dict=fuzz/dict/cni.dict", "-max_len=8192"]),
    ("runtime_config", &["-max_len=4096"]),
    (
        "agent_request",
        &["-dict=fuzz/dict/api.dict", "-max_len=8192"],
    ),
    (
        "state_loader",
        &["-dict=fuzz/dict/state.dict", "-max_len=20000"],
    ),
    ("event_record", &["-max_len=64"]),
];

/// `cargo fuzz <verb>` on nightly, in the workspace root, without the eBPF
/// build (the targets never load the object) and without AddressSanitizer:
/// the code under test is safe Rust but for one audited unaligned read
/// (whose result the `event_record` target checks byte by byte), and the
/// sanitizer costs a quarter more build (868 vs 681 CPU-s from scratch),
/// which is what a short CI run mostly costs, and runs 5x slower. Panics
/// and failed assertions are the crashes.
fn cargo_fuzz(verb: &str) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args([
        "run",
        "nightly",
        "cargo",
        "fuzz",
        verb,
        "--sanitizer",
        "none",
    ])
    .env("AYA_BUILD_SKIP", "1");
    cmd
}

/// Builds every fuzz target once, then runs each (or `only`) for `secs`
/// seconds from its committed seeds (fuzz/corpus/<target>/seed-*).
fn fuzz(secs: u64, only: Option<&str>) -> Result<()> {
    let targets: Vec<_> = FUZZ_TARGETS
        .iter()
        .filter(|(name, _)| only.is_none_or(|t| t == *name))
        .collect();
    if targets.is_empty() {
        let names: Vec<&str> = FUZZ_TARGETS.iter().map(|(n, _)| *n).collect();
        bail!("no fuzz target {only:?}; targets: {}", names.join(", "));
    }
    let started = Instant::now();
    // The fuzz workspace is outside `cargo fmt --all`.
    run_cmd(cargo().args(["fmt", "--manifest-path", "fuzz/Cargo.toml", "--", "--check"]))?;
    run_cmd(&mut cargo_fuzz("build"))?;
    let built = started.elapsed().as_secs_f64();
    for (name, options) in &targets {
        run_cmd(
            cargo_fuzz("run")
                .args([name, "--"])
                .arg(format!("-max_total_time={secs}"))
                .args(["-timeout=10", "-print_final_stats=1"])
                .args(*options),
        )?;
    }
    eprintln!(
        "fuzz: {} target(s), {secs} s each, no crash (build {built:.0} s, total {:.0} s)",
        targets.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
