//! Label mode (`docs/network.md`, "Routing by labels"): the TC program of a
//! fabric device that pushes, forwards by and pops BIER-style labels.
//!
//! **Encapsulation.** A labelled frame is the publisher's frame with
//! `2 + header_bytes` bytes inserted after the MAC addresses:
//! [`LABEL_ETHERTYPE`], then the label header (one byte of plane, then the
//! bit string, endpoint `e` in bit `e % 8` of byte `e / 8`), then the
//! frame's own EtherType and payload, untouched:
//!
//! ```text
//! dst MAC | src MAC | 0x88b5 | plane | bits (⌈endpoints/8⌉) | EtherType | payload
//! ```
//!
//! **Push** (an ingress device, a frame from one of its own endpoints): the
//! whole network program decides the endpoint set (endpoints numbered as
//! ports), less the publisher (the endpoint whose port the frame came in
//! on); the plane is `push_base + n mod push_count`, `n` the device's
//! packet count, one atomic add on a counter shared by the device's CPUs
//! (so with `push_base = 0` and `push_count` the planes held, packet `n`
//! takes plane `n mod planes`, as `LabelSimulator` does). The header is pushed
//! (`bpf_skb_change_head`, then the MACs moved to the front) only when a
//! neighbour gets a copy.
//!
//! **Forward** (every device): per row of the packet's plane, the copy to
//! the row's port carries `label & F-BM`, sent with `bpf_clone_redirect` if
//! that is not empty. Rows are data (`subc_label_rows`), so a reroute is a
//! map update ([`label_diff`]).
//!
//! **Pop** (the device's own endpoints whose bits are set): the header is
//! removed once, after every forwarded copy left (the payload moves back by
//! `2 + header_bytes` bytes and the tail is trimmed: the kernel's
//! `bpf_skb_adjust_room` refuses frames whose outer protocol is not IP),
//! and each endpoint gets the publisher's frame through its egress, with
//! the egress's rewrites.
//!
//! **Make-before-break reroutes.** Rewriting F-BM rows in place, switch
//! after switch, lets a packet in flight meet old rows at one hop and new
//! ones at the next; with latency-weighted routes old and new next hops can
//! point at each other, and a bit loops or is lost (labels have no TTL).
//! So the rows a device holds (`planes`, indexed by the header's plane
//! byte) may be more than the planes its ingress pushes (`push_base ..
//! push_base + push_count`): shape the program with twice the planes of a
//! routing, two *banks* (`0..P` and `P..2P`). To reroute:
//!
//! 1. write the new routes' rows into the bank no ingress pushes, on every
//!    device ([`label_diff`] writes only rows that differ from what
//!    that bank holds);
//! 2. move every ingress device's push range to the new bank (one
//!    `subc_label_cfg` entry each; its packet counter carries on);
//! 3. once the packets pushed in the old bank have drained (a few link
//!    latencies), the old bank is free for the next reroute.
//!
//! A packet's plane byte fixes its bank for its whole path, so it meets one
//! routing at every hop, old or new, never a mix. Step 2 before step 1 has
//! finished drops the copies that reach a device not yet holding the new
//! bank (no row: nothing forwarded; the test `fabric_labels.rs` makes the
//! wrong order and sees exactly those frames lost).
//!
//! The maps, sized by a [`LabelShape`]: `subc_label_cfg` (the push range,
//! and whether the device is an ingress), `subc_label_sent` (the plane
//! counter), `subc_label_rows` (`planes × rows` F-BM rows: port and bits)
//! and `subc_label_hosts` (the device's own endpoints: port and endpoint).

use crate::encode::MapOp;
use crate::layout::{CStruct, MapDef, MapRole, MapType, Scalar, KV};
use crate::model::{MapIds, Model};
use crate::{EbpfError, Hook, TargetError, UnsupportedError};
use subc_lang::spec::Spec;

pub use subc_bdd::{LabelShape, LabelTable, LABEL_ETHERTYPE, MAX_LABEL_PLANES};

/// Most endpoints a label holds: a port bitmap's 512 ports.
pub const MAX_LABEL_ENDPOINTS: u32 = 512;

/// Refuses what no label program can be: XDP, a label wider than the
/// program's ports, an empty or oversized shape.
pub(crate) fn check_shape(shape: &LabelShape, spec: &Spec, hook: Hook) -> Result<(), EbpfError> {
    let refuse = |e| Err(EbpfError::Unsupported(e));
    if hook == Hook::Xdp {
        return refuse(UnsupportedError::LabelsOnXdp);
    }
    if shape.endpoints == 0 || shape.endpoints > spec.ports || shape.endpoints > MAX_LABEL_ENDPOINTS {
        return refuse(UnsupportedError::LabelEndpoints { endpoints: shape.endpoints, ports: spec.ports });
    }
    if !shape.sized() {
        return refuse(UnsupportedError::LabelShape { planes: shape.planes, rows: shape.rows, hosts: shape.hosts });
    }
    Ok(())
}

