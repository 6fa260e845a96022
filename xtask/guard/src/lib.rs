//! Program-size regression guard (`rivet-guard`, run by `cargo xtask bench
//! --check` and by `cargo xtask test` before the tests): gates on what the
//! kernel reports deterministically instead of timings. Every program of the
//! embedded object is loaded the way the agent loads it
//! ([`rivet::datapath::Datapath::load`], maps and programs pinned in a
//! private pin directory removed afterwards; nothing is attached), and the
//! kernel's program info — verified instruction count, translated (xlated)
//! size, JIT size — is compared with the committed baseline
//! `tests/bench-baseline.json`. Growth of more than [`LIMIT_PERCENT`] in
//! verified instructions or xlated bytes fails, as does a program missing
//! from the baseline or gone from the object; the JIT size is shown but not
//! gated (it depends on the machine's JIT). `--update-baseline --reason
//! "why"` rewrites the baseline, which is then committed with the change.
//!
//! A crate of its own beside xtask: xtask depends on nothing of the project
//! (it builds before the eBPF toolchain exists) and runs this one through
//! cargo; the benchmarks (`rivet-bench`) do not take part.

use std::{
    collections::BTreeMap,
    fmt::{self, Write as _},
    io,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use aya::{
    EbpfLoader,
    programs::{ProgramError, ProgramInfo},
};
use rivet::{
    datapath::{Datapath, DatapathError, OBJECT},
    pins::{PinError, PinLayout},
};
use serde::{Deserialize, Serialize};

/// Allowed growth of a gated figure, in percent of the baseline.
pub const LIMIT_PERCENT: u64 = 15;

/// The verifier's limit on processed instructions per program
/// (`BPF_COMPLEXITY_LIMIT_INSNS`): a program over it does not load at all.
pub const VERIFIER_LIMIT: u32 = 1_000_000;

/// The program closest to the verifier's limit, as a line.
pub fn headroom(now: &BTreeMap<String, Figures>) -> Option<String> {
    let (name, f) = now.iter().max_by_key(|(_, f)| f.verified_insns)?;
    Some(format!(
        "largest: {name} with {} verified insns = {:.1}% of the verifier's limit ({VERIFIER_LIMIT})",
        f.verified_insns,
        f64::from(f.verified_insns) * 100.0 / f64::from(VERIFIER_LIMIT)
    ))
}

/// The committed baseline (`tests/bench-baseline.json` in the workspace;
/// this crate lives in `xtask/guard`).
pub fn default_baseline() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .unwrap_or(manifest)
        .join("tests/bench-baseline.json")
}

/// A short name unique to this process and call: `rt<pid hex><n>` (the
/// harness's prefix shape, so leftovers are recognisable).
fn unique_prefix() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("rt{:x}{n:x}", std::process::id() & 0xfffff)
}

/// What the kernel reports about one loaded program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    /// Instructions the verifier processed (`verified_insns`).
    pub verified_insns: u32,
    /// Size of the translated program after verification (`xlated_prog_len`).
    pub xlated_bytes: u32,
    /// Size of the JIT-compiled code (`jited_prog_len`; informational).
    pub jited_bytes: u32,
}

/// The baseline file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    /// Why the figures were last changed (never empty).
    pub reason: String,
    /// Date of the last change (YYYY-MM-DD, UTC).
    pub updated: String,
    /// Kernel the figures were measured on (`uname -r`): verifier counts
    /// can differ between kernels.
    pub kernel: String,
    /// Figures per program name.
    pub programs: BTreeMap<String, Figures>,
}

/// Errors of the guard; each names what it was doing.
#[derive(Debug)]
pub enum GuardError {
    /// The binary was built without the eBPF object.
    EmptyObject,
    /// Parsing the object to list its programs failed.
    Object(Box<aya::EbpfError>),
    /// The private pin directory could not be made or removed.
    Pins(PinError),
    /// Loading the datapath as the agent does failed.
    Load(DatapathError),
    /// A program of the object has no pin after loading: the agent does not
    /// load it.
    NotLoaded {
        /// Program name.
        program: String,
        /// Cause.
        source: ProgramError,
    },
    /// The kernel did not report a figure (kernel too old).
    NoFigure {
        /// Program name.
        program: String,
        /// Which figure.
        what: &'static str,
    },
    /// Reading or writing the baseline failed.
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// The baseline is not valid JSON of the expected shape.
    Json {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: serde_json::Error,
    },
    /// `--update-baseline` without a reason.
    EmptyReason,
}

