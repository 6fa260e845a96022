//! `cargo xtask demo`: one node, three pods, traffic through the BPF
//! datapath, the agent's view of it, then cleanup (or `--keep`).

use std::process::Command;

use clap::Parser;
use rivet_tests::{
    World, bin,
    traffic::{iperf3_client, iperf3_server, ping},
};

#[derive(Parser)]
#[command(about = "rivet demo: a node with three pods in network namespaces")]
struct Args {
    /// Leave namespaces, agent and pins in place for poking around.
    #[arg(long)]
    keep: bool,
    /// iperf3 duration in seconds.
    #[arg(long, default_value_t = 3)]
    secs: u32,
}

fn step(text: &str) {
    println!("\n\x1b[1m== {text}\x1b[0m");
}

fn rivetctl(socket: &std::path::Path, args: &[&str]) {
    let out = Command::new(bin("rivetctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("running rivetctl");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
}

fn main() {
    let args = Args::parse();
    step("building the world: underlay bridge, one node, rivetd");
    let mut w = World::new();
    let n = w.add_node_with_agent();
    println!(
        "node {} (namespace {}), uplink eth0 {}, pod CIDR {}",
        w.nodes[n].name,
        w.nodes[n].ns.name(),
        w.nodes[n].ip,
        w.nodes[n].pod_cidr
    );
    println!("agent socket {}", w.nodes[n].agent().socket().display());

    step("creating three pods through the agent API");
    let pods: Vec<usize> = (0..3).map(|_| w.add_pod(n)).collect();
    for &p in &pods {
        let e = &w.pods[p].endpoint;
        println!(
            "pod {:<18} ip {:<12} host veth {} (ifindex {})",
            w.pods[p].name, e.ip, e.host_ifname, e.host_ifindex
        );
    }

    step("ping between every pair of pods, and pod <-> node");
    for &i in &pods {
        for &j in &pods {
            if i != j {
                let r = ping(&w.pods[i].ns, w.pods[j].ip, 3, 0.1);
                println!(
                    "{} -> {}: {}/{} replies, avg {:.3} ms",
                    w.pods[i].ip,
                    w.pods[j].ip,
                    r.received,
                    r.sent,
                    r.avg_ms.unwrap_or(f64::NAN)
                );
            }
        }
        let r = ping(&w.pods[i].ns, w.nodes[n].ip, 2, 0.1);
        println!(
            "{} -> node {}: {}/{} replies",
            w.pods[i].ip, w.nodes[n].ip, r.received, r.sent
        );
    }
    let r = ping(&w.nodes[n].ns, w.pods[pods[0]].ip, 2, 0.1);
    println!(
        "node -> {}: {}/{} replies",
        w.pods[pods[0]].ip, r.received, r.sent
    );

    step(&format!("iperf3 {}s, pod 1 -> pod 2", args.secs));
    let server = iperf3_server(&w.pods[pods[1]].ns, 5201, Some(1));
    let res = iperf3_client(
        &w.pods[pods[0]].ns,
        w.pods[pods[1]].ip,
        5201,
        args.secs,
        1,
        Some(0),
    );
    drop(server);
    println!(
        "{:.2} Gbit/s, {} retransmits",
        res.bits_per_second / 1e9,
        res.retransmits
    );

    let socket = w.nodes[n].agent().socket().to_owned();
    step("rivetctl endpoints");
    rivetctl(&socket, &["endpoints"]);
    step("rivetctl stats (BPF counters; fwd_local = bpf_redirect_peer between pods)");
    rivetctl(&socket, &["stats"]);
    step("rivetctl status");
    rivetctl(&socket, &["status"]);

    if args.keep {
        step("--keep: leaving everything up");
        println!("node namespace:  {}", w.nodes[n].ns.name());
        for &p in &pods {
            println!("pod namespace:   {}", w.pods[p].ns.name());
        }
        println!(
            "try:   ip netns exec {} ping {}",
            w.pods[pods[0]].ns.name(),
            w.pods[pods[2]].ip
        );
        println!(
            "       {} --socket {} stats",
            bin("rivetctl").display(),
            socket.display()
        );
        println!(
            "agent pid {:?}, pins {}",
            w.nodes[n].agent().pid(),
            w.nodes[n].pin_dir().display()
        );
        println!(
            "clean up: kill the agent, then `{} --netns {} --node-name {} --state-dir {} --socket {} unload`,",
            bin("rivetd").display(),
            w.nodes[n].ns.name(),
            w.nodes[n].name,
            w.nodes[n].agent_args.state_dir.display(),
            socket.display()
        );
        println!(
            "          and `ip netns del` each namespace listed above (and {}).",
            w.underlay.name()
        );
        w.keep();
    } else {
        step("cleaning up (agents stopped, pins removed, namespaces deleted)");
    }
}
