//! Reopening a pinned data plane from another "process": the maps read
//! back match the image that filled them, a changed map is noticed,
//! updates through the reopened maps are what the loaded program decides
//! with, and a new build replaces the program without detaching.

mod common;

use common::*;
use subc_backend_ebpf::NoMatch;
use subc_backend_ebpf::TableImage;
use subc_backend_ebpf::{clang, EbpfOptions, Hook};
use subc_ebpf_loader::{Dataplane, PinnedTables};

fn bpffs_dir(name: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from("/sys/fs/bpf").join(format!("subc-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn pinned_tables_are_read_back_checked_and_updated() {
    if !kernel_available("pinned_tables_are_read_back_checked_and_updated") {
        return;
    }
    let p = example("itch");
    let mut set = compile(&p);
    let opts = EbpfOptions { hook: Hook::Tc, ..Default::default() };
    let art = artifacts(&p, &set, &opts);
    let obj = clang::compile(&art.source, clang::BuildFlags::test()).unwrap();
    let dp = Dataplane::load_with_image(&obj, art.model.clone(), art.image.clone()).unwrap();
    let dir = bpffs_dir("pinned");
    dp.pin(&dir).unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut tables = PinnedTables::open(&dir, art.model.clone()).unwrap();
        let live = tables.live_generation().unwrap();
        let img = |pipes: Vec<subc_bdd::Pipeline>, ids, gen| TableImage::from_parts(&art.model, pipes, ids, gen).unwrap();
        let image = img(art.image.pipelines().to_vec(), art.image.update_ids().clone(), live);
        assert_eq!(tables.check(&image, 10).unwrap(), Vec::<String>::new());
        // Another image is told apart.
        let mut other = art.image.pipelines().to_vec();
        let (k, v) = other[0].leaves.iter().next().map(|(k, v)| (*k, v.clone())).unwrap();
        let mut v2 = v.clone();
        v2.ports.push(63);
        other[0].leaves.insert(k, v2);
        assert!(!tables.check(&img(other, art.image.update_ids().clone(), live), 10).unwrap().is_empty());
        // Updates through the reopened maps change what the program decides.
        tables.set_image(image);
        let pkt = subc_workload::moldudp_add_order(1, 1, b'B', 500, "ZZZZ", 10);
        let pkt = subc_workload::udp_packet([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [10, 0, 0, 1], [10, 0, 0, 2], 1000, 26400, &pkt);
        assert_eq!(dp.test_run(&pkt, 0, NoMatch::Pass, 1).unwrap().record.unwrap().ports, Vec::<u32>::new());
        let add = p.normal_forms.len() as u64 + 1;
        let nf = program(&std::fs::read_to_string(examples_dir().join("itch/itch.spec")).unwrap(), "stock == ZZZZ : fwd(7)").normal_forms
            [0]
        .clone();
        let nf = subc_lang::NfSubscription { id: add, ..nf };
        let u = set.add(&[nf]).unwrap();
        tables.update(&u).unwrap();
        assert_eq!(dp.test_run(&pkt, 0, NoMatch::Pass, 1).unwrap().record.unwrap().ports, vec![7]);
        let after = tables.image().unwrap().clone();
        let live = tables.live_generation().unwrap();
        assert_eq!(tables.check(&after.with_live_gen(live), 10).unwrap(), Vec::<String>::new());
    }));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
