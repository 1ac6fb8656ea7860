//! Admission to the text phase (parse, check, normal form) of `Add` and
//! `Check`: at most `limits.max_concurrent_checks` run at once, and at most
//! `limits.max_concurrent_checks_per_app` of one application, so that one
//! caller's large requests leave the others their share of the cores. Each
//! runs under `limits.check_timeout_ms` (waiting for a place included), and
//! stops as soon as its caller goes away: the checker asks before each line.

use crate::config::Limits;
use crate::metrics::Metrics;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

pub(crate) struct TextGate {
    all: Arc<Semaphore>,
    per_app: Mutex<HashMap<Arc<str>, Arc<Semaphore>>>,
    per_app_limit: usize,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

/// Raises its flag when dropped: the handler's future was dropped (the
/// caller cancelled, or its deadline passed) or the work is done.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl TextGate {
    pub(crate) fn new(limits: &Limits, metrics: Arc<Metrics>) -> TextGate {
        TextGate {
            all: Arc::new(Semaphore::new(limits.max_concurrent_checks)),
            per_app: Mutex::default(),
            per_app_limit: limits.max_concurrent_checks_per_app,
            timeout: Duration::from_millis(limits.check_timeout_ms),
            metrics,
        }
    }

    /// Runs `work` on a blocking thread once `app` has a place; `work`
    /// gets the predicate that says when to stop (`None` back from `work`
    /// means it stopped).
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        app: &Arc<str>,
        work: impl FnOnce(&dyn Fn() -> bool) -> Option<T> + Send + 'static,
    ) -> Result<T, Status> {
        let deadline = Instant::now() + self.timeout;
        let permits = tokio::time::timeout_at(deadline.into(), self.places(app)).await.map_err(|_| self.busy())?;
        let cancelled = Arc::new(AtomicBool::new(false));
        let _cancel = CancelOnDrop(cancelled.clone());
        let stop = move || cancelled.load(Ordering::Relaxed) || Instant::now() >= deadline;
        let out = tokio::task::spawn_blocking(move || {
            let _permits = permits;
            work(&stop)
        })
        .await
        .map_err(|e| Status::internal(format!("the check failed: {e}")))?;
        out.ok_or_else(|| self.too_long())
    }

    /// The application's place, then one of all.
    async fn places(&self, app: &Arc<str>) -> (OwnedSemaphorePermit, OwnedSemaphorePermit) {
        let mine = {
            let mut m = self.per_app.lock().expect("per-app places");
            m.entry(app.clone()).or_insert_with(|| Arc::new(Semaphore::new(self.per_app_limit))).clone()
        };
        let own = mine.acquire_owned().await.expect("never closed");
        let any = self.all.clone().acquire_owned().await.expect("never closed");
        (own, any)
    }

    fn busy(&self) -> Status {
        self.metrics.limit_refusals.get_or_create(&Metrics::label("limit", "check_time")).inc();
        Status::resource_exhausted(format!(
            "no place to check the text within {} ms (limits.check_timeout_ms): this application's other requests, or \
             others', hold every place (limits.max_concurrent_checks, limits.max_concurrent_checks_per_app); nothing was added",
            self.timeout.as_millis()
        ))
    }

    fn too_long(&self) -> Status {
        self.metrics.limit_refusals.get_or_create(&Metrics::label("limit", "check_time")).inc();
        Status::resource_exhausted(format!(
            "checking the text took longer than {} ms (limits.check_timeout_ms); nothing was added: send fewer or smaller lines",
            self.timeout.as_millis()
        ))
    }
}
