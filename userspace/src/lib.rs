//! rivet's userspace: the node agent (`rivetd`), the operator CLI
//! (`rivetctl`) and what they share.
//!
//! The modules form layers; a module imports only modules of the layers
//! below its own (`tests/layers.rs` enforces it):
//!
//! | layer | module | role |
//! |---|---|---|
//! | 7 | [`server`] | the API socket (one handler per request) and the metrics + health endpoint |
//! | 6 | [`agent`] | the agent: node state, start-up, reconciliation, status |
//! | 5 | [`cluster`] | remote nodes → ROUTES and PEERS maps; node devices; sources of the cluster's nodes (etcd) |
//! | 4 | [`endpoint`] | plumbing pods in and out, with rollback; CHECK, GC, hostPorts; address management |
//! | 3 | [`nat`] | masquerade settings and the NAT table's collector |
//! | 3 | [`services`] | Service and EndpointSlice objects → the Service maps |
//! | 3 | [`events`] | datapath events → `monitor` |
//! | 3 | [`install`] | CNI binary, conflist, unit and config onto a node |
//! | 2 | [`datapath`] | the eBPF object: load, pin, attach, socket hooks, typed maps |
//! | 2 | [`objects`] | Kubernetes objects (Services, EndpointSlices, …): parsed, validated, kept durably |
//! | 1 | [`netlink`] | links, addresses, routes, neighbours: messages, an async handle, batches; network namespaces |
//! | 1 | [`store`] | crash-safe records and files |
//! | 0 | [`config`] | TOML + flags → validated [`config::AgentConfig`] |

pub mod agent;
pub mod cluster;
pub mod config;
pub mod datapath;
pub mod endpoint;
pub mod events;
pub mod install;
pub mod nat;
pub mod netlink;
pub mod objects;
pub mod policy;
pub mod server;
pub mod services;
pub mod store;

// The paths of the flat layout, kept for the test harness (tests/, fuzz/,
// benches), which still names them.
#[doc(hidden)]
pub use cluster::{etcd, node};
#[doc(hidden)]
pub use datapath::{pins, sockhooks};
#[doc(hidden)]
pub use endpoint::ipam;
#[doc(hidden)]
pub use netlink::netns;
