//! The durable store: SQLite in WAL mode.
//!
//! What it holds: the subscriptions (id, owning application, the id and
//! the generation in that application's own numbering, text, the generation
//! that added them), each application's counters (`apps`: its next id, its
//! generation, its last event number; see docs/server.md, "What an
//! application sees"), the registered targets and, per target, the
//! generation it was last seen holding and its status; an event log for
//! `Watch` replays; the replies of recent `Add`s by idempotency key; and a few
//! meta values (schema version, current generation, next subscription id,
//! the spec text the subscriptions were checked against, the field order,
//! the pipelines' layout); and per subscription, the pipelines its rules
//! were placed in.
//!
//! What only grows, the replies and the events, is pruned by age and size
//! (`[retention]`, and `events_keep`), and the pages it freed go back to the
//! file system (`auto_vacuum = INCREMENTAL`, then a checkpoint that
//! truncates the WAL), so the file follows the subscriptions, not the
//! changes made to them. An existing store is checked (`quick_check`) when
//! opened; an empty or damaged one is refused (`restore.rs` puts a backup
//! in its place).
//!
//! Invariants:
//! - One writer: the service's writer thread owns the only writing
//!   connection; readers (`Watch` replays) open their own.
//! - Every change the service acknowledges is one committed transaction
//!   ([`Store::write`]) before the reply; with `durability = full`
//!   (`synchronous=FULL`) the commit is on disk, so neither a killed process
//!   nor a power cut loses it.
//! - Subscription ids are never reused: `next_id` and every application's
//!   `apps.next_id` only grow, in the same transaction as the insert.
//! - A store from before per-application numbering keeps its ids (each
//!   row's id becomes its per-application id) and every application's
//!   counters start at the old global ones (meta `app_floor_*`), so no
//!   per-application id is given out twice.
//! - Compiled state (diagrams, tables) is never stored: it is a function of
//!   the subscriptions, the layout and the placements, and is rebuilt at
//!   startup; targets are read back.

use crate::config::Durability;
use crate::proto;
use crate::Error;
use prost::Message;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;

