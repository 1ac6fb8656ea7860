//! Hooking a loaded program to an interface: XDP through a link in native
//! or generic mode, TC through a tcx link or, on kernels without tcx, a
//! clsact filter. A pinned link outlives the process; an unpinned one (and
//! a clsact filter this process made without pinning) goes with its
//! [`Attachment`].

use crate::dataplane::{pin_fd, Dataplane};
use crate::sys;
use crate::LoaderError;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use subc_backend_ebpf::Hook;

/// The index of a network interface of the calling thread's namespace.
pub fn ifindex(name: &str) -> Result<u32, LoaderError> {
    let c = std::ffi::CString::new(name).map_err(|_| LoaderError::BadInterfaceName { name: name.to_string() })?;
    sys::if_nametoindex(&c).ok_or_else(|| LoaderError::NoInterface { name: name.to_string() })
}

/// How to hook a program to an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMode {
    /// XDP in the driver, else generic XDP.
    XdpAuto,
    XdpNative,
    XdpGeneric,
    /// tcx, else a clsact filter.
    TcAuto,
    Tcx,
    Clsact,
}

/// How a program ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachKind {
    XdpNative,
    XdpGeneric,
    Tcx,
    Clsact,
}

impl std::fmt::Display for AttachKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AttachKind::XdpNative => "xdp-native",
            AttachKind::XdpGeneric => "xdp-generic",
            AttachKind::Tcx => "tcx",
            AttachKind::Clsact => "clsact",
        })
    }
}

/// Where an XDP program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver.
    Native,
    /// On the socket buffer (any interface).
    Generic,
}

/// Links `prog` (an XDP program) to interface `ifindex` in `mode`; the
/// program stays attached while the returned link is open (or pinned).
pub fn link_xdp(prog: BorrowedFd<'_>, ifindex: u32, mode: XdpMode) -> std::io::Result<OwnedFd> {
    let flags = match mode {
        XdpMode::Native => libbpf_sys::XDP_FLAGS_DRV_MODE,
        XdpMode::Generic => libbpf_sys::XDP_FLAGS_SKB_MODE,
    };
    sys::link_create(prog, ifindex, libbpf_sys::BPF_XDP, flags)
}

/// Links `prog` (a TC program) to the ingress of interface `ifindex`
/// through tcx; attached while the returned link is open (or pinned).
pub fn link_tcx_ingress(prog: BorrowedFd<'_>, ifindex: u32) -> std::io::Result<OwnedFd> {
    sys::link_create(prog, ifindex, libbpf_sys::BPF_TCX_INGRESS, 0)
}

/// One program attached to one interface.
#[derive(Debug, Serialize, Deserialize)]
pub struct Attachment {
    pub iface: String,
    pub ifindex: u32,
    pub program: String,
    pub kind: AttachKind,
    /// The pinned link (XDP and tcx), if pinned.
    pub link_pin: Option<PathBuf>,
    /// The link's fd while this process holds it; dropping it detaches an
    /// unpinned link.
    #[serde(skip)]
    pub link: Option<OwnedFd>,
    /// A clsact filter this process removes when the attachment is dropped.
    #[serde(skip)]
    owned_clsact: bool,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        // A clsact filter is not a link: it stays until removed. Unpinned
        // attachments belong to this process, so it goes with them.
        if self.owned_clsact {
            detach_clsact(self.ifindex);
        }
    }
}

const CLSACT_HANDLE: u32 = 0x5c;
const CLSACT_PRIORITY: u32 = 0x5c;

fn attach_clsact(prog: BorrowedFd<'_>, ifindex: u32) -> Result<(), LoaderError> {
    let mut b = libbpf_rs::TcHookBuilder::new(prog);
    b.ifindex(ifindex as i32).replace(true).handle(CLSACT_HANDLE).priority(CLSACT_PRIORITY);
    let mut hook = b.hook(libbpf_rs::TC_INGRESS);
    hook.create().map_err(|e| LoaderError::bpf("cannot create the clsact qdisc", e))?;
    hook.attach().map_err(|e| LoaderError::bpf("cannot attach the clsact filter", e))?;
    Ok(())
}

/// Removes this crate's clsact filter from an interface, if it is there.
pub(crate) fn detach_clsact(ifindex: u32) {
    // bpf_tc_detach needs no program fd, but the builder wants one.
    let devnull = std::fs::File::open("/dev/null");
    if let Ok(f) = devnull {
        let mut b = libbpf_rs::TcHookBuilder::new(f.as_fd());
        b.ifindex(ifindex as i32).handle(CLSACT_HANDLE).priority(CLSACT_PRIORITY);
        let mut hook = b.hook(libbpf_rs::TC_INGRESS);
        let _ = hook.detach();
    }
}

