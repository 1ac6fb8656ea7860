//! The store's safety: `restore_store` (the old store's WAL, a running
//! server, a damaged backup, ids never given twice), the checks at startup
//! (an empty or damaged store is refused), and a store whose size follows
//! the subscriptions, not the changes made to them.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use subc_server::{backup_store, proto, restore_store};

fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}{suffix}", path.display()))
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Files in `dir` whose names hold `part`.
fn named(dir: &Path, part: &str) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.contains(part)).collect()
}

async fn add_lines(c: &mut subc_server::Clients, lines: Vec<String>, request_id: &str) -> proto::AddResponse {
    c.subs.add(proto::AddRequest { lines, request_id: request_id.into(), ..Default::default() }).await.expect("add").into_inner()
}

fn lines(from: usize, n: usize) -> Vec<String> {
    (from..from + n).map(|i| format!("stock == GOOGL && shares > {i} : fwd(1)")).collect()
}

/// A restore over a store that a killed server left with its WAL: the
/// backup is served (not the stale WAL's subscriptions), the WAL is gone,
/// and new ids and generations start above every one the replaced store
/// acknowledged. On 99f2b95 the documented restore (copying the backup
/// over the store) served the WAL's subscriptions, and new ids restarted
/// at the backup's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_over_a_crashed_store_serves_the_backup_and_never_reuses_an_id() {
    bounded(120, async {
        let mut env = Env::new().await;
        let store = env.dir.path().join("subc.db");
        let crashed = tempfile::tempdir().unwrap();
        let backup = crashed.path().join("backup.db");
        let kept: BTreeSet<u64> = add_lines(&mut env.alice, lines(0, 5), "").await.subscriptions.iter().map(|s| s.id).collect();
        backup_store(&store, &backup).unwrap();
        let later = add_lines(&mut env.alice, lines(5, 5), "later").await;
        let last_id = later.subscriptions.iter().map(|s| s.id).max().unwrap();

        // What a killed server leaves: the store and its WAL, the later adds in the WAL.
        let image = crashed.path().join("subc.db");
        for suffix in ["", "-wal", "-shm"] {
            std::fs::copy(sidecar(&store, suffix), sidecar(&image, suffix)).unwrap();
        }
        assert!(size(&sidecar(&image, "-wal")) > 0, "the crash image has a WAL");
        let _ = env.stop().await;

        let report = restore_store(&backup, &image, 0).expect("the restore succeeds");
        assert_eq!(report.subscriptions, 5, "{report:?}");
        assert!(report.replaced && report.next_id > last_id, "{report:?}");
        assert!(report.generation > later.generation, "{report:?}");
        assert!(!sidecar(&image, "-wal").exists() && !sidecar(&image, "-shm").exists());
        assert!(named(crashed.path(), ".restore-").is_empty());

        let r = start(config(crashed.path())).await;
        let mut admin = client(&r, Some(ADMIN));
        let served: BTreeSet<u64> = list_all(&mut admin, 100).await.iter().map(|s| s.id).collect();
        assert_eq!(served, kept, "the backup's subscriptions, not the stale WAL's");
        let mut alice = client(&r, Some(ALICE));
        let new = add_lines(&mut alice, lines(100, 1), "").await;
        assert!(new.subscriptions[0].id > last_id, "id {} was given before the restore", new.subscriptions[0].id);
        assert!(new.generation > report.generation);
        r.shutdown().await.unwrap();
    })
    .await;
}

/// Refused while a server holds the store, which keeps serving; and a
/// damaged backup is refused before anything is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_is_refused_while_a_server_runs_or_when_the_backup_is_damaged() {
    bounded(120, async {
        let mut env = Env::new().await;
        let store = env.dir.path().join("subc.db");
        let dir = tempfile::tempdir().unwrap();
        let backup = dir.path().join("backup.db");
        add_lines(&mut env.alice, lines(0, 300), "").await;
        backup_store(&store, &backup).unwrap();

        let busy = restore_store(&backup, &store, 0).unwrap_err().to_string();
        assert!(busy.contains("in use") && busy.contains("subc.db"), "{busy}");
        assert_eq!(add_lines(&mut env.alice, lines(300, 1), "").await.subscriptions.len(), 1, "the server still serves");
        let _ = env.stop().await;

        // A damaged backup (its last page, part of a table) over a store
        // (restored from the good one) leaves that store as it was.
        let store = dir.path().join("subc.db");
        assert!(!restore_store(&backup, &store, 0).unwrap().replaced);
        let before = std::fs::read(&store).unwrap();
        let mut bytes = std::fs::read(&backup).unwrap();
        let n = bytes.len();
        bytes[n - 4096..].fill(0xA5);
        std::fs::write(&backup, &bytes).unwrap();
        let damaged = restore_store(&backup, &store, 0).unwrap_err().to_string();
        assert!(damaged.contains("integrity") || damaged.contains("malformed"), "{damaged}");
        assert!(named(dir.path(), ".restore-").is_empty());
        assert!(std::fs::read(&store).unwrap() == before, "the store is as it was");
        let missing = restore_store(&dir.path().join("none.db"), &store, 0).unwrap_err().to_string();
        assert!(missing.contains("no such backup"), "{missing}");

        let r = start(config(dir.path())).await;
        assert_eq!(list_all(&mut client(&r, Some(ADMIN)), 1000).await.len(), 300);
        r.shutdown().await.unwrap();
    })
    .await;
}