impl fmt::Display for GuardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyObject => write!(
                f,
                "the embedded eBPF object is empty (built with AYA_BUILD_SKIP=1): nothing to check"
            ),
            Self::Object(e) => write!(f, "parsing the embedded eBPF object: {e}"),
            Self::Pins(e) => write!(f, "private pin directory: {e}"),
            Self::Load(e) => write!(f, "loading the datapath as the agent does: {e}"),
            Self::NotLoaded { program, source } => write!(
                f,
                "program {program} is in the object but the agent's loader did not load it \
                 (no pin; datapath::PROGRAMS / program_names::SOCKET_HOOKS): {source}"
            ),
            Self::NoFigure { program, what } => write!(
                f,
                "the kernel reports no {what} for {program} (needs Linux 5.16 or later)"
            ),
            Self::Io { what, path, source } => write!(f, "{what} {}: {source}", path.display()),
            Self::Json { path, source } => write!(f, "baseline {}: {source}", path.display()),
            Self::EmptyReason => write!(
                f,
                "--update-baseline needs --reason \"why the programs grew or shrank\" \
                 (recorded in the baseline)"
            ),
        }
    }
}

impl std::error::Error for GuardError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Object(e) => Some(e.as_ref()),
            Self::Pins(e) => Some(e),
            Self::Load(e) => Some(e),
            Self::NotLoaded { source, .. } => Some(source),
            Self::Io { source, .. } => Some(source),
            Self::Json { source, .. } => Some(source),
            Self::EmptyObject | Self::NoFigure { .. } | Self::EmptyReason => None,
        }
    }
}

/// A pin directory of our own under /sys/fs/bpf (outside the agents'
/// `rivet/`), removed with everything in it when dropped.
struct PrivatePins {
    layout: PinLayout,
}

impl PrivatePins {
    fn new() -> Result<Self, GuardError> {
        let bpffs = Path::new(rivet::config::DEFAULT_BPFFS);
        rivet::pins::ensure_bpffs(bpffs).map_err(GuardError::Pins)?;
        let layout = PinLayout::new(bpffs.join(format!("rivet-guard-{}", unique_prefix())));
        // The loader reuses pinned maps: start from an empty directory.
        layout.remove_all().map_err(GuardError::Pins)?;
        Ok(Self { layout })
    }
}

impl Drop for PrivatePins {
    fn drop(&mut self) {
        if let Err(e) = self.layout.remove_all() {
            eprintln!(
                "bench guard: removing {}: {e}",
                self.layout.root().display()
            );
        }
    }
}

/// Names of every program in the embedded object.
fn object_programs() -> Result<Vec<String>, GuardError> {
    // Loading creates the object's maps (unpinned, freed on drop); no
    // program is loaded.
    let ebpf = EbpfLoader::new()
        .load(OBJECT)
        .map_err(|e| GuardError::Object(Box::new(e)))?;
    let mut names: Vec<String> = ebpf.programs().map(|(n, _)| n.to_owned()).collect();
    names.sort();
    Ok(names)
}

fn figures(program: &str, info: &ProgramInfo) -> Result<Figures, GuardError> {
    let missing = |what| GuardError::NoFigure {
        program: program.to_owned(),
        what,
    };
    Ok(Figures {
        verified_insns: info
            .verified_instruction_count()
            .ok_or_else(|| missing("verified instruction count"))?,
        xlated_bytes: info
            .size_translated()
            .ok_or_else(|| missing("translated size"))?,
        jited_bytes: info.size_jitted(),
    })
}

/// Loads the datapath as the agent does (private pins, nothing attached)
/// and reads the kernel's figures for every program of the object.
pub fn measure() -> Result<BTreeMap<String, Figures>, GuardError> {
    if OBJECT.is_empty() {
        return Err(GuardError::EmptyObject);
    }
    let names = object_programs()?;
    let pins = PrivatePins::new()?;
    // The agent's loader with its default map sizes.
    let datapath = Datapath::load(&pins.layout).map_err(GuardError::Load)?;
    let mut out = BTreeMap::new();
    for name in names {
        let info = ProgramInfo::from_pin(pins.layout.prog(&name)).map_err(|source| {
            GuardError::NotLoaded {
                program: name.clone(),
                source,
            }
        })?;
        out.insert(name.clone(), figures(&name, &info)?);
    }
    drop(datapath);
    drop(pins);
    Ok(out)
}

