//! Connections a shutdown can cut.
//!
//! A graceful shutdown waits for every open stream to end, and a stream
//! ends only once its last bytes are sent: a client that stopped reading
//! (its HTTP/2 window full) holds it open forever. So every accepted
//! connection is wrapped in [`Cuttable`]: once the server's [`Cutter`]
//! fires, its reads and writes fail, hyper drops the connection and its
//! streams, and the shutdown completes. [`Calls`] counts the handlers
//! running, so that a shutdown cuts as soon as only streams are left.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tonic::transport::server::{Connected, TcpConnectInfo};

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

/// Fires the cut of every connection accepted so far and later.
pub(crate) struct Cutter(watch::Sender<bool>);

impl Cutter {
    pub(crate) fn new() -> Cutter {
        Cutter(watch::Sender::new(false))
    }

    /// Wraps an accepted connection.
    pub(crate) fn wrap<IO>(&self, io: IO) -> Cuttable<IO> {
        let mut rx = self.0.subscribe();
        Cuttable {
            io,
            cut: Box::pin(async move {
                let _ = rx.wait_for(|cut| *cut).await;
            }),
        }
    }

    /// Cuts every connection.
    pub(crate) fn cut(&self) {
        self.0.send_replace(true);
    }
}

/// A connection whose reads and writes fail once it is cut.
pub(crate) struct Cuttable<IO> {
    io: IO,
    /// Ready once the connection is cut (or the cutter is gone).
    cut: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl<IO> Cuttable<IO> {
    /// An error once the connection is cut; polling registers for the cut.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.cut.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the server is shutting down")),
            Poll::Pending => Ok(()),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Cuttable<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Cuttable<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: Connected<ConnectInfo = TcpConnectInfo>> Connected for Cuttable<IO> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}
