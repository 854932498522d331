//! What the seckill-api benches share: the CPU each process used during a run (from
//! `/proc`), waiting for a quiet machine before one, and medians.

use std::time::{Duration, Instant};

use seckill_store::RedisConn;

/// Linux reports process CPU time in ticks of 1/100 s.
pub const CLK_TCK: f64 = 100.0;

/// The processes whose CPU time each run reports.
pub struct Procs {
    named: Vec<(&'static str, Vec<u32>)>,
    /// Label of the CPU time of our waited-for children (a load generator we spawned).
    children: Option<&'static str>,
}

/// CPU ticks per process group, plus the whole machine's.
pub struct CpuSample {
    at: Instant,
    ticks: Vec<(&'static str, u64)>,
    /// Busy and interrupt ticks of the whole machine.
    machine: (u64, u64),
}

impl Procs {
    /// `own` (the bench's processes), then the Redis server behind `redis` and RabbitMQ's
    /// `beam.smp`; with `children`, our children's time too, under that label.
    pub async fn find(
        redis: &mut RedisConn,
        own: Vec<(&'static str, Vec<u32>)>,
        children: Option<&'static str>,
    ) -> Self {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(redis)
            .await
            .unwrap_or_default();
        let redis_pid: Vec<u32> = info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok())
            .into_iter()
            .collect();
        let beams: Vec<u32> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "beam.smp")
            })
            .collect();
        let mut named = own;
        named.push(("redis", redis_pid));
        named.push(("rabbitmq", beams));
        Self { named, children }
    }

    /// The ticks of every group now.
    pub fn sample(&self) -> CpuSample {
        let mut ticks: Vec<(&'static str, u64)> = self
            .named
            .iter()
            .map(|(name, pids)| (*name, pids.iter().map(|p| proc_ticks(*p).0).sum()))
            .collect();
        if let Some(label) = self.children {
            ticks.push((label, proc_ticks(std::process::id()).1));
        }
        CpuSample {
            at: Instant::now(),
            ticks,
            machine: machine_ticks(),
        }
    }
}

impl CpuSample {
    /// "api 1.10, redis 0.60, ..., other 0.05": cores each used since `earlier`.
    pub fn usage_since(&self, earlier: &CpuSample, busy_before: f64) -> String {
        let secs = self.at.duration_since(earlier.at).as_secs_f64().max(1e-3);
        let cores = |now: u64, then: u64| now.saturating_sub(then) as f64 / CLK_TCK / secs;
        let mut accounted = 0.0;
        let mut parts = Vec::new();
        for ((name, now), (_, then)) in self.ticks.iter().zip(&earlier.ticks) {
            let used = cores(*now, *then);
            accounted += used;
            if used >= 0.005 {
                parts.push(format!("{name} {used:.2}"));
            }
        }
        let machine = cores(self.machine.0, earlier.machine.0);
        let interrupts = cores(self.machine.1, earlier.machine.1);
        parts.push(format!("irq/softirq {interrupts:.2}"));
        parts.push(format!(
            "other {:.2}",
            (machine - accounted - interrupts).max(0.0)
        ));
        format!("{} (busy before: {busy_before:.2})", parts.join(", "))
    }
}

/// (utime + stime, cutime + cstime) of `pid`, in ticks; zeros when unreadable.
fn proc_ticks(pid: u32) -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return (0, 0);
    };
    // Fields after the parenthesised name, which may hold spaces; utime is field 14.
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    match fields[..] {
        [utime, stime, cutime, cstime] => (utime + stime, cutime + cstime),
        _ => (0, 0),
    }
}

/// Busy ticks of all CPUs (everything but idle and iowait) and the part of them spent in
/// interrupts and softirqs (on loopback, much of TCP), from `/proc/stat`.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let values: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let field = |i: usize| values.get(i).copied().unwrap_or(0);
    let total: u64 = values.iter().sum();
    (
        total.saturating_sub(field(3) + field(4)),
        field(5) + field(6),
    )
}

/// Waits until the whole machine is busy with at most `quiet_below` cores over a second,
/// for at most `wait_secs`; returns the last busy reading.
pub async fn wait_for_quiet(quiet_below: f64, wait_secs: u64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(wait_secs);
    loop {
        let (before, at) = (machine_ticks().0, Instant::now());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let busy =
            machine_ticks().0.saturating_sub(before) as f64 / CLK_TCK / at.elapsed().as_secs_f64();
        if busy <= quiet_below || Instant::now() >= deadline {
            return busy;
        }
    }
}

/// The machine's load averages, "1 5 15".
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The median of `values` (0 when empty).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}