/// The verdict on one program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Same gated figures.
    Unchanged,
    /// Grew, within the limit (none shrank).
    Within,
    /// A gated figure shrank and none grew.
    Shrank,
    /// One gated figure shrank, another grew within the limit.
    Changed,
    /// A gated figure grew more than the limit: fails.
    Grew,
    /// In the object, not in the baseline: fails.
    New,
    /// In the baseline, not in the object: fails.
    Gone,
}

impl Status {
    /// Whether this status fails the check.
    pub const fn fails(self) -> bool {
        matches!(self, Self::Grew | Self::New | Self::Gone)
    }

    /// The status column; `updating`: the baseline is being rewritten, so
    /// nothing fails.
    const fn label(self, updating: bool) -> &'static str {
        match (self, updating) {
            (Self::Unchanged, _) => "ok",
            (Self::Within, _) => "ok (grew, within limit)",
            (Self::Shrank, _) => "ok (shrank)",
            (Self::Changed, _) => "ok (changed within limit)",
            (Self::Grew, false) => "FAIL: grew more than the limit",
            (Self::New, false) => "FAIL: not in the baseline",
            (Self::Gone, false) => "FAIL: no longer in the object",
            (Self::Grew, true) => "grew more than the limit (accepted: updating)",
            (Self::New, true) => "new (added: updating)",
            (Self::Gone, true) => "gone (removed: updating)",
        }
    }
}

/// One program compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Program name.
    pub program: String,
    /// Baseline figures (None: new program).
    pub base: Option<Figures>,
    /// Current figures (None: program gone).
    pub now: Option<Figures>,
    /// Verdict.
    pub status: Status,
}

/// True if `now` exceeds `base` by more than [`LIMIT_PERCENT`] (integer
/// arithmetic: exactly the limit passes).
pub fn grew_too_much(base: u32, now: u32) -> bool {
    u64::from(now) * 100 > u64::from(base) * (100 + LIMIT_PERCENT)
}

/// Growth in percent (None when the baseline is 0).
pub fn growth_percent(base: u32, now: u32) -> Option<f64> {
    (base != 0).then(|| (f64::from(now) - f64::from(base)) * 100.0 / f64::from(base))
}

fn status(base: Figures, now: Figures) -> Status {
    let gated = [
        (base.verified_insns, now.verified_insns),
        (base.xlated_bytes, now.xlated_bytes),
    ];
    let grew = gated.iter().any(|&(b, n)| n > b);
    let shrank = gated.iter().any(|&(b, n)| n < b);
    if gated.iter().any(|&(b, n)| grew_too_much(b, n)) {
        Status::Grew
    } else {
        match (grew, shrank) {
            (true, true) => Status::Changed,
            (true, false) => Status::Within,
            (false, true) => Status::Shrank,
            (false, false) => Status::Unchanged,
        }
    }
}

/// Compares current figures with the baseline's, program by program (sorted
/// by name).
pub fn compare(base: &BTreeMap<String, Figures>, now: &BTreeMap<String, Figures>) -> Vec<Row> {
    let mut names: Vec<&String> = base.keys().chain(now.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let (b, n) = (base.get(name).copied(), now.get(name).copied());
            let status = match (b, n) {
                (Some(b), Some(n)) => status(b, n),
                (None, _) => Status::New,
                (Some(_), None) => Status::Gone,
            };
            Row {
                program: name.clone(),
                base: b,
                now: n,
                status,
            }
        })
        .collect()
}

/// True if no row fails.
pub fn passed(rows: &[Row]) -> bool {
    !rows.iter().any(|r| r.status.fails())
}

