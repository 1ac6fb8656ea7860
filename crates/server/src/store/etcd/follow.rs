//! A standby's reading of the etcd store: the subscriptions at one
//! revision, then every commit after it as etcd's watch reports them, so
//! that a standby answers reads without asking the writer.
//!
//! Every commit rewrites `P/rev`, so every commit reaches the watch, and
//! the revision of the last one seen is the revision the follower's view
//! is at. The watch is from a revision: nothing falls between the read and
//! the watch. A watch that ends, fails, or starts below etcd's compaction
//! is an error; the caller reads the store again.

use super::{key_number, store_err, undecodable, Conn, Index, Store, SubRecord};
use crate::store::StoredSub;
use crate::Error;
use etcd_client::{EventType, WatchOptions};
use prost::Message;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

/// A change to one subscription.
#[derive(Debug)]
pub(crate) enum SubChange {
    Put(StoredSub),
    Delete(u64),
}

/// The commits of one watch response: the subscriptions they changed, and
/// the revision of the last of them.
#[derive(Debug)]
pub(crate) struct Followed {
    pub revision: i64,
    pub changes: Vec<SubChange>,
}

/// How often [`Store::follow`] looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(250);

impl Store {
    /// A reader of the store as it is now: every read at its latest revision.
    pub(crate) fn pinned_latest(&self) -> Result<Store, Error> {
        let key = self.conn.key("rev");
        let head = self.conn.read("reading the revision", move |mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })?;
        let at = head.header().map(|h| h.revision()).ok_or_else(|| store_err("reading the revision", "no header"))?;
        Ok(Store { conn: self.conn.clone(), lease: None, rev: 0, index: Index::default(), at, published: Arc::default() })
    }

    /// The store's latest revision, and its subscriptions as of it.
    pub(crate) fn subs_now(&self) -> Result<(i64, Vec<StoredSub>), Error> {
        let pinned = self.pinned_latest()?;
        Ok((pinned.at, pinned.load_subs()?))
    }

    /// The revision of the last commit (as of this reader's revision, or
    /// for the writer, its own last).
    pub(crate) fn data_revision(&self) -> Result<i64, Error> {
        if self.lease.is_some() {
            return Ok(self.rev);
        }
        Ok(self.conn.get_at(self.conn.key("rev"), self.at)?.map(|kv| kv.mod_revision()).unwrap_or(0))
    }

    /// Calls `f` with every commit after revision `from`, in order, until
    /// `stop` is raised (`Ok`) or the watch fails (`Err`: read the store
    /// again with [`Store::subs_now`]).
    pub(crate) fn follow(&self, from: i64, stop: &AtomicBool, mut f: impl FnMut(Followed)) -> Result<(), Error> {
        let (tx, rx) = mpsc::channel::<Result<Followed, Error>>();
        let task = self.conn.rt().spawn(watch(self.conn.clone(), from, tx));
        let r = loop {
            match rx.recv_timeout(STOP_POLL) {
                Ok(Ok(followed)) => f(followed),
                Ok(Err(e)) => break Err(e),
                Err(RecvTimeoutError::Timeout) if stop.load(Ordering::SeqCst) => break Ok(()),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break Err(store_err("following the store", "the watch stopped")),
            }
        };
        task.abort();
        r
    }
}

/// The watch over the whole prefix from `from + 1`, decoded, sent to `tx`
/// until the receiver goes or the watch fails.
async fn watch(conn: Arc<Conn>, from: i64, tx: mpsc::Sender<Result<Followed, Error>>) {
    let fail = |e: Error| {
        let _ = tx.send(Err(e));
    };
    let (prefix, subs_dir) = (conn.key(""), conn.key("subs/"));
    let mut client = conn.client.clone();
    let options = WatchOptions::new().with_prefix().with_start_revision(from + 1);
    let mut stream = match client.watch(prefix, Some(options)).await {
        Ok(s) => s,
        Err(e) => return fail(store_err("watching the store", e)),
    };
    loop {
        let resp = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return fail(store_err("watching the store", "the watch ended")),
            Err(e) => return fail(store_err("watching the store", e)),
        };
        if resp.canceled() || resp.compact_revision() > 0 {
            let why = format!("the watch was cancelled (compacted at revision {})", resp.compact_revision());
            return fail(store_err("watching the store", why));
        }
        // The reply that creates the watch carries no commit.
        let Some(last) = resp.events().iter().filter_map(|e| e.kv()).map(|kv| kv.mod_revision()).max() else { continue };
        let mut changes = vec![];
        for e in resp.events() {
            let Some(kv) = e.kv().filter(|kv| kv.key().starts_with(subs_dir.as_bytes())) else { continue };
            let Some(id) = key_number(kv.key()) else { continue };
            changes.push(match e.event_type() {
                EventType::Delete => SubChange::Delete(id),
                EventType::Put => match SubRecord::decode(kv.value()) {
                    Ok(r) => SubChange::Put(r.stored(id)),
                    Err(e) => return fail(undecodable("subscription", e)),
                },
            });
        }
        if tx.send(Ok(Followed { revision: last, changes })).is_err() {
            return;
        }
    }
}

impl Store {
    /// The number of the last stored event: the service's, or (`app`) the
    /// application's own; 0 if there is none.
    pub(crate) fn last_event(&self, app: Option<&str>) -> Result<u64, Error> {
        let dir = match app {
            None => self.conn.key("events/"),
            Some(a) => self.conn.key(&format!("appevents/{}/", super::hex(a))),
        };
        let end = super::prefix_end(dir.as_bytes());
        let r = self.conn.read("reading the last event", move |mut c| {
            let options = etcd_client::GetOptions::new()
                .with_range(end.clone())
                .with_keys_only()
                .with_limit(1)
                .with_sort(etcd_client::SortTarget::Key, etcd_client::SortOrder::Descend);
            let dir = dir.clone();
            async move { c.get(dir, Some(options)).await }
        })?;
        Ok(r.kvs().first().and_then(|kv| key_number(kv.key())).unwrap_or(0))
    }
}
