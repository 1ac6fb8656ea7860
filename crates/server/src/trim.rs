//! Gives freed heap memory back to the system.
//!
//! A write batch or a deploy compiles, diffs and encodes, and frees most of
//! what it allocated when it ends. glibc's allocator keeps such memory in
//! its per-thread arenas rather than returning it, so the service's RSS
//! would follow the largest transient peak of any thread, not what it
//! holds (measured in BENCHMARKS.md, "Service memory"). Trimming after each
//! batch and each deploy costs well under a millisecond.

/// Returns the free memory of every malloc arena to the system (glibc);
/// nothing elsewhere.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists, under
    // its locks; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
