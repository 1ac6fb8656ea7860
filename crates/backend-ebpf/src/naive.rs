//! The naive baseline for benchmarks: the same parser and stream state as
//! the generated program, but instead of the decision diagram's tables,
//! every rule (a box: one interval per query field) is tested one by one in
//! a `bpf_loop`. Rules are the cubes of the normal forms, with a cube's
//! multi-interval sets expanded into boxes. Variable updates are not part
//! of the baseline (the benchmark sets have none): [`write_naive`] refuses
//! a set with any, rather than build a program that decides differently.
//! The loader's `tests/kernel.rs` checks its decisions against the
//! interpreter.

use crate::encode::MapOp;
use crate::layout::{CStruct, MapDef, MapRole, MapType, Scalar, KV};
use crate::model::Model;
use crate::{EbpfError, EbpfOptions, UnsupportedError};
use subc_bdd::PortSet;
use subc_lang::mask;
use subc_lang::spec::Spec;
use subc_lang::NfSubscription;

/// One rule: per query field `[lo, hi]`, and its actions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RuleBox {
    pub lo: Vec<u64>,
    pub hi: Vec<u64>,
    pub ports: Vec<u32>,
    pub drop: bool,
}

/// The boxes of a subscription set.
pub(crate) fn boxes(spec: &Spec, subs: &[NfSubscription]) -> Vec<RuleBox> {
    let q = spec.query_fields.len();
    let mut out = vec![];
    for s in subs {
        for cube in &s.cubes {
            let mut partial: Vec<(Vec<u64>, Vec<u64>)> = vec![(vec![0; q], spec.query_fields.iter().map(|f| mask(f.width)).collect())];
            for (f, set) in &cube.0 {
                let mut next = vec![];
                for (lo, hi) in &partial {
                    for iv in set.intervals() {
                        let (mut l, mut h) = (lo.clone(), hi.clone());
                        l[f.0 as usize] = iv.lo;
                        h[f.0 as usize] = iv.hi;
                        next.push((l, h));
                    }
                }
                partial = next;
            }
            for (lo, hi) in partial {
                out.push(RuleBox { lo, hi, ports: s.actions.ports.iter().copied().collect(), drop: s.actions.drop });
            }
        }
    }
    out
}

/// The naive program: its source, model (with `subc_rules`) and the rule
/// entries. Any hook; `opts.ranges` does not apply (there are no tables).
/// A set with variable updates is [`EbpfError::Unsupported`].
pub fn write_naive(spec: &Spec, subs: &[NfSubscription], opts: &EbpfOptions) -> Result<(String, Model, Vec<MapOp>), EbpfError> {
    if let Some(s) = subs.iter().find(|s| !s.actions.updates.is_empty()) {
        return Err(EbpfError::Unsupported(UnsupportedError::NaiveUpdates { subscription: s.id }));
    }
    if spec.ports > crate::BITMAP_MAX_PORTS {
        return Err(EbpfError::Unsupported(UnsupportedError::NaivePorts { ports: spec.ports }));
    }
    let mut model = Model::new(spec, &[], opts)?;
    let rules = boxes(spec, subs);
    let q = spec.query_fields.len() as u32;
    let rule = CStruct::builder("subc_rule")
        .array("lo", Scalar::U64, q.max(1))
        .array("hi", Scalar::U64, q.max(1))
        .array("ports", Scalar::U64, model.port_words)
        .scalar("drop", Scalar::U32)
        .finish();
    model.structs.push(rule.clone());
    model.maps.push(MapDef {
        name: "subc_rules".into(),
        role: MapRole::Rules,
        map_type: MapType::Array,
        key: KV::Scalar { scalar: Scalar::U32 },
        value: KV::Struct(rule.clone()),
        max_entries: rules.len().max(1) as u32,
        flags: None,
        only_if: None,
        state: None,
    });
    let map = model.maps.len() - 1;
    let ops = rules
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut v = rule.zeroed();
            for k in 0..q {
                v.u64_at("lo", k, r.lo[k as usize]).u64_at("hi", k, r.hi[k as usize]);
            }
            let ports = PortSet::from_ports(r.ports.iter().copied());
            for (w, x) in ports.words(model.port_words as usize).enumerate() {
                v.u64_at("ports", w as u32, x);
            }
            v.u32("drop", r.drop as u32);
            MapOp { map, key: (i as u32).to_ne_bytes().to_vec(), value: Some(v.into_bytes()), offset: None }
        })
        .collect();
    let source = crate::codegen::generate(spec, &model, Some(crate::codegen::NaiveRules { count: rules.len() }))?;
    Ok((source, model, ops))
}
