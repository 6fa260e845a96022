//! Generates the CRI client (`tests/src/cri.rs`) from the subset of the
//! Kubernetes CRI API in `proto/cri_runtime_v1.proto` (needs `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/cri_runtime_v1.proto";
    println!("cargo:rerun-if-changed={proto}");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&[proto], &["proto"])?;
    Ok(())
}
