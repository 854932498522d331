//! The allocator of the gateway and seckill-api, mimalloc, and the one call into it that
//! safe Rust cannot make: [`collect`] (the gateway's workers call it).
//!
//! mimalloc keeps a freed page with the thread that allocated it until that thread
//! allocates or collects again, and a page freed by another thread waits for its owner the
//! same way. A thread that goes idle after a flood therefore holds what the flood left: the
//! gateway, whose housekeeping drops the rate limiter's buckets of a million one-shot buyers
//! that its workers made, kept 50–78 MB of them while idle against 26 MB of live state.
//! [`collect`], called by each such thread from time to time, hands them back.

pub use mimalloc::MiMalloc;

/// Returns to mimalloc's arenas what this thread freed, or was freed for it, since it last
/// ran, and to the system what has stayed unused there for longer than mimalloc's purge
/// delay. Costs a few microseconds when there is little to do; frees nothing when the
/// global allocator is not mimalloc (as in tests), where mimalloc holds nothing.
pub fn collect() {
    // SAFETY: `mi_collect` takes no pointer, reads only the calling thread's heap and the
    // shared arenas (under mimalloc's own synchronisation), and may be called at any time
    // from any thread, mimalloc initialised or not.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(false);
    }
}