const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscriptions (
    id INTEGER PRIMARY KEY,
    app TEXT NOT NULL,
    text TEXT NOT NULL,
    generation INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS subscriptions_by_app ON subscriptions(app, id);
-- Per subscription, the pipeline of each of its cubes (a JSON array), with
-- the set's layout in meta 'layout': a restart rebuilds the same pipelines
-- from them (CompiledSet::compile_placed). A row may be missing (a store of
-- an earlier version); the set is then compiled afresh.
CREATE TABLE IF NOT EXISTS placements (
    id INTEGER PRIMARY KEY,
    pipes TEXT NOT NULL
);
-- A reused request_id with other content is refused: `fingerprint` is the
-- request's (request_fingerprint), NULL in rows of stores from before it.
CREATE TABLE IF NOT EXISTS requests (
    app TEXT NOT NULL,
    request_id TEXT NOT NULL,
    reply BLOB NOT NULL,
    created_ms INTEGER NOT NULL,
    fingerprint TEXT,
    PRIMARY KEY (app, request_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS targets (
    name TEXT PRIMARY KEY,
    registration BLOB NOT NULL,
    deployed INTEGER NOT NULL DEFAULT 0,
    created_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS target_status (
    name TEXT PRIMARY KEY,
    status BLOB NOT NULL
) WITHOUT ROWID;
-- `created_ms`: NULL in rows of stores from before it (pruned by count and
-- size only).
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    body BLOB NOT NULL,
    created_ms INTEGER
);
-- Per application, its own numbering: the next subscription id, its
-- generation (its committed changes) and its last event number. An
-- application without a row starts at meta 'app_floor_*'.
CREATE TABLE IF NOT EXISTS apps (
    app TEXT PRIMARY KEY,
    next_id INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    event_seq INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Indexes on columns [`add_missing_columns`] may have added.
const LATE_INDEXES: &str = "
CREATE UNIQUE INDEX IF NOT EXISTS subscriptions_by_app_id ON subscriptions(app, app_id);
CREATE INDEX IF NOT EXISTS events_by_app ON events(app, app_seq);
";

/// Columns added to tables after schema version 1 created them (a store
/// of an earlier build gets them, empty, when it is opened).
fn add_missing_columns(conn: &Connection) -> Result<(), Error> {
    for (table, column, ty) in [
        ("requests", "fingerprint", "TEXT"),
        ("events", "created_ms", "INTEGER"),
        // Per-application views: NULL in rows of earlier stores
        // (`number_per_app` fills the subscriptions'; earlier events stay
        // the administrator's).
        ("subscriptions", "app_id", "INTEGER"),
        ("subscriptions", "app_generation", "INTEGER"),
        ("events", "app", "TEXT"),
        ("events", "app_seq", "INTEGER"),
        ("events", "app_generation", "INTEGER"),
    ] {
        let has: bool = conn
            .query_row(&format!("SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = '{column}'"), [], |r| r.get::<_, i64>(0))
            .map_err(sql)?
            > 0;
        if !has {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {ty}")).map_err(sql)?;
        }
    }
    Ok(())
}

/// An application's own numbering: its row of `apps` or, without one, the
/// floors (meta `app_floor_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct AppCounters {
    /// The next subscription id.
    pub next_id: u64,
    /// Committed changes (the application's generation).
    pub generation: u64,
    /// The last event number.
    pub event_seq: u64,
}

pub(crate) const FLOOR_KEYS: [&str; 3] = ["app_floor_id", "app_floor_generation", "app_floor_seq"];

/// Numbers a store's rows per application once: a store from before it
/// keeps every id as the per-application id and the generation as the
/// application's, and the counters of every application start at the old
/// global ones (so nothing is given out twice). A new store's floors are 1,
/// 0 and 0.
fn number_per_app(conn: &Connection) -> Result<(), Error> {
    let has: i64 = conn.query_row("SELECT COUNT(*) FROM meta WHERE key = ?1", [FLOOR_KEYS[0]], |r| r.get(0)).map_err(sql)?;
    if has > 0 {
        return Ok(());
    }
    let meta = |key: &str| -> Result<u64, Error> {
        let v: Option<String> = conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional().map_err(sql)?;
        Ok(v.and_then(|v| v.parse().ok()).unwrap_or(0))
    };
    let max_id: i64 = conn.query_row("SELECT COALESCE(MAX(id), 0) FROM subscriptions", [], |r| r.get(0)).map_err(sql)?;
    let seq: i64 = conn.query_row("SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence WHERE name = 'events'", [], |r| r.get(0)).unwrap_or(0);
    let floor = AppCounters { next_id: meta("next_id")?.max(max_id as u64 + 1), generation: meta("generation")?, event_seq: seq as u64 };
    let tx = conn.unchecked_transaction().map_err(sql)?;
    tx.execute_batch("UPDATE subscriptions SET app_id = id, app_generation = generation WHERE app_id IS NULL").map_err(sql)?;
    for (key, value) in FLOOR_KEYS.iter().zip([floor.next_id, floor.generation, floor.event_seq]) {
        tx.execute("INSERT OR REPLACE INTO meta VALUES (?1, ?2)", params![key, value.to_string()]).map_err(sql)?;
    }
    tx.commit().map_err(sql)
}

/// The most bytes the WAL keeps once checkpointed (`journal_size_limit`):
/// a large transaction's WAL is cut back to this, not kept at its peak.
const WAL_SIZE_LIMIT: u64 = 4 << 20;

/// What an operator is told to do with a store the server refuses.
fn restore_hint(path: &Path) -> String {
    format!("stop anything using it and restore a backup with `subc store restore BACKUP --store {}`", path.display())
}

fn damaged(path: &Path, detail: &str) -> Error {
    Error::Store(format!("{}: the store is damaged ({detail}); the server will not use it: {}", path.display(), restore_hint(path)))
}

/// An existing 0-byte file is no store (a store is never empty once
/// created): refused rather than silently started afresh. A missing file is
/// fine (a new store), and so is an empty one whose WAL holds its pages.
fn refuse_empty_file(path: &Path) -> Result<(), Error> {
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
    if len(path) == Some(0) && len(&sidecar(path, "-wal")).unwrap_or(0) == 0 {
        return Err(Error::Store(format!(
            "{}: the store is an empty file (0 bytes), not a subc store; the server will not start afresh over it: {}, \
             or remove the file to start with no subscriptions",
            path.display(),
            restore_hint(path)
        )));
    }
    Ok(())
}

/// `PRAGMA quick_check` (every page and record read and checked, without
/// the index-to-table cross-checks of `integrity_check`, so in time linear
/// in the store's size): `Err` with the first problems found.
fn quick_check(conn: &Connection) -> Result<(), String> {
    let mut st = conn.prepare("PRAGMA quick_check(5)").map_err(|e| e.to_string())?;
    let rows = st.query_map([], |r| r.get::<_, String>(0)).map_err(|e| e.to_string())?;
    let problems = rows.collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
    match problems.as_slice() {
        [ok] if ok == "ok" => Ok(()),
        _ => Err(format!("quick_check: {}", problems.join("; "))),
    }
}

/// Freed pages go back to the file system after pruning (`incremental_vacuum`).
/// A store created before that was set is rebuilt once (`VACUUM`) for it to
/// take effect.
fn use_incremental_vacuum(conn: &Connection, path: &Path) -> Result<(), Error> {
    let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0)).map_err(sql)?;
    if mode != 2 {
        tracing::info!(store = %path.display(), "rebuilding the store once so that it gives freed pages back (auto_vacuum)");
        conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL; VACUUM;").map_err(sql)?;
    }
    Ok(())
}

/// `path` with `suffix` appended (SQLite's `-wal` and `-shm` files).
pub(crate) fn sidecar(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    s.into()
}

/// The reply of an earlier `Add` with an idempotency key, and the
/// fingerprint of its request (`None` in rows from before fingerprints).
pub(crate) struct StoredReply {
    pub reply: Vec<u8>,
    pub fingerprint: Option<String>,
}

/// A stored subscription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSub {
    pub id: u64,
    pub app: String,
    /// The id and the generation in the application's own numbering.
    pub app_id: u64,
    pub app_generation: u64,
    pub text: String,
    pub generation: u64,
    pub created_ms: i64,
}

/// A stored target: how it was registered, whether it was ever deployed,
/// and its last recorded status.
#[derive(Clone, Debug)]
pub(crate) struct StoredTarget {
    pub registration: proto::RegisterTargetRequest,
    pub deployed: bool,
    pub status: Option<proto::TargetStatus>,
}

pub(crate) struct Store {
    conn: Connection,
}

pub(crate) fn sql(e: rusqlite::Error) -> Error {
    Error::Store(e.to_string())
}

/// What a backup holds, read back from the copy.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BackupReport {
    pub subscriptions: u64,
    pub targets: u64,
    pub generation: u64,
    pub bytes: u64,
}

