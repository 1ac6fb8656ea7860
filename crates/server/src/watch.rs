//! Watch streams: who may hold how many, and what a watcher that stops
//! reading costs.
//!
//! Slots are counted per application (`limits.max_watchers_per_app`) and in
//! all (`limits.max_watchers`), of which `limits.admin_watchers` are the
//! administrator's: applications together never take those. Once, one
//! application could take every slot and keep them with streams it never
//! read.
//!
//! Each watcher has a buffer of `limits.watch_buffer_events` events. A live
//! event that finds it full drops the watcher: its task ends, its slot is
//! given back, and the stream ends, after what was buffered, with ABORTED
//! saying where to resume. A replay waits for room (it can go at the
//! reader's pace) but at most [`REPLAY_STALL`]. Shutdown ends every task at
//! once; `server.rs` then cuts the connections of clients that read nothing.

use crate::auth::Principal;
use crate::config::Limits;
use crate::core::Core;
use crate::proto;
use crate::store::{AppEvent, EtcdStore};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;

/// How long a replay waits for a watcher to read before dropping it.
const REPLAY_STALL: Duration = Duration::from_secs(10);
/// Events a replay reads from the store at a time.
const REPLAY_PAGE: usize = 1000;

pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<proto::Event, Status>> + Send>>;

/// The Watch slots taken: in all, by applications, per application.
#[derive(Default)]
pub(crate) struct Slots {
    taken: Mutex<Taken>,
}

#[derive(Default)]
struct Taken {
    total: usize,
    apps: usize,
    per_app: HashMap<Arc<str>, usize>,
}

/// Why a Watch was refused a slot: the limit's metric label and message.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SlotRefusal {
    #[error("{0} watchers are connected, the limit (limits.max_watchers)")]
    All(usize),
    #[error("applications hold {0} watchers, their share of limits.max_watchers ({1} are the administrator's: limits.admin_watchers)")]
    AppsShare(usize, usize),
    #[error("application {0:?} holds {1} watchers, the limit (limits.max_watchers_per_app)")]
    PerApp(Arc<str>, usize),
}

impl SlotRefusal {
    /// The `limit` label of `subc_limit_refusals_total`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            SlotRefusal::All(_) | SlotRefusal::AppsShare(..) => "watchers",
            SlotRefusal::PerApp(..) => "watchers_per_app",
        }
    }
}

impl Slots {
    /// Takes a slot for `who`, or says which limit is reached.
    pub(crate) fn claim(&self, limits: &Limits, who: &Principal) -> Result<(), SlotRefusal> {
        let mut t = self.taken.lock().expect("watch slots");
        if t.total >= limits.max_watchers {
            return Err(SlotRefusal::All(limits.max_watchers));
        }
        if !who.admin {
            let apps_share = limits.max_watchers.saturating_sub(limits.admin_watchers);
            if t.apps >= apps_share {
                return Err(SlotRefusal::AppsShare(apps_share, limits.admin_watchers));
            }
            let mine = t.per_app.get(&who.app).copied().unwrap_or(0);
            if mine >= limits.max_watchers_per_app {
                return Err(SlotRefusal::PerApp(who.app.clone(), limits.max_watchers_per_app));
            }
            t.apps += 1;
            *t.per_app.entry(who.app.clone()).or_default() += 1;
        }
        t.total += 1;
        Ok(())
    }

    /// Gives back a slot [`Slots::claim`] took for `who`.
    fn release(&self, who: &Principal) {
        let mut t = self.taken.lock().expect("watch slots");
        t.total -= 1;
        if !who.admin {
            t.apps -= 1;
            if let Some(n) = t.per_app.get_mut(&who.app) {
                *n -= 1;
                if *n == 0 {
                    t.per_app.remove(&who.app);
                }
            }
        }
    }

    /// Slots taken in all.
    pub(crate) fn taken(&self) -> usize {
        self.taken.lock().expect("watch slots").total
    }
}

/// A claimed slot, given back when dropped (when the watcher's task ends).
pub(crate) struct Slot {
    slots: Arc<Slots>,
    who: Principal,
}

