//! Per-port counters: what the program's `subc_port_stats` map holds,
//! summed over CPUs, for a loaded data plane ([`crate::Dataplane`]) and
//! for one reopened from its pins ([`crate::PinnedTables`]) alike.
//!
//! The program adds every copy it hands to a logical port's egress (a
//! redirect, `XDP_TX`, a clone that succeeded) to that port's
//! `{packets, bytes}`. The map is per CPU so that the data path counts
//! with plain adds, no atomics and no shared cache line; the price is
//! paid here, on the rare read: one lookup per port returns every CPU's
//! copy, and they are summed.

use crate::LoaderError;
use libbpf_rs::{MapCore, MapFlags, MapHandle};
use serde::Serialize;
use subc_backend_ebpf::{read_field, Model};

/// What one logical port (a `fwd(N)` port number) was given since the
/// program was loaded.
///
/// `packets` counts copies the program handed to the port's egress: a
/// packet forwarded to three ports counts once on each. `bytes` sums their
/// lengths from the Ethernet header on, as the hook saw them (rewrites
/// keep the length). A copy to a port without an egress, or one the
/// kernel refused to redirect or clone, is not counted; one the kernel
/// drops later (a full queue on the way out) is, as the interface's own
/// counters would tell.
///
/// The counters belong to the program, not to its tables: updates (diffs
/// of the tables, either generation) never write them, so they keep
/// counting across every incremental update. A full reinstall loads a new
/// program with new maps and pins them over the old ones, so its counters
/// start again from zero, as a restarted process's would (a monitoring
/// system sees a counter reset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PortCounter {
    pub port: u32,
    pub packets: u64,
    pub bytes: u64,
}

/// Reads `subc_port_stats` from `maps` (indexed like `model.maps`, `None`
/// where a map was not built or not pinned): every port with at least one
/// packet counted, in port order, each summed over CPUs.
///
/// The CPUs' copies are read one port at a time while packets run, so a
/// sum can miss a packet counted during the read; `packets` and `bytes`
/// only ever grow.
pub(crate) fn read(maps: &[Option<MapHandle>], model: &Model) -> Result<Vec<PortCounter>, LoaderError> {
    let Some((id, map)) = model.ids.port_stats.and_then(|id| Some((id, maps[id].as_ref()?))) else {
        return Err(LoaderError::NoPortCounters);
    };
    let def = model.map(id);
    let value = def.value_struct();
    let mut out = vec![];
    for port in 0..def.max_entries {
        let cpus = map
            .lookup_percpu(&port.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| LoaderError::Map { map: def.name.clone(), source })?
            .unwrap_or_default();
        let mut c = PortCounter { port, ..Default::default() };
        for v in &cpus {
            c.packets = c.packets.wrapping_add(read_field(value, v, "packets", 0));
            c.bytes = c.bytes.wrapping_add(read_field(value, v, "bytes", 0));
        }
        if c.packets > 0 {
            out.push(c);
        }
    }
    Ok(out)
}
