//! Builds the eBPF object (`ebpf/`, bin `rivet`) with aya-build and leaves it
//! in OUT_DIR for `include_bytes_aligned!`.
//!
//! With `AYA_BUILD_SKIP=1` (lint-only builds on machines without the BPF
//! toolchain) an empty object is written instead; loading it then fails with
//! a clear message at runtime.

use std::{env, fs, path::PathBuf};

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?);
    let ebpf_dir = manifest_dir.join("../ebpf");
    let ebpf_dir = ebpf_dir
        .canonicalize()
        .with_context(|| format!("eBPF crate not found at {}", ebpf_dir.display()))?;
    let root_dir = ebpf_dir
        .to_str()
        .context("eBPF crate path is not valid UTF-8")?;

    // The object's build stamp (ebpf/src/stamp.rs) comes from here.
    println!("cargo:rerun-if-env-changed=RIVET_EBPF_STAMP");
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        fs::write(out_dir.join("rivet"), []).context("writing the empty eBPF object stub")?;
    }
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "rivet-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