/// A store that cannot be read leaves the ids it gave out unknown: the
/// restore asks for a floor, and uses it.
#[test]
fn a_restore_over_an_unreadable_store_needs_a_floor_for_ids() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let backup = dir.path().join("backup.db");
    let live = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let r = start(config(live.path())).await;
        add_lines(&mut client(&r, Some(ALICE)), lines(0, 3), "").await;
        r.shutdown().await.unwrap();
    });
    backup_store(&live.path().join("subc.db"), &backup).unwrap();
    let store = dir.path().join("subc.db");
    std::fs::write(&store, b"").unwrap();
    let refused = restore_store(&backup, &store, 0).unwrap_err().to_string();
    assert!(refused.contains("--min-next-id"), "{refused}");
    let report = restore_store(&backup, &store, 1000).unwrap();
    assert_eq!((report.subscriptions, report.next_id), (3, 1000));
}

/// Startup refuses an empty (0-byte) store and one with a damaged page
/// (here an index page, which startup does not otherwise read: on 99f2b95
/// that server reported SERVING and every add failed), naming the file and
/// the way out; a missing store is still created.
#[test]
fn startup_refuses_an_empty_or_damaged_store() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let live = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let r = start(config(live.path())).await;
        add_lines(&mut client(&r, Some(ALICE)), lines(0, 400), "").await;
        r.shutdown().await.unwrap();
    });
    // A copy no connection holds (a stopped server's store, in one file).
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("subc.db");
    backup_store(&live.path().join("subc.db"), &store).unwrap();

    let root: i64 = {
        let c = rusqlite::Connection::open(&store).unwrap();
        c.query_row("SELECT rootpage FROM sqlite_master WHERE name = 'subscriptions_by_app'", [], |r| r.get(0)).unwrap()
    };
    let mut bytes = std::fs::read(&store).unwrap();
    let page = (root as usize - 1) * 4096;
    bytes[page..page + 4096].fill(0xA5);
    std::fs::write(&store, &bytes).unwrap();
    let e = rt.block_on(subc_server::start(config(dir.path()))).err().expect("a damaged store is refused").to_string();
    assert!(e.contains("damaged") && e.contains("subc.db") && e.contains("subc store restore"), "{e}");

    std::fs::write(&store, b"").unwrap();
    let e = rt.block_on(subc_server::start(config(dir.path()))).err().expect("an empty store is refused").to_string();
    assert!(e.contains("0 bytes") && e.contains("subc.db") && e.contains("subc store restore"), "{e}");
    assert_eq!(size(&store), 0, "and left as it was");

    std::fs::remove_file(&store).unwrap();
    rt.block_on(async { start(config(dir.path())).await.shutdown().await.unwrap() });
    assert!(size(&store) > 0, "a missing store is created");
}

/// `cycles` times, alice adds `n` lines (with a request_id, so that the
/// reply is kept for replays) and removes them; returns the store's bytes
/// (its file and WAL) and its file's alone.
async fn churn(cycles: usize, n: usize, f: impl FnOnce(&mut subc_server::Config)) -> (u64, u64) {
    let mut env = Env::with(|c| {
        c.limits.max_lines_per_request = n.max(1);
        f(c)
    })
    .await;
    let store = env.dir.path().join("subc.db");
    for cycle in 0..cycles {
        let cheap = (0..n).map(|i| format!("stock == S{i} : fwd(1)")).collect();
        let added = add_lines(&mut env.alice, cheap, &format!("cycle-{cycle}")).await;
        let ids = added.subscriptions.iter().map(|s| s.id).collect();
        env.alice.subs.remove(proto::RemoveRequest { ids, ..Default::default() }).await.expect("remove");
        if cycles >= 50 && cycle % 10 == 9 {
            eprintln!("cycle {}: {} bytes, {} with the WAL", cycle + 1, size(&store), size(&store) + size(&sidecar(&store, "-wal")));
        }
    }
    let sizes = (size(&store) + size(&sidecar(&store, "-wal")), size(&store));
    let _ = env.stop().await;
    sizes
}

/// Replies and events are pruned by size, and freed pages given back: 30
/// cycles of 5,000 lines (about 0.3 MB of replies and events each) under
/// 256 KiB limits stay under 1 MiB (4 MiB with the WAL). On 99f2b95 (no size
/// limits, pruning every 256 commits) such a store grew with every cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_and_events_are_pruned_by_size_and_freed_pages_given_back() {
    bounded(600, async {
        let t = std::time::Instant::now();
        let (total, file) = churn(30, 5_000, |c| {
            c.retention.request_max_bytes = 256 << 10;
            c.retention.events_max_bytes = 256 << 10;
        })
        .await;
        eprintln!("30 cycles of 5,000 lines: {total} bytes with the WAL, {file} in the file, {:?}", t.elapsed());
        assert!(total < 4 << 20 && file < 1 << 20, "{total} bytes with the WAL, {file} in the file");
    })
    .await;
}

/// The measure, with the default limits: 100 cycles of adding and
/// removing 50,000 lines leave the store under 10 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "too slow in a debug build (an add of 50,000 lines outlasts the 30 s client timeout); 3.5 min in release: cargo test --release -p subc-server --test store -- --ignored"]
async fn a_hundred_cycles_of_fifty_thousand_lines_leave_the_store_under_ten_megabytes() {
    bounded(3600, async {
        let t = std::time::Instant::now();
        let (total, file) = churn(100, 50_000, |_| {}).await;
        eprintln!("100 cycles of 50,000 lines: {total} bytes with the WAL, {file} in the file, {:?}", t.elapsed());
        assert!(total < 10_000_000, "{total} bytes with the WAL, {file} in the file");
    })
    .await;
}
