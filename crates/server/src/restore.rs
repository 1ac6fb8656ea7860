//! `subc store restore`: puts a backup in a store's place.
//!
//! Copying a backup over a store is unsafe: a server may still hold the
//! store; the old store's WAL (`-wal`, `-shm`) is applied to the copy when
//! it is next opened (stale pages over the copy's: a store that serves what
//! the backup never held, or a malformed one); and the backup's next
//! subscription id is below ids the replaced store had acknowledged, which
//! would be given out again. [`restore_store`]:
//! 1. refuses while anything holds the store (it takes an exclusive lock on
//!    it, which a server's open connections prevent);
//! 2. reads what the restored store must not go below (the replaced store's
//!    next id, generation and last event number, its WAL included);
//! 3. copies the backup beside the store under a temporary name (SQLite's
//!    backup API), checks the copy (`PRAGMA integrity_check`, the schema
//!    version), raises its next id, generation and event numbers to those
//!    floors (and every application's own: see [`raise_app_floors`]), and
//!    syncs it;
//! 4. removes the old store's `-wal` and `-shm`, renames the copy over the
//!    store and syncs the directory.
//!
//! A failure before step 4 leaves the store as it was and no temporary file.

use crate::store::{copy_and_check, sidecar, sql, sync_parent};
use crate::Error;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the restored store holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RestoreReport {
    pub subscriptions: u64,
    pub targets: u64,
    /// The restored store's generation: the backup's, or one above the
    /// replaced store's if that was higher.
    pub generation: u64,
    /// The first internal id new subscriptions get: above every id the
    /// backup or the replaced store ever gave out. Every application's own
    /// next id is at least this too (each numbers its own: docs/server.md).
    pub next_id: u64,
    pub bytes: u64,
    /// Whether a store was replaced (false: there was none).
    pub replaced: bool,
}

/// What the restored store must not go below: the replaced store's values.
#[derive(Clone, Copy, Debug, Default)]
struct Floors {
    next_id: u64,
    generation: u64,
    event_seq: u64,
}

