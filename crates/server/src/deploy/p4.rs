//! A `p4runtime` registration (or a topology's P4Runtime device) checked,
//! and as the switch target's settings: the target itself is
//! `subc_p4runtime::SwitchTarget`.

use super::{RegistrationError, TargetError};
use crate::proto;
use std::path::Path;
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::{Arch, PortMap, Receivers, MAX_DEVICE_PORTS};
use subc_client::{ClientIdentity, HalfIdentity};
use subc_p4runtime::{ReadLimits, SwitchSettings, TlsOptions};

/// The registration's port map, checked.
pub(crate) fn port_map(cfg: &proto::P4RuntimeTarget) -> Result<PortMap, RegistrationError> {
    PortMap::new(cfg.ports.iter().map(|(p, d)| (*p, *d)).collect()).map_err(RegistrationError::Ports)
}

/// The names a registration's `arch` may take (empty: v1model).
pub(crate) const ARCH_NAMES: [&str; 2] = ["v1model", "tna"];

/// The registration's architecture: `v1model` (also when unset) or `tna`.
pub(crate) fn arch(cfg: &proto::P4RuntimeTarget) -> Result<Arch, RegistrationError> {
    match cfg.arch.as_str() {
        "" | "v1model" => Ok(Arch::V1Model),
        "tna" => Ok(Arch::Tna),
        other => Err(RegistrationError::UnknownArch { given: other.to_string() }),
    }
}

/// The registration's receivers (`receivers`, the JSON `subc compile
/// --p4-receivers` reads): empty, every receiver on its default port.
pub(crate) fn receivers(cfg: &proto::P4RuntimeTarget) -> Result<Receivers, RegistrationError> {
    if cfg.receivers.trim().is_empty() {
        return Ok(Receivers::Plain);
    }
    Receivers::from_json(&cfg.receivers).map_err(|e| RegistrationError::Receivers(e.to_string()))
}

/// The registration's receivers checked against a spec of `ports` ports:
/// only a spec past 511 ports has receivers, each listed one a port of
/// the spec, on a device port below 511.
pub(crate) fn check_receivers(cfg: &proto::P4RuntimeTarget, ports: u32) -> Result<(), RegistrationError> {
    let Receivers::Listed(listed) = receivers(cfg)? else { return Ok(()) };
    let refuse = |why: String| Err(RegistrationError::Receivers(why));
    if ports <= MAX_DEVICE_PORTS {
        return refuse(format!(
            "the spec declares {ports} ports, which are the switch's own ports; receivers apply past \
             {MAX_DEVICE_PORTS} (`ports N;` in the spec), so leave them out (the port map says where a port leaves)"
        ));
    }
    if let Some(p) = listed.keys().find(|p| **p >= ports) {
        return refuse(format!("receiver {p}: the spec has {ports} ports (0 to {})", ports - 1));
    }
    if let Some((p, d)) = listed.iter().find_map(|(p, r)| r.port.filter(|d| *d >= MAX_DEVICE_PORTS).map(|d| (p, d))) {
        return refuse(format!("receiver {p}: device port {d}; device ports are 0 to {}", MAX_DEVICE_PORTS - 1));
    }
    Ok(())
}

/// The registration's TLS settings as the client takes them; empty strings
/// are unset (no CA: the system's roots). Half a client identity is refused.
pub(crate) fn tls_options(cfg: &proto::P4RuntimeTarget) -> Result<Option<TlsOptions>, HalfIdentity> {
    cfg.tls.as_ref().map(tls_files).transpose()
}

/// TLS files as the client takes them (a P4Runtime switch's, an agent's).
pub(crate) fn tls_files(t: &proto::P4RuntimeTls) -> Result<TlsOptions, HalfIdentity> {
    let path = |s: &str| (!s.is_empty()).then(|| std::path::PathBuf::from(s));
    Ok(TlsOptions {
        ca_cert: path(&t.ca_cert_file),
        identity: ClientIdentity::from_parts(path(&t.client_cert_file), path(&t.client_key_file))?,
        server_name: (!t.server_name.is_empty()).then(|| t.server_name.clone()),
    })
}

/// The registration's P4Info, decoded (`None` when it has none).
pub(crate) fn given_p4info(cfg: &proto::P4RuntimeTarget) -> Result<Option<P4Info>, RegistrationError> {
    use prost::Message;
    if cfg.p4info.is_empty() {
        return Ok(None);
    }
    let info = P4Info::decode(cfg.p4info.as_slice())?;
    if info.tables.is_empty() {
        return Err(RegistrationError::P4InfoEmpty);
    }
    Ok(Some(info))
}

/// Where a target's image is kept: `<data_dir>/targets/<name>`, for a
/// name that is an identifier (`names.rs`).
pub(crate) fn image_dir(data_dir: &Path, name: &str) -> Result<std::path::PathBuf, crate::names::NameError> {
    crate::names::child_path(&data_dir.join("targets"), "target name", name)
}

/// The settings of target `name`, its image under `data_dir`;
/// `prune_ingress`: a switch of a fabric (`docs/network.md`); `epoch`: a
/// replica's (0 with a store of one server), the election id's high bits.
pub(crate) fn settings(
    name: &str,
    cfg: &proto::P4RuntimeTarget,
    data_dir: &Path,
    prune_ingress: bool,
    limits: ReadLimits,
    epoch: u64,
) -> Result<SwitchSettings, TargetError> {
    let fail = |e: &dyn std::fmt::Display| TargetError::transient(e.to_string());
    Ok(SwitchSettings {
        address: cfg.address.clone(),
        device_id: cfg.device_id,
        election_id: cfg.election_id,
        epoch,
        arch: arch(cfg).map_err(|e| fail(&e))?,
        given: given_p4info(cfg).map_err(|e| fail(&e))?,
        device_config: cfg.device_config.clone(),
        ports: port_map(cfg).map_err(|e| fail(&e))?,
        receivers: receivers(cfg).map_err(|e| fail(&e))?,
        tls: tls_options(cfg).map_err(|e| fail(&e))?,
        limits,
        prune_ingress,
        image_dir: image_dir(data_dir, name).map_err(|e| fail(&e))?,
    })
}
