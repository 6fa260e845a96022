//! `cargo xtask setup`: everything a fresh machine needs, each step checked
//! first and skipped when already done.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// Debian packages the build, tests, demo and benchmarks use, each with
/// the files that prove it is usable. Setup checks the files, not the
/// package database: a package can be installed and still lack what the
/// build reads (Debian's `protobuf-compiler` ships `protoc` but not the
/// well-known `.proto` files, which are in `libprotobuf-dev`), and a file
/// still missing after the install is named here instead of surfacing as
/// a build error later.
const APT_PACKAGES: &[(&str, &[&str])] = &[
    // rivetd's allocator (jemalloc) is built from C with make.
    ("make", &["/usr/bin/make"]),
    ("gcc", &["/usr/bin/gcc"]),
    (
        "iproute2",
        &["/usr/sbin/ip", "/usr/sbin/tc", "/usr/sbin/bridge"],
    ),
    ("iputils-ping", &["/usr/bin/ping"]),
    ("iperf3", &["/usr/bin/iperf3"]),
    (
        "iptables",
        &["/usr/sbin/iptables", "/usr/sbin/iptables-save"],
    ),
    ("nftables", &["/usr/sbin/nft"]),
    ("ipset", &["/usr/sbin/ipset"]),
    ("kubernetes-client", &["/usr/bin/kubectl"]),
    ("bpftool", &["/usr/sbin/bpftool"]),
    ("tcpdump", &["/usr/bin/tcpdump"]),
    ("ethtool", &["/usr/sbin/ethtool"]),
    ("sockperf", &["/usr/bin/sockperf"]),
    ("netcat-openbsd", &["/usr/bin/nc"]),
    (
        "containernetworking-plugins",
        &[
            "/usr/lib/cni/host-local",
            "/usr/lib/cni/bridge",
            "/usr/lib/cni/loopback",
            "/usr/lib/cni/portmap",
            "/usr/lib/cni/tuning",
        ],
    ),
    ("podman", &["/usr/bin/podman"]),
    ("runc", &["/usr/sbin/runc"]),
    ("busybox-static", &["/bin/busybox"]),
    ("etcd-server", &["/usr/bin/etcd"]),
    ("etcd-client", &["/usr/bin/etcdctl"]),
    ("protobuf-compiler", &["/usr/bin/protoc"]),
    (
        "libprotobuf-dev",
        &[
            "/usr/include/google/protobuf/descriptor.proto",
            "/usr/include/google/protobuf/empty.proto",
        ],
    ),
    ("containerd", &["/usr/bin/containerd", "/usr/bin/ctr"]),
    // The BGP speaker of `bgp` mode (and the tests' top-of-rack routers).
    ("bird2", &["/usr/sbin/bird", "/usr/sbin/birdc"]),
];

/// The bpf-linker release that matches aya-ebpf 0.2.1 and LLVM 22.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// The cargo-fuzz release `cargo xtask fuzz` runs (built with the stable
/// toolchain; the fuzz targets themselves build with nightly).
const CARGO_FUZZ_VERSION: &str = "0.13.2";

fn ok(what: &str) {
    eprintln!("  ok   {what}");
}

fn doing(what: &str) {
    eprintln!("  ..   {what}");
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("running {}", super::describe(cmd)))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            super::describe(cmd),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn status(cmd: &mut Command) -> Result<()> {
    let st = cmd
        .status()
        .with_context(|| format!("running {}", super::describe(cmd)))?;
    if !st.success() {
        bail!("{} failed ({st})", super::describe(cmd));
    }
    Ok(())
}