/// Restores `backup` (a `subc store backup` copy, or any stopped store)
/// into `store`, as the module says. `min_next_id` raises the next id
/// further; it is required when the store exists but cannot be read (its
/// ids are then unknown).
pub fn restore_store(backup: &Path, store: &Path, min_next_id: u64) -> Result<RestoreReport, Error> {
    check_paths(backup, store)?;
    let claim = Claim::take(store)?;
    let floors = claim.floors(store, min_next_id)?;
    let replaced = claim.conn.is_some();
    let tmp = temp_beside(store)?;
    let result = copy_with_floors(backup, &tmp, floors).and_then(|report| {
        claim.release();
        swap_in(&tmp, store)?;
        Ok(RestoreReport { replaced, ..report })
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_file(sidecar(&tmp, "-journal"));
    }
    result
}

fn check_paths(backup: &Path, store: &Path) -> Result<(), Error> {
    if !backup.is_file() {
        return Err(Error::Store(format!("{}: no such backup", backup.display())));
    }
    if std::fs::canonicalize(backup).ok() == std::fs::canonicalize(store).ok() {
        return Err(Error::Store(format!("{}: the backup is the store itself", backup.display())));
    }
    Ok(())
}

/// The store, exclusively locked (none if there is no store), and what was
/// read of it.
struct Claim {
    conn: Option<Connection>,
    floors: Result<Floors, String>,
}

impl Claim {
    /// Locks the store: refused while a server (or anything else) has it open.
    fn take(store: &Path) -> Result<Claim, Error> {
        if !store.exists() {
            return Ok(Claim { conn: None, floors: Ok(Floors::default()) });
        }
        let conn = Connection::open_with_flags(store, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
            .map_err(|e| Error::Store(format!("cannot open {}: {e}", store.display())))?;
        conn.busy_timeout(Duration::from_millis(500)).map_err(sql)?;
        let floors = match conn.execute_batch("PRAGMA locking_mode=EXCLUSIVE; BEGIN EXCLUSIVE;") {
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {
                return Err(Error::Store(format!(
                    "{}: the store is in use (is a server running on it?): stop the server, then restore",
                    store.display()
                )))
            }
            Err(e) => Err(e.to_string()),
            Ok(()) => read_floors(&conn).map_err(|e| e.to_string()),
        };
        Ok(Claim { conn: Some(conn), floors })
    }

    /// The floors, raised to `min_next_id`; an error when the store could
    /// not be read and no `min_next_id` says where ids may start.
    fn floors(&self, store: &Path, min_next_id: u64) -> Result<Floors, Error> {
        match &self.floors {
            Ok(f) => Ok(Floors { next_id: f.next_id.max(min_next_id), ..*f }),
            Err(_) if min_next_id > 0 => Ok(Floors { next_id: min_next_id, ..Floors::default() }),
            Err(e) => Err(Error::Store(format!(
                "cannot read {} ({e}), so the subscription ids it gave out are unknown: give --min-next-id N, above every id \
                 a client was given, to restore over it anyway",
                store.display()
            ))),
        }
    }

    /// Closes the store (its WAL folded in), giving the lock up.
    fn release(self) {
        if let Some(conn) = self.conn {
            let _ = conn.execute_batch("COMMIT");
            let _ = conn.close();
        }
    }
}

/// The replaced store's next id, generation and last event number (its WAL
/// included: the commits in it were acknowledged).
fn read_floors(conn: &Connection) -> rusqlite::Result<Floors> {
    let meta = |key: &str| -> rusqlite::Result<u64> {
        let v: Option<String> = conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()?;
        Ok(v.and_then(|v| v.parse().ok()).unwrap_or(0))
    };
    let max_id: i64 = conn.query_row("SELECT COALESCE(MAX(id), 0) FROM subscriptions", [], |r| r.get(0))?;
    let event_seq: i64 =
        conn.query_row("SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence WHERE name = 'events'", [], |r| r.get(0)).unwrap_or(0);
    Ok(Floors { next_id: meta("next_id")?.max(max_id as u64 + 1), generation: meta("generation")?, event_seq: event_seq as u64 })
}

/// A temporary name beside `store` (so that the rename is atomic).
fn temp_beside(store: &Path) -> Result<PathBuf, Error> {
    let name = store.file_name().ok_or_else(|| Error::Store(format!("{}: not a file name", store.display())))?;
    Ok(store.with_file_name(format!(".{}.restore-{}", name.to_string_lossy(), std::process::id())))
}

/// Copies and checks the backup into `tmp`, raises its floors, syncs it.
fn copy_with_floors(backup: &Path, tmp: &Path, floors: Floors) -> Result<RestoreReport, Error> {
    let copied = copy_and_check(backup, tmp)?;
    let (generation, next_id) = raise_floors(tmp, floors)?;
    let bytes = crate::store::sync_file(tmp)?;
    Ok(RestoreReport { subscriptions: copied.subscriptions, targets: copied.targets, generation, next_id, bytes, replaced: false })
}

/// Raises the copy's next id to the floor (and above its own ids), its
/// generation above the replaced store's, and its event numbers past the
/// replaced store's (so that `Watch` resumes see new events); leaves it a
/// single file (rollback journal; the server turns WAL on). Returns the
/// generation and next id.
fn raise_floors(tmp: &Path, floors: Floors) -> Result<(u64, u64), Error> {
    let mut conn = Connection::open(tmp).map_err(|e| Error::Store(format!("cannot open {}: {e}", tmp.display())))?;
    conn.execute_batch("PRAGMA journal_mode=DELETE; PRAGMA synchronous=FULL;").map_err(sql)?;
    let tx = conn.transaction().map_err(sql)?;
    let floors_of_copy = read_floors(&tx).map_err(sql)?;
    let next_id = floors_of_copy.next_id.max(floors.next_id);
    let generation = if floors.generation > floors_of_copy.generation { floors.generation + 1 } else { floors_of_copy.generation };
    let set = |key: &str, value: u64| tx.execute("INSERT OR REPLACE INTO meta VALUES (?1, ?2)", params![key, value.to_string()]).map(drop);
    set("next_id", next_id).map_err(sql)?;
    set("generation", generation).map_err(sql)?;
    raise_app_floors(&tx, floors, floors.generation > floors_of_copy.generation, generation).map_err(sql)?;
    if floors.event_seq > floors_of_copy.event_seq {
        tx.execute("DELETE FROM sqlite_sequence WHERE name = 'events'", []).map_err(sql)?;
        tx.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('events', ?1)", [floors.event_seq as i64]).map_err(sql)?;
    }
    tx.commit().map_err(sql)?;
    conn.close().map_err(|(_, e)| sql(e))?;
    Ok((generation, next_id))
}

/// Raises every application's own counters (and where applications without
/// counters start) in the copy to the replaced store's global ones, which
/// are at least any application's there: an application's next id, its
/// generation and its event number never pass the service's. So no
/// per-application id is given out again, and an application's generation
/// and event numbers go on from above what it saw. `generation`: the
/// restored store's, given when the replaced store's was higher. A copy
/// from before per-application numbering has no counters yet: opening it
/// numbers it from its raised global counters (`store.rs`).
fn raise_app_floors(tx: &Connection, floors: Floors, newer_replaced: bool, generation: u64) -> rusqlite::Result<()> {
    let has_apps: i64 = tx.query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'apps'", [], |r| r.get(0))?;
    let has_floor: i64 = tx.query_row("SELECT COUNT(*) FROM meta WHERE key = 'app_floor_id'", [], |r| r.get(0))?;
    if has_apps == 0 || has_floor == 0 {
        return Ok(());
    }
    let generation = if newer_replaced { generation } else { 0 };
    let raise = |column: &str, key: &str, to: u64| -> rusqlite::Result<()> {
        let to = to as i64;
        tx.execute(&format!("UPDATE apps SET {column} = MAX({column}, ?1)"), [to])?;
        tx.execute("UPDATE meta SET value = CAST(MAX(CAST(value AS INTEGER), ?2) AS TEXT) WHERE key = ?1", params![key, to])?;
        Ok(())
    };
    raise("next_id", "app_floor_id", floors.next_id)?;
    raise("generation", "app_floor_generation", generation)?;
    raise("event_seq", "app_floor_seq", floors.event_seq)
}

/// Removes the replaced store's WAL and shared-memory files (applied to
/// the new file they would corrupt it), then renames the copy into place.
fn swap_in(tmp: &Path, store: &Path) -> Result<(), Error> {
    for suffix in ["-wal", "-shm"] {
        let stale = sidecar(store, suffix);
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Store(format!("cannot remove the old {}: {e}", stale.display()))),
        }
    }
    std::fs::rename(tmp, store).map_err(|e| Error::Store(format!("cannot rename the restored copy to {}: {e}", store.display())))?;
    sync_parent(store);
    Ok(())
}
