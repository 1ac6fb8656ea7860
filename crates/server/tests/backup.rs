//! `backup_store`: an online copy of the store taken while a client keeps
//! adding, which a new server then serves; and the refusals that leave no
//! file behind.

mod common;

use common::*;
use std::collections::BTreeSet;
use subc_server::backup_store;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_during_adds_restores_a_consistent_generation() {
    bounded(120, async {
        let env = Env::new().await;
        let store = env.dir.path().join("subc.db");
        let copy = env.dir.path().join("copy.db");
        let mut alice = env.alice.clone();
        let (twenty_in, mut wait_twenty) = tokio::sync::watch::channel(false);
        let adds = tokio::spawn(async move {
            let mut acked = vec![];
            for i in 0..300 {
                let a = alice.subs.add(add_req(&[&format!("stock == GOOGL && shares > {i} : fwd(1)")])).await.unwrap().into_inner();
                acked.push((a.generation, a.subscriptions[0].id));
                let _ = twenty_in.send(acked.len() >= 20);
            }
            acked
        });
        // Back up while the adds run, once twenty are in.
        wait_twenty.wait_for(|in_| *in_).await.unwrap();
        let (s, c) = (store.clone(), copy.clone());
        let report = tokio::task::spawn_blocking(move || backup_store(&s, &c)).await.unwrap().expect("the backup succeeds");
        let acked = adds.await.unwrap();
        assert!(report.bytes > 0 && copy.exists());
        // Exactly the adds acknowledged up to the copy's generation.
        let expected: BTreeSet<u64> = acked.iter().filter(|(g, _)| *g <= report.generation).map(|(_, id)| *id).collect();
        assert_eq!(report.subscriptions as usize, expected.len(), "{report:?}");
        assert!(expected.len() >= 20, "the copy holds what was acknowledged before it began: {report:?}");
        let leftovers: Vec<_> = std::fs::read_dir(env.dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!leftovers.iter().any(|n| n.to_string_lossy().contains(".partial-")), "{leftovers:?}");
        let _kept = env.stop().await;

        // A server on the copy serves that generation.
        let restored = tempfile::tempdir().unwrap();
        std::fs::copy(&copy, restored.path().join("subc.db")).unwrap();
        let r = start(config(restored.path())).await;
        let mut admin = client(&r, Some(ADMIN));
        let ids: BTreeSet<u64> = list_all(&mut admin, 100).await.iter().map(|s| s.id).collect();
        assert_eq!(ids, expected);
        assert_eq!(r.core.generation(), report.generation);
        r.shutdown().await.unwrap();
    })
    .await;
}

#[test]
fn refused_backups_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let missing = backup_store(&dir.path().join("none.db"), &dir.path().join("out.db")).unwrap_err();
    assert!(missing.to_string().contains("no such store"), "{missing}");

    // A file that is not a store.
    let not_a_store = dir.path().join("junk.db");
    std::fs::write(&not_a_store, b"not sqlite at all, but long enough to look like a header......").unwrap();
    assert!(backup_store(&not_a_store, &dir.path().join("out.db")).is_err());

    // Over itself, or into a directory that does not exist.
    let real = tempfile::tempdir().unwrap();
    let store = real.path().join("subc.db");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let r = start(config(real.path())).await;
        r.shutdown().await.unwrap();
    });
    let itself = backup_store(&store, &store).unwrap_err();
    assert!(itself.to_string().contains("overwrite the store itself"), "{itself}");
    assert!(backup_store(&store, &dir.path().join("no/such/dir/out.db")).is_err());
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, vec!["junk.db".to_string()], "nothing but the junk file");
}
