//! rivet's userspace: the node agent (`rivetd`), the operator CLI
//! (`rivetctl`) and what they share.
//!
//! | module | role |
//! |---|---|
//! | [`config`] | TOML + flags → validated [`config::AgentConfig`] |
//! | [`pins`] | bpffs, the per-node pin directory and its lock |
//! | [`datapath`] | the embedded eBPF object: load, pin, attach, typed maps |
//! | [`netns`] | running work inside another network namespace |
//! | [`netlink`] | links, addresses, routes, neighbours |
//! | [`endpoint`] | plumbing pods in and out, with rollback; leases, CHECK, GC |
//! | [`ipam`] | choosing pod addresses (ranges, round-robin) |
//! | [`store`] | crash-safe records |
//! | [`install`] | CNI binary + conflist onto a node |
//! | [`node`] | node devices (`rivet_host`, idle vxlan), forwarding |
//! | [`cluster`] | remote nodes → ROUTES and PEERS maps |
//! | [`etcd`] | cluster state in etcd (flannel's schema) |
//! | [`agent`] | the agent: start-up, API server, reconciliation |

pub mod agent;
pub mod cluster;
pub mod config;
pub mod datapath;
pub mod endpoint;
pub mod etcd;
pub mod events;
pub mod install;
pub mod ipam;
pub mod metrics;
pub mod nat;
pub mod netlink;
pub mod netns;
pub mod nlbatch;
pub mod node;
pub mod pins;
pub mod sockhooks;
pub mod store;
