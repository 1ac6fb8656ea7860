//! The target config: what a logical port is on this machine, and what to
//! do with packets that match nothing.
//!
//! ```json
//! {
//!   "no_match": "pass",
//!   "ports": {
//!     "1": { "interface": "veth1" },
//!     "2": { "interface": "veth2", "dst_mac": "02:00:00:00:00:02",
//!            "dst_ip": "10.0.2.2", "dst_port": 7000 }
//!   }
//! }
//! ```
//!
//! A port is an egress interface, optionally with rewrites of the
//! destination (and source) MAC, the IPv4 destination and the UDP
//! destination port; the program fixes the IPv4 and UDP checksums, so a
//! topic fans out to UDP endpoints as BPF-Broker does. Ports not listed
//! send nothing. Interface names are resolved by the loader; this module
//! only encodes.

use crate::encode::MapOp;
use crate::model::Model;
use crate::{EbpfError, TargetError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoMatch {
    /// To the kernel stack (the default).
    #[default]
    Pass,
    Drop,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Egress {
    pub interface: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst_mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst_ip: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst_port: Option<u16>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    #[serde(default)]
    pub no_match: NoMatch,
    /// Never send a copy out of the interface the packet came in on: the
    /// rule of a switch in a fabric (`docs/network.md`). Off, a single port
    /// on the ingress interface is answered with `XDP_TX`, as a broker
    /// answering its publisher's host does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prune_ingress: bool,
    #[serde(default)]
    pub ports: BTreeMap<u32, Egress>,
}

pub fn parse_mac(s: &str) -> Result<[u8; 6], EbpfError> {
    subc_lang::parse_mac(s).ok_or_else(|| EbpfError::Target(TargetError::BadMac { text: s.to_string() }))
}

impl TargetConfig {
    pub fn from_json(text: &str) -> Result<TargetConfig, EbpfError> {
        serde_json::from_str(text).map_err(|e| EbpfError::Target(TargetError::Config(e)))
    }

    /// Checks ports against the program and encodes `subc_egress`,
    /// `subc_devmap` (XDP) and `subc_config`. `ifindex` resolves an
    /// interface name (the loader's, with the loader's error).
    pub fn ops<E: From<EbpfError>>(&self, model: &Model, ifindex: &dyn Fn(&str) -> Result<u32, E>) -> Result<Vec<MapOp>, E> {
        let mut ops = vec![];
        let s = model.maps[model.ids.egress].value_struct();
        for (port, e) in &self.ports {
            if *port >= model.ports {
                return Err(EbpfError::Target(TargetError::PortOutOfRange { port: *port, ports: model.ports }).into());
            }
            let idx = ifindex(&e.interface)?;
            let mut v = s.zeroed();
            let mut flags = 0u32;
            v.u32("ifindex", idx);
            if let Some(m) = &e.dst_mac {
                v.bytes("dmac", &parse_mac(m).map_err(E::from)?);
                flags |= 1;
            }
            if let Some(m) = &e.src_mac {
                v.bytes("smac", &parse_mac(m).map_err(E::from)?);
                flags |= 2;
            }
            if let Some(ip) = e.dst_ip {
                v.bytes("ip", &ip.octets());
                flags |= 4;
            }
            if let Some(p) = e.dst_port {
                v.bytes("port", &p.to_be_bytes());
                flags |= 8;
            }
            v.u32("flags", flags);
            ops.push(MapOp { map: model.ids.egress, key: port.to_ne_bytes().to_vec(), value: Some(v.into_bytes()), offset: None });
            if let Some(dm) = model.ids.devmap {
                ops.push(MapOp { map: dm, key: port.to_ne_bytes().to_vec(), value: Some(idx.to_ne_bytes().to_vec()), offset: None });
            }
        }
        ops.push(config_op(model, self.no_match, self.prune_ingress, 0));
        Ok(ops)
    }
}

/// `subc_config`: the no-match action, ingress pruning and the clock of
/// test builds.
pub fn config_op(model: &Model, no_match: NoMatch, prune_ingress: bool, now_ns: u64) -> MapOp {
    let s = model.maps[model.ids.config].value_struct();
    let mut v = s.zeroed();
    v.u32("no_match", (no_match == NoMatch::Drop) as u32).u32("prune_ingress", prune_ingress as u32).u64("now_ns", now_ns);
    MapOp { map: model.ids.config, key: 0u32.to_ne_bytes().to_vec(), value: Some(v.into_bytes()), offset: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_and_rejects_typos() {
        let c = TargetConfig::from_json(r#"{"ports": {"1": {"interface": "eth0", "dst_ip": "10.0.0.2", "dst_port": 7000}}}"#).unwrap();
        assert_eq!(c.no_match, NoMatch::Pass);
        assert_eq!(c.ports[&1].dst_ip, Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert!(TargetConfig::from_json(r#"{"ports": {"1": {"iface": "eth0"}}}"#).is_err());
        assert!(parse_mac("02:00:00:00:00").is_err());
        assert_eq!(parse_mac("02:00:00:00:00:0a").unwrap(), [2, 0, 0, 0, 0, 10]);
    }
}
