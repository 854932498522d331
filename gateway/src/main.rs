//! gateway binary: the shared start-up (`seckill_service::main`; the service's part is its
//! `Service` implementation in `startup.rs`).

#[global_allocator]
static ALLOCATOR: seckill_alloc::MiMalloc = seckill_alloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    seckill_service::main::<gateway::Settings>()
}
