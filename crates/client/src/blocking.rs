//! Calling an async client from blocking code (a target's driver runs on a
//! blocking thread of the service's runtime, or in a program with none).

use std::future::Future;

/// Where an async client runs: the caller's runtime (the code blocks on one
/// of its blocking threads), or one of its own outside any runtime.
pub struct Blocking(Rt);

enum Rt {
    Shared(tokio::runtime::Handle),
    Own(tokio::runtime::Runtime),
}

impl Blocking {
    /// The current runtime, or a runtime of one worker thread.
    pub fn new() -> std::io::Result<Blocking> {
        match tokio::runtime::Handle::try_current() {
            Ok(h) => Ok(Blocking(Rt::Shared(h))),
            Err(_) => tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().map(|r| Blocking(Rt::Own(r))),
        }
    }

    /// Runs `f` in the runtime's context (for what spawns tasks, such as a
    /// lazily connected channel).
    pub fn enter<T>(&self, f: impl FnOnce() -> T) -> T {
        let _guard = match &self.0 {
            Rt::Shared(h) => h.enter(),
            Rt::Own(r) => r.enter(),
        };
        f()
    }

    /// Runs `f` to completion. Not from inside an async task: only from a
    /// blocking thread or outside the runtime.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        match &self.0 {
            Rt::Shared(h) => h.block_on(f),
            Rt::Own(r) => r.block_on(f),
        }
    }
}
