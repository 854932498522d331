//! The two request series every service exports: `http_requests_total` (by service, route,
//! method, status) and `http_request_duration_seconds` (by service, route, method).
//!
//! Handles are kept per thread once registered: looking a series up in the recorder builds
//! its key (allocating each label) and takes a lock, on every request. Labels stay few by
//! construction: routes are templates or fixed names, methods outside the standard ones
//! are `other` (a client must not create series at will), statuses are three digits.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use metrics::{Counter, Histogram};

/// The method as a metric label: the standard ones by name, anything else `other`.
pub fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// A metric series of one (service, route, method, status).
struct Series {
    requests: Counter,
    duration: Histogram,
}

/// Registered handles by (service, method, status), then by route.
type Registered = HashMap<(&'static str, &'static str, u16), HashMap<Box<str>, Series>>;

thread_local! {
    static SERIES: RefCell<Registered> = RefCell::new(HashMap::new());
}

/// Counts one answer of `service` to a `method` request (a [`method_label`]) on `route`, and
/// the time it took.
pub fn record(
    service: &'static str,
    route: &str,
    method: &'static str,
    status: StatusCode,
    elapsed: Duration,
) {
    SERIES.with_borrow_mut(|registered| {
        let by_route = registered
            .entry((service, method, status.as_u16()))
            .or_default();
        let series = match by_route.get(route) {
            Some(series) => series,
            None => by_route.entry(route.into()).or_insert_with(|| Series {
                requests: metrics::counter!("http_requests_total", "service" => service,
                    "route" => route.to_owned(), "method" => method,
                    "status" => status.as_str().to_owned()),
                duration: metrics::histogram!("http_request_duration_seconds",
                    "service" => service, "route" => route.to_owned(), "method" => method),
            }),
        };
        series.requests.increment(1);
        series.duration.record(elapsed.as_secs_f64());
    });
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    #[test]
    fn answers_are_counted_per_series_and_odd_methods_share_one() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            for method in ["BREW", "FOO", "BAR"] {
                let method = Method::from_bytes(method.as_bytes()).expect("method");
                record(
                    "metrics-test",
                    "/api/x/{id}",
                    method_label(&method),
                    StatusCode::OK,
                    Duration::from_millis(3),
                );
            }
            record(
                "metrics-test",
                "/api/x/{id}",
                method_label(&Method::POST),
                StatusCode::CONFLICT,
                Duration::from_millis(1),
            );
        });
        let text = handle.render();
        let sample = |series: &str| {
            text.lines()
                .filter_map(|line| line.rsplit_once(' '))
                .find(|(name, _)| *name == series)
                .map(|(_, value)| value.to_string())
        };
        let labels = r#"service="metrics-test",route="/api/x/{id}""#;
        assert_eq!(
            sample(&format!(
                r#"http_requests_total{{{labels},method="other",status="200"}}"#
            ))
            .as_deref(),
            Some("3"),
            "{text}"
        );
        assert_eq!(
            sample(&format!(
                r#"http_requests_total{{{labels},method="POST",status="409"}}"#
            ))
            .as_deref(),
            Some("1"),
            "{text}"
        );
        assert_eq!(
            sample(&format!(
                r#"http_request_duration_seconds_count{{{labels},method="other"}}"#
            ))
            .as_deref(),
            Some("3"),
            "{text}"
        );
        assert!(!text.contains("BREW"), "{text}");
    }
}