/// Copies the store at `store` to `out` with SQLite's online backup, while
/// a server may be writing to it: the copy is one consistent snapshot (a
/// committed generation, never half a transaction). It is written beside
/// `out` under a temporary name, checked (`PRAGMA integrity_check`, the
/// schema version), synced and renamed over `out`, so `out` is either the
/// old file or the whole new copy. Restore with [`crate::restore_store`]
/// (`subc store restore`), or serve the copy itself (`subc serve --store COPY`).
pub fn backup_store(store: &Path, out: &Path) -> Result<BackupReport, Error> {
    if !store.is_file() {
        return Err(Error::Store(format!("{}: no such store", store.display())));
    }
    if std::fs::canonicalize(store).ok() == std::fs::canonicalize(out).ok() {
        return Err(Error::Store(format!("{}: the backup would overwrite the store itself", out.display())));
    }
    let name = out.file_name().ok_or_else(|| Error::Store(format!("{}: not a file name", out.display())))?;
    let tmp = out.with_file_name(format!(".{}.partial-{}", name.to_string_lossy(), std::process::id()));
    let result = copy_and_check(store, &tmp).and_then(|report| {
        std::fs::rename(&tmp, out).map_err(|e| Error::Store(format!("cannot rename the copy to {}: {e}", out.display())))?;
        sync_parent(out);
        Ok(report)
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

pub(crate) fn copy_and_check(store: &Path, tmp: &Path) -> Result<BackupReport, Error> {
    let src = Store::open_reader(store)?;
    let mut dst = Connection::open(tmp).map_err(|e| Error::Store(format!("cannot create {}: {e}", tmp.display())))?;
    {
        let backup = rusqlite::backup::Backup::new(&src.conn, &mut dst).map_err(sql)?;
        // All pages in one step, under one read transaction: a WAL reader
        // does not block the writer, and a snapshot taken in smaller steps
        // would start over whenever the writer commits.
        loop {
            match backup.step(-1).map_err(sql)? {
                rusqlite::backup::StepResult::Done => break,
                _ => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    }
    let ok: String = dst.query_row("PRAGMA integrity_check", [], |r| r.get(0)).map_err(sql)?;
    if ok != "ok" {
        return Err(Error::Store(format!("the copy fails its integrity check: {ok}")));
    }
    let copy = Store { conn: dst };
    if copy.meta("schema_version")? != Some(SCHEMA_VERSION.to_string()) {
        return Err(Error::Store(format!("{}: not a subc store of schema version {SCHEMA_VERSION}", store.display())));
    }
    let count = |table: &str| -> Result<u64, Error> {
        copy.conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get::<_, i64>(0)).map(|n| n as u64).map_err(sql)
    };
    let report = BackupReport {
        subscriptions: count("subscriptions")?,
        targets: count("targets")?,
        generation: copy.meta_u64("generation")?,
        bytes: 0,
    };
    drop(copy);
    Ok(BackupReport { bytes: sync_file(tmp)?, ..report })
}

/// Syncs the file at `path` to disk; its size in bytes.
pub(crate) fn sync_file(path: &Path) -> Result<u64, Error> {
    let file = std::fs::File::open(path).map_err(|e| Error::Store(format!("{}: {e}", path.display())))?;
    file.sync_all().map_err(|e| Error::Store(format!("cannot sync {}: {e}", path.display())))?;
    Ok(file.metadata().map(|m| m.len()).unwrap_or(0))
}

/// Syncs the directory holding `path`, so that a rename into it survives a
/// power cut (best effort: not every file system allows it).
pub(crate) fn sync_parent(path: &Path) {
    if let Some(dir) = path.parent().map(|d| if d.as_os_str().is_empty() { Path::new(".") } else { d }) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl Store {
    /// Opens (creating if needed) the store at `path`. An existing store
    /// is checked first (`PRAGMA quick_check`): a damaged or empty file is
    /// refused, never served or overwritten.
    pub(crate) fn open(path: &Path, durability: Durability) -> Result<Store, Error> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::Store(format!("cannot create {}: {e}", dir.display())))?;
        }
        refuse_empty_file(path)?;
        let conn = Connection::open(path).map_err(|e| Error::Store(format!("cannot open {}: {e}", path.display())))?;
        conn.execute_batch("PRAGMA busy_timeout=10000; PRAGMA auto_vacuum=INCREMENTAL;").map_err(|e| damaged(path, &e.to_string()))?;
        quick_check(&conn).map_err(|detail| damaged(path, &detail))?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)).map_err(sql)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Store(format!("{}: cannot switch to WAL mode (got {mode})", path.display())));
        }
        let sync = match durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        };
        conn.execute_batch(&format!("PRAGMA synchronous={sync}; PRAGMA journal_size_limit={WAL_SIZE_LIMIT};")).map_err(sql)?;
        conn.execute_batch(SCHEMA).map_err(sql)?;
        add_missing_columns(&conn)?;
        conn.execute_batch(LATE_INDEXES).map_err(sql)?;
        number_per_app(&conn)?;
        use_incremental_vacuum(&conn, path)?;
        let store = Store { conn };
        match store.meta("schema_version")? {
            None => {
                store.conn.execute("INSERT INTO meta VALUES ('schema_version', ?1)", [SCHEMA_VERSION.to_string()]).map_err(sql)?;
            }
            Some(v) if v == SCHEMA_VERSION.to_string() => {}
            Some(v) => return Err(Error::Store(format!("{}: schema version {v}, this server knows {SCHEMA_VERSION}", path.display()))),
        }
        Ok(store)
    }

    /// A second connection for reads that must not wait for the writer.
    pub(crate) fn open_reader(path: &Path) -> Result<Store, Error> {
        let conn =
            Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .map_err(|e| Error::Store(format!("cannot open {}: {e}", path.display())))?;
        conn.execute_batch("PRAGMA busy_timeout=10000;").map_err(sql)?;
        Ok(Store { conn })
    }

    pub(crate) fn meta(&self, key: &str) -> Result<Option<String>, Error> {
        self.conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional().map_err(sql)
    }

    pub(crate) fn meta_u64(&self, key: &str) -> Result<u64, Error> {
        Ok(self.meta(key)?.and_then(|v| v.parse().ok()).unwrap_or(0))
    }

    /// Every subscription, in id order.
    pub(crate) fn load_subs(&self) -> Result<Vec<StoredSub>, Error> {
        let mut st = self
            .conn
            .prepare("SELECT id, app, text, generation, created_ms, app_id, app_generation FROM subscriptions ORDER BY id")
            .map_err(sql)?;
        let rows = st
            .query_map([], |r| {
                Ok(StoredSub {
                    id: r.get::<_, i64>(0)? as u64,
                    app: r.get(1)?,
                    text: r.get(2)?,
                    generation: r.get::<_, i64>(3)? as u64,
                    created_ms: r.get(4)?,
                    app_id: r.get::<_, i64>(5)? as u64,
                    app_generation: r.get::<_, i64>(6)? as u64,
                })
            })
            .map_err(sql)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(sql)
    }

    /// Where applications without counters start, and each application's
    /// counters.
    pub(crate) fn load_app_counters(&self) -> Result<(AppCounters, Vec<(String, AppCounters)>), Error> {
        let [id, generation, seq] = FLOOR_KEYS.map(|k| self.meta_u64(k));
        let floor = AppCounters { next_id: id?.max(1), generation: generation?, event_seq: seq? };
        let mut st = self.conn.prepare("SELECT app, next_id, generation, event_seq FROM apps ORDER BY app").map_err(sql)?;
        let rows = st
            .query_map([], |r| {
                let n = |i: usize| r.get::<_, i64>(i).map(|v| v as u64);
                Ok((r.get(0)?, AppCounters { next_id: n(1)?, generation: n(2)?, event_seq: n(3)? }))
            })
            .map_err(sql)?;
        Ok((floor, rows.collect::<Result<Vec<_>, _>>().map_err(sql)?))
    }

    /// Every stored placement: subscription id and the JSON array of its
    /// cubes' pipelines.
    pub(crate) fn load_placements(&self) -> Result<Vec<(u64, String)>, Error> {
        let mut st = self.conn.prepare("SELECT id, pipes FROM placements").map_err(sql)?;
        let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?))).map_err(sql)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(sql)
    }

    pub(crate) fn load_targets(&self) -> Result<Vec<StoredTarget>, Error> {
        let mut st = self
            .conn
            .prepare(
                "SELECT t.registration, t.deployed, s.status FROM targets t LEFT JOIN target_status s ON s.name = t.name ORDER BY t.name",
            )
            .map_err(sql)?;
        let rows =
            st.query_map([], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, bool>(1)?, r.get::<_, Option<Vec<u8>>>(2)?))).map_err(sql)?;
        let mut out = vec![];
        for row in rows {
            let (reg, deployed, status) = row.map_err(sql)?;
            let registration = proto::RegisterTargetRequest::decode(reg.as_slice())
                .map_err(|e| Error::Store(format!("a stored target does not decode: {e}")))?;
            let status = match status {
                Some(s) => Some(
                    proto::TargetStatus::decode(s.as_slice()).map_err(|e| Error::Store(format!("a stored status does not decode: {e}")))?,
                ),
                None => None,
            };
            out.push(StoredTarget { registration, deployed, status });
        }
        Ok(out)
    }

    /// Up to `limit` stored events with `seq > after`, oldest first. Events
    /// stored before times were `Timestamp`s get theirs from the old field.
    pub(crate) fn events_after(&self, after: u64, limit: usize) -> Result<Vec<proto::Event>, Error> {
        let mut st = self.conn.prepare_cached("SELECT seq, body, NULL FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2").map_err(sql)?;
        let rows = st.query_map(params![after as i64, limit as i64], event_row).map_err(sql)?;
        decode_events(rows)
    }

    /// The last `limit` events, oldest first.
    pub(crate) fn last_events(&self, limit: usize) -> Result<Vec<proto::Event>, Error> {
        let mut st = self.conn.prepare_cached("SELECT seq, body, NULL FROM events ORDER BY seq DESC LIMIT ?1").map_err(sql)?;
        let rows = st.query_map(params![limit as i64], event_row).map_err(sql)?;
        let mut events = decode_events(rows)?;
        events.reverse();
        Ok(events)
    }

    /// Up to `limit` of `app`'s own events with an application event number
    /// above `after`, oldest first, as the application sees them: its
    /// numbers and generations (read through the `events_by_app` index).
    pub(crate) fn app_events_after(&self, app: &str, after: u64, limit: usize) -> Result<Vec<proto::Event>, Error> {
        let mut st = self
            .conn
            .prepare_cached("SELECT app_seq, body, app_generation FROM events WHERE app = ?1 AND app_seq > ?2 ORDER BY app_seq LIMIT ?3")
            .map_err(sql)?;
        let rows = st.query_map(params![app, after as i64, limit as i64], event_row).map_err(sql)?;
        decode_events(rows)
    }
}

