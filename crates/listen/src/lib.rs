//! Connections, before any call is made: how many a server holds (in all
//! and per peer address), how long one may take to start talking, and the
//! TCP options of every accepted socket. `subc serve`'s gRPC listener and
//! metrics endpoint, and `subc agent`'s listener, accept through a
//! [`GatedListener`].
//!
//! A connection is *pending* until the peer has answered what the server
//! wrote: a read that completes after the server's first write (the HTTP/2
//! SETTINGS acknowledgement; TLS's Finished). Nothing else proves a peer
//! that speaks the protocol. A pending connection is closed when
//! `transport.handshake_timeout_ms` passes, and is the first to go when a
//! new one would pass a limit: the oldest pending connection (of the same
//! peer, for the per-peer limit) is closed to make room. When no pending
//! connection can go, the new one is closed at once. So silent sockets
//! cannot hold the server's descriptors, and a client that does speak gets
//! in even while thousands of silent ones arrive.

#![warn(unreachable_pub)]

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Descriptors kept free of connections for the store, targets and logs.
const RESERVED_DESCRIPTORS: u64 = 128;
/// How long accepting pauses after an error (such as running out of
/// descriptors), so that a failing accept does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The limits of a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub max_per_peer: usize,
    /// How long a connection may take to answer what the server wrote.
    pub handshake_timeout: Duration,
    pub nodelay: bool,
    pub keepalive: Option<Duration>,
}

impl ConnectionLimits {
    /// These limits with `max_connections` (and the per-peer limit) lowered
    /// to what the process's descriptor limit leaves after
    /// [`RESERVED_DESCRIPTORS`].
    pub fn within_descriptors(self) -> ConnectionLimits {
        let by_descriptors = descriptor_limit().map(|n| n.saturating_sub(RESERVED_DESCRIPTORS).max(16) as usize);
        let max_connections = by_descriptors.map_or(self.max_connections, |d| self.max_connections.min(d));
        if max_connections < self.max_connections {
            tracing::info!(
                configured = self.max_connections,
                in_force = max_connections,
                "max_connections lowered to fit the process's descriptor limit (RLIMIT_NOFILE)"
            );
        }
        ConnectionLimits { max_connections, max_per_peer: self.max_per_peer.min(max_connections), ..self }
    }
}

/// What a listener reports: the `listener` names it (`grpc`, `metrics`).
pub trait Observer: Send + Sync {
    /// How many connections the listener holds now.
    fn open(&self, listener: &'static str, count: usize);
    /// The listener closed a connection, for `reason`: `max_connections`,
    /// `max_connections_per_peer`, `evicted_pending` or `handshake_timeout`.
    fn closed(&self, listener: &'static str, reason: &'static str);
}

/// An observer that only logs closes (at debug).
pub struct LogObserver;

impl Observer for LogObserver {
    fn open(&self, _: &'static str, _: usize) {}
    fn closed(&self, listener: &'static str, reason: &'static str) {
        tracing::debug!(listener, reason, "connection closed by the gate");
    }
}

/// The soft limit on open descriptors, if it can be read.
fn descriptor_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Raises the soft descriptor limit to the hard one (as Go's runtime does):
/// the default soft limit of 1,024 is far below what a server needs, and
/// the hard one is the administrator's decision.
pub fn raise_descriptor_limit() {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write only the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                tracing::debug!("cannot raise RLIMIT_NOFILE");
            }
        }
    }
}

/// Why a connection was closed by the gate (the `reason` label).
#[derive(Clone, Copy, Debug)]
enum Closed {
    /// Over `max_connections`, with no pending connection to close instead.
    Total,
    /// Over `max_connections_per_peer`, likewise.
    PerPeer,
    /// A pending connection closed to make room for a new one.
    Evicted,
    /// A pending connection whose handshake took too long.
    Handshake,
}

impl Closed {
    fn label(self) -> &'static str {
        match self {
            Closed::Total => "max_connections",
            Closed::PerPeer => "max_connections_per_peer",
            Closed::Evicted => "evicted_pending",
            Closed::Handshake => "handshake_timeout",
        }
    }
}

struct Entry {
    peer: IpAddr,
    pending: Arc<AtomicBool>,
    evict: CancellationToken,
}

/// Every open connection, by admission order (oldest first).
#[derive(Default)]
struct Table {
    next: u64,
    open: BTreeMap<u64, Entry>,
    per_peer: HashMap<IpAddr, usize>,
}

impl Table {
    /// The oldest pending connection, of `peer` if given.
    fn oldest_pending(&self, peer: Option<IpAddr>) -> Option<u64> {
        self.open.iter().find(|(_, e)| e.pending.load(Ordering::Relaxed) && peer.is_none_or(|p| p == e.peer)).map(|(id, _)| *id)
    }

