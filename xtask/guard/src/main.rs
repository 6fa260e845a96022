//! `rivet-guard`: the program-size regression guard, run by `cargo xtask
//! bench --check` (and by `cargo xtask test` before the tests). Needs root
//! and a BPF-capable kernel; seconds.

use clap::Parser;

#[derive(Parser)]
#[command(
    about = "rivet's program-size guard: each program's verified instructions and xlated size \
             (kernel program info) against the committed baseline; fails on growth over 15%"
)]
struct Args {
    /// Rewrite the baseline with the current figures.
    #[arg(long, requires = "reason")]
    update_baseline: bool,
    /// Why the baseline changes (recorded in it; required, not empty).
    #[arg(long, requires = "update_baseline")]
    reason: Option<String>,
    /// Baseline file (default: tests/bench-baseline.json).
    #[arg(long)]
    baseline: Option<std::path::PathBuf>,
}

fn main() {
    let args = Args::parse();
    let path = args.baseline.unwrap_or_else(rivet_guard::default_baseline);
    let reason = args
        .update_baseline
        .then_some(args.reason.as_deref().unwrap_or(""));
    std::process::exit(rivet_guard::main(&path, reason));
}
