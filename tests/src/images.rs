//! Container images built locally, for runtimes that import them (no
//! registry is reachable from the tests): an OCI image layout (`oci-layout`,
//! `index.json`, manifest, config, one gzip layer) packed in a tarball, the
//! format `ctr images import` reads.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

/// Where the static busybox comes from (Debian `busybox-static`).
pub const BUSYBOX: &str = "/bin/busybox";

/// Applets linked next to busybox in the image (`bin/<applet>` → `busybox`).
pub const APPLETS: &[&str] = &[
    "sh", "cat", "echo", "sleep", "nc", "wget", "ip", "ping", "timeout", "hostname", "ls", "true",
];

/// An image tarball on disk.
#[derive(Debug, Clone)]
pub struct ImageTar {
    /// Its name (`host/repo:tag`), as the runtime will know it.
    pub name: String,
    /// The tarball (an OCI image layout).
    pub path: PathBuf,
    /// Manifest digest (`sha256:…`).
    pub manifest_digest: String,
}

fn run(cmd: &mut Command, what: &str) -> Vec<u8> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `sha256:<hex>` of a file (`sha256sum`).
fn digest(path: &Path) -> String {
    let out = run(
        Command::new("sha256sum").arg(path),
        &format!("sha256sum {}", path.display()),
    );
    let text = String::from_utf8_lossy(&out);
    let hex = text.split_whitespace().next().unwrap_or_default();
    assert!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "sha256sum {}: unexpected output {text:?}",
        path.display()
    );
    format!("sha256:{hex}")
}

/// Moves `file` into the layout's blob store under its digest; returns
/// (digest, size).
fn add_blob(layout: &Path, file: &Path) -> (String, u64) {
    let d = digest(file);
    let size = std::fs::metadata(file)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
        .len();
    let hex = d.trim_start_matches("sha256:");
    let dst = layout.join("blobs/sha256").join(hex);
    std::fs::rename(file, &dst).unwrap_or_else(|e| panic!("{}: {e}", dst.display()));
    (d, size)
}

fn write_json(path: &Path, value: &serde_json::Value) {
    let text = serde_json::to_vec(value).expect("serializing JSON");
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Builds a linux/amd64 image named `name` whose only layer is a static
/// busybox at `bin/busybox` with relative symlinks for [`APPLETS`], whose
/// default command is `cmd`, under `dir` (created; left for the caller to
/// remove). Panics (with the failing step) if a tool or busybox is missing.
pub fn busybox_image(dir: &Path, name: &str, cmd: &[&str]) -> ImageTar {
    assert!(
        Path::new(BUSYBOX).exists(),
        "{BUSYBOX} missing: install busybox-static (cargo xtask setup)"
    );
    let rootfs = dir.join("rootfs");
    let layout = dir.join("layout");
    for d in [
        rootfs.join("bin"),
        rootfs.join("etc"),
        rootfs.join("tmp"),
        rootfs.join("proc"),
        rootfs.join("sys"),
        rootfs.join("dev"),
        layout.join("blobs/sha256"),
    ] {
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    }
    std::fs::copy(BUSYBOX, rootfs.join("bin/busybox"))
        .unwrap_or_else(|e| panic!("copying {BUSYBOX}: {e}"));
    for applet in APPLETS {
        let link = rootfs.join("bin").join(applet);
        std::os::unix::fs::symlink("busybox", &link)
            .unwrap_or_else(|e| panic!("{}: {e}", link.display()));
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").expect("etc/passwd");
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\n").expect("etc/group");

    // The layer: a reproducible tar of the rootfs, then gzip.
    let layer_tar = dir.join("layer.tar");
    run(
        Command::new("tar")
            .args([
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "--mtime=@0",
                "-C",
            ])
            .arg(&rootfs)
            .arg("-cf")
            .arg(&layer_tar)
            .arg("."),
        "tar of the image rootfs",
    );
    let diff_id = digest(&layer_tar);
    run(
        Command::new("gzip").args(["-n", "-f"]).arg(&layer_tar),
        "gzip of the layer",
    );
    let (layer_digest, layer_size) = add_blob(&layout, &dir.join("layer.tar.gz"));

    let config = dir.join("config.json");
    write_json(
        &config,
        &serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/bin"],
                "Cmd": cmd,
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }),
    );
    let (config_digest, config_size) = add_blob(&layout, &config);

    let manifest = dir.join("manifest.json");
    write_json(
        &manifest,
        &serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": layer_digest,
                "size": layer_size,
            }],
        }),
    );
    let (manifest_digest, manifest_size) = add_blob(&layout, &manifest);

    let tag = name.rsplit_once(':').map(|(_, t)| t).unwrap_or("latest");
    write_json(
        &layout.join("oci-layout"),
        &serde_json::json!({"imageLayoutVersion": "1.0.0"}),
    );
    write_json(
        &layout.join("index.json"),
        &serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        }),
    );
    let path = dir.join("image.tar");
    run(
        Command::new("tar")
            .args(["--owner=0", "--group=0", "--numeric-owner", "-C"])
            .arg(&layout)
            .arg("-cf")
            .arg(&path)
            .args(["oci-layout", "index.json", "blobs"]),
        "tar of the image layout",
    );
    ImageTar {
        name: name.to_owned(),
        path,
        manifest_digest,
    }
}
