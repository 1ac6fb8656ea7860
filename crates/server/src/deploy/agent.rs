//! An `agent` registration (or a topology's agent device) as
//! `subc_agent::AgentSettings`: the target itself is
//! `subc_agent::AgentTarget`, which drives a host's `subc agent`.

use super::ebpf::{self, EbpfDevice};
use super::{Controller, RegistrationError, TargetError};
use crate::proto;
use std::path::Path;
use subc_agent::{AgentSettings, Layout};

/// Checks an agent registration's fields (not whether the agent answers).
pub(crate) fn check(a: &proto::AgentTarget) -> Result<(), RegistrationError> {
    if a.address.is_empty() {
        return Err(RegistrationError::Agent("give the agent's address (host:port)"));
    }
    let Some(p) = &a.program else { return Err(RegistrationError::Agent("give the program: an eBPF target's interface and hook")) };
    if p.interface.is_empty() {
        return Err(RegistrationError::NoInterface);
    }
    if p.hook == proto::Hook::Unspecified as i32 {
        return Err(RegistrationError::NoHook);
    }
    match (&a.tls, a.insecure) {
        (Some(_), true) => Err(RegistrationError::Agent("both TLS files and insecure are given; an agent serves one or the other")),
        (None, false) => Err(RegistrationError::Agent(
            "an agent requires mutual TLS: give the CA and the server's client certificate and key, or insecure for an agent serving --insecure",
        )),
        (Some(t), false) if t.client_cert_file.is_empty() || t.client_key_file.is_empty() => {
            Err(RegistrationError::Agent("an agent requires a client certificate: give client_cert_file and client_key_file"))
        }
        _ => Ok(()),
    }
}

/// The settings of agent target `name`, fenced as `controller`.
pub(crate) fn settings(
    name: &str,
    a: &proto::AgentTarget,
    bpffs_root: &Path,
    device: Option<&EbpfDevice>,
    controller: &Controller,
) -> Result<AgentSettings, TargetError> {
    let program = a.program.as_ref().ok_or_else(|| TargetError::transient("the agent target has no program"))?;
    let e = ebpf::settings(name, program, bpffs_root, device)?;
    let layout = Layout { hook: e.hook, mode: e.mode, interfaces: e.ifaces, config: e.config };
    let mut s = AgentSettings::new(&a.address, layout, controller.epoch, &controller.name);
    s.insecure = a.insecure;
    if let Some(t) = &a.tls {
        s.tls = super::p4::tls_files(t).map_err(|e| TargetError::transient(e.to_string()))?;
    }
    Ok(s)
}
