//! The durable store: one contract, two engines.
//!
//! - `sqlite.rs`: a file in WAL mode, the default (one server, one machine).
//! - `etcd.rs`: an etcd cluster shared by replicas of the server
//!   (`store = "etcd://host:port,…/prefix"`); one of them, elected with a
//!   lease, is the writer (`docs/server.md`, "HA").
//!
//! The contract is [`Store`]: reads, and [`Store::write`], which runs a
//! closure of [`Txn`] calls as one transaction: committed whole before it
//! returns `Ok`, or not at all. Both engines keep the same records
//! (subscriptions, placements, targets and their status, idempotency
//! replies, events, meta values) with the same invariants (`sqlite.rs`).
//! etcd's commit is also fenced: it succeeds only while this server holds
//! the writer's lease and the store is at the revision it last wrote.

mod etcd;
mod migrate;
mod sqlite;

use crate::config::{Durability, StoreLocation};
use crate::proto;
use crate::Error;

pub(crate) use etcd::{Followed, Resigner, Store as EtcdStore, SubChange, WriterView};
pub(crate) use migrate::UNFINISHED;
pub use migrate::{backup_any, migrate_store, MigrateReport};
pub use sqlite::{backup_store, now_ms, BackupReport, StoredSub};

/// An `Add`'s stored reply, whole (a migration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredRequest {
    pub app: String,
    pub request_id: String,
    pub reply: Vec<u8>,
    pub fingerprint: Option<String>,
    pub created_ms: i64,
}

/// Every record of a store, as of one committed state.
#[derive(Debug, Default)]
pub(crate) struct Dump {
    /// Meta values but the schema version.
    pub meta: Vec<(String, String)>,
    pub subs: Vec<StoredSub>,
    pub placements: Vec<(u64, String)>,
    pub targets: Vec<StoredTarget>,
    pub requests: Vec<StoredRequest>,
    pub events: Vec<proto::Event>,
    /// seq → when the event was stored (for pruning by age).
    pub event_times: std::collections::BTreeMap<u64, i64>,
    /// seq → the application whose event it is, in its numbering.
    pub event_apps: std::collections::BTreeMap<u64, AppEvent>,
    /// Every application's counters (the floors are meta values).
    pub apps: Vec<(String, AppCounters)>,
}

impl Dump {
    pub(crate) fn is_empty(&self) -> bool {
        self.meta.is_empty()
            && self.subs.is_empty()
            && self.targets.is_empty()
            && self.requests.is_empty()
            && self.events.is_empty()
            && self.apps.is_empty()
    }
}
pub(crate) use sqlite::{
    copy_and_check, sidecar, sql, sync_file, sync_parent, AppCounters, AppEvent, EventRetention, StoredReply, StoredTarget,
};

/// An open store.
pub(crate) enum Store {
    Sqlite(sqlite::Store),
    Etcd(etcd::Store),
}

/// An open write transaction of either engine.
pub(crate) enum Txn<'a, 'b> {
    Sqlite(&'a sqlite::Txn<'b>),
    Etcd(&'a etcd::Txn<'b>),
}

/// The writer's claim on an etcd store: the epoch it fences devices with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Leadership {
    /// The etcd revision at which this server became the writer.
    pub revision: u64,
}

macro_rules! either {
    ($on:expr, $s:ident => $body:expr) => {
        match $on {
            Store::Sqlite($s) => $body,
            Store::Etcd($s) => $body,
        }
    };
}

macro_rules! in_txn {
    ($on:expr, $t:ident => $body:expr) => {
        match $on {
            Txn::Sqlite($t) => $body,
            Txn::Etcd($t) => $body,
        }
    };
}

impl Store {
    /// Opens the writer's store. For etcd this first waits to be elected
    /// the writer (a standby replica waits here), then reads the store.
    pub(crate) fn open(at: &StoreLocation, durability: Durability, name: &str) -> Result<Store, Error> {
        match at {
            StoreLocation::Sqlite(path) => sqlite::Store::open(path, durability).map(Store::Sqlite),
            StoreLocation::Etcd(e) => etcd::Store::open_writer(e, name).map(Store::Etcd),
        }
    }