/// A figure of the table: label, accessor, gated.
type Metric = (&'static str, fn(&Figures) -> u32, bool);

/// The table's figures, in order.
const METRICS: [Metric; 3] = [
    ("verified insns", |f| f.verified_insns, true),
    ("xlated bytes", |f| f.xlated_bytes, true),
    ("jited bytes", |f| f.jited_bytes, false),
];

/// The comparison as a fixed-width table: one line per program and figure
/// (`updating`: the baseline is being rewritten; failures read as accepted).
pub fn table(rows: &[Row], updating: bool) -> String {
    let mut out = format!(
        "{:<18} {:<15} {:>9} {:>9} {:>8}  status\n",
        "program", "figure", "baseline", "now", "growth"
    );
    let num = |v: Option<u32>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    for r in rows {
        for (i, (label, get, gated)) in METRICS.into_iter().enumerate() {
            let (b, n) = (r.base.as_ref().map(get), r.now.as_ref().map(get));
            let growth = match (b, n) {
                (Some(b), Some(n)) => {
                    growth_percent(b, n).map_or_else(|| "n/a".to_owned(), |g| format!("{g:+.1}%"))
                }
                _ => "-".to_owned(),
            };
            let note = match (i, gated, b, n) {
                (0, ..) => r.status.label(updating),
                (_, true, Some(b), Some(n)) if grew_too_much(b, n) => "<- over the limit",
                (_, false, ..) => "(informational)",
                _ => "",
            };
            let name = if i == 0 { r.program.as_str() } else { "" };
            let _ = writeln!(
                out,
                "{name:<18} {label:<15} {:>9} {:>9} {growth:>8}  {note}",
                num(b),
                num(n)
            );
        }
    }
    out
}

/// Reads a baseline file.
pub fn read_baseline(path: &Path) -> Result<Baseline, GuardError> {
    let text = std::fs::read_to_string(path).map_err(|source| GuardError::Io {
        what: "reading",
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| GuardError::Json {
        path: path.to_owned(),
        source,
    })
}

/// Writes a baseline file (pretty JSON; a temporary file renamed over it).
pub fn write_baseline(path: &Path, baseline: &Baseline) -> Result<(), GuardError> {
    let io_err = |what| {
        move |source| GuardError::Io {
            what,
            path: path.to_owned(),
            source,
        }
    };
    let mut text = serde_json::to_string_pretty(baseline).map_err(|source| GuardError::Json {
        path: path.to_owned(),
        source,
    })?;
    text.push('\n');
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(io_err("writing"))?;
    std::fs::rename(&tmp, path).map_err(io_err("replacing"))
}

/// A new baseline from `programs`, dated today; refuses an empty reason.
pub fn new_baseline(
    reason: &str,
    programs: BTreeMap<String, Figures>,
) -> Result<Baseline, GuardError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(GuardError::EmptyReason);
    }
    Ok(Baseline {
        reason: reason.to_owned(),
        updated: today(),
        kernel: kernel_release(),
        programs,
    })
}

/// Today's date, UTC (YYYY-MM-DD).
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    civil_date(i64::try_from(secs / 86_400).unwrap_or(0))
}

/// The date (YYYY-MM-DD) `days` days after 1970-01-01 (Howard Hinnant's
/// civil-from-days).
fn civil_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `uname -r`.
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// How to accept a change.
const HOW_TO_UPDATE: &str = "If the change is intended, update the baseline in the same commit:\n  \
     cargo xtask bench --check --update-baseline --reason \"<why the programs changed>\"\n  \
     git commit tests/bench-baseline.json <your files>";

/// `rivet-guard [--update-baseline --reason R]`: prints the table
/// and returns the exit code (0 pass or baseline written, 1 regression or
/// program set changed, 2 error).
pub fn main(baseline_path: &Path, update_reason: Option<&str>) -> i32 {
    match check(baseline_path, update_reason) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("bench guard: error: {e}");
            2
        }
    }
}

