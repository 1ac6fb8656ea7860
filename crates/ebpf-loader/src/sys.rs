//! The system calls this crate makes itself, beyond libbpf-rs's safe API:
//! each is wrapped here once, with its `// SAFETY:` argument, and takes
//! and gives typed descriptors (`BorrowedFd`, `OwnedFd`). A raw descriptor
//! exists only inside the call that hands it to the kernel or to libbpf,
//! and a new one becomes an `OwnedFd` on the line that receives it.
//!
//! libbpf's low-level functions return `-errno` on failure (libbpf 1.0
//! semantics), so their errors are read from the return value, not from
//! `errno`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

/// A libbpf return value: the non-negative result, or the error its
/// negative value names.
fn check(r: i32) -> io::Result<i32> {
    if r < 0 {
        Err(io::Error::from_raw_os_error(-r))
    } else {
        Ok(r)
    }
}

/// Takes ownership of a descriptor a call just created.
fn owned(fd: i32) -> io::Result<OwnedFd> {
    let fd = check(fd)?;
    // SAFETY: `fd` was returned by the kernel to this call a moment ago and
    // is not stored anywhere else, so this is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A path as a C string, or `None` if it holds a NUL byte.
pub(crate) fn c_path(path: &Path) -> Option<CString> {
    CString::new(path.as_os_str().as_encoded_bytes()).ok()
}

/// `membarrier(MEMBARRIER_CMD_GLOBAL)`: true once every CPU has passed an
/// RCU grace period; false if the kernel refused (e.g. with `nohz_full`).
pub(crate) fn membarrier_global() -> bool {
    const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;
    // SAFETY: membarrier takes three integers and touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0 as libc::c_uint, 0 as libc::c_int) };
    r == 0
}

/// The index of a network interface of the calling thread's namespace.
pub(crate) fn if_nametoindex(name: &std::ffi::CStr) -> Option<u32> {
    // SAFETY: `name` is a NUL-terminated string that outlives the call,
    // which only reads it.
    let idx = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (idx != 0).then_some(idx)
}

/// The effective user id of this process.
pub(crate) fn geteuid() -> u32 {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// The instructions the verifier processed for a loaded program (0 if the
/// kernel does not say).
pub(crate) fn prog_verified_insns(prog: BorrowedFd<'_>) -> u32 {
    prog_info(prog).map_or(0, |i| i.verified_insns)
}

/// The instructions of a loaded program after the kernel's translation
/// (0 if the kernel does not say).
pub(crate) fn prog_translated_insns(prog: BorrowedFd<'_>) -> u32 {
    prog_info(prog).map_or(0, |i| i.xlated_prog_len / std::mem::size_of::<libbpf_sys::bpf_insn>() as u32)
}

fn prog_info(prog: BorrowedFd<'_>) -> Option<libbpf_sys::bpf_prog_info> {
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: `info` is a writable `bpf_prog_info` of `len` bytes, both
    // outlive the call, and the kernel writes at most `len` bytes.
    let r = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(prog.as_raw_fd(), &mut info, &mut len) };
    (r == 0).then_some(info)
}

/// Pins a BPF object (map, program or link) at `path` under bpffs.
pub(crate) fn obj_pin(fd: BorrowedFd<'_>, path: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated and outlives the call, which only
    // reads it; `fd` is open for the call's duration.
    check(unsafe { libbpf_sys::bpf_obj_pin(fd.as_raw_fd(), path.as_ptr()) }).map(drop)
}

/// Opens a pinned BPF object.
pub(crate) fn obj_get(path: &std::ffi::CStr) -> io::Result<OwnedFd> {
    // SAFETY: `path` is NUL-terminated and outlives the call, which only
    // reads it.
    owned(unsafe { libbpf_sys::bpf_obj_get(path.as_ptr()) })
}

/// `bpf_link_create`: a link attaching `prog` to interface `ifindex`.
pub(crate) fn link_create(prog: BorrowedFd<'_>, ifindex: u32, attach: libbpf_sys::bpf_attach_type, flags: u32) -> io::Result<OwnedFd> {
    let opts =
        libbpf_sys::bpf_link_create_opts { sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _, flags, ..Default::default() };
    // SAFETY: `opts` is a valid `bpf_link_create_opts` whose `sz` is its
    // size, it outlives the call, and libbpf only reads it; `prog` is open.
    owned(unsafe { libbpf_sys::bpf_link_create(prog.as_raw_fd(), ifindex as i32, attach, &opts) })
}

/// `bpf_link_update`: points `link` at `prog`, atomically.
pub(crate) fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: both descriptors are open for the call; null options mean
    // none, which libbpf allows.
    check(unsafe { libbpf_sys::bpf_link_update(link.as_raw_fd(), prog.as_raw_fd(), std::ptr::null()) }).map(drop)
}