/// Runs every step.
pub fn run() -> Result<()> {
    eprintln!("setup:");
    if !nix_is_root() {
        bail!("rivet's setup, tests and demo need root (network namespaces, BPF): run as root");
    }
    apt()?;
    nightly_rust_src()?;
    let sysroot = llvm_symlink()?;
    bpf_linker(&sysroot)?;
    cargo_fuzz()?;
    bpffs()?;
    Ok(())
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The files of `APT_PACKAGES` that do not exist.
fn missing_files() -> Vec<(&'static str, &'static str)> {
    APT_PACKAGES
        .iter()
        .flat_map(|(pkg, files)| files.iter().map(move |f| (*pkg, *f)))
        .filter(|(_, f)| !Path::new(f).exists())
        .collect()
}

fn apt() -> Result<()> {
    let missing = missing_files();
    if missing.is_empty() {
        ok(&format!(
            "apt packages ({} present, every file they must provide exists)",
            APT_PACKAGES.len()
        ));
        return Ok(());
    }
    let mut packages: Vec<&str> = missing.iter().map(|(p, _)| *p).collect();
    packages.dedup();
    for (pkg, file) in &missing {
        eprintln!("  ..   {file} missing ({pkg})");
    }
    doing(&format!("apt-get install {}", packages.join(" ")));
    status(Command::new("apt-get").args(["update", "-qq"]))?;
    status(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&packages),
    )?;
    let still = missing_files();
    if !still.is_empty() {
        let named: Vec<String> = still
            .iter()
            .map(|(pkg, file)| format!("{file} (from {pkg})"))
            .collect();
        bail!(
            "installed the packages, but these files are still missing: {}",
            named.join(", ")
        );
    }
    ok("apt packages installed; every file they must provide exists");
    Ok(())
}

fn nightly_rust_src() -> Result<()> {
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .context("the nightly toolchain is required for the eBPF build")?;
    if installed.lines().any(|l| l.trim() == "rust-src") {
        ok("nightly rust-src");
        return Ok(());
    }
    doing("rustup component add rust-src --toolchain nightly");
    status(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

/// bpf-linker links against nightly's own libLLVM: it needs an unversioned
/// `libLLVM.so` beside the versioned one.
fn llvm_symlink() -> Result<PathBuf> {
    let sysroot = PathBuf::from(
        output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?.trim(),
    );
    let lib = sysroot.join("lib");
    let link = lib.join("libLLVM.so");
    if link.exists() {
        ok("nightly libLLVM.so link");
        return Ok(sysroot);
    }
    let target = std::fs::read_dir(&lib)
        .with_context(|| format!("listing {}", lib.display()))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so.22"))
        .with_context(|| format!("no libLLVM.so.22.* in {}", lib.display()))?;
    doing(&format!("ln -s {target} {}", link.display()));
    std::os::unix::fs::symlink(&target, &link)
        .with_context(|| format!("creating {}", link.display()))?;
    Ok(sysroot)
}

fn bpf_linker(sysroot: &Path) -> Result<()> {
    let have = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if have.contains(BPF_LINKER_VERSION) {
        ok(&format!("bpf-linker {BPF_LINKER_VERSION}"));
        return Ok(());
    }
    let llvm = output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let major = llvm
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("cannot read nightly's LLVM version")?
        .to_owned();
    doing(&format!(
        "cargo install bpf-linker@{BPF_LINKER_VERSION} (llvm-{major}, about a minute)"
    ));
    status(
        Command::new("cargo")
            .env("LLVM_PREFIX", sysroot)
            .args([
                "install",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--locked",
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ]),
    )
}

fn cargo_fuzz() -> Result<()> {
    let have = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if have.split_whitespace().any(|w| w == CARGO_FUZZ_VERSION) {
        ok(&format!("cargo-fuzz {CARGO_FUZZ_VERSION}"));
        return Ok(());
    }
    doing(&format!(
        "cargo install cargo-fuzz@{CARGO_FUZZ_VERSION} (about a minute)"
    ));
    status(Command::new("cargo").args([
        "install",
        &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}"),
        "--locked",
    ]))
}

fn bpffs() -> Result<()> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf") && l.contains(" bpf "))
    {
        ok("bpffs at /sys/fs/bpf");
        return Ok(());
    }
    doing("mount -t bpf bpf /sys/fs/bpf");
    status(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))
}
