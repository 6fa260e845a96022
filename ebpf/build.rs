//! Rebuild the object when bpf-linker changes (it is part of the toolchain).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
