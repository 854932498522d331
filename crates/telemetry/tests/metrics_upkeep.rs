//! The recorder's upkeep keeps a process nobody scrapes from growing with every histogram
//! sample. Its own test binary, so it owns the process' recorder and its memory. Linux only
//! (it reads `/proc/self/status`), as every test of this workspace that needs the services.

use std::time::{Duration, Instant};

use seckill_telemetry::{UPKEEP_EVERY, metrics_handle, metrics_upkeeps};

/// Samples recorded between two looks at the process' memory: about 8 MB of them, kept.
const CHUNK: usize = 1_000_000;

/// Resident memory of this process, in bytes (`VmRSS`, whatever the page size).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .expect("VmRSS in kB");
    kib * 1024
}

/// Waits until the upkeep ran twice from now: at least once wholly after what came before.
fn wait_for_an_upkeep() {
    let start = metrics_upkeeps();
    let deadline = Instant::now() + 10 * UPKEEP_EVERY;
    while metrics_upkeeps() < start + 2 {
        assert!(
            Instant::now() < deadline,
            "no upkeep ran in {:?}",
            10 * UPKEEP_EVERY
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn histogram_samples_do_not_pile_up_in_a_process_nobody_scrapes() {
    let _recorder = metrics_handle();
    let histogram = metrics::histogram!("test_upkeep_seconds");
    let record = || {
        for i in 0..CHUNK {
            histogram.record(i as f64 * 1e-9);
        }
    };
    record();
    wait_for_an_upkeep();
    let after_first = rss_bytes();
    for _ in 0..3 {
        record();
        wait_for_an_upkeep();
    }
    let grown = rss_bytes().saturating_sub(after_first);
    // Kept, three more chunks grew this process by 47 MB (upkeep disabled); folded into
    // buckets, they reuse what the first one's samples took.
    assert!(
        grown < 12 << 20,
        "grew by {} MB over {} more samples",
        grown >> 20,
        3 * CHUNK
    );
}
