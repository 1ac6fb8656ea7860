//! Copying every record of a store into another: `subc store migrate`
//! (SQLite to etcd and back) and `subc store backup` of an etcd store
//! (to a SQLite file, online).
//!
//! Invariants:
//! - The source is read as one committed state (a read transaction; one
//!   etcd revision), and the destination must be empty.
//! - Ids, generations, event sequence numbers and idempotency replies are
//!   kept as they were: a client resumes a `Watch` or retries an `Add`
//!   against the copy as against the original.
//! - A SQLite destination is written in one transaction. An etcd one, whose
//!   transactions are bounded (`--max-txn-ops`), is written in chunks under
//!   a meta marker, `migration = "unfinished"`, removed by the last chunk:
//!   a server refuses a store that carries it, and a migration run again
//!   clears it first. Meanwhile the migration holds the writer's lease, so
//!   no server writes.

use super::{Dump, Store, Txn};
use crate::config::{EtcdConfig, StoreLocation};
use crate::Error;
use std::path::Path;

/// Records written per etcd transaction (two keys at most for each).
const CHUNK: usize = 20_000;

/// What a migration copied.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MigrateReport {
    pub subscriptions: u64,
    pub targets: u64,
    pub requests: u64,
    pub events: u64,
    pub generation: u64,
}

/// The meta key of an etcd migration that has not finished.
pub(crate) const UNFINISHED: &str = "migration";

/// Copies every record of `from` into `to`, which must be empty (or hold
/// only a migration that did not finish). No server may run on either.
pub fn migrate_store(from: &Path, to: &Path, etcd: &EtcdConfig) -> Result<MigrateReport, Error> {
    let (from_at, to_at) = (StoreLocation::parse(from, etcd)?, StoreLocation::parse(to, etcd)?);
    if from_at == to_at {
        return Err(Error::Store(format!("{}: the source and the destination are one store", from.display())));
    }
    let dump = read_source(&from_at)?;
    let name = format!("subc store migrate ({})", std::process::id());
    let mut dst = match &to_at {
        StoreLocation::Sqlite(p) => {
            if p.exists() {
                return Err(Error::Store(format!("{}: the destination exists; migrate into a new file", p.display())));
            }
            Store::Sqlite(super::sqlite::Store::open(p, crate::config::Durability::Full)?)
        }
        StoreLocation::Etcd(e) => Store::Etcd(super::etcd::Store::open_writer_now(e, &name)?),
    };
    prepare_destination(&mut dst, to)?;
    write_all(&mut dst, &dump)?;
    Ok(report(&dump))
}

/// A backup of any store to the SQLite file `out`: for SQLite, its online
/// backup ([`super::backup_store`]); for etcd, every record at one revision,
/// written beside `out`, checked, synced and renamed into place.
pub fn backup_any(store: &Path, out: &Path, etcd: &EtcdConfig) -> Result<super::BackupReport, Error> {
    let at = match StoreLocation::parse(store, etcd)? {
        StoreLocation::Sqlite(p) => return super::backup_store(&p, out),
        StoreLocation::Etcd(at) => at,
    };
    let dump = super::etcd::Store::open_reader(&at)?.dump()?;
    let name = out.file_name().ok_or_else(|| Error::Store(format!("{}: not a file name", out.display())))?;
    let tmp = out.with_file_name(format!(".{}.partial-{}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut dst = Store::Sqlite(super::sqlite::Store::open(&tmp, crate::config::Durability::Full)?);
        write_all(&mut dst, &dump)?;
        drop(dst);
        let _ = std::fs::remove_file(super::sidecar(&tmp, "-wal"));
        let _ = std::fs::remove_file(super::sidecar(&tmp, "-shm"));
        let report = super::copy_and_check(&tmp, &tmp.with_extension("check"))?;
        let _ = std::fs::remove_file(tmp.with_extension("check"));
        std::fs::rename(&tmp, out).map_err(|e| Error::Store(format!("cannot rename the copy to {}: {e}", out.display())))?;
        super::sync_parent(out);
        Ok(super::BackupReport { bytes: super::sync_file(out)?, ..report })
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn read_source(at: &StoreLocation) -> Result<Dump, Error> {
    match at {
        StoreLocation::Sqlite(p) => {
            if !p.is_file() {
                return Err(Error::Store(format!("{}: no such store", p.display())));
            }
            super::sqlite::Store::open_reader(p)?.dump()
        }
        StoreLocation::Etcd(e) => super::etcd::Store::open_reader(e)?.dump(),
    }
}

/// Refuses a destination that holds anything but an unfinished migration,
/// which it clears.
fn prepare_destination(dst: &mut Store, to: &Path) -> Result<(), Error> {
    let held = dst.dump()?;
    if held.is_empty() {
        return Ok(());
    }
    let unfinished = held.meta.iter().any(|(k, _)| k == UNFINISHED);
    match dst {
        Store::Etcd(e) if unfinished => e.wipe(),
        _ => Err(Error::Store(format!(
            "{}: the destination is not empty ({} subscriptions, {} targets, {} events); migrate into an empty store",
            to.display(),
            held.subs.len(),
            held.targets.len(),
            held.events.len()
        ))),
    }
}

/// One record's writes.
type Step<'a> = Box<dyn Fn(&Txn) -> Result<(), Error> + 'a>;

/// Every record of `dump` into `dst`: one transaction, or (etcd) chunks
/// under the unfinished marker.
fn write_all(dst: &mut Store, dump: &Dump) -> Result<(), Error> {
    let chunked = matches!(dst, Store::Etcd(_));
    let mut steps: Vec<Step<'_>> = vec![];
    for s in &dump.subs {
        steps.push(Box::new(move |t| t.insert_sub(s)));
    }
    for (id, pipes) in &dump.placements {
        steps.push(Box::new(move |t| t.put_placement(*id, pipes)));
    }
    for tg in &dump.targets {
        steps.push(Box::new(move |t| {
            t.put_target(&tg.registration)?;
            if tg.deployed {
                t.set_deployed(&tg.registration.name)?;
            }
            match &tg.status {
                Some(s) => t.put_status(s),
                None => Ok(()),
            }
        }));
    }
    for r in &dump.requests {
        steps.push(Box::new(move |t| t.put_request_at(r)));
    }
    for e in &dump.events {
        let created = dump.event_times.get(&e.seq).copied().unwrap_or_else(super::now_ms);
        let of_app = dump.event_apps.get(&e.seq);
        steps.push(Box::new(move |t| t.put_event_at(e, created, of_app)));
    }
    for (app, c) in &dump.apps {
        steps.push(Box::new(move |t| t.put_app(app, c)));
    }
    let meta = |t: &Txn| -> Result<(), Error> {
        for (k, v) in &dump.meta {
            t.set_meta(k, v)?;
        }
        Ok(())
    };
    if !chunked {
        return dst.write(|t| {
            for step in &steps {
                step(t)?;
            }
            meta(t)
        });
    }
    dst.write(|t| t.set_meta(UNFINISHED, "unfinished"))?;
    for chunk in steps.chunks(CHUNK) {
        dst.write(|t| chunk.iter().try_for_each(|step| step(t)))?;
    }
    dst.write(|t| {
        meta(t)?;
        t.delete_meta(UNFINISHED)
    })
}

fn report(d: &Dump) -> MigrateReport {
    let generation = d.meta.iter().find(|(k, _)| k == "generation").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    MigrateReport {
        subscriptions: d.subs.len() as u64,
        targets: d.targets.len() as u64,
        requests: d.requests.len() as u64,
        events: d.events.len() as u64,
        generation,
    }
}
