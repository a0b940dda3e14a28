//! One rayon pool per process for decoding, rebuilt after `fork`: a pool's threads do not
//! exist in a forked child (e.g. a PyTorch DataLoader worker), so a child that used the
//! parent's pool would hang. The pool is keyed by process id and thread count.

use std::sync::{Arc, Mutex};

use rayon::{ThreadPool, ThreadPoolBuilder};

struct Cached {
    pid: u32,
    threads: usize,
    pool: Arc<ThreadPool>,
}

static POOL: Mutex<Option<Cached>> = Mutex::new(None);

/// Threads to use when the caller passes 0: the CPUs this process may run on.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Builds a pool of `threads` workers (0 = one per CPU) named `eagle-io-{role}-N`.
pub fn build(threads: usize, role: &str) -> ThreadPool {
    let threads = if threads == 0 { default_threads() } else { threads };
    let role = role.to_owned();
    ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("eagle-io-{role}-{i}"))
        .build()
        .expect("spawning pool threads")
}

/// The process-wide reader pool with `threads` workers, created on first use in each process.
pub fn shared(threads: usize) -> Arc<ThreadPool> {
    let pid = std::process::id();
    // The lock is held only to look the pool up or build it, never across decoding.
    let mut slot = POOL.lock().unwrap_or_else(|p| p.into_inner());
    match slot.as_ref() {
        Some(c) if c.pid == pid && c.threads == threads => c.pool.clone(),
        _ => {
            let pool = Arc::new(build(threads, "read"));
            *slot = Some(Cached {
                pid,
                threads,
                pool: pool.clone(),
            });
            pool
        }
    }
}