    /// A second handle for reads that must not wait for the writer.
    pub(crate) fn open_reader(&self, at: &StoreLocation) -> Result<Store, Error> {
        match (self, at) {
            (Store::Etcd(e), _) => Ok(Store::Etcd(e.reader())),
            (Store::Sqlite(_), StoreLocation::Sqlite(path)) => sqlite::Store::open_reader(path).map(Store::Sqlite),
            (Store::Sqlite(_), StoreLocation::Etcd(_)) => Err(Error::Internal("a SQLite store with an etcd location".into())),
        }
    }

    /// The writer's election, for an etcd store.
    pub(crate) fn leadership(&self) -> Option<Leadership> {
        match self {
            Store::Sqlite(_) => None,
            Store::Etcd(e) => Some(e.leadership()),
        }
    }

    /// An etcd writer's last commit revision, as it changes (for replies).
    pub(crate) fn revision(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicI64>> {
        match self {
            Store::Sqlite(_) => None,
            Store::Etcd(e) => Some(e.revision()),
        }
    }

    /// The revision of the last commit (etcd; SQLite: 0).
    pub(crate) fn data_revision(&self) -> Result<i64, Error> {
        match self {
            Store::Sqlite(_) => Ok(0),
            Store::Etcd(e) => e.data_revision(),
        }
    }

    /// Every record, as of one committed state.
    pub(crate) fn dump(&self) -> Result<Dump, Error> {
        either!(self, s => s.dump())
    }

    /// An etcd writer's lease: lost or not, and how to give it back.
    pub(crate) fn resigner(&self) -> Option<Resigner> {
        match self {
            Store::Sqlite(_) => None,
            Store::Etcd(e) => e.resigner(),
        }
    }

    pub(crate) fn meta(&self, key: &str) -> Result<Option<String>, Error> {
        either!(self, s => s.meta(key))
    }

    pub(crate) fn meta_u64(&self, key: &str) -> Result<u64, Error> {
        Ok(self.meta(key)?.and_then(|v| v.parse().ok()).unwrap_or(0))
    }

    /// Every subscription, in id order.
    pub(crate) fn load_subs(&self) -> Result<Vec<StoredSub>, Error> {
        either!(self, s => s.load_subs())
    }

    /// The floors of applications without counters, and every
    /// application's counters.
    pub(crate) fn load_app_counters(&self) -> Result<(AppCounters, Vec<(String, AppCounters)>), Error> {
        either!(self, s => s.load_app_counters())
    }

    /// Up to `limit` of `app`'s own events after its event number `after`,
    /// in its numbering.
    pub(crate) fn app_events_after(&self, app: &str, after: u64, limit: usize) -> Result<Vec<proto::Event>, Error> {
        either!(self, s => s.app_events_after(app, after, limit))
    }

    /// Every stored placement: subscription id and the JSON array of its
    /// cubes' pipelines.
    pub(crate) fn load_placements(&self) -> Result<Vec<(u64, String)>, Error> {
        either!(self, s => s.load_placements())
    }

    pub(crate) fn load_targets(&self) -> Result<Vec<StoredTarget>, Error> {
        either!(self, s => s.load_targets())
    }

    /// Up to `limit` stored events with `seq > after`, oldest first.
    pub(crate) fn events_after(&self, after: u64, limit: usize) -> Result<Vec<proto::Event>, Error> {
        either!(self, s => s.events_after(after, limit))
    }

    /// The last `limit` stored events, oldest first.
    pub(crate) fn last_events(&self, limit: usize) -> Result<Vec<proto::Event>, Error> {
        either!(self, s => s.last_events(limit))
    }

    /// The stored reply of an earlier `Add` with this idempotency key.
    pub(crate) fn request_reply(&self, app: &str, request_id: &str) -> Result<Option<StoredReply>, Error> {
        either!(self, s => s.request_reply(app, request_id))
    }

    /// After pruning: gives the space back (SQLite's WAL checkpoint; etcd
    /// compacts its own history).
    pub(crate) fn checkpoint(&self) {
        if let Store::Sqlite(s) = self {
            s.checkpoint()
        }
    }

    /// Runs `f` in one transaction and commits it; on any error nothing is written.
    pub(crate) fn write<T>(&mut self, f: impl FnOnce(&Txn) -> Result<T, Error>) -> Result<T, Error> {
        match self {
            Store::Sqlite(s) => s.write(|t| f(&Txn::Sqlite(t))),
            Store::Etcd(s) => s.write(|t| f(&Txn::Etcd(t))),
        }
    }
}

impl Txn<'_, '_> {
    pub(crate) fn set_meta(&self, key: &str, value: &str) -> Result<(), Error> {
        in_txn!(self, t => t.set_meta(key, value))
    }