/// An event row: its number, its body, and the generation to show instead
/// of the body's (an application's view).
fn event_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(i64, Vec<u8>, Option<i64>)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
}

fn decode_events(rows: impl Iterator<Item = rusqlite::Result<(i64, Vec<u8>, Option<i64>)>>) -> Result<Vec<proto::Event>, Error> {
    let mut out = vec![];
    for row in rows {
        let (seq, body, generation) = row.map_err(sql)?;
        let mut e = proto::Event::decode(body.as_slice()).map_err(|e| Error::Store(format!("a stored event does not decode: {e}")))?;
        e.seq = seq as u64;
        if let Some(g) = generation {
            e.generation = g as u64;
        }
        if e.time.is_none() {
            e.time = LegacyEventTime::decode(body.as_slice()).ok().filter(|l| l.unix_ms != 0).map(|l| subc_client::timestamp(l.unix_ms));
        }
        out.push(e);
    }
    Ok(out)
}

impl Store {
    /// The stored reply of an earlier `Add` with this idempotency key.
    pub(crate) fn request_reply(&self, app: &str, request_id: &str) -> Result<Option<StoredReply>, Error> {
        self.conn
            .prepare_cached("SELECT reply, fingerprint FROM requests WHERE app = ?1 AND request_id = ?2")
            .map_err(sql)?
            .query_row(params![app, request_id], |r| Ok(StoredReply { reply: r.get(0)?, fingerprint: r.get(1)? }))
            .optional()
            .map_err(sql)
    }

