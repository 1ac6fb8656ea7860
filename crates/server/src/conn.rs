//! Connections a shutdown can cut.
//!
//! A graceful shutdown waits for every open stream to end, and a stream
//! ends only once its last bytes are sent: a client that stopped reading
//! (its HTTP/2 window full) holds it open forever. So every accepted
//! connection (`subc_listen::Conn`) watches the server's [`Cutter`]: once it
//! fires, the connection's reads and writes fail, hyper drops it and its
//! streams, and the shutdown completes. [`Calls`] counts the handlers
//! running, so that a shutdown cuts as soon as only streams are left.

use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The handlers running now (a stream's handler returns once the stream
/// is set up).
#[derive(Default)]
pub(crate) struct Calls(watch::Sender<usize>);

impl Calls {
    /// Counts a call until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>) -> CallGuard {
        self.0.send_modify(|n| *n += 1);
        CallGuard(self.clone())
    }

    /// Returns once no handler runs.
    pub(crate) async fn idle(&self) {
        let _ = self.0.subscribe().wait_for(|n| *n == 0).await;
    }
}

pub(crate) struct CallGuard(Arc<Calls>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0 .0.send_modify(|n| *n -= 1);
    }
}

/// Fires the cut of every connection accepted so far and later (the
/// gated listener gives each connection the token: `transport.rs`). Going
/// away cuts them too.
#[derive(Default)]
pub(crate) struct Cutter(CancellationToken);

impl Cutter {
    /// What each accepted connection watches.
    pub(crate) fn token(&self) -> CancellationToken {
        self.0.clone()
    }

    /// Cuts every connection.
    pub(crate) fn cut(&self) {
        self.0.cancel();
    }
}

impl Drop for Cutter {
    fn drop(&mut self) {
        self.0.cancel();
    }
}