impl Slot {
    pub(crate) fn new(slots: Arc<Slots>, who: Principal) -> Slot {
        Slot { slots, who }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.release(&self.who);
    }
}

/// An event as the writer publishes it: as the administrator sees it, and,
/// for an application's own event, its number and generation there.
#[derive(Clone, Debug)]
pub(crate) struct LiveEvent {
    pub event: proto::Event,
    pub of_app: Option<AppEvent>,
}

impl LiveEvent {
    /// A target or deployment event: the administrator's alone.
    pub(crate) fn admin_only(event: proto::Event) -> LiveEvent {
        LiveEvent { event, of_app: None }
    }

    /// The event as `who` sees it, if `who` sees it.
    fn view(&self, who: &Principal) -> Option<proto::Event> {
        if who.admin {
            return Some(self.event.clone());
        }
        let own = self.of_app.as_ref().filter(|a| a.app == who.app)?;
        Some(proto::Event { seq: own.seq, generation: own.generation, ..self.event.clone() })
    }
}

/// A watcher's task stops: the client went, the server is closing, or the
/// stream ended with a status.
struct Stop;

/// The watcher's end of its stream: a buffer of `capacity` events and
/// one place more, for the status that ends it.
struct Sink {
    tx: mpsc::Sender<Result<proto::Event, Status>>,
    capacity: usize,
    who: Principal,
    /// The last event sent, in the watcher's numbering: where to resume.
    last: u64,
}

impl Sink {
    /// Queues a live event (seen as the watcher sees it), or drops the
    /// watcher when its buffer is full.
    fn offer(&mut self, e: proto::Event) -> Result<(), Stop> {
        if self.tx.is_closed() {
            return Err(Stop);
        }
        if self.tx.capacity() <= 1 {
            let why = format!(
                "this watcher read nothing while {} events waited for it (limits.watch_buffer_events); watch again with replay and after_seq = {}",
                self.capacity, self.last
            );
            return self.end(Status::aborted(why));
        }
        self.last = e.seq;
        self.tx.try_send(Ok(e)).map_err(|_| Stop)
    }

    /// Queues a replayed event, waiting for room (at most [`REPLAY_STALL`]).
    async fn replay(&mut self, e: proto::Event) -> Result<(), Stop> {
        // Room for the event and the status that may follow it.
        if self.tx.capacity() <= 1 {
            let room = tokio::time::timeout(REPLAY_STALL, self.tx.reserve_many(2)).await.map(|r| r.is_ok());
            match room {
                Ok(true) => {}
                Ok(false) => return Err(Stop),
                Err(_) => {
                    let why = format!(
                        "this watcher read nothing for {} s of its replay; watch again with replay and after_seq = {}",
                        REPLAY_STALL.as_secs(),
                        self.last
                    );
                    return self.end(Status::aborted(why));
                }
            }
        }
        self.last = e.seq;
        self.tx.try_send(Ok(e)).map_err(|_| Stop)
    }

    /// Ends the stream with `status` (after what is buffered).
    fn end(&mut self, status: Status) -> Result<(), Stop> {
        let _ = self.tx.try_send(Err(status));
        Err(Stop)
    }
}

