//! Upgrade without loss: node 1's agent is restarted with a rebuilt eBPF
//! object (`rivetd --ebpf-object`, same source, another build stamp, so
//! other bytes) and then rolled back to the embedded one, while four paced
//! TCP streams and four sequenced UDP flows run through the node —
//! same-node, cross-node (in each mode), masqueraded to the outside, and
//! from the outside through a hostPort. Every stream must complete with
//! every byte, no reset, no lost segment (no retransmission timeout, every
//! retransmission a duplicate the receiver reported) and no pause over
//! `continuity::MAX_PAUSE` (500 ms); every datagram must arrive exactly
//! once; a poller reading the kernel's attachments every 10 ms must never
//! see a pod veth, the uplink or `rivet_host` without its program; after
//! each swap every hook runs the freshly loaded programs (new IDs, same
//! instructions), the agent's status names the object it loaded, and the
//! endpoints, routes, peers, hostPorts, NAT entries and lease records are
//! the same as before.
//!
//! The second object is built once per test run from the workspace
//! (`target/upgrade-obj`, the flags of `userspace/build.rs`), or taken from
//! `$RIVET_UPGRADE_OBJECT`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::OnceLock,
    time::{Duration, Instant},
};

use aya::programs::ProgramInfo;
use rivet::{
    datapath::{OBJECT, object_hash, object_stamp},
    pins::PinLayout,
};
use rivet_api::{AgentStatus, Request, Response};
use rivet_common::program_names;
use rivet_tests::{
    AgentProc, World,
    continuity::{Hook, Scenario, attached_ids, build_object, state},
};

/// The rebuilt object, built once for every test of this binary.
fn upgrade_object() -> &'static PathBuf {
    static OBJ: OnceLock<PathBuf> = OnceLock::new();
    OBJ.get_or_init(|| {
        let t = Instant::now();
        let path = build_object(&format!("upgrade-{}", std::process::id()));
        eprintln!(
            "upgrade object {} built in {:?}",
            path.display(),
            t.elapsed()
        );
        path
    })
}

fn status(w: &World, n: usize) -> AgentStatus {
    match w.nodes[n].agent().client().call(&Request::Status {}) {
        Ok(Response::Status(s)) => s,
        other => panic!("status: {other:?}"),
    }
}

/// Stops node `n`'s agent (SIGTERM) and starts it again, with the programs
/// from `object` (None: the embedded object). Returns how long the node
/// had no agent.
fn restart_with(w: &mut World, n: usize, object: Option<&Path>) -> Duration {
    let mut args = w.nodes[n].agent().args().clone();
    args.extra_args.retain(|a| !a.starts_with("--ebpf-object="));
    if let Some(o) = object {
        args.extra_args
            .push(format!("--ebpf-object={}", o.display()));
    }
    let t = Instant::now();
    let st = w.nodes[n].agent_mut().stop().expect("agent was running");
    assert!(st.success(), "SIGTERM exit status {st}");
    w.nodes[n].agent = Some(AgentProc::start(args));
    t.elapsed()
}

/// (program, ID, tag) of every TC program pinned for node `n`.
fn pinned_programs(w: &World, n: usize) -> BTreeMap<&'static str, (u32, u64)> {
    let layout = PinLayout::new(w.nodes[n].pin_dir());
    [
        program_names::FROM_POD,
        program_names::FROM_UPLINK,
        program_names::FROM_HOST,
    ]
    .into_iter()
    .map(|name| {
        let info = ProgramInfo::from_pin(layout.prog(name))
            .unwrap_or_else(|e| panic!("pinned program {name}: {e}"));
        (name, (info.id(), info.tag()))
    })
    .collect()
}

/// Every hook runs exactly the pinned program for it.
fn assert_hooks_run(
    ids: &BTreeMap<String, Vec<u32>>,
    hooks: &[Hook],
    progs: &BTreeMap<&'static str, (u32, u64)>,
) {
    for (name, _, _) in hooks {
        let want = match name.as_str() {
            "eth0" => program_names::FROM_UPLINK,
            "rivet_host" => program_names::FROM_HOST,
            _ => program_names::FROM_POD,
        };
        assert_eq!(
            ids[name],
            vec![progs[want].0],
            "{name} runs the {want} just loaded"
        );
    }
}

