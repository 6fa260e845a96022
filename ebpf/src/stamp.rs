//! The build stamp: which build of the datapath an object is. Userspace
//! finds it by scanning the object's bytes for [`MAGIC`] (no program reads
//! it, so it costs no instruction) and reports it in `rivetctl status`, so
//! an operator rolling out a rebuilt object (`rivetd --ebpf-object`) can see
//! which one each node runs.
//!
//! The value comes from the environment at compile time:
//! `RIVET_EBPF_STAMP=hotfix-42 cargo build ...`; without it, the crate
//! version.

/// What precedes the value in the object; userspace searches for it.
const MAGIC: &[u8] = b"rivet-ebpf-stamp:";

/// Room for the magic, the value and at least one NUL.
const LEN: usize = 64;

/// The value: `$RIVET_EBPF_STAMP`, else the crate version.
const VALUE: &[u8] = match option_env!("RIVET_EBPF_STAMP") {
    Some(v) => v.as_bytes(),
    None => env!("CARGO_PKG_VERSION").as_bytes(),
};

const _: () = assert!(
    MAGIC.len() + VALUE.len() < LEN,
    "RIVET_EBPF_STAMP is too long (46 bytes at most)"
);

const fn stamp() -> [u8; LEN] {
    let mut out = [0u8; LEN];
    let mut i = 0;
    while i < MAGIC.len() {
        out[i] = MAGIC[i];
        i += 1;
    }
    let mut j = 0;
    while j < VALUE.len() {
        out[i + j] = VALUE[j];
        j += 1;
    }
    out
}

/// The stamp, NUL-padded. Exported (`no_mangle`) and `#[used]` so the
/// linker keeps it although no program refers to it; it lands in
/// `.rodata`.
#[unsafe(no_mangle)]
#[used]
static RIVET_EBPF_STAMP: [u8; LEN] = stamp();