/// Indices of the label maps in [`Model::maps`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LabelMapIds {
    pub cfg: usize,
    pub sent: usize,
    pub rows: usize,
    pub hosts: usize,
}

/// The label maps' structs, in declaration order.
pub(crate) fn label_structs(shape: &LabelShape) -> [CStruct; 3] {
    [
        CStruct::builder("subc_label_cfg")
            .scalar("push_base", Scalar::U32)
            .scalar("push_count", Scalar::U32)
            .scalar("ingress", Scalar::U32)
            .finish(),
        CStruct::builder("subc_label_row")
            .scalar("port", Scalar::U32)
            .scalar("used", Scalar::U32)
            .array("fbm", Scalar::U64, shape.words())
            .finish(),
        CStruct::builder("subc_label_host")
            .scalar("used", Scalar::U32)
            .scalar("port", Scalar::U32)
            .scalar("endpoint", Scalar::U32)
            .finish(),
    ]
}

/// The label maps, appended to `maps`; their indices.
pub(crate) fn add_label_maps(shape: &LabelShape, structs: &[CStruct; 3], maps: &mut Vec<MapDef>) -> LabelMapIds {
    let u32_key = KV::Scalar { scalar: Scalar::U32 };
    let mut add = |name: &str, role: MapRole, value: KV, max_entries: u32| {
        maps.push(MapDef {
            name: name.to_string(),
            role,
            map_type: MapType::Array,
            key: u32_key.clone(),
            value,
            max_entries,
            flags: None,
            only_if: None,
            state: None,
        });
        maps.len() - 1
    };
    let [cfg, row, host] = structs;
    LabelMapIds {
        cfg: add("subc_label_cfg", MapRole::LabelConfig, KV::Struct(cfg.clone()), 1),
        sent: add("subc_label_sent", MapRole::LabelSent, KV::Scalar { scalar: Scalar::U64 }, 1),
        rows: add("subc_label_rows", MapRole::LabelRows, KV::Struct(row.clone()), shape.planes * shape.rows),
        hosts: add("subc_label_hosts", MapRole::LabelHosts, KV::Struct(host.clone()), shape.hosts),
    }
}

/// Every label map entry of a device's `table`, empty slots included, so
/// that writing them replaces whatever the maps held (the plane counter
/// aside).
pub fn label_ops(table: &LabelTable, model: &Model) -> Result<Vec<MapOp>, EbpfError> {
    let (shape, ids) = labels_of(model)?;
    check_table(table, &shape)?;
    let mut ops = vec![cfg_op(table, model, ids)];
    for plane in 0..shape.planes {
        let rows = table.planes.get(plane as usize).map_or(&[][..], Vec::as_slice);
        for slot in 0..shape.rows {
            let value = row_value(model, ids, rows.get(slot as usize));
            ops.push(MapOp { map: ids.rows, key: (plane * shape.rows + slot).to_ne_bytes().to_vec(), value: Some(value), offset: None });
        }
    }
    for slot in 0..shape.hosts {
        let value = host_value(model, ids, table.deliver.get(slot as usize));
        ops.push(MapOp { map: ids.hosts, key: slot.to_ne_bytes().to_vec(), value: Some(value), offset: None });
    }
    Ok(ops)
}

/// The entries that change from `from` to `to`: none for a device whose
/// tables did not change.
pub fn label_diff(from: &LabelTable, to: &LabelTable, model: &Model) -> Result<Vec<MapOp>, EbpfError> {
    let before = label_ops(from, model)?;
    let after = label_ops(to, model)?;
    Ok(after.into_iter().zip(before).filter(|(a, b)| a != b).map(|(a, _)| a).collect())
}

/// Whether a device's tables fit the program's maps.
fn check_table(t: &LabelTable, shape: &LabelShape) -> Result<(), EbpfError> {
    let too_big = |what, got: usize, max: u32| {
        (got > max as usize).then_some(EbpfError::Target(TargetError::LabelTable { what, got, max: max as usize }))
    };
    let widest = t.planes.iter().flatten().map(|(_, bits)| bits.len()).max().unwrap_or(0);
    let last_endpoint = t.deliver.iter().map(|&(_, e)| e as usize + 1).max().unwrap_or(0);
    let held = t.planes.len();
    let push_end = u64::from(t.push_base) + u64::from(t.push_count);
    if (t.ingress && t.push_count == 0) || push_end > held as u64 {
        return Err(EbpfError::Target(TargetError::LabelPush { base: t.push_base, count: t.push_count, held }));
    }
    let errors = [
        too_big("the number of planes", held, shape.planes),
        too_big("the most rows in a plane", t.planes.iter().map(Vec::len).max().unwrap_or(0), shape.rows),
        too_big("the number of own endpoints", t.deliver.len(), shape.hosts),
        too_big("an F-BM's bytes", widest, shape.endpoints.div_ceil(8)),
        too_big("the endpoints delivered to", last_endpoint, shape.endpoints),
    ];
    errors.into_iter().flatten().next().map_or(Ok(()), Err)
}

