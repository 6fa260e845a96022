//! Installing the CNI plugin on a node: the binary into the CNI bin dir and
//! a conflist into the CNI config dir, both root-owned and written
//! atomically (temp file + fsync + rename), so a runtime never executes a
//! half-written binary ("text file busy" cannot happen: the old inode stays
//! intact while it runs) or reads a half-written config.

use std::path::{Path, PathBuf};

use crate::store::{StoreError, write_atomic_mode};

/// Default CNI binary directory.
pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";
/// Default CNI configuration directory.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// Name of the conflist file.
pub const CONFLIST_NAME: &str = "10-rivet.conflist";

/// Where and what to install.
#[derive(Debug, Clone)]
pub struct InstallPlan {
    /// The rivet-cni binary to copy.
    pub binary: PathBuf,
    /// CNI bin dir.
    pub bin_dir: PathBuf,
    /// CNI conf dir.
    pub conf_dir: PathBuf,
    /// Agent socket the conflist names.
    pub socket: PathBuf,
    /// Network name.
    pub network: String,
}

/// Install errors.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// Reading the source binary failed.
    #[error("reading {path}: {source}")]
    Read {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Writing failed.
    #[error(transparent)]
    Write(#[from] StoreError),
    /// Setting ownership failed.
    #[error("chown root:root {path}: {source}")]
    Chown {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

/// The conflist rivet installs. `cniVersion` is 1.0.0 so that runtimes with
/// an older libcni (podman 4.3, containerd 1.6) can read the result;
/// `cniVersions` lets newer runtimes pick 1.1.0 (STATUS, GC).
pub fn conflist(network: &str, socket: &Path) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "cniVersions": ["0.3.1", "0.4.0", "1.0.0", "1.1.0"],
        "name": network,
        "plugins": [{
            "type": "rivet-cni",
            "socket": socket,
            "ipam": {"type": "rivet"},
            "capabilities": {"portMappings": true, "bandwidth": true}
        }]
    })
}

fn root_owned(path: &Path) -> Result<(), InstallError> {
    std::os::unix::fs::chown(path, Some(0), Some(0)).map_err(|source| InstallError::Chown {
        path: path.to_owned(),
        source,
    })
}

/// Installs the binary (0755) and the conflist (0644). Returns the paths.
pub fn install(plan: &InstallPlan) -> Result<Vec<PathBuf>, InstallError> {
    let binary = std::fs::read(&plan.binary).map_err(|source| InstallError::Read {
        path: plan.binary.clone(),
        source,
    })?;
    for dir in [&plan.bin_dir, &plan.conf_dir] {
        create_dir(dir)?;
    }
    let bin = plan.bin_dir.join("rivet-cni");
    write_atomic_mode(&bin, &binary, 0o755)?;
    root_owned(&bin)?;
    let conf = plan.conf_dir.join(CONFLIST_NAME);
    let text = serde_json::to_vec_pretty(&conflist(&plan.network, &plan.socket)).map_err(|e| {
        StoreError {
            what: "serializing",
            path: conf.clone(),
            source: std::io::Error::other(e),
        }
    })?;
    write_atomic_mode(&conf, &text, 0o644)?;
    root_owned(&conf)?;
    Ok(vec![bin, conf])
}

/// Removes what [`install`] wrote. Returns the paths that existed.
pub fn uninstall(bin_dir: &Path, conf_dir: &Path) -> Result<Vec<PathBuf>, InstallError> {
    let mut removed = Vec::new();
    for path in [bin_dir.join("rivet-cni"), conf_dir.join(CONFLIST_NAME)] {
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(InstallError::Write(StoreError {
                    what: "removing",
                    path,
                    source,
                }));
            }
        }
    }
    Ok(removed)
}

/// The systemd unit shipped with rivet.
pub const SYSTEMD_UNIT: &str = include_str!("../../deploy/rivetd.service");
/// The example configuration (every option, commented).
pub const EXAMPLE_CONFIG: &str = include_str!("../../deploy/rivet.toml");
/// Name of the unit file.
pub const UNIT_NAME: &str = "rivetd.service";
/// Name of the configuration file.
pub const CONFIG_NAME: &str = "rivet.toml";