fn upgrade_without_loss(mode: &str) {
    let new_object = upgrade_object().clone();
    let new_bytes = std::fs::read(&new_object).expect("read the rebuilt object");
    let (old_hash, new_hash) = (object_hash(OBJECT), object_hash(&new_bytes));
    let (old_stamp, new_stamp) = (object_stamp(OBJECT), object_stamp(&new_bytes));
    assert_ne!(old_hash, new_hash, "the rebuilt object differs in bytes");
    assert!(
        old_stamp.is_some() && new_stamp.is_some() && old_stamp != new_stamp,
        "both objects carry a stamp, and they differ: {old_stamp:?} {new_stamp:?}"
    );

    let mut sc = Scenario::start(mode);
    let n1 = sc.n1;
    let before = sc.state();
    let (ns_path, hooks) = (sc.ns_path.clone(), sc.hooks.clone());
    let w = &mut sc.w;
    let s = status(w, n1);
    assert_eq!(
        (s.ebpf.source.as_str(), &s.ebpf.stamp, &s.ebpf.hash),
        ("embedded", &old_stamp, &old_hash),
        "the agent runs the embedded object"
    );
    let progs0 = pinned_programs(w, n1);
    assert_hooks_run(&attached_ids(&ns_path, &hooks), &hooks, &progs0);

    // Upgrade: the rebuilt object from a file.
    let up_gap = restart_with(w, n1, Some(&new_object));
    std::thread::sleep(Duration::from_secs(2));
    let s = status(w, n1);
    assert_eq!(
        (s.ebpf.source.clone(), &s.ebpf.stamp, &s.ebpf.hash),
        (new_object.display().to_string(), &new_stamp, &new_hash),
        "the agent reports the object it loaded"
    );
    assert_eq!(s.ebpf.bytes, new_bytes.len() as u64);
    let log = w.nodes[n1].agent().log();
    assert!(
        log.contains("datapath object loaded")
            && log.contains(new_stamp.as_deref().unwrap_or_default()),
        "the start log names the object: {log}"
    );
    let progs1 = pinned_programs(w, n1);
    assert_hooks_run(&attached_ids(&ns_path, &hooks), &hooks, &progs1);
    for (name, (id, tag)) in &progs1 {
        let (id0, tag0) = progs0[name];
        assert_ne!(*id, id0, "{name}: a new program replaced the old one");
        assert_eq!(*tag, tag0, "{name}: same source, same instructions");
    }
    let upgraded = state(w, n1);

    // Roll back: the embedded object again.
    let back_gap = restart_with(w, n1, None);
    std::thread::sleep(Duration::from_secs(2));
    let s = status(w, n1);
    assert_eq!(
        (s.ebpf.source.as_str(), &s.ebpf.stamp, &s.ebpf.hash),
        ("embedded", &old_stamp, &old_hash),
        "rolled back to the embedded object"
    );
    let progs2 = pinned_programs(w, n1);
    assert_hooks_run(&attached_ids(&ns_path, &hooks), &hooks, &progs2);
    for (name, (id, _)) in &progs2 {
        assert_ne!(*id, progs1[name].0, "{name}: rolled back to a new load");
    }
    let after = state(w, n1);

    eprintln!(
        "{mode}: agent down {up_gap:?} (upgrade), {back_gap:?} (rollback); \
         program IDs {progs0:?} -> {progs1:?} -> {progs2:?}"
    );
    sc.finish(mode, 300);
    assert_eq!(before, upgraded, "state before and after the upgrade");
    assert_eq!(before, after, "state before and after the rollback");
}

#[test]
fn upgrades_lose_nothing_vxlan() {
    upgrade_without_loss("vxlan");
}

#[test]
fn upgrades_lose_nothing_ipip() {
    upgrade_without_loss("ipip");
}

#[test]
fn upgrades_lose_nothing_native() {
    upgrade_without_loss("native");
}