    pub(crate) fn delete_meta(&self, key: &str) -> Result<(), Error> {
        in_txn!(self, t => t.delete_meta(key))
    }

    pub(crate) fn insert_sub(&self, s: &StoredSub) -> Result<(), Error> {
        in_txn!(self, t => t.insert_sub(s))
    }

    pub(crate) fn delete_sub(&self, id: u64) -> Result<(), Error> {
        in_txn!(self, t => t.delete_sub(id))
    }

    /// Sets subscription `id`'s placement (a JSON array).
    pub(crate) fn put_placement(&self, id: u64, pipes: &str) -> Result<(), Error> {
        in_txn!(self, t => t.put_placement(id, pipes))
    }

    /// Forgets every placement (before a new layout's are written).
    pub(crate) fn clear_placements(&self) -> Result<(), Error> {
        in_txn!(self, t => t.clear_placements())
    }

    pub(crate) fn put_request(&self, app: &str, request_id: &str, reply: &[u8], fingerprint: &str) -> Result<(), Error> {
        in_txn!(self, t => t.put_request(app, request_id, reply, fingerprint))
    }

    /// Forgets the replies of idempotency keys older than `max_age_ms`, then
    /// the oldest until they hold at most `max_bytes` (the newest is kept).
    pub(crate) fn prune_requests(&self, max_age_ms: u64, max_bytes: u64) -> Result<(), Error> {
        in_txn!(self, t => t.prune_requests(max_age_ms, max_bytes))
    }

    pub(crate) fn put_target(&self, reg: &proto::RegisterTargetRequest) -> Result<(), Error> {
        in_txn!(self, t => t.put_target(reg))
    }

    pub(crate) fn delete_target(&self, name: &str) -> Result<(), Error> {
        in_txn!(self, t => t.delete_target(name))
    }

    pub(crate) fn set_deployed(&self, name: &str) -> Result<(), Error> {
        in_txn!(self, t => t.set_deployed(name))
    }

    pub(crate) fn put_status(&self, s: &proto::TargetStatus) -> Result<(), Error> {
        in_txn!(self, t => t.put_status(s))
    }

    /// Appends an event and returns its sequence number; `of_app`: the
    /// application whose event it is, in its numbering.
    pub(crate) fn append_event(&self, e: &proto::Event, of_app: Option<&AppEvent>) -> Result<u64, Error> {
        in_txn!(self, t => t.append_event(e, of_app))
    }

    pub(crate) fn put_app(&self, app: &str, c: &AppCounters) -> Result<(), Error> {
        in_txn!(self, t => t.put_app(app, c))
    }

    /// Keeps only the newest `r.keep` events, none older than
    /// `r.max_age_ms`, and the newest that hold at most `r.max_bytes`.
    pub(crate) fn prune_events(&self, r: &EventRetention) -> Result<(), Error> {
        in_txn!(self, t => t.prune_events(r))
    }

    pub(crate) fn put_request_at(&self, r: &StoredRequest) -> Result<(), Error> {
        in_txn!(self, t => t.put_request_at(r))
    }

    pub(crate) fn put_event_at(&self, e: &proto::Event, created_ms: i64, of_app: Option<&AppEvent>) -> Result<(), Error> {
        in_txn!(self, t => t.put_event_at(e, created_ms, of_app))
    }

    /// Gives freed pages back to the file system (SQLite only).
    pub(crate) fn release_free_pages(&self) -> Result<(), Error> {
        match self {
            Txn::Sqlite(t) => t.release_free_pages(),
            Txn::Etcd(_) => Ok(()),
        }
    }
}
