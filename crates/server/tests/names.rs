//! Names are data: random names (`.`, `..`, `/`, NUL, very long, unicode)
//! given to every API and configuration entry point that takes one touch
//! nothing outside the store's directory and the bpffs root. Canary files
//! around both roots, and one inside the store's directory, must survive.
//! (A P4Runtime target named `..`, removed with `uninstall`, once deleted
//! every file beside the store.)

mod common;

use common::*;
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::time::Duration;
use subc_server::proto::{self, register_target_request::Kind};

/// The canaries: path and content.
fn canaries(top: &Path) -> Vec<(PathBuf, String)> {
    ["canary", "store/canary", "bpffs/canary", "bpffs/root/zz-canary"].iter().map(|p| (top.join(p), format!("canary {p}"))).collect()
}

fn registrations(name: &str) -> Vec<proto::RegisterTargetRequest> {
    let reg = |kind| proto::RegisterTargetRequest { name: name.to_string(), kind: Some(kind), manual: true };
    vec![
        reg(Kind::Sim(proto::SimTarget { path: "sim.json".into() })),
        reg(Kind::P4runtime(proto::P4RuntimeTarget { address: "127.0.0.1:1".into(), ..Default::default() })),
        reg(Kind::Ebpf(proto::EbpfTarget { interface: "lo".into(), hook: proto::Hook::Tc as i32, ..Default::default() })),
    ]
}

fn name_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(".".to_string()),
        Just("..".to_string()),
        Just("/".to_string()),
        Just("../..".to_string()),
        Just("a/../../b".to_string()),
        Just("\0".to_string()),
        Just("a\0b".to_string()),
        Just("-rf".to_string()),
        Just(String::new()),
        "[a-z][a-z0-9_-]{0,12}",
        "[./a-z]{1,12}",
        "\\PC{1,24}",
        "x{60,70}",
        "y{1000,5000}",
        any::<String>(),
    ]
}

#[test]
fn random_names_touch_nothing_outside_the_roots() {
    let top = tempfile::tempdir().unwrap();
    let top = top.path().to_path_buf();
    for d in ["store", "bpffs/root"] {
        std::fs::create_dir_all(top.join(d)).unwrap();
    }
    for (p, text) in canaries(&top) {
        std::fs::write(p, text).unwrap();
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut cfg = config(&top.join("store"));
    cfg.deploy.bpffs_root = top.join("bpffs/root");
    let r = rt.block_on(start(cfg));
    let mut admin = rt.block_on(async { client(&r, Some(ADMIN)) });
    let mut alice = rt.block_on(async { client(&r, Some(ALICE)) });
    rt.block_on(alice.subs.add(add_req(&["stock == GOOGL : fwd(1)"]))).unwrap();

    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 96, ..ProptestConfig::default() });
    runner
        .run(&name_strategy(), |name| {
            let valid = subc_server::check_name("name", &name).is_ok();
            let mut admin = admin.clone();
            rt.block_on(async {
                for reg in registrations(&name) {
                    let registered = admin.targets.register(reg).await;
                    prop_assert_eq!(registered.is_ok(), valid, "register {:?}: {:?}", name, registered.as_ref().err());
                    if let Err(e) = &registered {
                        prop_assert!(e.message().len() < 400, "a long message: {} bytes", e.message().len());
                    }
                    let target = proto::TargetRequest { name: name.clone() };
                    let _ = admin.targets.status(target.clone()).await;
                    let _ = tokio::time::timeout(Duration::from_secs(5), admin.targets.plan(target)).await;
                    let _ = admin.targets.deploy(proto::DeployRequest { name: name.clone(), timeout_ms: 200 }).await;
                    let _ = admin.targets.remove(proto::RemoveTargetRequest { name: name.clone(), uninstall: true }).await;
                    let _ = admin.targets.remove(proto::RemoveTargetRequest { name: name.clone(), uninstall: false }).await;
                }
                let _ = admin.subs.list(proto::ListRequest { app: name.clone(), ..Default::default() }).await;
                Ok(())
            })?;
            // The configuration takes application names.
            let mut cfg = config(&top.join("store"));
            cfg.auth.apps[0].name = name.clone();
            prop_assert_eq!(cfg.validate().is_ok(), valid, "an application named {:?}", name);
            for (p, text) in canaries(&top) {
                let now = std::fs::read_to_string(&p).ok();
                prop_assert_eq!(now.as_deref(), Some(text.as_str()), "{} after {:?}", p.display(), name);
            }
            Ok(())
        })
        .unwrap();

    // The store is whole: the subscription is still there, and nothing
    // foreign was written beside it.
    let subs = rt.block_on(list_all(&mut admin, 100));
    assert_eq!(subs.len(), 1);
    let mut beside: Vec<String> =
        std::fs::read_dir(top.join("store")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    beside.sort();
    beside.retain(|f| !f.starts_with("subc.db") && f != "targets" && f != "sim");
    assert_eq!(beside, vec!["canary".to_string()]);
    rt.block_on(r.shutdown()).unwrap();
}
