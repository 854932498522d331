//! Failpoints: named step boundaries of the operations that write to more than one place
//! or make more than one call, where a test or a fault drill injects a failure between two
//! steps (the table of them all: `docs/failpoints.md`).
//!
//! [`failpoint!`](crate::failpoint) compiles to nothing unless the crate that *uses* it
//! enables its own `failpoints` feature (which enables the `fail` crate's): the `cfg` in
//! its expansion is judged where it expands. Release builds therefore carry no failpoint,
//! not even its name. Armed (`fail::cfg`, or `FAILPOINTS=name=action;…` read by the
//! binaries' `fail::FailScenario::setup()`), a failpoint can:
//! - `return`: end the operation with the error its next step would give had that call
//!   failed (a Redis, AMQP or Postgres error), or, in a step that returns nothing, abandon
//!   the operation there, as a task that died would;
//! - `return(abort)`: abort the process on the spot (`std::process::abort`), a crash;
//! - `panic`, `sleep(ms)` (blocks the thread), `pause`, and counts such as `1*return`.

/// A failpoint named `$name` (`<operation>::<step>`): when armed with `return`, the
/// enclosing function returns `$returned` (evaluated only then); with `return(abort)` the
/// process aborts. Nothing at all without the using crate's `failpoints` feature.
#[macro_export]
macro_rules! failpoint {
    ($name:literal, $returned:expr) => {
        #[cfg(feature = "failpoints")]
        ::fail::fail_point!($name, |action: ::std::option::Option<
            ::std::string::String,
        >| {
            $crate::failpoint::abort_if_asked($name, action.as_deref());
            $returned
        });
    };
}

/// Aborts the process when a failpoint's `return` names `abort`: the crash a fault drill
/// asks for. Logged first, so the drill's log says which failpoint it was. Any other
/// return is logged and counted (`failpoints_fired_total{failpoint}`), so a test can tell
/// that its failpoint fired.
pub fn abort_if_asked(name: &'static str, action: Option<&str>) {
    if action == Some("abort") {
        tracing::error!(failpoint = name, "failpoint: aborting the process");
        eprintln!("failpoint {name}: aborting the process");
        std::process::abort();
    }
    tracing::warn!(failpoint = name, "failpoint: returning early");
    metrics::counter!("failpoints_fired_total", "failpoint" => name).increment(1);
}

/// The I/O error a failpoint hands to the client library it stands in for: a connection
/// reset, as a store that went away gives it.
pub fn connection_reset() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "connection reset (failpoint)",
    )
}