    /// Folds the WAL into the store's file and truncates it (so that the
    /// file shrinks by the pages pruning freed, and the WAL does not stay at
    /// its largest). Waits at most 100 ms for readers of older snapshots;
    /// if they remain, it is left for the next time.
    pub(crate) fn checkpoint(&self) {
        let _ = self.conn.busy_timeout(std::time::Duration::from_millis(100));
        match self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get::<_, i64>(0)) {
            Ok(0) => {}
            Ok(_) => tracing::debug!("a reader held the WAL; the checkpoint waits for the next prune"),
            Err(e) => tracing::warn!(error = %e, "checkpoint failed"),
        }
        let _ = self.conn.busy_timeout(std::time::Duration::from_secs(10));
    }

    /// Runs `f` in one transaction and commits it; on any error nothing is written.
    pub(crate) fn write<T>(&mut self, f: impl FnOnce(&Txn) -> Result<T, Error>) -> Result<T, Error> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(sql)?;
        let txn = Txn { tx };
        let out = f(&txn)?;
        txn.tx.commit().map_err(sql)?;
        Ok(out)
    }
}

/// An open write transaction.
pub(crate) struct Txn<'a> {
    tx: rusqlite::Transaction<'a>,
}

impl Txn<'_> {
    pub(crate) fn set_meta(&self, key: &str, value: &str) -> Result<(), Error> {
        self.tx.prepare_cached("INSERT OR REPLACE INTO meta VALUES (?1, ?2)").map_err(sql)?.execute(params![key, value]).map_err(sql)?;
        Ok(())
    }

    pub(crate) fn insert_sub(&self, s: &StoredSub) -> Result<(), Error> {
        self.tx
            .prepare_cached(
                "INSERT INTO subscriptions (id, app, text, generation, created_ms, app_id, app_generation) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .map_err(sql)?
            .execute(params![s.id as i64, s.app, s.text, s.generation as i64, s.created_ms, s.app_id as i64, s.app_generation as i64])
            .map_err(sql)?;
        Ok(())
    }

    pub(crate) fn delete_sub(&self, id: u64) -> Result<(), Error> {
        let n = self.tx.prepare_cached("DELETE FROM subscriptions WHERE id = ?1").map_err(sql)?.execute([id as i64]).map_err(sql)?;
        if n != 1 {
            return Err(Error::Store(format!("subscription {id} is not in the store")));
        }
        self.tx.prepare_cached("DELETE FROM placements WHERE id = ?1").map_err(sql)?.execute([id as i64]).map_err(sql)?;
        Ok(())
    }

    /// Sets subscription `id`'s placement (a JSON array).
    pub(crate) fn put_placement(&self, id: u64, pipes: &str) -> Result<(), Error> {
        self.tx
            .prepare_cached("INSERT OR REPLACE INTO placements VALUES (?1, ?2)")
            .map_err(sql)?
            .execute(params![id as i64, pipes])
            .map_err(sql)?;
        Ok(())
    }

    /// Forgets every placement (before a new layout's are written).
    pub(crate) fn clear_placements(&self) -> Result<(), Error> {
        self.tx.execute("DELETE FROM placements", []).map_err(sql)?;
        Ok(())
    }

    pub(crate) fn put_request(&self, app: &str, request_id: &str, reply: &[u8], fingerprint: &str) -> Result<(), Error> {
        self.tx
            .prepare_cached("INSERT OR REPLACE INTO requests (app, request_id, reply, created_ms, fingerprint) VALUES (?1, ?2, ?3, ?4, ?5)")
            .map_err(sql)?
            .execute(params![app, request_id, reply, now_ms(), fingerprint])
            .map_err(sql)?;
        Ok(())
    }

    /// Forgets the replies of idempotency keys older than `max_age_ms`, then
    /// the oldest until they hold at most `max_bytes` (the newest is kept).
    pub(crate) fn prune_requests(&self, max_age_ms: u64, max_bytes: u64) -> Result<(), Error> {
        self.tx.prepare_cached("DELETE FROM requests WHERE created_ms < ?1").map_err(sql)?.execute([cutoff(max_age_ms)]).map_err(sql)?;
        self.tx
            .prepare_cached(
                "DELETE FROM requests WHERE (app, request_id) IN (SELECT app, request_id FROM (
                    SELECT app, request_id,
                        SUM(length(reply)) OVER newest_first AS total, ROW_NUMBER() OVER newest_first AS n
                    FROM requests WINDOW newest_first AS (ORDER BY created_ms DESC, app DESC, request_id DESC))
                 WHERE total > ?1 AND n > 1)",
            )
            .map_err(sql)?
            .execute([clamp(max_bytes)])
            .map_err(sql)?;
        Ok(())
    }

    pub(crate) fn put_target(&self, reg: &proto::RegisterTargetRequest) -> Result<(), Error> {
        self.tx
            .prepare_cached("INSERT INTO targets (name, registration, deployed, created_ms) VALUES (?1, ?2, 0, ?3)")
            .map_err(sql)?
            .execute(params![reg.name, reg.encode_to_vec(), now_ms()])
            .map_err(sql)?;
        Ok(())
    }

    pub(crate) fn delete_target(&self, name: &str) -> Result<(), Error> {
        self.tx.prepare_cached("DELETE FROM targets WHERE name = ?1").map_err(sql)?.execute([name]).map_err(sql)?;
        self.tx.prepare_cached("DELETE FROM target_status WHERE name = ?1").map_err(sql)?.execute([name]).map_err(sql)?;
        Ok(())
    }

    pub(crate) fn set_deployed(&self, name: &str) -> Result<(), Error> {
        self.tx.prepare_cached("UPDATE targets SET deployed = 1 WHERE name = ?1").map_err(sql)?.execute([name]).map_err(sql)?;
        Ok(())
    }

    pub(crate) fn put_status(&self, s: &proto::TargetStatus) -> Result<(), Error> {
        self.tx
            .prepare_cached("INSERT OR REPLACE INTO target_status VALUES (?1, ?2)")
            .map_err(sql)?
            .execute(params![s.name, s.encode_to_vec()])
            .map_err(sql)?;
        Ok(())
    }

    /// Sets an application's counters.
    pub(crate) fn put_app(&self, app: &str, c: &AppCounters) -> Result<(), Error> {
        self.tx
            .prepare_cached("INSERT OR REPLACE INTO apps (app, next_id, generation, event_seq) VALUES (?1, ?2, ?3, ?4)")
            .map_err(sql)?
            .execute(params![app, c.next_id as i64, c.generation as i64, c.event_seq as i64])
            .map_err(sql)?;
        Ok(())
    }

    /// Appends an event and returns its sequence number. `of_app`: the
    /// application whose event it is, with its event number and generation
    /// there (what that application's Watch shows).
    pub(crate) fn append_event(&self, e: &proto::Event, of_app: Option<&AppEvent>) -> Result<u64, Error> {
        let (app, seq, generation) = match of_app {
            Some(a) => (Some(a.app.as_ref()), Some(a.seq as i64), Some(a.generation as i64)),
            None => (None, None, None),
        };
        self.tx
            .prepare_cached("INSERT INTO events (body, created_ms, app, app_seq, app_generation) VALUES (?1, ?2, ?3, ?4, ?5)")
            .map_err(sql)?
            .execute(params![e.encode_to_vec(), now_ms(), app, seq, generation])
            .map_err(sql)?;
        Ok(self.tx.last_insert_rowid() as u64)
    }

    /// Keeps only the newest `r.keep` events, none older than
    /// `r.max_age_ms`, and the newest that hold at most `r.max_bytes` (the
    /// newest is kept, whatever its size).
    pub(crate) fn prune_events(&self, r: &EventRetention) -> Result<(), Error> {
        let delete =
            |q: &str, arg: i64| -> Result<(), Error> { self.tx.prepare_cached(q).map_err(sql)?.execute([arg]).map(drop).map_err(sql) };
        delete("DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?1", clamp(r.keep))?;
        delete("DELETE FROM events WHERE created_ms < ?1", cutoff(r.max_age_ms))?;
        delete(
            "DELETE FROM events WHERE seq < (SELECT MAX(seq) FROM events) AND seq <= (
                SELECT seq FROM (SELECT seq, SUM(length(body)) OVER (ORDER BY seq DESC) AS total FROM events)
                WHERE total > ?1 ORDER BY seq DESC LIMIT 1)",
            clamp(r.max_bytes),
        )
    }

    /// Gives the pages freed since the last call back to the file system
    /// (the store uses `auto_vacuum = INCREMENTAL`).
    pub(crate) fn release_free_pages(&self) -> Result<(), Error> {
        // One page per step: it returns a row for each.
        let mut st = self.tx.prepare_cached("PRAGMA incremental_vacuum").map_err(sql)?;
        let mut rows = st.query([]).map_err(sql)?;
        while rows.next().map_err(sql)?.is_some() {}
        Ok(())
    }
}

