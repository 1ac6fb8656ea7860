//! What crosses the wire between the controller and an agent: JSON
//! payloads with the SHA-256 of their bytes, versions of what is held, and
//! the layout of a program on the agent's host.

use crate::proto;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};
use subc_backend_ebpf::{Hook, TargetConfig};
use subc_bdd::Pipeline;
use subc_ebpf_loader::AttachMode;

/// Why a payload or a layout was refused.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the request has no {0}")]
    Missing(&'static str),
    #[error("the {what}'s SHA-256 does not match its bytes (truncated or corrupt)")]
    Digest { what: &'static str },
    #[error("the {what} is not the IR's JSON: {error}")]
    Json { what: &'static str, error: serde_json::Error },
    #[error("the layout's hook must be xdp or tc")]
    NoHook,
    #[error("the layout's attach mode {0} is not one the agent knows")]
    Mode(i32),
    #[error("an XDP attach mode was given for a TC program")]
    ModeForTc,
    #[error("the layout names no interface")]
    NoInterface,
    #[error("interface name {0:?} is not a Linux interface name (1 to 15 bytes, no '/', whitespace or NUL)")]
    Interface(String),
}

/// `value` as a payload.
pub fn payload<T: Serialize + ?Sized>(value: &T) -> proto::Payload {
    let json = serde_json::to_vec(value).expect("the IR's types serialize to JSON");
    let sha256 = Sha256::digest(&json).to_vec();
    proto::Payload { json, sha256 }
}

/// A payload's value, after its digest is checked.
pub fn decode<T: DeserializeOwned>(p: Option<&proto::Payload>, what: &'static str) -> Result<T, WireError> {
    let p = p.ok_or(WireError::Missing(what))?;
    if Sha256::digest(&p.json).as_slice() != p.sha256.as_slice() {
        return Err(WireError::Digest { what });
    }
    serde_json::from_slice(&p.json).map_err(|error| WireError::Json { what, error })
}

/// The digest that names a list of pipelines (both sides compute it alike).
pub fn digest(pipes: &[Pipeline]) -> Vec<u8> {
    payload(pipes).sha256
}

/// Where and how a program runs on an agent's host, decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub hook: Hook,
    pub mode: AttachMode,
    pub interfaces: Vec<String>,
    pub config: TargetConfig,
}

impl Layout {
    /// The layout as the API carries it, with the spec's source text.
    pub fn to_proto(&self, spec: &str) -> proto::Layout {
        let (hook, mode) = match (self.hook, self.mode) {
            (Hook::Tc, _) => (proto::Hook::Tc, proto::AttachMode::Auto),
            (Hook::Xdp, AttachMode::XdpNative) => (proto::Hook::Xdp, proto::AttachMode::XdpNative),
            (Hook::Xdp, AttachMode::XdpGeneric) => (proto::Hook::Xdp, proto::AttachMode::XdpGeneric),
            (Hook::Xdp, _) => (proto::Hook::Xdp, proto::AttachMode::Auto),
        };
        proto::Layout {
            spec: spec.to_string(),
            hook: hook as i32,
            mode: mode as i32,
            interfaces: self.interfaces.clone(),
            config_json: serde_json::to_string(&self.config).expect("a target config serializes"),
        }
    }

    /// A layout as the API carries it, checked (but not its spec).
    pub fn from_proto(p: &proto::Layout) -> Result<Layout, WireError> {
        let mode = proto::AttachMode::try_from(p.mode).map_err(|_| WireError::Mode(p.mode))?;
        let (hook, mode) = match (proto::Hook::try_from(p.hook), mode) {
            (Ok(proto::Hook::Tc), proto::AttachMode::Auto) => (Hook::Tc, AttachMode::TcAuto),
            (Ok(proto::Hook::Tc), _) => return Err(WireError::ModeForTc),
            (Ok(proto::Hook::Xdp), proto::AttachMode::XdpNative) => (Hook::Xdp, AttachMode::XdpNative),
            (Ok(proto::Hook::Xdp), proto::AttachMode::XdpGeneric) => (Hook::Xdp, AttachMode::XdpGeneric),
            (Ok(proto::Hook::Xdp), proto::AttachMode::Auto) => (Hook::Xdp, AttachMode::XdpAuto),
            _ => return Err(WireError::NoHook),
        };
        if p.interfaces.is_empty() {
            return Err(WireError::NoInterface);
        }
        if let Some(bad) = p.interfaces.iter().find(|i| !interface_name(i)) {
            return Err(WireError::Interface(bad.clone()));
        }
        let config = serde_json::from_str(&p.config_json).map_err(|error| WireError::Json { what: "port configuration", error })?;
        Ok(Layout { hook, mode, interfaces: p.interfaces.clone(), config })
    }
}

/// A name Linux could give an interface (`dev_valid_name`).
fn interface_name(name: &str) -> bool {
    (1..16).contains(&name.len())
        && name != "."
        && name != ".."
        && !name.bytes().any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_decodes_only_with_its_digest() {
        let p = payload(&vec![1u32, 2, 3]);
        assert_eq!(decode::<Vec<u32>>(Some(&p), "list").unwrap(), vec![1, 2, 3]);
        let mut cut = p.clone();
        cut.json.pop();
        assert!(matches!(decode::<Vec<u32>>(Some(&cut), "list"), Err(WireError::Digest { what: "list" })));
        assert!(matches!(decode::<Vec<u32>>(None, "list"), Err(WireError::Missing("list"))));
    }

    #[test]
    fn layouts_go_through_the_api_unchanged() {
        for (hook, mode) in [
            (Hook::Tc, AttachMode::TcAuto),
            (Hook::Xdp, AttachMode::XdpAuto),
            (Hook::Xdp, AttachMode::XdpNative),
            (Hook::Xdp, AttachMode::XdpGeneric),
        ] {
            let l = Layout { hook, mode, interfaces: vec!["eth0".into()], config: TargetConfig::default() };
            assert_eq!(Layout::from_proto(&l.to_proto("spec")).unwrap(), l);
        }
        let mut p = Layout { hook: Hook::Tc, mode: AttachMode::TcAuto, interfaces: vec!["a/b".into()], config: TargetConfig::default() }
            .to_proto("");
        assert!(matches!(Layout::from_proto(&p), Err(WireError::Interface(_))));
        p.interfaces = vec![];
        assert!(matches!(Layout::from_proto(&p), Err(WireError::NoInterface)));
    }
}
