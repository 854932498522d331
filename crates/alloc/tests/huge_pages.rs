//! mimalloc's arena stays in 4 KiB pages once [`seckill_alloc::no_huge_pages`] ran: the
//! kernel reports the process' huge pages off, and what the process touches after the call
//! adds none, while the same allocations before it did (the control, which needs a kernel
//! with THP in `madvise` or `always` mode, and one that had a huge page to give: when it fell
//! back to small pages, `thp_fault_fallback` in `/proc/vmstat` says so, and the control
//! proves nothing that time).

#![cfg(target_os = "linux")]

#[global_allocator]
static ALLOCATOR: seckill_alloc::MiMalloc = seckill_alloc::MiMalloc;

/// Enough small blocks to touch many 2 MiB stretches of the arena (the services' heap is
/// made of such blocks; a single large one would be mapped apart from the arena).
const BLOCKS: usize = 16 * 1024;
const BLOCK: usize = 1024;

/// `AnonHugePages` of this process, in kB.
fn huge_kb() -> u64 {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
    rollup
        .lines()
        .find_map(|line| line.strip_prefix("AnonHugePages:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("an AnonHugePages line")
}

/// `THP_enabled` of this process (`/proc/self/status`, Linux 5.0 and later): whether the
/// kernel may back its memory with huge pages. `None` on older kernels.
fn thp_enabled() -> Option<bool> {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("THP_enabled:"))
        .map(|value| value.trim() == "1")
}

/// How often, machine-wide, a page fault asked for a huge page and got small ones.
fn thp_fallbacks() -> u64 {
    let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    vmstat
        .lines()
        .find_map(|line| line.strip_prefix("thp_fault_fallback "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

/// 16 MiB in 1 KiB blocks, each written, kept alive by the caller.
fn touch() -> Vec<Box<[u8]>> {
    (0..BLOCKS)
        .map(|i| vec![u8::try_from(i % 251).expect("below 256"); BLOCK].into_boxed_slice())
        .collect()
}

#[test]
fn memory_touched_after_the_call_is_not_in_huge_pages() {
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.is_empty() || thp.contains("[never]") {
        eprintln!("this kernel gives no transparent huge pages ({thp:?}): nothing to keep off");
        return;
    }

    if thp_enabled() == Some(false) {
        // Inherited from a parent that made the call, or mimalloc told to keep off them.
        eprintln!("huge pages are off for this process already: nothing to compare against");
        return;
    }
    let (before, fallbacks) = (huge_kb(), thp_fallbacks());
    let first = touch();
    let grown_before = huge_kb().saturating_sub(before);
    // The control: without the call, mimalloc's arena gets huge pages, unless the kernel had
    // none to give just then (memory too fragmented), which it counts.
    if thp_fallbacks() == fallbacks {
        assert!(
            grown_before >= 2048,
            "16 MiB touched before the call added only {grown_before} kB of huge pages"
        );
    } else {
        eprintln!("the kernel fell back to small pages: the control proves nothing this time");
    }

    assert!(
        seckill_alloc::no_huge_pages(),
        "prctl(PR_SET_THP_DISABLE) refused"
    );
    assert_ne!(
        thp_enabled(),
        Some(true),
        "huge pages still on after the call"
    );
    let middle = huge_kb();
    let second = touch();
    let grown_after = huge_kb().saturating_sub(middle);
    assert_eq!(
        grown_after, 0,
        "16 MiB touched after the call added {grown_after} kB of huge pages"
    );
    assert_eq!(first.len() + second.len(), 2 * BLOCKS);
}