    /// Closes connection `id` (its socket closes at its next poll).
    fn evict(&mut self, id: u64) {
        if let Some(e) = self.open.get(&id) {
            e.evict.cancel();
        }
    }
}

/// Admits connections within the limits; shared by the accepted ones.
#[derive(Clone)]
struct Gate {
    limits: ConnectionLimits,
    table: Arc<Mutex<Table>>,
    observer: Arc<dyn Observer>,
    /// The `listener` label: `grpc` or `metrics`.
    name: &'static str,
}

impl Gate {
    /// A guard for a new connection from `peer`, making room by closing
    /// pending connections; `None` when the new one must be closed.
    fn admit(&self, peer: IpAddr) -> Option<Guard> {
        let mut t = self.table.lock().expect("connection table");
        if t.per_peer.get(&peer).copied().unwrap_or(0) >= self.limits.max_per_peer {
            let Some(id) = t.oldest_pending(Some(peer)) else {
                self.count_closed(Closed::PerPeer);
                return None;
            };
            self.close_for_room(&mut t, id);
        }
        if t.open.len() >= self.limits.max_connections {
            let Some(id) = t.oldest_pending(None) else {
                self.count_closed(Closed::Total);
                return None;
            };
            self.close_for_room(&mut t, id);
        }
        let id = t.next;
        t.next += 1;
        let entry = Entry { peer, pending: Arc::new(AtomicBool::new(true)), evict: CancellationToken::new() };
        let guard = Guard { id, pending: entry.pending.clone(), evict: entry.evict.clone(), gate: self.clone() };
        t.open.insert(id, entry);
        *t.per_peer.entry(peer).or_default() += 1;
        self.observer.open(self.name, t.open.len());
        Some(guard)
    }

    /// Closes pending connection `id` and forgets it at once, so that the
    /// new connection has its place now rather than at the old one's next poll.
    fn close_for_room(&self, t: &mut Table, id: u64) {
        t.evict(id);
        Gate::forget(t, id);
        self.count_closed(Closed::Evicted);
    }

    fn forget(t: &mut Table, id: u64) {
        if let Some(e) = t.open.remove(&id) {
            if let Some(n) = t.per_peer.get_mut(&e.peer) {
                *n -= 1;
                if *n == 0 {
                    t.per_peer.remove(&e.peer);
                }
            }
        }
    }

    fn count_closed(&self, why: Closed) {
        self.observer.closed(self.name, why.label());
    }
}

/// A connection's place in the table; dropping it gives the place back.
struct Guard {
    id: u64,
    pending: Arc<AtomicBool>,
    evict: CancellationToken,
    gate: Gate,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut t = self.gate.table.lock().expect("connection table");
        Gate::forget(&mut t, self.id);
        self.gate.observer.open(self.gate.name, t.open.len());
    }
}

/// A listener that admits connections within [`ConnectionLimits`] and sets
/// their TCP options.
pub struct GatedListener {
    listener: TcpListener,
    gate: Gate,
    /// Cancelled when the server cuts every connection.
    cut: CancellationToken,
}

impl GatedListener {
    pub fn new(listener: TcpListener, limits: ConnectionLimits, observer: Arc<dyn Observer>, name: &'static str) -> GatedListener {
        GatedListener { listener, gate: Gate { limits, table: Arc::default(), observer, name }, cut: CancellationToken::new() }
    }

    /// Its connections fail once `cut` is cancelled.
    pub fn cut_by(self, cut: CancellationToken) -> GatedListener {
        GatedListener { cut, ..self }
    }

    /// The next admitted connection. Errors of `accept` (out of
    /// descriptors, a connection reset before it was taken) pause
    /// accepting briefly and are never returned.
    pub async fn next(&mut self) -> (Conn, SocketAddr) {
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(error = %e, listener = self.gate.name, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Some(guard) = self.gate.admit(peer.ip()) else {
                // Dropping the stream closes it.
                continue;
            };
            self.set_options(&stream);
            return (Conn::new(stream, guard, self.gate.limits.handshake_timeout, self.cut.clone()), peer);
        }
    }

    fn set_options(&self, stream: &TcpStream) {
        let limits = &self.gate.limits;
        if let Err(e) = stream.set_nodelay(limits.nodelay) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        if let Some(every) = limits.keepalive {
            let keepalive = socket2::TcpKeepalive::new().with_time(every).with_interval(every);
            if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
                tracing::debug!(error = %e, "cannot set TCP keepalive");
            }
        }
    }

    /// The admitted connections as a stream for tonic: a task accepts them
    /// and ends when the server drops the stream.
    pub fn into_stream(mut self) -> tokio_stream::wrappers::ReceiverStream<io::Result<Conn>> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    (conn, _) = self.next() => if tx.send(Ok(conn)).await.is_err() { return },
                    _ = tx.closed() => return,
                }
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

