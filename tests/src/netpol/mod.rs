//! NetworkPolicy conformance: a reference evaluator of the Kubernetes
//! semantics and a truth-table scenario to compare the datapath against.
//!
//! | module | what |
//! |---|---|
//! | `reference` | [`reference::Cluster`]: namespaces, pods and policies read from the same YAML the agent gets; `allowed(src, dst, proto, port)` = egress at the source and ingress at the destination, written from the semantics of the API alone |
//! | `cases` | namespaces x, y, z with pods a, b, c each, serving TCP and UDP on 80 and 81; [`cases::baseline_objects`] and [`cases::cases`]: named sequences of apply and delete steps (policies, updates, deletions, label changes) |
//!
//! `tests/tests/policy_conformance.rs` applies each step with `rivetctl`,
//! probes every pod pair on every port and compares each cell with the
//! evaluator.

pub mod cases;
pub mod reference;
