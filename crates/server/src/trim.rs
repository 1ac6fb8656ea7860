//! Gives freed heap memory back to the system.
//!
//! A write batch or a deploy compiles, diffs and encodes, and frees most of
//! what it allocated when it ends. glibc's allocator keeps such memory in
//! its per-thread arenas rather than returning it, so the service's RSS
//! would follow the largest transient peak of any thread, not what it
//! holds (measured in BENCHMARKS.md, "Service memory").
//!
//! A trim walks every arena, consolidates its free chunks and `madvise`s
//! free pages away: its cost grows with the heap, and each `madvise` shoots
//! down TLB entries on every core. In network mode every change ends one
//! sync per device, and trimming after each of them (32 devices, 100,000
//! rules: 32 walks of a 600 MB heap per change) took most of the service's
//! time (BENCHMARKS.md, "Agents"). So a request only asks for a trim: one
//! thread trims, then waits [`SPACING`] before the next, and the requests
//! that came meanwhile are served by one more trim after it. The last
//! request is always followed by a trim, at most [`SPACING`] later.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::OnceLock;
use std::time::Duration;

/// The least time between the ends of two trims.
const SPACING: Duration = Duration::from_millis(100);

/// Trims done (for tests).
static TRIMS: AtomicU64 = AtomicU64::new(0);

/// Asks for the free memory of every malloc arena to be returned to the
/// system (glibc; nothing elsewhere): soon, and once for all the requests
/// made meanwhile. Never blocks.
pub(crate) fn release_free_memory() {
    static TRIMMER: OnceLock<Option<SyncSender<()>>> = OnceLock::new();
    let trimmer = TRIMMER.get_or_init(|| {
        // One request waits while a trim runs or spaces; more are the same request.
        let (tx, rx) = sync_channel::<()>(1);
        let spawned = std::thread::Builder::new().name("subc-trim".into()).spawn(move || {
            while rx.recv().is_ok() {
                trim_now();
                std::thread::sleep(SPACING);
            }
        });
        spawned.ok().map(|_| tx)
    });
    match trimmer {
        // Full: a trim is already due, which serves this request too.
        Some(tx) => {
            let _ = tx.try_send(());
        }
        None => trim_now(),
    }
}

fn trim_now() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists, under
    // its locks; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
    TRIMS.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn requests_in_a_burst_share_trims_and_the_last_is_served() {
        let before = TRIMS.load(Ordering::Relaxed);
        let t = Instant::now();
        for _ in 0..10_000 {
            release_free_memory();
        }
        // Served: a trim follows the burst within about SPACING.
        let until = Instant::now() + Duration::from_secs(10);
        while TRIMS.load(Ordering::Relaxed) == before {
            assert!(Instant::now() < until, "no trim followed the requests");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(3 * SPACING);
        // Whoever asks (other tests too), trims end at least SPACING apart:
        // one running when we started, then one per SPACING.
        let (done, elapsed) = (TRIMS.load(Ordering::Relaxed) - before, t.elapsed());
        let most = 2 + (elapsed.as_millis() / SPACING.as_millis()) as u64;
        assert!(done <= most, "{done} trims in {elapsed:?} for 10,000 requests");
    }
}
