//! rivet-cni as a library: everything the plugin decodes (environment,
//! network configuration, `runtimeConfig`, `args`, `CNI_ARGS`, previous
//! results) and the results it builds. The binary (`main.rs`) is the thin
//! client around it; the fuzz targets (`fuzz/`) drive the same functions.

pub mod conf;
pub mod delegate;
pub mod local;
pub mod result;
pub mod skel;

use std::net::Ipv4Addr;

use conf::{CniArgs, NetConf, parse_cni_args};
use rivet_api::PortMapping;
use skel::{Args, CniError};

/// Decodes the network configuration of an invocation (every verb but
/// VERSION) and checks that its version allows the verb.
pub fn decode_config(args: &Args, stdin: &[u8]) -> Result<NetConf, CniError> {
    let conf = NetConf::parse(stdin)?;
    skel::check_version(args.command, &conf.cni_version)?;
    Ok(conf)
}

/// The error document printed on stdout: in the version the config names,
/// else the plugin's own.
pub fn error_json(e: &CniError, stdin: &[u8]) -> serde_json::Value {
    let version = NetConf::version_of(stdin).unwrap_or_else(|| skel::CURRENT_VERSION.to_owned());
    e.to_json(&version)
}

/// What ADD takes from the environment and the configuration before it
/// talks to the agent or a delegated IPAM plugin, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddInputs {
    /// `CNI_ARGS` (pod identity, `IP=`).
    pub cni_args: CniArgs,
    /// `runtimeConfig.portMappings`.
    pub port_mappings: Vec<PortMapping>,
    /// Extra routes of the ipam section.
    pub routes: Vec<String>,
    /// The requested address: `CNI_ARGS` `IP`, else `runtimeConfig.ips`,
    /// else `args.cni.ips`.
    pub requested: Option<Ipv4Addr>,
}

/// Decodes and validates ADD's inputs (in the order ADD reports them).
pub fn add_inputs(args: &Args, conf: &NetConf) -> Result<AddInputs, CniError> {
    let cni_args = parse_cni_args(&args.cni_args)?;
    let port_mappings = conf.port_mappings()?;
    let routes = conf.routes()?;
    let requested = cni_args.ip.or(conf.requested_ip()?);
    Ok(AddInputs {
        cni_args,
        port_mappings,
        routes,
        requested,
    })
}
