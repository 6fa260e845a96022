//! CNI plugin speed: ADD and DEL latency for sequential pods (interleaved
//! pod by pod between the variants) and ADD throughput with 8 concurrent
//! runtimes' calls — rivet vs the reference bridge + host-local.
//!
//! Both plugins are executed the same way: fork/exec from a thread that has
//! joined the node namespace, config on stdin, like a runtime.

use std::{
    io::{Read as _, Write as _},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{Options, Report, percentile, progress};
use rivet_tests::{
    Netns, World,
    cni::{Outcome, Plugin, rivet_conf},
    unique_prefix,
};

struct Variant {
    name: &'static str,
    plugin: Plugin,
    node: PathBuf,
    conf: Value,
    pods: Vec<Netns>,
}

impl Variant {
    fn del(&self, i: usize) -> Outcome {
        let (plugin, pod, conf) = (&self.plugin, self.pods[i].path(), &self.conf);
        rivet::netns::run_in(&self.node, || {
            plugin.del(&format!("b{i}"), Some(&pod), conf)
        })
        .expect("node netns")
    }

    /// ADD (`add`) or DEL of pod `i` from the calling thread, which first
    /// joins the node namespace (untimed, like a runtime that lives there):
    /// the milliseconds from the plugin's spawn to its exit and output.
    /// Only on a thread of this benchmark's own.
    fn timed(&self, add: bool, i: usize) -> f64 {
        rivet::netns::enter(&self.node).expect("node netns");
        let (id, pod) = (format!("b{i}"), self.pods[i].path());
        let t = Instant::now();
        let out = if add {
            self.plugin.add(&id, &pod, &self.conf)
        } else {
            self.plugin.del(&id, Some(&pod), &self.conf)
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        assert!(
            out.ok,
            "{} {}: {}{}",
            self.name,
            if add { "ADD" } else { "DEL" },
            out.stdout,
            out.stderr
        );
        ms
    }
}

/// `RIVET_BENCH_CNI_SCRAPE_MS=N`: one thread per rivet agent GETs its
/// `/metrics` every N ms during the timed phases, in the agent's node
/// namespace (127.0.0.1, port `RIVET_BENCH_CNI_SCRAPE_PORT`, default
/// 9402) — a scraper that polls hard, to see what it costs ADDs.
struct Scraper {
    stop: Arc<AtomicBool>,
    threads: Vec<(&'static str, ScrapeThread)>,
}

/// A scraper thread: its scrapes' milliseconds and failures.
type ScrapeThread = std::thread::JoinHandle<(Vec<f64>, u64)>;

impl Scraper {
    fn start(every: Duration, port: u16, nodes: &[(&'static str, PathBuf)]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = nodes
            .iter()
            .map(|(name, node)| {
                let (stop, node) = (Arc::clone(&stop), node.clone());
                let t = std::thread::spawn(move || {
                    rivet::netns::enter(&node).expect("node netns");
                    let (mut took, mut failed) = (Vec::new(), 0u64);
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        match scrape(port) {
                            Ok(()) => took.push(t.elapsed().as_secs_f64() * 1e3),
                            Err(_) => failed += 1,
                        }
                        std::thread::sleep(every.saturating_sub(t.elapsed()));
                    }
                    (took, failed)
                });
                (*name, t)
            })
            .collect();
        Self { stop, threads }
    }

    /// Stops the scrapers; per agent: (name, scrape ms samples, failures).
    fn finish(self) -> Vec<(&'static str, Vec<f64>, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|(name, t)| {
                let (took, failed) = t.join().expect("scraper");
                (name, took, failed)
            })
            .collect()
    }
}

/// One GET /metrics on 127.0.0.1:`port`, the whole answer read.
fn scrape(port: u16) -> std::io::Result<()> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    if out.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(std::io::Error::other("not 200"))
    }
}