impl Store {
    /// Every record, read in one transaction (one committed state).
    pub(crate) fn dump(&self) -> Result<super::Dump, Error> {
        let tx = self.conn.unchecked_transaction().map_err(sql)?;
        let rows = |q: &str| -> Result<Vec<Vec<rusqlite::types::Value>>, Error> {
            let mut st = tx.prepare(q).map_err(sql)?;
            let n = st.column_count();
            let rows = st.query_map([], |r| (0..n).map(|i| r.get::<_, rusqlite::types::Value>(i)).collect()).map_err(sql)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(sql)
        };
        use rusqlite::types::Value as V;
        let text = |v: &V| match v {
            V::Text(t) => t.clone(),
            _ => String::new(),
        };
        let int = |v: &V| match v {
            V::Integer(i) => *i,
            _ => 0,
        };
        let blob = |v: &V| match v {
            V::Blob(b) => b.clone(),
            _ => vec![],
        };
        let mut d = super::Dump::default();
        for r in rows("SELECT key, value FROM meta WHERE key != 'schema_version' ORDER BY key")? {
            d.meta.push((text(&r[0]), text(&r[1])));
        }
        d.subs = self.load_subs()?;
        d.placements = self.load_placements()?;
        d.targets = self.load_targets()?;
        for r in rows("SELECT app, request_id, reply, fingerprint, created_ms FROM requests ORDER BY app, request_id")? {
            let fingerprint = matches!(r[3], V::Text(_)).then(|| text(&r[3]));
            let (app, request_id) = (text(&r[0]), text(&r[1]));
            d.requests.push(super::StoredRequest { app, request_id, reply: blob(&r[2]), fingerprint, created_ms: int(&r[4]) });
        }
        for r in rows("SELECT seq, created_ms, app, app_seq, app_generation FROM events ORDER BY seq")? {
            let seq = int(&r[0]) as u64;
            d.event_times.insert(seq, int(&r[1]));
            if let V::Text(app) = &r[2] {
                let of_app = AppEvent { app: std::sync::Arc::from(app.as_str()), seq: int(&r[3]) as u64, generation: int(&r[4]) as u64 };
                d.event_apps.insert(seq, of_app);
            }
        }
        d.apps = self.load_app_counters()?.1;
        let mut after = 0;
        loop {
            let page = self.events_after(after, 10_000)?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            d.events.extend(page);
        }
        tx.commit().map_err(sql)?;
        Ok(d)
    }
}

