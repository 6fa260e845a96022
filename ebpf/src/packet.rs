//! Bounds-checked access to packet headers (direct packet access).

use core::mem::size_of;

use aya_ebpf::programs::TcContext;

/// Make at least `len` bytes (or the whole packet, if shorter) readable
/// through direct packet access. Only pulls when the linear part is short, so
/// the common case costs two loads and a compare.
#[inline(always)]
pub fn ensure_linear(ctx: &TcContext, len: u32) {
    let have = ctx.data_end().saturating_sub(ctx.data());
    let want = if ctx.len() < len { ctx.len() } else { len };
    if (have as u32) < want {
        // A failed pull leaves the packet as it was; the bounds checks below
        // then classify it as truncated.
        let _ = ctx.pull_data(want);
    }
}

/// Pointer to a `T` at `offset` from the start of the frame, if the frame
/// holds all of it. Re-derive after anything that may move packet data.
#[inline(always)]
pub fn ptr_at<T>(ctx: &TcContext, offset: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

/// Copies a MAC address (from a map value) into the frame byte by byte,
/// unrolled. A plain `[u8; 6]` assignment between the two becomes a call
/// of the byte-loop `memmove` (the compiler cannot rule out overlap).
#[inline(always)]
pub fn copy_mac(dst: &mut [u8; 6], src: &[u8; 6]) {
    for i in 0..6 {
        // SAFETY: both indices are within their 6-byte arrays; volatile
        // only keeps LLVM from turning the copy back into a memmove call.
        unsafe { core::ptr::write_volatile(&mut dst[i], core::ptr::read_volatile(&src[i])) };
    }
}

/// Reads an IPv4 address stored as four bytes into a wire-order `u32` key.
#[inline(always)]
pub fn addr(bytes: &[u8; 4]) -> u32 {
    u32::from_ne_bytes(*bytes)
}