fn check(baseline_path: &Path, update_reason: Option<&str>) -> Result<bool, GuardError> {
    // Refuse a missing reason before loading anything.
    if let Some(reason) = update_reason
        && reason.trim().is_empty()
    {
        return Err(GuardError::EmptyReason);
    }
    let now = measure()?;
    let kernel = kernel_release();
    let old = match read_baseline(baseline_path) {
        Ok(b) => Some(b),
        Err(GuardError::Io { source, .. })
            if source.kind() == io::ErrorKind::NotFound && update_reason.is_some() =>
        {
            None
        }
        Err(e) => {
            if update_reason.is_none() {
                eprintln!(
                    "bench guard: no usable baseline. Create it with\n  cargo xtask bench \
                     --check --update-baseline --reason \"initial baseline\""
                );
            }
            return Err(e);
        }
    };
    let rows = compare(old.as_ref().map_or(&BTreeMap::new(), |b| &b.programs), &now);
    println!(
        "bench guard: kernel program info vs {} (fails on > {LIMIT_PERCENT}% growth of verified \
         insns or xlated bytes)",
        baseline_path.display()
    );
    if let Some(b) = &old {
        println!(
            "baseline: updated {}, kernel {}, reason: {}",
            b.updated, b.kernel, b.reason
        );
        if b.kernel != kernel {
            println!(
                "note: measured on kernel {kernel}, the baseline on {}: verifier figures can \
                 differ between kernels",
                b.kernel
            );
        }
    }
    print!("{}", table(&rows, update_reason.is_some()));
    if let Some(line) = headroom(&now) {
        println!("{line}");
    }
    if let Some(reason) = update_reason {
        let baseline = new_baseline(reason, now)?;
        write_baseline(baseline_path, &baseline)?;
        println!(
            "bench guard: baseline written to {} ({} programs, reason: {}); commit it with the \
             change",
            baseline_path.display(),
            baseline.programs.len(),
            baseline.reason
        );
        return Ok(true);
    }
    let ok = passed(&rows);
    let shrank: Vec<&str> = rows
        .iter()
        .filter(|r| matches!(r.status, Status::Shrank | Status::Changed))
        .map(|r| r.program.as_str())
        .collect();
    if ok {
        println!(
            "bench guard: PASS ({} programs)",
            rows.iter().filter(|r| r.now.is_some()).count()
        );
        if !shrank.is_empty() {
            println!(
                "bench guard: {} shrank; lowering the baseline keeps the gain guarded:\n  cargo \
                 xtask bench --check --update-baseline --reason \"<why>\"",
                shrank.join(", ")
            );
        }
    } else {
        for r in rows.iter().filter(|r| r.status.fails()) {
            let why = match r.status {
                Status::New => "is in the object but not in the baseline",
                Status::Gone => "is in the baseline but no longer in the object",
                _ => "grew more than the limit",
            };
            println!("bench guard: {} {why}", r.program);
        }
        println!("bench guard: FAIL\n{HOW_TO_UPDATE}");
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figs(verified_insns: u32, xlated_bytes: u32, jited_bytes: u32) -> Figures {
        Figures {
            verified_insns,
            xlated_bytes,
            jited_bytes,
        }
    }

    fn map(entries: &[(&str, Figures)]) -> BTreeMap<String, Figures> {
        entries.iter().map(|(n, f)| ((*n).to_owned(), *f)).collect()
    }

    fn one(base: Figures, now: Figures) -> Status {
        let rows = compare(&map(&[("p", base)]), &map(&[("p", now)]));
        assert_eq!(rows.len(), 1);
        rows[0].status
    }

    #[test]
    fn limit_boundaries() {
        assert!(!grew_too_much(1000, 1140));
        assert!(!grew_too_much(1000, 1150), "exactly the limit passes");
        assert!(grew_too_much(1000, 1151));
        assert!(grew_too_much(1000, 1160));
        assert!(
            grew_too_much(0, 1),
            "anything over a zero baseline is growth"
        );
        assert!(!grew_too_much(u32::MAX, u32::MAX), "no overflow");
    }

    #[test]
    fn fourteen_percent_passes() {
        let s = one(figs(10_000, 80_000, 40_000), figs(11_400, 91_200, 40_000));
        assert_eq!(s, Status::Within);
        assert!(!s.fails());
    }

    #[test]
    fn sixteen_percent_fails_on_either_gated_figure() {
        let base = figs(10_000, 80_000, 40_000);
        let insns = one(base, figs(11_600, 80_000, 40_000));
        let xlated = one(base, figs(10_000, 92_800, 40_000));
        assert_eq!(insns, Status::Grew);
        assert_eq!(xlated, Status::Grew);
        assert!(insns.fails() && xlated.fails());
        let rows = compare(
            &map(&[("a", base), ("b", base)]),
            &map(&[("a", base), ("b", figs(11_600, 80_000, 40_000))]),
        );
        assert!(!passed(&rows), "one failing program fails the check");
    }

    #[test]
    fn headroom_names_the_largest() {
        let line = headroom(&map(&[
            ("small", figs(100, 800, 400)),
            ("big", figs(250_000, 80_000, 40_000)),
        ]))
        .expect("line");
        assert!(line.contains("big with 250000"), "{line}");
        assert!(line.contains("25.0%"), "{line}");
        assert_eq!(headroom(&BTreeMap::new()), None);
    }

    #[test]
    fn jited_size_is_not_gated() {
        let s = one(figs(100, 800, 400), figs(100, 800, 4000));
        assert_eq!(s, Status::Unchanged);
    }

    #[test]
    fn shrinking_passes_and_is_reported() {
        let rows = compare(
            &map(&[("p", figs(1000, 8000, 4000))]),
            &map(&[("p", figs(700, 6000, 3000))]),
        );
        assert_eq!(rows[0].status, Status::Shrank);
        assert!(passed(&rows));
        assert!(
            table(&rows, false).contains("ok (shrank)"),
            "{}",
            table(&rows, false)
        );
        assert!(
            table(&rows, false).contains("-30.0%"),
            "{}",
            table(&rows, false)
        );
    }

    #[test]
    fn one_figure_down_one_up_within_is_changed() {
        let s = one(figs(1000, 8000, 4000), figs(750, 8100, 4000));
        assert_eq!(s, Status::Changed);
        assert!(!s.fails());
        let s = one(figs(1000, 8000, 4000), figs(750, 9600, 4000));
        assert_eq!(s, Status::Grew, "a shrink elsewhere does not excuse growth");
    }

    #[test]
    fn new_and_gone_programs_fail() {
        let f = figs(100, 800, 400);
        let rows = compare(&map(&[("a", f), ("old", f)]), &map(&[("a", f), ("new", f)]));
        let by: BTreeMap<&str, Status> = rows
            .iter()
            .map(|r| (r.program.as_str(), r.status))
            .collect();
        assert_eq!(by["a"], Status::Unchanged);
        assert_eq!(by["new"], Status::New);
        assert_eq!(by["old"], Status::Gone);
        assert!(!passed(&rows));
        let t = table(&rows, false);
        assert!(t.contains("not in the baseline"), "{t}");
        assert!(t.contains("no longer in the object"), "{t}");
        let updating = table(&rows, true);
        assert!(!updating.contains("FAIL"), "{updating}");
        assert!(updating.contains("new (added"), "{updating}");
    }

    #[test]
    fn table_marks_the_figure_over_the_limit() {
        let rows = compare(
            &map(&[("from_pod", figs(1000, 8000, 4000))]),
            &map(&[("from_pod", figs(1000, 9600, 4000))]),
        );
        let t = table(&rows, false);
        let xlated = t
            .lines()
            .find(|l| l.contains("xlated bytes"))
            .unwrap_or_default();
        assert!(xlated.contains("+20.0%"), "{t}");
        assert!(xlated.contains("over the limit"), "{t}");
        assert!(t.contains("FAIL"), "{t}");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(11_016), "2000-02-29");
        assert_eq!(civil_date(20_788), "2026-12-01");
    }

    #[test]
    fn default_baseline_is_the_committed_file() {
        assert!(default_baseline().ends_with("tests/bench-baseline.json"));
        assert!(
            default_baseline().exists(),
            "{}",
            default_baseline().display()
        );
    }

    #[test]
    fn baseline_round_trip_and_reason() {
        assert!(matches!(
            new_baseline("  ", BTreeMap::new()),
            Err(GuardError::EmptyReason)
        ));
        let b = new_baseline(" why ", map(&[("p", figs(1, 2, 3))])).expect("baseline");
        assert_eq!(b.reason, "why");
        assert_eq!(b.updated.len(), 10, "{}", b.updated);
        let dir = std::env::temp_dir().join(format!("{}-baseline", unique_prefix()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("b.json");
        write_baseline(&path, &b).expect("write");
        let text = std::fs::read_to_string(&path).expect("read");
        let back = read_baseline(&path).expect("parse");
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert_eq!(back, b);
        for key in [
            "\"verified_insns\": 1",
            "\"xlated_bytes\": 2",
            "\"jited_bytes\": 3",
            "\"reason\": \"why\"",
            "\"updated\"",
        ] {
            assert!(text.contains(key), "{key} missing from {text}");
        }
    }

    /// Needs root and a BPF-capable kernel: the real programs, loaded.
    #[test]
    fn measures_every_program_deterministically() {
        let first = measure().expect("measure");
        let names: Vec<&str> = first.keys().map(String::as_str).collect();
        for p in rivet::datapath::PROGRAMS
            .into_iter()
            .chain(rivet_common::program_names::SOCKET_HOOKS)
        {
            assert!(names.contains(&p), "{p} missing from {names:?}");
        }
        for (name, f) in &first {
            assert!(f.verified_insns > 0 && f.xlated_bytes > 0, "{name}: {f:?}");
            // 8 bytes per instruction: the translation holds at least one.
            assert_eq!(f.xlated_bytes % 8, 0, "{name}: {f:?}");
        }
        let second = measure().expect("measure again");
        assert_eq!(first, second, "the kernel's figures must not vary");
        let leftovers: Vec<_> = std::fs::read_dir(rivet::config::DEFAULT_BPFFS)
            .expect("bpffs")
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("rivet-guard-rt{:x}", std::process::id() & 0xfffff))
            })
            .collect();
        assert!(leftovers.is_empty(), "pins left behind: {leftovers:?}");
    }
}
