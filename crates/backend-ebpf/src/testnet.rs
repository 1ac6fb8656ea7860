//! Network namespaces and veth pairs for the end-to-end test and the
//! fan-out benchmark (not used by the back end itself).
//!
//! [`Namespaces`] deletes what it created when dropped, also while a test
//! panics; [`in_netns`] runs a closure on a thread inside a namespace, so
//! sockets and attachments made there live in it.

use crate::EbpfError;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::Instant;

/// Runs `ip` with `args`; an error carries its stderr.
pub fn ip(args: &[&str]) -> Result<(), EbpfError> {
    let out = Command::new("ip").args(args).output().map_err(|e| EbpfError::io("cannot run `ip` (install iproute2)", e))?;
    if !out.status.success() {
        return Err(EbpfError::Kernel(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(())
}

/// Writes a sysctl inside a namespace (through /proc, which needs no procps).
pub fn sysctl(ns: &str, key: &str, value: &str) {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let _ = Command::new("ip").args(["netns", "exec", ns, "sh", "-c", &format!("echo {value} > {path}")]).output();
}

/// Network namespaces removed on drop.
#[derive(Default)]
pub struct Namespaces(Vec<String>);

impl Namespaces {
    /// A new namespace with loopback up and IPv6 off (no router
    /// solicitations in captures).
    pub fn add(&mut self, name: &str) -> Result<String, EbpfError> {
        ip(&["netns", "add", name])?;
        self.0.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        sysctl(name, "net.ipv6.conf.all.disable_ipv6", "1");
        sysctl(name, "net.ipv6.conf.default.disable_ipv6", "1");
        Ok(name.to_string())
    }

    /// A veth pair `a` (in `ns_a`) and `b` (in `ns_b`), both up.
    pub fn veth(&self, a: &str, ns_a: &str, b: &str, ns_b: &str) -> Result<(), EbpfError> {
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
        assert_eq!(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns {path}");
        f()
    })
}

/// The MAC address of `dev` in `ns`.
pub fn mac_of(ns: &str, dev: &str) -> Result<String, EbpfError> {
    let out = Command::new("ip").args(["-n", ns, "-j", "link", "show", dev]).output().map_err(|e| EbpfError::io("ip link show", e))?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| EbpfError::Kernel(format!("ip -j: {e}")))?;
    v[0]["address"].as_str().map(String::from).ok_or_else(|| EbpfError::Kernel(format!("no address for {dev} in {ns}")))
}

/// An `AF_PACKET` socket on `dev` of the calling thread's namespace, with
/// a 20 ms receive timeout.
pub fn packet_socket(dev: &str) -> Result<OwnedFd, EbpfError> {
    let idx = crate::loader::ifindex(dev)?;
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, (libc::ETH_P_ALL as u16).to_be() as i32);
        if fd < 0 {
            return Err(EbpfError::io("AF_PACKET socket", std::io::Error::last_os_error()));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = idx as i32;
        if libc::bind(fd.as_raw_fd(), (&sll as *const libc::sockaddr_ll).cast(), std::mem::size_of::<libc::sockaddr_ll>() as u32) != 0 {
            return Err(EbpfError::io(format!("bind AF_PACKET to {dev}"), std::io::Error::last_os_error()));
        }
        let tv = libc::timeval { tv_sec: 0, tv_usec: 20_000 };
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
        Ok(fd)
    }
}

/// Frames received on a packet socket until `until`.
pub fn recv_frames(fd: &OwnedFd, until: Instant) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut buf = vec![0u8; 2048];
    while Instant::now() < until {
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n > 0 {
            out.push(buf[..n as usize].to_vec());
        }
    }
    out
}

/// Pins the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
