//! Work on many independent items (a tree's entries) on a few threads: on an NFS side each
//! item is a round trip, which one thread would wait for one after another.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// `f` on every item, on `threads` threads; the first error stops the rest (they take no
/// further item) and is the answer.
pub fn each_in_parallel<T: Sync, E: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let next = AtomicUsize::new(0);
    let first_error = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1).min(items.len()) {
            s.spawn(|| {
                while let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(e) = f(item) {
                        first_error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(e);
                        next.store(items.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