fn cfg_op(t: &LabelTable, model: &Model, ids: LabelMapIds) -> MapOp {
    let mut v = model.maps[ids.cfg].value_struct().zeroed();
    v.u32("push_base", t.push_base).u32("push_count", t.push_count).u32("ingress", u32::from(t.ingress));
    MapOp { map: ids.cfg, key: 0u32.to_ne_bytes().to_vec(), value: Some(v.into_bytes()), offset: None }
}

fn row_value(model: &Model, ids: LabelMapIds, row: Option<&(u32, Vec<u8>)>) -> Vec<u8> {
    let mut v = model.maps[ids.rows].value_struct().zeroed();
    if let Some((port, bits)) = row {
        // The bit string's bytes, least significant first, are the words
        // of a little-endian port bitmap.
        v.u32("port", *port).u32("used", 1).bytes("fbm", bits);
    }
    v.into_bytes()
}

fn host_value(model: &Model, ids: LabelMapIds, host: Option<&(u32, u32)>) -> Vec<u8> {
    let mut v = model.maps[ids.hosts].value_struct().zeroed();
    if let Some(&(port, endpoint)) = host {
        v.u32("used", 1).u32("port", port).u32("endpoint", endpoint);
    }
    v.into_bytes()
}

fn labels_of(model: &Model) -> Result<(LabelShape, LabelMapIds), EbpfError> {
    match (model.labels, &model.ids) {
        (Some(shape), MapIds { labels: Some(ids), .. }) => Ok((shape, *ids)),
        _ => Err(EbpfError::Target(TargetError::NoLabels)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> LabelShape {
        LabelShape { endpoints: 12, planes: 2, rows: 2, hosts: 2 }
    }

    #[test]
    fn tables_too_big_for_the_shape_are_refused() {
        let wide = LabelTable { planes: vec![vec![(1, vec![0, 0, 1])]], ..Default::default() };
        assert!(matches!(
            check_table(&wide, &shape()),
            Err(EbpfError::Target(TargetError::LabelTable { what: "an F-BM's bytes", got: 3, max: 2 }))
        ));
        let planes = LabelTable { planes: vec![vec![]; 3], ..Default::default() };
        assert!(check_table(&planes, &shape()).is_err());
        let far = LabelTable { deliver: vec![(3, 12)], ..Default::default() };
        assert!(check_table(&far, &shape()).is_err());
        assert!(check_table(&LabelTable { deliver: vec![(3, 11)], ..Default::default() }, &shape()).is_ok());
    }

    #[track_caller]
    fn check_push(ingress: bool, held: usize, push_base: u32, push_count: u32, expect: Result<(), (u32, u32, usize)>) {
        let t = LabelTable { ingress, push_base, push_count, planes: vec![vec![]; held], deliver: vec![] };
        let got = check_table(&t, &shape()).map_err(|e| match e {
            EbpfError::Target(TargetError::LabelPush { base, count, held }) => (base, count, held),
            other => panic!("not a push range error: {other}"),
        });
        assert_eq!(got, expect);
    }

    #[test]
    fn an_ingress_pushes_at_least_one_plane_of_those_held() {
        check_push(true, 2, 0, 2, Ok(()));
        check_push(true, 2, 1, 1, Ok(()));
        check_push(true, 2, 0, 0, Err((0, 0, 2)));
        check_push(true, 2, 1, 2, Err((1, 2, 2)));
        check_push(true, 0, 0, 1, Err((0, 1, 0)));
        check_push(true, 2, u32::MAX, 2, Err((u32::MAX, 2, 2)));
        // A transit device pushes nothing, and may say so.
        check_push(false, 2, 0, 0, Ok(()));
        check_push(false, 1, 0, 2, Err((0, 2, 1)));
    }

    #[test]
    fn planes_held_beyond_the_shape_are_refused_even_if_not_pushed() {
        let t = LabelTable { ingress: true, push_base: 0, push_count: 1, planes: vec![vec![]; 3], deliver: vec![] };
        assert!(matches!(
            check_table(&t, &shape()),
            Err(EbpfError::Target(TargetError::LabelTable { what: "the number of planes", got: 3, max: 2 }))
        ));
    }
}