/// What one `BPF_PROG_TEST_RUN` gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgRun {
    /// The program's return value.
    pub retval: u32,
    /// Average nanoseconds per repetition.
    pub ns: u64,
    /// The packet after the program.
    pub data: Vec<u8>,
}

/// What a TC test run says of its frame beyond the bytes: the interfaces.
/// Linux (`net/bpf/test_run.c`: `bpf_prog_test_run_skb` and
/// `convert___skb_to_skb`, 5.10 on) reads it as the head of the UAPI
/// `struct __sk_buff` and copies `ingress_ifindex` into the skb's `skb_iif`
/// (what a program reads as `skb->ingress_ifindex`) and makes an `ifindex`
/// above 1 the skb's device (looked up in the caller's network namespace,
/// `ENODEV` if absent). Without it the frame comes from nowhere
/// (`ingress_ifindex` 0) on the loopback device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SkbContext {
    pub ingress_ifindex: u32,
    pub ifindex: u32,
}

impl SkbContext {
    /// `struct __sk_buff` up to and including `ifindex` (offsets 36 and 40):
    /// `len` to `priority` zero, as the kernel requires of fields it does
    /// not take (it takes `mark` and `priority`, left 0 here).
    fn head(&self) -> [u8; 44] {
        let mut b = [0u8; 44];
        b[36..40].copy_from_slice(&self.ingress_ifindex.to_ne_bytes());
        b[40..44].copy_from_slice(&self.ifindex.to_ne_bytes());
        b
    }
}

/// `BPF_PROG_TEST_RUN` of `prog` on `packet`, `repeat` times.
pub fn prog_test_run(prog: BorrowedFd<'_>, packet: &[u8], repeat: u32) -> io::Result<ProgRun> {
    prog_test_run_with(prog, packet, repeat, None)
}

/// `BPF_PROG_TEST_RUN` of `prog` on `packet`, `repeat` times, with the
/// skb's interfaces if `ctx` is given (TC programs only: another program
/// type reads the context otherwise or refuses it).
pub fn prog_test_run_with(prog: BorrowedFd<'_>, packet: &[u8], repeat: u32, ctx: Option<SkbContext>) -> io::Result<ProgRun> {
    // Room for a program that grows the packet (headers pushed in front).
    let mut out = vec![0u8; packet.len() + 256];
    let head = ctx.map(|c| c.head());
    let mut opts = libbpf_sys::bpf_test_run_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as _,
        data_in: packet.as_ptr().cast(),
        data_size_in: packet.len() as u32,
        data_out: out.as_mut_ptr().cast(),
        data_size_out: out.len() as u32,
        ctx_in: head.as_ref().map_or(std::ptr::null(), |h| h.as_ptr().cast()),
        ctx_size_in: head.as_ref().map_or(0, |h| h.len() as u32),
        repeat: repeat as i32,
        ..Default::default()
    };
    // SAFETY: `opts` is a valid `bpf_test_run_opts` whose `sz` is its size;
    // its input pointer and length describe `packet` and its output ones
    // `out`, both of which outlive the call; the context, if any, is
    // `head`, `ctx_size_in` bytes that outlive the call and are only read
    // (no `ctx_out`); the kernel writes at most `data_size_out` bytes to
    // `out`; `prog` is open.
    check(unsafe { libbpf_sys::bpf_prog_test_run_opts(prog.as_raw_fd(), &mut opts) })?;
    out.truncate((opts.data_size_out as usize).min(out.len()));
    Ok(ProgRun { retval: opts.retval, ns: opts.duration as u64, data: out })
}

