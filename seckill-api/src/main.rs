//! seckill-api binary: the shared start-up (`seckill_service::main`; the service's part is
//! its `Service` implementation in `startup.rs`).

// glibc's malloc, free and consolidation were a fifth of this process' CPU under purchase load,
// mimalloc about an eighth (docs/benchmarks.md, "accepted path"); the gateway uses it too.
#[global_allocator]
static ALLOCATOR: seckill_alloc::MiMalloc = seckill_alloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    // `FAILPOINTS=name=action;…` arms failpoints for a fault drill (docs/failpoints.md).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    seckill_service::main::<seckill_api::Settings>()
}
