//! rivet's userspace: the node agent (`rivetd`), the operator CLI
//! (`rivetctl`) and what they share.
//!
//! | module | role |
//! |---|---|
//! | [`config`] | TOML + flags → validated [`config::AgentConfig`] |
//! | [`datapath`] | the embedded eBPF object: load, pin, attach, typed maps; bpffs pins, socket hooks |
//! | [`netlink`] | links, addresses, routes, neighbours; batches; network namespaces |
//! | [`endpoint`] | plumbing pods in and out, with rollback; leases, CHECK, GC; IPAM |
//! | [`store`] | crash-safe records |
//! | [`install`] | CNI binary + conflist onto a node |
//! | [`cluster`] | remote nodes → ROUTES and PEERS maps; node devices; etcd |
//! | [`agent`] | the agent: start-up, API server, reconciliation |
//! | [`server`] | metrics and health endpoint |

pub mod agent;
pub mod cluster;
pub mod config;
pub mod datapath;
pub mod endpoint;
pub mod events;
pub mod install;
pub mod nat;
pub mod netlink;
pub mod server;
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
pub use netlink::{batch as nlbatch, netns};