/// Links an XDP program in `mode` (`XdpAuto`: native, else generic).
fn attach_xdp(prog: BorrowedFd<'_>, idx: u32, iface: &str, mode: AttachMode) -> Result<(AttachKind, OwnedFd), LoaderError> {
    let generic = |native: Option<std::io::Error>| -> Result<(AttachKind, OwnedFd), LoaderError> {
        let link = link_xdp(prog, idx, XdpMode::Generic).map_err(|g| {
            let native = native.map(|e| format!(" (native: {e})")).unwrap_or_default();
            LoaderError::io(format!("cannot attach generic XDP to {iface}{native}"), g)
        })?;
        Ok((AttachKind::XdpGeneric, link))
    };
    match mode {
        AttachMode::XdpGeneric => generic(None),
        _ => match link_xdp(prog, idx, XdpMode::Native) {
            Ok(l) => Ok((AttachKind::XdpNative, l)),
            Err(e) if mode == AttachMode::XdpAuto => generic(Some(e)),
            Err(e) => Err(LoaderError::io(format!("cannot attach native XDP to {iface}"), e)),
        },
    }
}

/// Links a TC program through tcx, or adds a clsact filter (`TcAuto`: tcx,
/// else clsact).
fn attach_tc(prog: BorrowedFd<'_>, idx: u32, iface: &str, mode: AttachMode) -> Result<(AttachKind, Option<OwnedFd>), LoaderError> {
    let tcx = if mode == AttachMode::Clsact { None } else { Some(sys::link_create(prog, idx, libbpf_sys::BPF_TCX_INGRESS, 0)) };
    match tcx {
        Some(Ok(l)) => Ok((AttachKind::Tcx, Some(l))),
        Some(Err(e)) if mode == AttachMode::Tcx => Err(LoaderError::io(format!("cannot attach tcx to {iface}"), e)),
        _ => {
            attach_clsact(prog, idx)?;
            Ok((AttachKind::Clsact, None))
        }
    }
}

/// Attaches `program` (a program of `dp`) to `iface`. With `pin_dir`, the
/// link is pinned there and outlives the process.
pub fn attach_program(
    dp: &Dataplane,
    program: &str,
    iface: &str,
    mode: AttachMode,
    pin_dir: Option<&Path>,
) -> Result<Attachment, LoaderError> {
    let idx = ifindex(iface)?;
    let prog = dp.program_fd(program)?;
    let (kind, link) = match mode {
        AttachMode::XdpNative | AttachMode::XdpGeneric | AttachMode::XdpAuto => {
            let (kind, link) = attach_xdp(prog, idx, iface, mode)?;
            (kind, Some(link))
        }
        AttachMode::Tcx | AttachMode::TcAuto | AttachMode::Clsact => attach_tc(prog, idx, iface, mode)?,
    };
    let mut link_pin = None;
    if let (Some(dir), Some(l)) = (pin_dir, &link) {
        let p = dir.join(format!("link_{kind}_{iface}"));
        pin_fd(l.as_fd(), &p)?;
        link_pin = Some(p);
    }
    let owned_clsact = kind == AttachKind::Clsact && pin_dir.is_none();
    Ok(Attachment { iface: iface.to_string(), ifindex: idx, program: program.to_string(), kind, link_pin, link, owned_clsact })
}

/// Attaches a data plane for its hook: `subc_xdp` (and `subc_tc_fanout` on
/// TC ingress of the same interface), or `subc_tc`.
pub fn attach(dp: &Dataplane, iface: &str, mode: Option<AttachMode>, pin_dir: Option<&Path>) -> Result<Vec<Attachment>, LoaderError> {
    let hook = dp.model.hook;
    match hook {
        Hook::Xdp => {
            let mode = mode.unwrap_or(AttachMode::XdpAuto);
            if !matches!(mode, AttachMode::XdpAuto | AttachMode::XdpNative | AttachMode::XdpGeneric) {
                return Err(LoaderError::WrongMode { hook, mode });
            }
            let fanout = attach_program(dp, "subc_tc_fanout", iface, AttachMode::TcAuto, pin_dir)?;
            let xdp = attach_program(dp, "subc_xdp", iface, mode, pin_dir)?;
            Ok(vec![xdp, fanout])
        }
        Hook::Tc => {
            let mode = mode.unwrap_or(AttachMode::TcAuto);
            if !matches!(mode, AttachMode::TcAuto | AttachMode::Tcx | AttachMode::Clsact) {
                return Err(LoaderError::WrongMode { hook, mode });
            }
            Ok(vec![attach_program(dp, "subc_tc", iface, mode, pin_dir)?])
        }
    }
}