impl Txn<'_> {
    pub(crate) fn delete_meta(&self, key: &str) -> Result<(), Error> {
        self.tx.prepare_cached("DELETE FROM meta WHERE key = ?1").map_err(sql)?.execute([key]).map_err(sql)?;
        Ok(())
    }

    /// A request's reply as it was stored, with its time (a migration).
    pub(crate) fn put_request_at(&self, r: &super::StoredRequest) -> Result<(), Error> {
        self.tx
            .prepare_cached("INSERT INTO requests (app, request_id, reply, created_ms, fingerprint) VALUES (?1, ?2, ?3, ?4, ?5)")
            .map_err(sql)?
            .execute(params![r.app, r.request_id, r.reply, r.created_ms, r.fingerprint])
            .map_err(sql)?;
        Ok(())
    }

    /// An event under its own sequence number (a migration: a `Watch`
    /// resumes where it stopped).
    pub(crate) fn put_event_at(&self, e: &proto::Event, created_ms: i64, of_app: Option<&AppEvent>) -> Result<(), Error> {
        let mut body = e.clone();
        body.seq = 0;
        let (app, seq, generation) = match of_app {
            Some(a) => (Some(a.app.as_ref()), Some(a.seq as i64), Some(a.generation as i64)),
            None => (None, None, None),
        };
        self.tx
            .prepare_cached("INSERT INTO events (seq, body, created_ms, app, app_seq, app_generation) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .map_err(sql)?
            .execute(params![e.seq as i64, body.encode_to_vec(), created_ms, app, seq, generation])
            .map_err(sql)?;
        Ok(())
    }
}

/// An application's own event: the application, and the event's number and
/// generation in its numbering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AppEvent {
    pub app: std::sync::Arc<str>,
    pub seq: u64,
    pub generation: u64,
}

/// How many events the store keeps, for how long, in how many bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventRetention {
    pub keep: u64,
    pub max_age_ms: u64,
    pub max_bytes: u64,
}

/// The time `max_age_ms` ago, in milliseconds since the Unix epoch.
fn cutoff(max_age_ms: u64) -> i64 {
    now_ms().saturating_sub(clamp(max_age_ms))
}

/// A configured count or size as SQLite's integer.
fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The time of an event stored before `Event.time`: field 2, milliseconds
/// since the Unix epoch (now reserved in the proto).
#[derive(Clone, PartialEq, prost::Message)]
struct LegacyEventTime {
    #[prost(int64, tag = "2")]
    unix_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(id: u64) -> StoredSub {
        StoredSub {
            id,
            app: "a".into(),
            app_id: id,
            app_generation: id,
            text: format!("stock == S{id} : fwd(1)"),
            generation: id,
            created_ms: 1,
        }
    }

