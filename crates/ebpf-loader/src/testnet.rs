//! Network namespaces and veth pairs for the end-to-end tests and the
//! fan-out benchmark (not used by the loader itself; behind the `testing`
//! feature, so no default build has it).
//!
//! [`Namespaces`] deletes what it created when dropped, also while a test
//! panics; [`in_netns`] runs a closure on a thread inside a namespace, so
//! sockets and attachments made there live in it. Commands run without a
//! shell: every argument reaches `ip` as it is.

use crate::LoaderError;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `ip` with `args`; an error carries its stderr.
pub fn ip(args: &[&str]) -> Result<(), LoaderError> {
    let out = Command::new("ip").args(args).output().map_err(|e| LoaderError::io("cannot run `ip` (install iproute2)", e))?;
    if !out.status.success() {
        return Err(LoaderError::Command {
            command: format!("ip {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Writes a sysctl inside a namespace, through `/proc/sys` from a thread
/// that entered it (network sysctls are those of the writer's namespace);
/// best effort, like `sysctl -w` whose failure a test would not stop for.
pub fn sysctl(ns: &str, key: &str, value: &str) {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let value = value.to_string();
    let _ = in_netns(ns, move || std::fs::write(path, value)).join();
}

/// The kernel's per-CPU receive backlog (`net.core.netdev_max_backlog`,
/// 1,000 by default), raised while a guard lives: a TC program clones every
/// copy of a packet before it returns, and each waits in that backlog until
/// it does, so a fan-out to more receivers than the backlog holds loses the
/// rest (`docs/semantics.md`, "Audiences"). The value before the first
/// guard is put back when the last one drops, also when a test fails.
pub struct Backlog(());

static BACKLOG: std::sync::Mutex<(usize, Option<String>)> = std::sync::Mutex::new((0, None));
const BACKLOG_PATH: &str = "/proc/sys/net/core/netdev_max_backlog";

impl Backlog {
    /// Raises the backlog to at least `to` until the guard drops.
    pub fn raise(to: u32) -> std::io::Result<Backlog> {
        let mut b = BACKLOG.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::fs::read_to_string(BACKLOG_PATH)?;
        if now.trim().parse::<u32>().map_or(true, |n| n < to) {
            std::fs::write(BACKLOG_PATH, to.to_string())?;
            if b.0 == 0 {
                b.1 = Some(now);
            }
        }
        b.0 += 1;
        Ok(Backlog(()))
    }
}

impl Drop for Backlog {
    fn drop(&mut self) {
        let mut b = BACKLOG.lock().unwrap_or_else(|e| e.into_inner());
        b.0 -= 1;
        if b.0 == 0 {
            if let Some(old) = b.1.take() {
                let _ = std::fs::write(BACKLOG_PATH, old);
            }
        }
    }
}

/// Network namespaces removed on drop.
#[derive(Default)]
pub struct Namespaces(Vec<String>);

impl Namespaces {
    /// A new namespace with loopback up and IPv6 off (no router
    /// solicitations in captures).
    pub fn add(&mut self, name: &str) -> Result<String, LoaderError> {
        ip(&["netns", "add", name])?;
        self.0.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        sysctl(name, "net.ipv6.conf.all.disable_ipv6", "1");
        sysctl(name, "net.ipv6.conf.default.disable_ipv6", "1");
        Ok(name.to_string())
    }

    /// A veth pair `a` (in `ns_a`) and `b` (in `ns_b`), both up.
    pub fn veth(&self, a: &str, ns_a: &str, b: &str, ns_b: &str) -> Result<(), LoaderError> {
        ip(&["link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b])?;
        ip(&["-n", ns_a, "link", "set", a, "up"])?;
        ip(&["-n", ns_b, "link", "set", b, "up"])
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// Runs `f` on a thread that has entered network namespace `ns`.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("the namespace exists");
        crate::sys::enter_netns(&file).unwrap_or_else(|e| panic!("setns {path}: {e}"));
        f()
    })
}

/// The MAC address of `dev` in `ns`.
pub fn mac_of(ns: &str, dev: &str) -> Result<String, LoaderError> {
    let out = Command::new("ip").args(["-n", ns, "-j", "link", "show", dev]).output().map_err(|e| LoaderError::io("ip link show", e))?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(LoaderError::IpJson)?;
    v[0]["address"].as_str().map(String::from).ok_or_else(|| LoaderError::NoAddress { dev: dev.to_string(), ns: ns.to_string() })
}

/// An `AF_PACKET` socket on `dev` of the calling thread's namespace, with
/// a 20 ms receive timeout and a 4 MiB receive buffer (frames queue there
/// while a test sends; the default buffer holds only a few hundred).
pub fn packet_socket(dev: &str) -> Result<OwnedFd, LoaderError> {
    let idx = crate::ifindex(dev)?;
    let protocol = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: socket takes three integers and returns a new descriptor or -1.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, protocol as i32) };
    if fd < 0 {
        return Err(LoaderError::io("AF_PACKET socket", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is the descriptor socket just returned; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let sll = libc::sockaddr_ll {
        sll_family: libc::AF_PACKET as u16,
        sll_protocol: protocol,
        sll_ifindex: idx as i32,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 0,
        sll_addr: [0; 8],
    };
    // SAFETY: the address is a `sockaddr_ll` of the length given, it
    // outlives the call, which only reads it; the socket is open.
    let r =
        unsafe { libc::bind(fd.as_raw_fd(), (&sll as *const libc::sockaddr_ll).cast(), std::mem::size_of::<libc::sockaddr_ll>() as u32) };
    if r != 0 {
        return Err(LoaderError::io(format!("bind AF_PACKET to {dev}"), std::io::Error::last_os_error()));
    }
    let tv = libc::timeval { tv_sec: 0, tv_usec: 20_000 };
    let buffer: libc::c_int = 4 << 20;
    // SAFETY: each option value is a `timeval` or a `c_int` of the length
    // given, it outlives the call, which only reads it; the socket is open.
    // The buffer is best effort (SO_RCVBUFFORCE needs CAP_NET_ADMIN).
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&buffer as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        );
    }
    Ok(fd)
}

/// Sends one frame on a packet socket; the bytes sent.
pub fn send_frame(socket: impl AsFd, frame: &[u8]) -> std::io::Result<usize> {
    // SAFETY: the buffer is `frame`, of the length given, which outlives
    // the call and is only read; the socket is open.
    let n = unsafe { libc::send(socket.as_fd().as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Frames received on a packet socket until `until`.
pub fn recv_frames(socket: impl AsFd, until: Instant) -> Vec<Vec<u8>> {
    recv_until(socket.as_fd(), until, true)
}

/// Frames that arrived on a packet socket until `until`, leaving out those
/// the socket's own host sent (`PACKET_OUTGOING`).
pub fn recv_incoming_frames(socket: impl AsFd, until: Instant) -> Vec<Vec<u8>> {
    recv_until(socket.as_fd(), until, false)
}

/// Frames that arrive on a packet socket (not sent by its host) and that
/// `keep` accepts, until `quiet` passes without such a frame, or `deadline`.
pub fn recv_until_quiet(socket: impl AsFd, keep: impl Fn(&[u8]) -> bool, quiet: Duration, deadline: Instant) -> Vec<Vec<u8>> {
    let mut got = vec![];
    let mut last = Instant::now();
    while Instant::now() < deadline && last.elapsed() < quiet {
        let n = got.len();
        got.extend(recv_incoming_frames(&socket, Instant::now() + Duration::from_millis(50)).into_iter().filter(|f| keep(f)));
        if got.len() > n {
            last = Instant::now();
        }
    }
    got
}

/// Sends `frames` on a packet socket from namespace `ns`, `gap` apart, and
/// returns once they are sent; a frame sent short is an error.
pub fn send_paced(ns: &str, socket: &OwnedFd, frames: Vec<Vec<u8>>, gap: Duration) -> std::io::Result<()> {
    let socket = socket.try_clone()?;
    let sent = in_netns(ns, move || -> std::io::Result<()> {
        for f in &frames {
            if send_frame(&socket, f)? != f.len() {
                return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "a frame sent short"));
            }
            std::thread::sleep(gap);
        }
        Ok(())
    });
    sent.join().map_err(|_| std::io::Error::other("the sending thread panicked"))?
}

fn recv_until(socket: std::os::fd::BorrowedFd<'_>, until: Instant, outgoing: bool) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut buf = vec![0u8; 2048];
    while Instant::now() < until {
        // SAFETY: an all-zero `sockaddr_ll` is a valid value to overwrite.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `buf.len()` bytes to `buf` and
        // at most `len` bytes to `from`, both of which outlive the call;
        // the socket is open.
        let n = unsafe {
            libc::recvfrom(
                socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut len,
            )
        };
        if n > 0 && (outgoing || from.sll_pkttype != libc::PACKET_OUTGOING) {
            out.push(buf[..n as usize].to_vec());
        }
    }
    out
}

/// Whether a kernel test runs: with the BPF capabilities, it does; without
/// them it is skipped with a note, except under `CI=true`, where it fails.
pub fn kernel_available(test: &str) -> bool {
    const NEEDS: &str = "CAP_NET_ADMIN, and CAP_BPF with CAP_PERFMON (or CAP_SYS_ADMIN, which namespaces need too)";
    if crate::can_load_bpf() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: CI=true but this process cannot load BPF programs ({NEEDS})");
    }
    eprintln!("{test}: skipped (it needs {NEEDS}; set CI=true to make this an error)");
    false
}

/// An XDP program that passes every frame. A veth takes XDP redirects
/// only if its peer runs NAPI, which an XDP program there turns on: tests
/// attach this one (compiled with `subc_backend_ebpf::clang`) at the far
/// end of every veth a native XDP program redirects into.
pub const XDP_PASS_C: &str = "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\nSEC(\"xdp\") int pass(struct xdp_md *c) { return XDP_PASS; }\nchar _l[] SEC(\"license\") = \"GPL\";\n";

/// An XDP program that drops every frame: on both ends of a veth, it cuts
/// the link while both interfaces stay up.
pub const XDP_DROP_C: &str = "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\nSEC(\"xdp\") int cut(struct xdp_md *c) { return XDP_DROP; }\nchar _l[] SEC(\"license\") = \"GPL\";\n";

/// Loads `object` (one XDP program, such as [`XDP_PASS_C`] or
/// [`XDP_DROP_C`] compiled) and attaches its program as native XDP on
/// `dev` of the calling thread's namespace; the link (with the object it
/// keeps loaded) detaches when dropped.
pub fn xdp_on(object: &[u8], dev: &str) -> Result<XdpAttachment, LoaderError> {
    let o = libbpf_rs::ObjectBuilder::default()
        .open_memory(object)
        .and_then(|o| o.load())
        .map_err(|e| LoaderError::bpf("loading an XDP test program", e))?;
    let prog = o.progs().next().ok_or_else(|| LoaderError::MissingProgram { program: "an XDP test program".into() })?;
    let link = crate::link_xdp(prog.as_fd(), crate::ifindex(dev)?, crate::XdpMode::Native)
        .map_err(|e| LoaderError::io(format!("native XDP on {dev}"), e))?;
    Ok(XdpAttachment { _link: link, _object: o })
}

/// A test program attached by [`xdp_on`]: detached, and unloaded, when dropped.
pub struct XdpAttachment {
    // The link first: detached before the object goes.
    _link: OwnedFd,
    _object: libbpf_rs::Object,
}

/// Pins the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: an all-zero `cpu_set_t` is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit of `set`, checking `cpu` against the
    // set's size; sched_setaffinity reads `set`, of the size given, for the
    // calling thread (pid 0).
    unsafe {
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
