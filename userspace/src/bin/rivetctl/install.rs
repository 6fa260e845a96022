//! `install`, `uninstall` (the node as a service) and `install-cni`.

use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct NodeArgs {
    /// Directory holding the built rivetd, rivetctl and rivet-cni
    /// (default: the one rivetctl runs from).
    #[arg(long)]
    from: Option<PathBuf>,
    /// The rivet-cni binary (default: in --from).
    #[arg(long)]
    cni_binary: Option<PathBuf>,
    /// Where rivetd and rivetctl go.
    #[arg(long, default_value = "/usr/local/bin")]
    bin_dir: PathBuf,
    /// CNI binary directory.
    #[arg(long, default_value = rivet::install::DEFAULT_BIN_DIR)]
    cni_bin_dir: PathBuf,
    /// CNI configuration directory.
    #[arg(long, default_value = rivet::install::DEFAULT_CONF_DIR)]
    cni_conf_dir: PathBuf,
    /// systemd unit directory.
    #[arg(long, default_value = "/etc/systemd/system")]
    unit_dir: PathBuf,
    /// Configuration directory (rivet.toml).
    #[arg(long, default_value = "/etc/rivet")]
    config_dir: PathBuf,
    /// Install this configuration instead of the commented example.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Network name in the conflist.
    #[arg(long, default_value = "rivet")]
    network: String,
}

impl NodeArgs {
    fn plan(
        &self,
        socket: &std::path::Path,
    ) -> Result<rivet::install::NodePlan, Box<dyn std::error::Error>> {
        let from = match &self.from {
            Some(d) => d.clone(),
            None => std::env::current_exe()?
                .parent()
                .map(std::path::Path::to_path_buf)
                .ok_or("cannot locate the directory of rivetctl")?,
        };
        let config = match &self.config {
            Some(p) => Some(
                std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))?,
            ),
            None => None,
        };
        Ok(rivet::install::NodePlan {
            cni: rivet::install::InstallPlan {
                binary: self
                    .cni_binary
                    .clone()
                    .unwrap_or_else(|| from.join("rivet-cni")),
                bin_dir: self.cni_bin_dir.clone(),
                conf_dir: self.cni_conf_dir.clone(),
                socket: socket.to_owned(),
                network: self.network.clone(),
            },
            from,
            bin_dir: self.bin_dir.clone(),
            unit_dir: self.unit_dir.clone(),
            config_dir: self.config_dir.clone(),
            config,
        })
    }
}

/// systemd manages this machine and the unit goes where it looks.
fn systemd_owns(unit_dir: &std::path::Path) -> bool {
    unit_dir == std::path::Path::new("/etc/systemd/system")
        && std::path::Path::new("/run/systemd/system").is_dir()
}

pub fn install_node(
    args: &NodeArgs,
    socket: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let plan = args.plan(socket)?;
    for p in rivet::install::install_node(&plan)? {
        println!("installed {}", p.display());
    }
    if systemd_owns(&args.unit_dir) {
        let _ = std::process::Command::new("systemctl")
            .arg("daemon-reload")
            .status();
        println!(
            "edit {}, then: systemctl enable --now rivetd",
            args.config_dir.join(rivet::install::CONFIG_NAME).display()
        );
    }
    Ok(())
}

pub fn uninstall_node(
    args: &NodeArgs,
    socket: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let plan = args.plan(socket)?;
    if systemd_owns(&args.unit_dir) && args.unit_dir.join(rivet::install::UNIT_NAME).exists() {
        let _ = std::process::Command::new("systemctl")
            .args(["disable", "--now", "rivetd"])
            .status();
    }
    let rivetd = args.bin_dir.join("rivetd");
    let config = args.config_dir.join(rivet::install::CONFIG_NAME);
    if rivetd.exists() && config.exists() {
        let status = std::process::Command::new(&rivetd)
            .arg("--config")
            .arg(&config)
            .arg("unload")
            .status()
            .map_err(|e| format!("running {}: {e}", rivetd.display()))?;
        if !status.success() {
            return Err(format!(
                "{} --config {} unload failed ({status}); nothing removed",
                rivetd.display(),
                config.display()
            )
            .into());
        }
        println!("unloaded the datapath ({} unload)", rivetd.display());
    }
    let (removed, kept) = rivet::install::uninstall_node(&plan)?;
    for p in removed {
        println!("removed {}", p.display());
    }
    for p in kept {
        println!("kept {} (edited since install)", p.display());
    }
    Ok(())
}

/// `install-cni`: rivet-cni and its conflist (or, with `uninstall`, their
/// removal).
pub fn install_cni(
    socket: &Path,
    binary: Option<&Path>,
    bin_dir: &Path,
    conf_dir: &Path,
    network: &str,
    uninstall: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    if uninstall {
        for p in rivet::install::uninstall(bin_dir, conf_dir)? {
            println!("removed {}", p.display());
        }
        return Ok(());
    }
    let binary = match binary {
        Some(b) => b.to_path_buf(),
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("rivet-cni"))
            .ok_or("cannot locate rivet-cni next to rivetctl")?,
    };
    let plan = rivet::install::InstallPlan {
        binary,
        bin_dir: bin_dir.to_path_buf(),
        conf_dir: conf_dir.to_path_buf(),
        socket: socket.to_path_buf(),
        network: network.to_owned(),
    };
    for p in rivet::install::install(&plan)? {
        println!("installed {}", p.display());
    }
    Ok(())
}
