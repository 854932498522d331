//! The allocator of the gateway and seckill-api, mimalloc, and the two calls around it that
//! safe Rust cannot make: [`collect`] (the gateway's workers call it) and [`no_huge_pages`]
//! (both services' `main` calls it first).
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

/// Keeps this process' memory in 4 KiB pages: no transparent huge pages from here on.
///
/// mimalloc reserves its arena (1 GiB of address space) and asks the kernel for transparent
/// huge pages on it (`madvise(MADV_HUGEPAGE)`), so on a kernel whose THP mode is `madvise`
/// (Debian's) or `always`, the first touch of any 2 MiB of the arena makes all of it
/// resident. A service whose heap is a few MB spread over the arena is then charged in 2 MiB
/// steps: seckill-api measured 58 MB resident at start with 36 MB of huge pages, 39 MB
/// without, and the gateway stayed ~5 MB higher through a million-buyer flood
/// (`docs/benchmarks.md`). Neither's throughput measurably gained from the fewer TLB misses.
///
/// Call it first in `main`: memory touched before stays in the pages it got. It sets the
/// process-wide flag of `prctl(PR_SET_THP_DISABLE)`, which children inherit; where the
/// kernel refuses it (before Linux 3.15), nothing changes and it returns `false`.
#[cfg(target_os = "linux")]
pub fn no_huge_pages() -> bool {
    // SAFETY: this prctl takes integers only, touches no memory of ours, and only changes
    // which page size the kernel backs this process' later page faults with.
    #[allow(unsafe_code)]
    let status = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    status == 0
}

/// Elsewhere there are no transparent huge pages to keep off.
#[cfg(not(target_os = "linux"))]
pub fn no_huge_pages() -> bool {
    false
}