    #[test]
    fn a_committed_write_survives_reopening_and_a_failed_one_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let mut s = Store::open(&path, Durability::Full).unwrap();
            s.write(|t| {
                t.insert_sub(&sub(1))?;
                t.set_meta("generation", "1")
            })
            .unwrap();
            let r: Result<(), Error> = s.write(|t| {
                t.insert_sub(&sub(2))?;
                t.delete_sub(99)
            });
            assert!(r.is_err());
        }
        let s = Store::open(&path, Durability::Full).unwrap();
        assert_eq!(s.load_subs().unwrap(), vec![sub(1)]);
        assert_eq!(s.meta_u64("generation").unwrap(), 1);
    }

    #[test]
    fn events_are_numbered_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let mut s = Store::open(&path, Durability::Normal).unwrap();
        for g in 1..=5 {
            s.write(|t| {
                t.append_event(&proto::Event { generation: g, ..Default::default() }, None)?;
                t.prune_events(&EventRetention { keep: 3, max_age_ms: u64::MAX, max_bytes: u64::MAX })
            })
            .unwrap();
        }
        let r = Store::open_reader(&path).unwrap();
        let ev = r.events_after(0, 100).unwrap();
        assert_eq!(ev.iter().map(|e| (e.seq, e.generation)).collect::<Vec<_>>(), vec![(3, 3), (4, 4), (5, 5)]);
        assert_eq!(r.events_after(4, 100).unwrap().len(), 1);
        let last = r.last_events(2).unwrap();
        assert_eq!(last.iter().map(|e| (e.seq, e.generation)).collect::<Vec<_>>(), vec![(4, 4), (5, 5)]);
        assert_eq!(r.last_events(100).unwrap().len(), 3);
    }

    fn count(s: &Store, table: &str) -> i64 {
        s.conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0)).unwrap()
    }

    /// Events go by count, age and size, oldest first, the newest kept
    /// whatever its size; replies by age and size; freed pages are given
    /// back to the file system.
    #[test]
    fn events_and_replies_are_pruned_by_age_and_size_and_the_file_shrinks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let mut s = Store::open(&path, Durability::Normal).unwrap();
        let big = |g: u64| proto::Event { generation: g, subscription_ids: (0..5000).collect(), ..Default::default() };
        let event_len = big(1).encoded_len() as u64;
        s.write(|t| {
            for g in 1..=20 {
                t.append_event(&big(g), None)?;
                t.put_request("a", &format!("r{g:02}"), &vec![7u8; 20_000], "f")?;
            }
            Ok(())
        })
        .unwrap();
        let pages = |s: &Store| s.conn.query_row("PRAGMA page_count", [], |r| r.get::<_, i64>(0)).unwrap();
        let before = pages(&s);
        let keep_all = EventRetention { keep: 100, max_age_ms: u64::MAX, max_bytes: u64::MAX };
        s.write(|t| {
            t.prune_events(&EventRetention { max_bytes: 3 * event_len + 10, ..keep_all })?;
            t.prune_requests(u64::MAX, 50_000)?;
            t.release_free_pages()
        })
        .unwrap();
        let left = Store::open_reader(&path).unwrap().events_after(0, 100).unwrap();
        assert_eq!(left.iter().map(|e| e.generation).collect::<Vec<_>>(), vec![18, 19, 20]);
        let replies: Vec<String> =
            s.conn.prepare("SELECT request_id FROM requests").unwrap().query_map([], |r| r.get(0)).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(replies, vec!["r19".to_string(), "r20".to_string()]);
        assert!(pages(&s) < before / 2, "{} pages of {before} left", pages(&s));

        // The newest stays even when it alone is over the limit; by age, all go.
        s.write(|t| {
            t.prune_events(&EventRetention { max_bytes: 10, ..keep_all })?;
            t.prune_requests(u64::MAX, 10)
        })
        .unwrap();
        assert_eq!((count(&s, "events"), count(&s, "requests")), (1, 1));
        s.write(|t| {
            t.tx.execute_batch("UPDATE events SET created_ms = 0; UPDATE requests SET created_ms = 0").map_err(sql)?;
            t.prune_events(&EventRetention { max_age_ms: 60_000, ..keep_all })?;
            t.prune_requests(60_000, u64::MAX)
        })
        .unwrap();
        assert_eq!((count(&s, "events"), count(&s, "requests")), (0, 0));
    }

    /// A store of an earlier build (no auto_vacuum, events without
    /// `created_ms`) is converted once, its rows kept.
    #[test]
    fn an_earlier_store_is_converted_to_give_pages_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "PRAGMA journal_mode=WAL; CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB NOT NULL);
                 INSERT INTO events (body) VALUES (x'2001');",
            )
            .unwrap();
            assert_eq!(c.query_row("PRAGMA auto_vacuum", [], |r| r.get::<_, i64>(0)).unwrap(), 0);
        }
        let s = Store::open(&path, Durability::Full).unwrap();
        assert_eq!(s.conn.query_row("PRAGMA auto_vacuum", [], |r| r.get::<_, i64>(0)).unwrap(), 2);
        assert_eq!(s.events_after(0, 10).unwrap().len(), 1);
        s.conn.execute("UPDATE events SET created_ms = 1", []).unwrap();
    }

    #[test]
    fn an_event_stored_with_the_old_millisecond_time_reads_as_a_timestamp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let mut s = Store::open(&path, Durability::Normal).unwrap();
        // Field 2 as the old `int64 unix_ms`, beside the generation (field 4).
        let mut old = LegacyEventTime { unix_ms: 1_700_000_000_123 }.encode_to_vec();
        old.extend(proto::Event { generation: 9, ..Default::default() }.encode_to_vec());
        s.write(|t| t.tx.execute("INSERT INTO events (body) VALUES (?1)", [old]).map(drop).map_err(sql)).unwrap();
        let ev = Store::open_reader(&path).unwrap().events_after(0, 10).unwrap();
        assert_eq!(ev[0].generation, 9);
        assert_eq!(ev[0].time, Some(subc_client::timestamp(1_700_000_000_123)));
    }
}