/// Runs the benchmark.
pub fn run(opts: &Options) -> Report {
    let n = opts.pods.clamp(10, 200);
    let prefix = unique_prefix();
    let scratch = std::env::temp_dir().join(format!("rivet-bench-cni-{prefix}"));
    std::fs::create_dir_all(&scratch).expect("scratch");

    let mut world = World::new();
    let node = world.add_node_with_agent();
    let rivet_node = world.nodes[node].ns.path();
    let mut rivet_plugin = Plugin::rivet(&rivet_node);
    rivet_plugin.run_in = None;
    // A/B (development): a second rivet node, interleaved with the first,
    // whose agent gets extra environment `RIVET_BENCH_CNI_B_ENV` (`K=V,K=V`)
    // and/or is the rivetd of `RIVET_BENCH_CNI_B_BIN_DIR`, and/or whose
    // plugin is `RIVET_BENCH_CNI_B_BIN`. `RIVET_BENCH_CNI_LOG=<dir>` keeps
    // the agents' logs (ADD timelines) there.
    let b_env = std::env::var("RIVET_BENCH_CNI_B_ENV").ok();
    let b_bin = std::env::var_os("RIVET_BENCH_CNI_B_BIN").map(PathBuf::from);
    let b_dir = std::env::var_os("RIVET_BENCH_CNI_B_BIN_DIR");
    let node_b = (b_env.is_some() || b_bin.is_some() || b_dir.is_some()).then(|| {
        let nb = world.add_node();
        for kv in b_env.iter().flat_map(|e| e.split(',')) {
            if let Some((k, v)) = kv.split_once('=') {
                world.nodes[nb]
                    .agent_args
                    .env
                    .push((k.to_owned(), v.to_owned()));
            }
        }
        let saved = std::env::var_os("RIVET_BIN_DIR");
        if let Some(d) = &b_dir {
            // SAFETY: no other thread of this process reads the environment
            // while the agent starts (development A/B only).
            unsafe { std::env::set_var("RIVET_BIN_DIR", d) };
        }
        world.start_agent(nb);
        if b_dir.is_some() {
            // SAFETY: as above.
            unsafe {
                match &saved {
                    Some(v) => std::env::set_var("RIVET_BIN_DIR", v),
                    None => std::env::remove_var("RIVET_BIN_DIR"),
                }
            }
        }
        nb
    });

    let bridge_node = Netns::new(format!("{prefix}-bn"));
    let mut bridge_plugin = Plugin::reference("bridge", &bridge_node.path());
    bridge_plugin.run_in = None;

    progress(&format!("cni: creating {} pod namespaces", 2 * n));
    let make_pods = |tag: &str| -> Vec<Netns> {
        (0..n)
            .map(|i| Netns::new(format!("{prefix}-{tag}{i}")))
            .collect()
    };
    let mut variants = vec![Variant {
        name: "rivet",
        plugin: rivet_plugin,
        node: rivet_node,
        conf: rivet_conf("1.0.0", world.nodes[node].agent().socket()),
        pods: make_pods("r"),
    }];
    if let Some(nb) = node_b {
        let path = world.nodes[nb].ns.path();
        let mut plugin = Plugin::rivet(&path);
        plugin.run_in = None;
        if let Some(bin) = &b_bin {
            plugin.bin.clone_from(bin);
        }
        variants.push(Variant {
            name: "rivet-b",
            plugin,
            node: path,
            conf: rivet_conf("1.0.0", world.nodes[nb].agent().socket()),
            pods: make_pods("q"),
        });
    }
    variants.push(
        Variant {
            name: "bridge",
            plugin: bridge_plugin,
            node: bridge_node.path(),
            conf: json!({
                "cniVersion": "1.0.0", "name": "benchbr", "type": "bridge", "bridge": "cni0",
                "isGateway": true, "ipMasq": false,
                "ipam": {"type": "host-local", "subnet": "10.251.0.0/16", "dataDir": scratch.join("host-local")},
            }),
            pods: make_pods("b"),
        },
    );
    // The same bridge-netfilter setting in every namespace of every
    // variant (nodes, underlay, pods), read back.
    let spaces_all = |variants: &[Variant]| -> crate::Settings {
        let spaces = crate::world_spaces(&world)
            .chain([&bridge_node])
            .chain(variants.iter().flat_map(|v| &v.pods));
        crate::bridge_nf_read(spaces)
    };
    let kernel_at_setup = crate::bridge_nf_off(
        crate::world_spaces(&world)
            .chain([&bridge_node])
            .chain(variants.iter().flat_map(|v| &v.pods)),
    );
    let variants = Arc::new(variants);

    let mut report = Report {
        name: "CNI ADD/DEL".into(),
        variants: variants.iter().map(|v| v.name.to_owned()).collect(),
        baseline: "bridge".into(),
        ..Default::default()
    };
    for m in ["add_ms", "add_p99_ms", "del_ms", "del_p99_ms"] {
        report.better.insert(m.into(), "lower".into());
    }
    report
        .better
        .insert("adds_per_s_8way".into(), "higher".into());
    report.notes.push(format!(
        "{n} sequential pods, ADD then DEL, interleaved pod by pod between the variants (pod i starts with variant i mod the number of variants), after one warm-up ADD/DEL each, timed from the plugin's spawn to its exit on a long-lived caller thread in the node namespace; add_ms/del_ms rows are medians of all samples"
    ));
    report.notes.push(
        "adds_per_s_8way: {n} ADDs issued by 8 concurrent callers, wall-clock rate"
            .replace("{n}", &n.to_string()),
    );
    report.notes.push(
        "bridge: reference bridge + host-local from containernetworking-plugins (Debian)".into(),
    );

    let scrape_every = std::env::var("RIVET_BENCH_CNI_SCRAPE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis);
    let scrape_port = std::env::var("RIVET_BENCH_CNI_SCRAPE_PORT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(rivet_tests::metrics::METRICS_PORT);
    let scraper = scrape_every.map(|every| {
        let agents: Vec<(&'static str, PathBuf)> = variants
            .iter()
            .filter(|v| v.name.starts_with("rivet"))
            .map(|v| (v.name, v.node.clone()))
            .collect();
        Scraper::start(every, scrape_port, &agents)
    });

    let started = Instant::now();
    // The sequential phase runs on one thread of its own that moves into
    // each variant's node namespace before its call (a runtime calls
    // plugins from a long-lived thread: no thread start per call in the
    // figures, whose tail it was on a loaded machine).
    let samples: Vec<(Vec<f64>, Vec<f64>)> = std::thread::scope(|s| {
        s.spawn(|| {
            // Warm-up: one ADD and DEL per variant (pod 0, added again below).
            for v in variants.iter() {
                v.timed(true, 0);
                v.timed(false, 0);
            }
            let mut samples = vec![(Vec::new(), Vec::new()); variants.len()];
            let order: Vec<usize> = (0..variants.len()).collect();
            for i in 0..n {
                progress(&format!(
                    "cni: sequential ADD {i}/{n} [{:.0}s]",
                    started.elapsed().as_secs_f64()
                ));
                for k in crate::rotated(&order, i) {
                    samples[k].0.push(variants[k].timed(true, i));
                }
            }
            for i in 0..n {
                progress(&format!(
                    "cni: sequential DEL {i}/{n} [{:.0}s]",
                    started.elapsed().as_secs_f64()
                ));
                for k in crate::rotated(&order, i) {
                    samples[k].1.push(variants[k].timed(false, i));
                }
            }
            samples
        })
        .join()
        .expect("sequential phase")
    });
    for (v, (adds, dels)) in variants.iter().zip(&samples) {
        for a in adds {
            report.add("add_ms", v.name, *a);
        }
        for d in dels {
            report.add("del_ms", v.name, *d);
        }
        report.add("add_p99_ms", v.name, percentile(adds, 99.0));
        report.add("del_p99_ms", v.name, percentile(dels, 99.0));
    }

    for (vi, v) in variants.iter().enumerate() {
        progress(&format!(
            "cni: 8-way ADD storm, {} [{:.0}s]",
            v.name,
            started.elapsed().as_secs_f64()
        ));
        let next = Arc::new(Mutex::new(0usize));
        let t = Instant::now();
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let (variants, next) = (Arc::clone(&variants), Arc::clone(&next));
                std::thread::spawn(move || {
                    // Each caller lives in the node namespace.
                    rivet::netns::enter(&variants[vi].node).expect("node netns");
                    loop {
                        let i = {
                            let mut g = next.lock().expect("lock");
                            let i = *g;
                            *g += 1;
                            i
                        };
                        if i >= n {
                            break;
                        }
                        let v = &variants[vi];
                        let out = v.plugin.add(&format!("b{i}"), &v.pods[i].path(), &v.conf);
                        assert!(
                            out.ok,
                            "{} ADD: {}{}",
                            variants[vi].name, out.stdout, out.stderr
                        );
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        report.add(
            "adds_per_s_8way",
            v.name,
            n as f64 / t.elapsed().as_secs_f64(),
        );
        for i in 0..n {
            let out = v.del(i);
            assert!(out.ok, "{} DEL: {}", v.name, out.stdout);
        }
    }
    if let (Some(scraper), Some(every)) = (scraper, scrape_every) {
        for (name, took, failed) in scraper.finish() {
            report.notes.push(format!(
                "{name}: /metrics scraped every {} ms during the timed phases: {} scrapes, {failed} failed, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                every.as_millis(),
                took.len(),
                percentile(&took, 50.0),
                percentile(&took, 99.0),
                took.iter().copied().fold(0.0, f64::max),
            ));
        }
    }
    progress("");
    eprintln!("cni: done in {:.0}s", started.elapsed().as_secs_f64());
    report.set_kernel_settings(kernel_at_setup, &spaces_all(&variants));
    report
        .notes
        .push("adds_per_s_8way: one storm per variant, in the listed order".into());
    if let Some(dir) = std::env::var_os("RIVET_BENCH_CNI_LOG") {
        for (i, n) in world.nodes.iter().enumerate() {
            let to = PathBuf::from(&dir).join(format!("agent{i}.log"));
            if let Err(e) = std::fs::copy(&n.agent_args.log, &to) {
                eprintln!("cni: copying the agent log to {}: {e}", to.display());
            }
        }
    }
    drop(variants);
    drop(bridge_node);
    drop(world);
    let _ = std::fs::remove_dir_all(&scratch);
    report
}
