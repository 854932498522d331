//! order-service binary: the shared start-up (`seckill_service::main`; the service's part is
//! its `Service` implementation in `startup.rs`), or an operator command (see
//! [`order_service::cli`]).

use clap::Parser;

use order_service::Settings;
use order_service::cli::Cli;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // `FAILPOINTS=name=action;…` arms failpoints for a fault drill (docs/failpoints.md).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    match cli.command {
        // An operator command serves nobody and signs nothing: no secret check.
        Some(command) => {
            seckill_service::command(
                |settings: Settings| async move { command.run(&settings).await },
            )
        }
        None => seckill_service::main::<Settings>(),
    }
}
