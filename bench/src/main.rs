//! `cargo xtask bench`: rivet measured side by side with its peers in one
//! run. See BENCHMARKS.md for the method and the latest results. The
//! program-size regression guard is not here: `cargo xtask bench --check`
//! runs `rivet-guard` (xtask/guard).

use clap::{Parser, ValueEnum};
use rivet_bench::{self as bench, Machine, Options};

#[derive(Parser)]
#[command(
    about = "rivet benchmarks (interleaved variants, medians, ratios to a same-run baseline)"
)]
struct Args {
    /// Which benchmarks (default: all but `services`, `policy`,
    /// `bandwidth` and `bgp`, which run when named).
    #[arg(value_enum)]
    which: Vec<Which>,
    /// Measured rounds (each variant once per round, interleaved; default
    /// 7, bandwidth 3).
    #[arg(long)]
    pairs: Option<u32>,
    /// iperf3 seconds per sample (default 5; bandwidth 11, so that 10 s
    /// follow the first second, which it reports apart).
    #[arg(long)]
    secs: Option<u32>,
    /// Pods per CNI measurement.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// services: only the numbers of Services up to this one (the peers'
    /// programming grows with N²: minutes per restore beyond 10,000).
    #[arg(long)]
    max_services: Option<usize>,
    /// services: these numbers of Services instead of 1, 1,000, 10,000
    /// and 30,000 (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    services: Vec<usize>,
    /// services: only these variants (default all; the goals need all).
    #[arg(long, value_enum, value_delimiter = ',')]
    variants: Vec<bench::services::Var>,
    /// control: only these parts (comma-separated or repeated): bulk
    /// (map updates: the agent's code, ip route, nft), api (through the
    /// agent's socket, one change with the table full), etcd (convergence
    /// at 2, 5, 10 nodes), kube (the Kubernetes API source: 1,000 nodes,
    /// 10,000 Services); default all.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<bench::control::Part>,
    /// Smoke run: fewer, shorter samples.
    #[arg(long)]
    quick: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Which {
    /// Pod to pod on one node: rivet vs bridge vs ptp vs a direct veth pair.
    SameNode,
    /// CNI ADD/DEL latency and ADD throughput: rivet vs bridge + host-local.
    Cni,
    /// Cross-node pod to pod: underlay, flannel-style kernel vxlan, rivet in
    /// every mode, with veth-default and NIC-like underlays.
    Overlay,
    /// hostPort connect latency and rate vs the number of mappings: rivet's
    /// BPF DNAT vs iptables DNAT rules (portmap's layout) vs an nftables
    /// map; masquerade vs iptables MASQUERADE.
    Nat,
    /// Per-packet cost of each program path (BPF_PROG_TEST_RUN), with
    /// small and full maps, and live (kernel BPF statistics under iperf3).
    ProgCost,
    /// Packet rate of 64-byte UDP pod to pod (real frames, AF_PACKET):
    /// rivet vs an empty TC program + kernel forwarding vs no program.
    Pps,
    /// Control plane: map updates/s through the agent (API and its own
    /// code) vs ip route / nft, one change's latency with a full route
    /// table, etcd convergence when a node joins and leaves, the
    /// Kubernetes API source at 1,000 nodes and 10,000 Services (initial
    /// sync, one change's convergence, memory and CPU); `--only` picks
    /// parts.
    Control,
    /// Kubernetes Services vs their number: rivet (socket-level and uplink
    /// translation) vs kube-proxy's iptables and nftables modes; connect
    /// latency to a ClusterIP and a NodePort, UDP, throughput, one
    /// Service's apply-to-answer time, agent memory.
    Services,
    /// Kubernetes NetworkPolicy vs the number of rules: rivet (per-pod
    /// BPF tries) vs the same pods without policy vs iptables + ipset in
    /// kube-router's layout; connect latency, throughput, programming
    /// time, one rule's change-to-effect time.
    Policy,
    /// Pod bandwidth limits (CNI `bandwidth` capability): rivet vs the
    /// reference ptp + bandwidth chain; accuracy at the receiver, added
    /// ping latency under load, CPU per GB, at 10/100/1000 Mbit/s × 1 and
    /// 4 streams × egress and ingress.
    Bandwidth,
    /// `bgp` mode: announce/withdraw to every datapath at 10 and 50
    /// nodes, mesh vs route reflectors; a stopped node's withdrawal;
    /// agent and speaker memory at 50 peers; throughput across racks vs
    /// the fabric's host-to-host path and vs rivet VXLAN.
    Bgp,
}

fn main() {
    let args = Args::parse();
    let opts = if args.quick {
        // A smoke run of every benchmark: `cargo xtask bench --quick`
        // within about 4 minutes, an incremental build included (the
        // same-node paced CPU samples keep their 5 s).
        Options {
            rounds: 2,
            secs: 1,
            pods: 20,
            quick: true,
        }
    } else {
        Options {
            rounds: args.pairs.unwrap_or(7),
            secs: args.secs.unwrap_or(5),
            pods: args.pods,
            quick: false,
        }
    };
    let which = if args.which.is_empty() {
        vec![
            Which::SameNode,
            Which::Cni,
            Which::Overlay,
            Which::Nat,
            Which::ProgCost,
            Which::Pps,
            Which::Control,
            // Not `services`: kube-proxy's tables alone take minutes to
            // load at 10,000 Services and more; it runs when named. Nor
            // `policy` (about 15 minutes at up to 10,000 rules), nor
            // `bandwidth` (about 20 minutes), nor `bgp` (50-node worlds).
        ]
    } else {
        args.which
    };
    let machine = Machine::read();
    let dir = bench::out_dir();
    let mut reports = Vec::new();
    let suite = std::time::Instant::now();
    let count = which.len();
    for (i, w) in which.into_iter().enumerate() {
        let name = w
            .to_possible_value()
            .map_or_else(|| format!("{w:?}"), |v| v.get_name().to_owned());
        eprintln!(
            "[{}] {name} ({}/{count}) starting, suite at {:.0} s",
            bench::clock(),
            i + 1,
            suite.elapsed().as_secs_f64()
        );
        let started = std::time::Instant::now();
        let mut report = match w {
            Which::SameNode => bench::same_node::run(&opts),
            Which::Cni => bench::cni::run(&opts),
            Which::Overlay => bench::overlay::run(&opts),
            Which::ProgCost => bench::progcost::run(&opts),
            Which::Pps => bench::pps::run(&opts),
            // A smoke run stops at 5 nodes: every node of the largest
            // cluster is an agent to start and sync.
            Which::Control => bench::control::run(
                &opts,
                if args.quick { &[2, 5] } else { &[2, 5, 10] },
                &args.only,
            ),
            // A smoke run: 1 and 1,000 Services.
            Which::Services => {
                let sizes: &[usize] = if !args.services.is_empty() {
                    &args.services
                } else if args.quick {
                    &[1, 1000]
                } else {
                    &[1, 1000, 10_000, 30_000]
                };
                let sizes: Vec<usize> = sizes
                    .iter()
                    .copied()
                    .filter(|&n| args.max_services.is_none_or(|m| n <= m))
                    .collect();
                bench::services::run(&opts, &sizes, &args.variants)
            }
            // A smoke run: 10 and 1,000 rules.
            Which::Policy => bench::policy::run(
                &opts,
                if args.quick {
                    &[10, 1000]
                } else {
                    &[10, 100, 1000, 10_000]
                },
            ),
            // A smoke run: 1 round of 3 s samples at 10 and 100 Mbit/s;
            // --pairs and --secs are honoured when given.
            Which::Bandwidth => {
                let sizes = if args.quick {
                    bench::bandwidth::Sizes::quick(args.pairs.unwrap_or(1), args.secs.unwrap_or(3))
                } else {
                    bench::bandwidth::Sizes::full(args.pairs.unwrap_or(3), args.secs.unwrap_or(11))
                };
                bench::bandwidth::run(&opts, &sizes)
            }
            // A smoke run: 10 nodes only.
            Which::Bgp => bench::bgp::run(&opts, if args.quick { &[10] } else { &[10, 50] }),
            Which::Nat => bench::nat::run(
                &opts,
                // Every size up to 10k in a smoke run too, with short
                // samples; 30k in the full suite.
                if args.quick {
                    &[1, 100, 1000, 10_000]
                } else {
                    &[1, 100, 1000, 10_000, 30_000]
                },
            ),
        };
        let took = started.elapsed().as_secs_f64();
        report.elapsed_s = Some(took);
        eprintln!(
            "[{}] {name} ({}/{count}) took {took:.0} s, suite at {:.0} s",
            bench::clock(),
            i + 1,
            suite.elapsed().as_secs_f64()
        );
        reports.push(report);
        // Written after every benchmark, so a suite that dies half-way
        // keeps what it measured.
        if let Err(e) = bench::write(&dir, &machine, &reports) {
            eprintln!("writing results to {}: {e}", dir.display());
        }
    }
    eprint!("{}", bench::run_time_table(&reports));
    for r in &reports {
        println!("{}", r.markdown());
    }
    println!("results: {}", dir.display());
}