/// Little-endian reads of an ELF64 object.
fn u16_at(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes([b[at], b[at + 1]]))
}
fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes")) as usize
}
fn u64_at(b: &[u8], at: usize) -> usize {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes")) as usize
}
fn cstr(b: &[u8], at: usize) -> &[u8] {
    let end = b[at..]
        .iter()
        .position(|&c| c == 0)
        .map_or(b.len(), |e| at + e);
    &b[at..end]
}

/// The file offset of map `name`'s definition (`bpf_map_def` in the
/// `maps` section: type, key size, value size, ...).
fn map_def_offset(elf: &[u8], name: &str) -> usize {
    let (shoff, shentsize, shnum) = (u64_at(elf, 0x28), u16_at(elf, 0x3a), u16_at(elf, 0x3c));
    let shstr = u64_at(elf, shoff + u16_at(elf, 0x3e) * shentsize + 24);
    let sh = |i: usize| shoff + i * shentsize;
    let maps = (0..shnum)
        .find(|&i| cstr(elf, shstr + u32_at(elf, sh(i))) == b"maps")
        .expect("a maps section");
    let symtab = (0..shnum)
        .find(|&i| u32_at(elf, sh(i) + 4) == 2)
        .expect("a symbol table");
    let strtab = u64_at(elf, sh(u32_at(elf, sh(symtab) + 40)) + 24);
    let (sym_off, sym_size) = (u64_at(elf, sh(symtab) + 24), u64_at(elf, sh(symtab) + 32));
    let sym = (sym_off..sym_off + sym_size)
        .step_by(24)
        .find(|&s| {
            u16_at(elf, s + 6) == maps && cstr(elf, strtab + u32_at(elf, s)) == name.as_bytes()
        })
        .unwrap_or_else(|| panic!("symbol {name} in the maps section"));
    u64_at(elf, sh(maps) + 24) + u64_at(elf, sym + 8)
}

/// An object whose ENDPOINTS map has another value size (built from
/// another rivet): the agent refuses it with a message naming the map and
/// the way out, before touching anything; the running datapath keeps
/// forwarding and the embedded object starts again.
#[test]
fn an_object_with_another_map_layout_is_refused() {
    let mut bytes = std::fs::read(upgrade_object()).expect("read the rebuilt object");
    let at = map_def_offset(&bytes, "ENDPOINTS") + 8;
    let value = u32_at(&bytes, at);
    assert_eq!(
        value,
        size_of::<rivet_common::EndpointInfo>(),
        "found ENDPOINTS' value size"
    );
    bytes[at..at + 4].copy_from_slice(&(value as u32 + 8).to_le_bytes());

    let mut w = World::new();
    let n = w.add_node_with_agent();
    let a = w.add_pod(n);
    let b = w.add_pod(n);
    let bad = w.nodes[n].agent().args().state_dir.with_extension("bad.o");
    std::fs::write(&bad, &bytes).expect("write the changed object");
    let _cleanup = RemoveOnDrop(bad.clone());
    let pinned = |w: &World| {
        let dir = PinLayout::new(w.nodes[n].pin_dir()).progs_dir();
        std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
            .count()
    };
    let pins_before = pinned(&w);
    assert!(pins_before > 0, "the agent pinned its programs");
    let progs0 = pinned_programs(&w, n);

    w.nodes[n].agent_mut().stop().expect("agent was running");
    let mut cmd = w.nodes[n].agent().args().command();
    let out = cmd
        .arg(format!("--ebpf-object={}", bad.display()))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("rivetd");
    let err =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "rivetd started with a foreign object"
    );
    assert!(
        err.contains("ENDPOINTS")
            && err.contains("defines map")
            && err.contains(&bad.display().to_string())
            && err.contains("Refusing to load it"),
        "{err}"
    );
    // Nothing was touched: the old programs still run and forward.
    assert_eq!(pinned_programs(&w, n), progs0, "the pinned programs stayed");
    assert_eq!(pins_before, pinned(&w), "pinned programs");
    rivet_tests::traffic::assert_ping(&w.pods[a].ns, w.pods[b].ip, 3);
    w.nodes[n].agent_mut().restart();
    rivet_tests::traffic::assert_ping(&w.pods[a].ns, w.pods[b].ip, 3);
}

/// Removes a file when dropped (also while unwinding).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
