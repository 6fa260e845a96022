//! rivetctl: talk to a running rivetd.
//!
//! `cli`: the command line; `install`: the node and the CNI plugin onto
//! the machine; `monitor`: events and counter rates as they come; `table`:
//! answers printed for a person. The other verbs are one request each,
//! built in `run`; `apply`, `delete` and `get` send the document's text
//! (the agent parses it) and wait longer for the answer.

mod cli;
mod install;
mod monitor;
mod table;

use std::{io::Read as _, path::Path, process::ExitCode, time::Duration};

use clap::Parser as _;
use rivet_api::{
    Bandwidth, Client, EndpointBandwidth, EndpointCheck, EndpointRef, EndpointSpec, Request,
    Response,
};

use crate::cli::{Cli, Command, EndpointAction, NodeAction, Output};

fn main() -> ExitCode {
    // Output piped into a reader that stops early (`rivetctl services |
    // head`) ends rivetctl quietly, as it ends other command-line tools,
    // instead of a panic on the failed write.
    // SAFETY: called first, before any other thread exists; SIG_DFL is a
    // valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rivetctl: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How long `apply`, `delete` and `get` wait for each step of the exchange
/// (the agent answers once every object is checked, written and synced:
/// minutes for tens of thousands of objects on a slow disk).
const OBJECTS_TIMEOUT: Duration = Duration::from_secs(900);

/// The text of the document at `path` (`-`: standard input).
fn read_document(path: &Path) -> Result<String, Box<dyn std::error::Error>> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("reading standard input: {e}"))?;
        Ok(text)
    } else {
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()).into())
    }
}

fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    let socket = match &cli.node {
        Some(node) => {
            std::path::Path::new(rivet_api::DEFAULT_SOCKET).with_file_name(format!("{node}.sock"))
        }
        None => cli.socket.clone(),
    };
    let objects = matches!(
        cli.command,
        Command::Apply { .. } | Command::Delete { .. } | Command::Get { .. }
    );
    // Storing ten thousand objects takes the agent seconds (a sync per file).
    let client = if objects {
        Client::new(&socket).with_timeout(OBJECTS_TIMEOUT)
    } else {
        Client::new(&socket)
    };
    let request = match &cli.command {
        Command::Version => {
            println!("rivetctl {}", env!("CARGO_PKG_VERSION"));
            match client.call(&Request::Status {}) {
                Ok(Response::Status(s)) => println!("rivetd {} (node {})", s.version, s.node_name),
                Ok(other) => println!("rivetd: unexpected answer {other:?}"),
                Err(e) => println!("rivetd: not reachable ({e})"),
            }
            return Ok(());
        }
        Command::Stats {
            all,
            watch: Some(secs),
            count,
        } => return monitor::watch_stats(&client, *secs, *count, *all),
        Command::Install(args) => return install::install_node(args, &socket),
        Command::Uninstall(args) => return install::uninstall_node(args, &socket),
        Command::Monitor {
            flows,
            sample,
            reason,
            count,
        } => {
            return monitor::monitor(
                &client,
                cli.output,
                *flows,
                *sample,
                reason.as_deref(),
                *count,
            );
        }
        Command::InstallCni {
            binary,
            bin_dir,
            conf_dir,
            network,
            uninstall,
        } => {
            return install::install_cni(
                &socket,
                binary.as_deref(),
                bin_dir,
                conf_dir,
                network,
                *uninstall,
            );
        }
        Command::Apply { file } => Request::Apply {
            document: read_document(file)?,
        },
        Command::Delete {
            file,
            ignore_not_found,
        } => Request::Delete {
            document: read_document(file)?,
            ignore_not_found: *ignore_not_found,
        },
        Command::Get {
            kind,
            name,
            namespace,
            all_namespaces,
        } => Request::Get {
            kind: kind.clone(),
            namespace: if *all_namespaces {
                None
            } else {
                Some(namespace.clone().unwrap_or_else(|| "default".to_owned()))
            },
            name: name.clone(),
        },
        Command::Status => Request::Status {},
        Command::Services => Request::Services {},
        Command::Bgp => Request::Bgp {},
        Command::Policy { pod } => Request::Policy { pod: pod.clone() },
        Command::Endpoints => Request::EndpointList {},
        Command::Routes => Request::NodeList {},
        Command::Nat {
            ip,
            port,
            limit,
            offset,
        } => Request::NatPage {
            ip: *ip,
            port: *port,
            offset: *offset,
            limit: Some(*limit),
        },
        Command::Portmaps { limit, offset } => Request::PortmapPage {
            offset: *offset,
            limit: Some(*limit),
        },
        Command::Node { action } => match action {
            NodeAction::Set {
                subnet,
                node_ip,
                vtep_mac,
            } => Request::NodeSet(rivet_api::NodeEntry {
                subnet: subnet.clone(),
                node_ip: *node_ip,
                vtep_mac: vtep_mac.clone(),
                vni: None,
                route: None,
            }),
            NodeAction::Del { subnet } => Request::NodeDel {
                subnet: subnet.clone(),
            },
        },
        Command::Stats { .. } => Request::Stats {},
        Command::Endpoint { action } => match action {
            EndpointAction::Add {
                container_id,
                netns,
                ip,
                ifname,
            } => Request::EndpointAdd(EndpointSpec {
                ifname: ifname.clone(),
                ip: *ip,
                ..EndpointSpec::new(container_id, netns)
            }),
            EndpointAction::Del {
                container_id,
                ifname,
            } => Request::EndpointDel(EndpointRef::new(container_id, ifname)),
            EndpointAction::Bandwidth {
                container_id,
                ifname,
                ingress_rate,
                ingress_burst,
                egress_rate,
                egress_burst,
            } => Request::EndpointBandwidth(EndpointBandwidth {
                endpoint: EndpointRef::new(container_id, ifname),
                bandwidth: Some(Bandwidth {
                    ingress_rate: *ingress_rate,
                    ingress_burst: *ingress_burst,
                    egress_rate: *egress_rate,
                    egress_burst: *egress_burst,
                }),
            }),
            EndpointAction::Check {
                container_id,
                ifname,
            } => Request::EndpointCheck(EndpointCheck {
                container_id: container_id.clone(),
                ifname: ifname.clone(),
                ip: None,
                network: None,
            }),
        },
    };
    let response = client.call(&request)?;
    if let (Output::Json, Response::Objects { items }) = (cli.output, &response) {
        // As kubectl prints a listing.
        let list = serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": ""},
            "items": items,
        });
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else if matches!(cli.output, Output::Json) {
        println!("{}", serde_json::to_string_pretty(&response)?);
    } else {
        let show_all = matches!(cli.command, Command::Stats { all: true, .. });
        table::print_table(&response, show_all);
    }
    match response {
        Response::Status(s) if !s.ready => Err(format!(
            "agent at {} is not ready: {}",
            socket.display(),
            s.not_ready.as_deref().unwrap_or("unknown reason")
        )
        .into()),
        Response::Error(e) => Err(format!("agent at {}: {e}", socket.display()).into()),
        _ => Ok(()),
    }
}