/// Looks `key` up in a map whose values are `value.len()` bytes.
pub(crate) fn map_lookup(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<()> {
    // SAFETY: the kernel reads the map's key size from `key` and writes its
    // value size to `value`; callers size both from the map's layout, and
    // both outlive the call; `map` is open.
    check(unsafe { libbpf_sys::bpf_map_lookup_elem(map.as_raw_fd(), key.as_ptr().cast(), value.as_mut_ptr().cast()) }).map(drop)
}

/// Loads a program of `prog_type` made of `insns`, licensed GPL.
pub(crate) fn prog_load(
    prog_type: libbpf_sys::bpf_prog_type,
    name: &std::ffi::CStr,
    insns: &[libbpf_sys::bpf_insn],
) -> io::Result<OwnedFd> {
    // SAFETY: the name, the license and the instructions outlive the call,
    // which only reads them (`insns.len()` of them); null options mean none.
    owned(unsafe {
        libbpf_sys::bpf_prog_load(prog_type, name.as_ptr(), c"GPL".as_ptr(), insns.as_ptr(), insns.len() as _, std::ptr::null_mut())
    })
}

/// Runs `f` on a thread that first joins the network namespace `ns`
/// (`/run/netns/<ns>`, as `ip netns` names them), so that interface names
/// resolve, and programs attach, there. The thread ends with `f`; links and
/// maps it made work from any thread afterwards. Needs CAP_SYS_ADMIN.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let file = std::fs::File::open(Path::new("/run/netns").join(ns))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            enter_netns(&file)?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Moves the calling thread into the network namespace `file` opened
/// (`/run/netns/<ns>`). Only the calling thread changes namespace: call it
/// on a thread of one's own, which ends with the work done there.
pub(crate) fn enter_netns(file: &std::fs::File) -> io::Result<()> {
    // SAFETY: setns reads only its two integer arguments; the namespace
    // file stays open for the call.
    let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An array map's values mapped into this process (a map created
/// `BPF_F_MMAPABLE`): element `i` starts at `i * stride`, where `stride`
/// is the value size rounded up to 8 bytes, as the kernel lays them out.
pub(crate) struct MapMemory {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; writes go
// through atomic 64-bit stores (`MapMemory::write_words`), so sharing it
// between threads cannot tear a word.
unsafe impl Send for MapMemory {}
// SAFETY: as above.
unsafe impl Sync for MapMemory {}

impl MapMemory {
    /// Maps the first `len` bytes of `map`'s values, read and write.
    pub(crate) fn map(map: BorrowedFd<'_>, len: usize) -> io::Result<MapMemory> {
        // SAFETY: a new shared mapping of an open BPF map descriptor, at an
        // address the kernel chooses; the kernel refuses a `len` past the
        // map's values, and `Drop` unmaps exactly this range.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, map.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast()).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidData))?;
        Ok(MapMemory { ptr, len })
    }

    /// Stores `bytes` (whole 64-bit words) at byte `at` (a multiple of 8),
    /// one aligned atomic store per word, so that a program reading a word
    /// sees it before or after, never torn. `None` if out of range or
    /// unaligned (nothing is written then).
    pub(crate) fn write_words(&self, at: usize, bytes: &[u8]) -> Option<()> {
        use std::sync::atomic::{AtomicU64, Ordering};
        if !at.is_multiple_of(8) || !bytes.len().is_multiple_of(8) || at.checked_add(bytes.len())? > self.len {
            return None;
        }
        for (i, w) in bytes.chunks_exact(8).enumerate() {
            let w = u64::from_ne_bytes(w.try_into().expect("8 bytes"));
            // SAFETY: `at + 8 * i + 8 <= len` and the mapping starts page
            // aligned, so the address is in range and 8-byte aligned; the
            // memory is only accessed atomically from this process.
            let word = unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(at + 8 * i).cast()) };
            word.store(w, Ordering::Relaxed);
        }
        Some(())
    }
}

impl Drop for MapMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps the range `map` mapped, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
