-- wrk script of scripts/bench-gateway.sh: no per-request Lua (wrk sends its pre-built
-- request), only one machine-readable line at the end, from the same histogram wrk's
-- --latency table is printed from, in microseconds instead of rounded milliseconds.
function done(summary, latency, requests)
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%.0f p90_us=%.0f p99_us=%.0f "
      .. "p999_us=%.0f max_us=%.0f connect_err=%d read_err=%d write_err=%d "
      .. "timeout_err=%d non2xx=%d\n",
    summary.requests, summary.duration, summary.requests / seconds,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max,
    e.connect, e.read, e.write, e.timeout, e.status))
end
