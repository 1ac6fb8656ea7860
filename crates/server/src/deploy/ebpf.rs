//! An `ebpf` registration (or a topology's eBPF device) as the loader's
//! [`EbpfSettings`]: the target itself is `subc_ebpf_loader::EbpfTarget`.

use super::TargetError;
use crate::proto;
use std::collections::BTreeMap;
use std::path::Path;
use subc_backend_ebpf::{Egress, Hook, NoMatch, TargetConfig};
use subc_ebpf_loader::{AttachMode, EbpfSettings};

/// What a device of a network (`network.rs`) adds to an eBPF target: the
/// program goes on every port's interface, in the device's namespace, and
/// never sends a packet back out of the port it came in on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EbpfDevice {
    /// A named network namespace (`/run/netns/<netns>`) in which interfaces
    /// are resolved and programs attached; `None`: the server's own.
    pub netns: Option<String>,
    /// The interfaces the program is attached to: one per device port.
    pub interfaces: Vec<String>,
    /// Label mode: the label program's shape (`labels.rs`).
    pub labels: Option<subc_bdd::LabelShape>,
}

fn egress(e: &proto::EbpfEgress) -> Result<Egress, TargetError> {
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let dst_ip = match e.dst_ip.as_str() {
        "" => None,
        s => Some(s.parse().map_err(|_| TargetError::transient(format!("{s} is not an IPv4 address")))?),
    };
    let dst_port = match e.dst_port {
        0 => None,
        p => Some(u16::try_from(p).map_err(|_| TargetError::transient(format!("{p} is not a UDP port")))?),
    };
    Ok(Egress { interface: e.interface.clone(), dst_mac: opt(&e.dst_mac), src_mac: opt(&e.src_mac), dst_ip, dst_port })
}

/// The settings of target `name`, pinned under `bpffs_root/<name>`.
pub(crate) fn settings(
    name: &str,
    cfg: &proto::EbpfTarget,
    bpffs_root: &Path,
    device: Option<&EbpfDevice>,
) -> Result<EbpfSettings, TargetError> {
    let (hook, mode) = match (proto::Hook::try_from(cfg.hook), proto::XdpMode::try_from(cfg.xdp_mode)) {
        (Ok(proto::Hook::Tc), _) => (Hook::Tc, AttachMode::TcAuto),
        (_, Ok(proto::XdpMode::Native)) => (Hook::Xdp, AttachMode::XdpNative),
        (_, Ok(proto::XdpMode::Generic)) => (Hook::Xdp, AttachMode::XdpGeneric),
        _ => (Hook::Xdp, AttachMode::XdpAuto),
    };
    let mut ports = BTreeMap::new();
    for (p, e) in &cfg.ports {
        ports.insert(*p, egress(e)?);
    }
    let no_match = if cfg.drop_unmatched { NoMatch::Drop } else { NoMatch::Pass };
    let config = TargetConfig { no_match, prune_ingress: device.is_some(), ports };
    let (ifaces, netns) = match device {
        Some(d) => (d.interfaces.clone(), d.netns.clone()),
        None => (vec![cfg.interface.clone()], None),
    };
    let pin_dir = crate::names::child_path(bpffs_root, "target name", name).map_err(|e| TargetError::transient(e.to_string()))?;
    let labels = device.and_then(|d| d.labels);
    Ok(EbpfSettings { hook, mode, ifaces, netns, config, pin_dir, labels })
}