/// A whole node: the agent, the CLI, the CNI plugin, the unit and the
/// configuration.
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// Directory holding the built `rivetd`, `rivetctl` and `rivet-cni`.
    pub from: PathBuf,
    /// Where `rivetd` and `rivetctl` go (`/usr/local/bin`).
    pub bin_dir: PathBuf,
    /// CNI binary and configuration directories, socket, network name.
    pub cni: InstallPlan,
    /// systemd unit directory (`/etc/systemd/system`).
    pub unit_dir: PathBuf,
    /// Configuration directory (`/etc/rivet`).
    pub config_dir: PathBuf,
    /// The configuration to write (default: [`EXAMPLE_CONFIG`]); an
    /// existing file is kept.
    pub config: Option<String>,
}

fn read(path: &Path) -> Result<Vec<u8>, InstallError> {
    std::fs::read(path).map_err(|source| InstallError::Read {
        path: path.to_owned(),
        source,
    })
}

fn create_dir(dir: &Path) -> Result<(), InstallError> {
    std::fs::create_dir_all(dir).map_err(|source| {
        InstallError::Write(StoreError {
            what: "creating",
            path: dir.to_owned(),
            source,
        })
    })
}

/// Installs a node: binaries (0755), the CNI plugin and conflist, the unit
/// (0644) and, unless one exists, the configuration (0644). Returns the
/// paths written.
pub fn install_node(plan: &NodePlan) -> Result<Vec<PathBuf>, InstallError> {
    let mut written = Vec::new();
    for dir in [&plan.bin_dir, &plan.unit_dir, &plan.config_dir] {
        create_dir(dir)?;
    }
    for name in ["rivetd", "rivetctl"] {
        let to = plan.bin_dir.join(name);
        write_atomic_mode(&to, &read(&plan.from.join(name))?, 0o755)?;
        root_owned(&to)?;
        written.push(to);
    }
    written.extend(install(&InstallPlan {
        binary: plan.from.join("rivet-cni"),
        ..plan.cni.clone()
    })?);
    let unit = plan.unit_dir.join(UNIT_NAME);
    write_atomic_mode(&unit, SYSTEMD_UNIT.as_bytes(), 0o644)?;
    root_owned(&unit)?;
    written.push(unit);
    let config = plan.config_dir.join(CONFIG_NAME);
    if !config.exists() {
        let text = plan.config.as_deref().unwrap_or(EXAMPLE_CONFIG);
        write_atomic_mode(&config, text.as_bytes(), 0o644)?;
        root_owned(&config)?;
        written.push(config);
    }
    Ok(written)
}

/// Removes a node's files after the datapath is gone (the caller runs
/// `rivetd unload` first). The configuration is removed only if it is the
/// one `install_node` wrote (`config`, or the example), else kept and
/// reported in the second list.
pub fn uninstall_node(plan: &NodePlan) -> Result<(Vec<PathBuf>, Vec<PathBuf>), InstallError> {
    let mut removed = uninstall(&plan.cni.bin_dir, &plan.cni.conf_dir)?;
    let mut kept = Vec::new();
    let config = plan.config_dir.join(CONFIG_NAME);
    let shipped = plan.config.as_deref().unwrap_or(EXAMPLE_CONFIG);
    let mut doomed = vec![
        plan.bin_dir.join("rivetd"),
        plan.bin_dir.join("rivetctl"),
        plan.unit_dir.join(UNIT_NAME),
    ];
    match std::fs::read_to_string(&config) {
        Ok(text) if text == shipped => doomed.push(config),
        Ok(_) => kept.push(config),
        Err(_) => {}
    }
    for path in doomed {
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(InstallError::Write(StoreError {
                    what: "removing",
                    path,
                    source,
                }));
            }
        }
    }
    // The configuration directory goes too if nothing else is in it.
    let _ = std::fs::remove_dir(&plan.config_dir);
    Ok((removed, kept))
}
