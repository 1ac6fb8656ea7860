//! The pure part, without a kernel: the table image looked up the way the
//! generated program looks it up (descriptors, exact hash, sorted intervals
//! or longest prefix, default) gives the IR's own decisions, on examples
//! and generated sets, in both layouts, and after random diffs; and an
//! image survives being saved as parts and rebuilt.

mod common;

use common::{compile, example, examples, program};
use subc_backend_ebpf::TableImage;
use subc_backend_ebpf::{write_program, EbpfOptions, RangeLookup};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_lang::Program;
use subc_workload::Rng;
use subc_workload::{itch, siena, siena_spec, ItchParams, SienaParams};

const ITCH_SPEC: &str = include_str!("../../../examples/itch/itch.spec");

/// Query-field values near the set's constants.
fn values(p: &Program, rng: &mut Rng) -> Vec<u64> {
    let mut pool: Vec<Vec<u64>> = vec![vec![]; p.spec.query_fields.len()];
    for n in &p.normal_forms {
        for c in &n.cubes {
            for (f, set) in &c.0 {
                for iv in set.intervals() {
                    pool[f.0 as usize].extend([iv.lo.wrapping_sub(1), iv.lo, iv.hi, iv.hi.wrapping_add(1)]);
                }
            }
        }
    }
    p.spec
        .query_fields
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let m = subc_lang::mask(q.width);
            if !pool[i].is_empty() && rng.chance(0.8) {
                *rng.pick(&pool[i]) & m
            } else {
                rng.next_u64() & m
            }
        })
        .collect()
}

#[track_caller]
fn agree(p: &Program, set: &CompiledSet, image: &TableImage, model: &subc_backend_ebpf::Model, seed: u64, ctx: &str) {
    let mut rng = Rng::new(seed);
    for _ in 0..400 {
        let v = values(p, &mut rng);
        assert_eq!(image.lookup(model, &v), set.eval_tables(&v), "{ctx}: values {v:?}");
    }
}

fn layouts() -> [EbpfOptions; 2] {
    [RangeLookup::Sorted, RangeLookup::Lpm].map(|ranges| EbpfOptions { ranges, ..Default::default() })
}

#[test]
fn images_decide_as_the_pipelines_do() {
    let mut sets: Vec<(String, Program)> = examples().into_iter().map(|e| (e.clone(), example(&e))).collect();
    sets.push((
        "itch".into(),
        program(ITCH_SPEC, &itch(&ItchParams { subscriptions: 300, symbols: 10, hosts: 20, seed: 3, ..Default::default() })),
    ));
    let sp = SienaParams { filters: 60, attributes: 6, ports: 16, seed: 4, ..Default::default() };
    sets.push(("siena".into(), program(&siena_spec(sp.attributes, sp.ports), &siena(&sp))));
    for (name, p) in &sets {
        let set = compile(p);
        for opts in layouts() {
            let a = write_program(&p.spec, &set.pipelines(), &opts).unwrap();
            agree(p, &set, &a.image, &a.model, 1, &format!("{name} {:?}", opts.ranges));
        }
    }
}

#[test]
fn images_follow_diffs_and_survive_saving() {
    let p = program(ITCH_SPEC, &itch(&ItchParams { subscriptions: 200, symbols: 8, hosts: 16, seed: 6, ..Default::default() }));
    for opts in layouts() {
        let opts = EbpfOptions {
            capacity: subc_backend_ebpf::Capacity { headroom: subc_bdd::Headroom::new(4.0).unwrap(), min_entries: 64 },
            ..opts
        };
        let mut rng = Rng::new(11);
        let mut live: Vec<bool> = (0..p.normal_forms.len()).map(|i| i < 100).collect();
        let nfs: Vec<_> = p.normal_forms.iter().zip(&live).filter(|(_, l)| **l).map(|(n, _)| n.clone()).collect();
        let mut set = CompiledSet::compile(&p.spec, &nfs, CompileOptions::default()).unwrap();
        let a = write_program(&p.spec, &set.pipelines(), &opts).unwrap();
        let (model, mut image) = (a.model, a.image);
        for step in 0..20 {
            let i = rng.below(live.len() as u64) as usize;
            let u = if live[i] { set.remove(&[p.normal_forms[i].id]).unwrap() } else { set.add(&[p.normal_forms[i].clone()]).unwrap() };
            live[i] = !live[i];
            let (_, next) = image.plan(&model, &u).unwrap();
            image = next;
            assert_eq!(image.pipelines().iter().collect::<Vec<_>>(), set.pipelines(), "step {step}");
            agree(&p, &set, &image, &model, step, &format!("{:?} step {step}", opts.ranges));
        }
        let saved = TableImage::from_saved(&model, image.pipelines().to_vec(), image.parts()).unwrap();
        assert_eq!(saved.initial_ops(&model), image.initial_ops(&model), "{:?}: a saved image encodes the same", opts.ranges);
        assert_eq!(saved.parts(), image.parts());
    }
}