/// Starts a watcher holding `slot` and returns its stream.
pub(crate) fn start(core: Arc<Core>, who: Principal, req: proto::WatchRequest, slot: Slot) -> EventStream {
    // Subscribe before replaying, so nothing falls between the two.
    let live = core.subscribe_events();
    let capacity = core.config().limits.watch_buffer_events;
    let (tx, rx) = mpsc::channel(capacity + 1);
    let sink = Sink { tx, capacity, who, last: req.after_seq };
    tokio::spawn(async move {
        let _slot = slot;
        let _ = run(&core, sink, live, req.replay).await;
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A watcher's task: the replay, then live events until a stop.
async fn run(core: &Core, mut sink: Sink, mut live: tokio::sync::broadcast::Receiver<LiveEvent>, replay: bool) -> Result<(), Stop> {
    let mut closing = core.closing();
    if replay {
        tokio::select! {
            r = replay_stored(core, &mut sink) => r?,
            _ = closing.wait_for(|c| *c) => return Err(Stop),
        }
    }
    let replayed = if replay { sink.last } else { 0 };
    loop {
        let next = tokio::select! {
            e = live.recv() => e,
            _ = sink.tx.closed() => return Err(Stop),
            _ = closing.wait_for(|c| *c) => return Err(Stop),
        };
        match next.map(|e| e.view(&sink.who)) {
            Ok(None) => {}
            Ok(Some(e)) if e.seq <= replayed => {}
            Ok(Some(e)) => sink.offer(e)?,
            Err(RecvError::Lagged(n)) => {
                let why = format!("this watcher fell {n} events behind; watch again with replay and after_seq = {}", sink.last);
                return sink.end(Status::aborted(why));
            }
            Err(RecvError::Closed) => return Err(Stop),
        }
    }
}

/// Sends the stored events after `sink.last` the watcher sees, page by page.
async fn replay_stored(core: &Core, sink: &mut Sink) -> Result<(), Stop> {
    loop {
        let page = match core.read_events_as(&sink.who, sink.last, REPLAY_PAGE) {
            Ok(p) => p,
            Err(s) => return sink.end(s),
        };
        if page.is_empty() {
            return Ok(());
        }
        for e in page {
            sink.replay(e).await?;
        }
    }
}

/// A standby's watcher (`standby.rs`): the stored events that `who` sees
/// after `req.after_seq` (without replay, after the last one stored when
/// the call came), then, each time the followed revision moves, those
/// stored since. Events are read from the store, so a watcher that moves
/// between replicas with its last number sees each event once, in order.
pub(crate) async fn follow(
    store: Arc<EtcdStore>,
    revisions: tokio::sync::watch::Receiver<i64>,
    closing: tokio::sync::watch::Receiver<bool>,
    (who, req, slot): (Principal, proto::WatchRequest, Slot),
    capacity: usize,
) -> Result<EventStream, Status> {
    let after = if req.replay {
        req.after_seq
    } else {
        let app = (!who.admin).then(|| who.app.to_string());
        read_store(&store, move |s| s.last_event(app.as_deref())).await?
    };
    let (tx, rx) = mpsc::channel(capacity + 1);
    let sink = Sink { tx, capacity, who, last: after };
    tokio::spawn(async move {
        let _slot = slot;
        let _ = run_following(&store, sink, revisions, closing).await;
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

async fn run_following(
    store: &Arc<EtcdStore>,
    mut sink: Sink,
    mut revisions: tokio::sync::watch::Receiver<i64>,
    mut closing: tokio::sync::watch::Receiver<bool>,
) -> Result<(), Stop> {
    loop {
        revisions.borrow_and_update();
        loop {
            let (who, after) = (sink.who.clone(), sink.last);
            let page = read_store(store, move |s| {
                if who.admin {
                    s.events_after(after, REPLAY_PAGE)
                } else {
                    s.app_events_after(&who.app, after, REPLAY_PAGE)
                }
            });
            let page = match page.await {
                Ok(p) => p,
                Err(s) => return sink.end(s),
            };
            if page.is_empty() {
                break;
            }
            for e in page {
                sink.replay(e).await?;
            }
        }
        tokio::select! {
            r = revisions.changed() => r.map_err(|_| Stop)?,
            _ = sink.tx.closed() => return Err(Stop),
            _ = closing.wait_for(|c| *c) => return Err(Stop),
        }
    }
}

/// A read of the etcd store, off the runtime's threads.
async fn read_store<T: Send + 'static>(
    store: &Arc<EtcdStore>,
    f: impl FnOnce(&EtcdStore) -> Result<T, crate::Error> + Send + 'static,
) -> Result<T, Status> {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || f(&store)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Status::unavailable(format!("this standby cannot read the store: {e}"))),
        Err(e) => Err(Status::internal(e.to_string())),
    }
}