#[cfg(feature = "axum")]
impl axum::serve::Listener for GatedListener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        self.next().await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An admitted connection: a TCP stream that fails its reads once the
/// handshake deadline passes or the gate closes it while pending, and its
/// reads and writes once the server cuts it.
pub struct Conn {
    io: TcpStream,
    guard: Guard,
    /// Until the connection is established.
    deadline: Option<Pin<Box<Sleep>>>,
    evicted: Pin<Box<WaitForCancellationFutureOwned>>,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    wrote: bool,
}

impl Conn {
    fn new(io: TcpStream, guard: Guard, handshake: Duration, cut: CancellationToken) -> Conn {
        let evicted = Box::pin(guard.evict.clone().cancelled_owned());
        let deadline = Some(Box::pin(tokio::time::sleep(handshake)));
        Conn { io, guard, deadline, evicted, cut: Box::pin(cut.cancelled_owned()), wrote: false }
    }

    /// An error once the server has cut the connection; polling registers
    /// for the cut.
    fn check_cut(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        match self.cut.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the server is shutting down")),
            Poll::Pending => Ok(()),
        }
    }

    /// While pending: an error if the gate closed this connection or its
    /// handshake deadline passed.
    fn check_pending(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        let Some(deadline) = &mut self.deadline else { return Ok(()) };
        if self.evicted.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "closed to make room for a new connection"));
        }
        if deadline.as_mut().poll(cx).is_ready() {
            self.guard.gate.count_closed(Closed::Handshake);
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the handshake took longer than transport.handshake_timeout_ms"));
        }
        Ok(())
    }

    /// The peer answered what the server wrote: it speaks the protocol.
    fn establish(&mut self) {
        self.deadline = None;
        self.guard.pending.store(false, Ordering::Relaxed);
    }
}

use std::future::Future;

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.check_cut(cx)?;
        this.check_pending(cx)?;
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before && this.wrote && this.deadline.is_some() {
            this.establish();
        }
        r
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.check_cut(cx)?;
        let r = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.wrote = true;
        }
        r
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        self.check_cut(cx)?;
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.wrote = true;
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check_cut(cx)?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(max_connections: usize, max_per_peer: usize) -> Gate {
        let limits =
            ConnectionLimits { max_connections, max_per_peer, handshake_timeout: Duration::from_secs(1), nodelay: true, keepalive: None };
        Gate { limits, table: Arc::default(), observer: Arc::new(LogObserver), name: "grpc" }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_new_connection_takes_the_place_of_the_oldest_pending_one() {
        let g = gate(3, 3);
        let a = g.admit(ip(1)).unwrap();
        let b = g.admit(ip(1)).unwrap();
        b.pending.store(false, Ordering::Relaxed);
        let _c = g.admit(ip(2)).unwrap();
        let _d = g.admit(ip(3)).unwrap();
        assert!(a.evict.is_cancelled(), "the oldest pending connection makes room");
        assert!(!b.evict.is_cancelled(), "an established connection is never closed for room");
        assert_eq!(g.table.lock().unwrap().open.len(), 3);
    }

    #[test]
    fn with_every_place_established_the_new_connection_is_refused() {
        let g = gate(2, 2);
        let held: Vec<Guard> = (0..2).map(|i| g.admit(ip(i)).unwrap()).collect();
        for h in &held {
            h.pending.store(false, Ordering::Relaxed);
        }
        assert!(g.admit(ip(9)).is_none());
        drop(held);
        assert!(g.admit(ip(9)).is_some(), "closed connections give their places back");
    }

    #[tokio::test]
    async fn accepted_sockets_get_the_configured_tcp_options() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ConnectionLimits { keepalive: Some(Duration::from_secs(42)), ..gate(4, 4).limits };
        let mut gated = GatedListener::new(listener, limits, Arc::new(LogObserver), "grpc");
        let _client = TcpStream::connect(addr).await.unwrap();
        let (conn, _) = gated.next().await;
        let sock = socket2::SockRef::from(&conn.io);
        assert!(sock.tcp_nodelay().unwrap());
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(42));
    }

    #[test]
    fn the_per_peer_limit_closes_that_peers_pending_connections_only() {
        let g = gate(10, 2);
        let other = g.admit(ip(2)).unwrap();
        let a = g.admit(ip(1)).unwrap();
        let b = g.admit(ip(1)).unwrap();
        let _c = g.admit(ip(1)).unwrap();
        assert!(a.evict.is_cancelled() && !b.evict.is_cancelled() && !other.evict.is_cancelled());
        let t = g.table.lock().unwrap();
        assert_eq!((t.per_peer[&ip(1)], t.per_peer[&ip(2)]), (2, 1));
    }
}
