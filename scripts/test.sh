#!/usr/bin/env bash
# The whole test suite: makes the infrastructure ready, clears leftovers of crashed earlier
# runs, then runs the workspace's tests with cargo-nextest (.config/nextest.toml: one process
# per test, several at once, no retries) against the real Postgres, Redis and RabbitMQ:
# every test on the single Redis server, then on a local 3-master Redis Cluster
# (scripts/redis-cluster.sh) the tests that reach Redis (the `cluster` profile's filter),
# because every script and key layout must work on both.
# Arguments go to `cargo nextest run` (e.g. `scripts/test.sh -p gateway`,
# `scripts/test.sh -E 'test(purchase)'`, `scripts/test.sh --no-capture`);
# SECKILL_TEST_REDIS_MODES="single" (or "cluster") runs one pass only. A cluster the run
# started is stopped at its end; one that was already up and healthy is left as it was.
# First, for the whole suite (no arguments), the Kubernetes manifests rendered and checked
# offline (scripts/check-kubernetes.sh; SECKILL_TEST_KUBERNETES=0 skips it, =1 runs it with
# arguments too). Then, likewise, the fault matrix's fast scenarios
# (`scripts/chaos.sh --debug-build --prebuilt --fast`: on the binaries the test build made;
# its own stores, a few minutes);
# SECKILL_TEST_CHAOS=0 skips it, =1 runs it with arguments too.
# Last, likewise, the HTTP/1.1 parsers and the HS256 token check fuzzed for
# SECKILL_TEST_FUZZ_SECONDS (default 20) per target (`scripts/fuzz.sh`, its instrumented
# build run beside the tests; its long run is a documented command of its own);
# SECKILL_TEST_FUZZ=0 skips it, =1 runs it with arguments too.
# Set TEST_LOG=1 to see the services' logs in failing tests.
# It ends with the slowest tests and the wall time of each step, then
# `tests: N passed, N failed`; after a failed run, first
# with a list of what failed, so that the tail of a long log names it.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_cargo
"$SCRIPTS/infra.sh"
# The real client tools some tests drive (wrk, k6, promtool, schemathesis).
"$SCRIPTS/tools.sh"
PATH="$PATH:$HOME/.local/bin"
modes=${SECKILL_TEST_REDIS_MODES:-single cluster}
log=
# A cluster this run started (or had to rebuild) is stopped at the end; a healthy one stays.
started_cluster=0
# The fuzz build started in the background (below), when the run ends before it.
fuzz_build_pid=
cleanup() {
  [ -z "$fuzz_build_pid" ] || kill -- "-$fuzz_build_pid" 2>/dev/null || true
  [ -z "$log" ] || rm -f "$log" "$log".*.xml
  if ((started_cluster)); then
    "$SCRIPTS/redis-cluster.sh" stop >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
if [[ " $modes " == *" cluster "* ]]; then
  "$SCRIPTS/redis-cluster.sh" status >/dev/null 2>&1 || started_cluster=1
  "$SCRIPTS/redis-cluster.sh" start
fi
"$SCRIPTS/clean-test-state.sh" t_

cd "$ROOT"
# Keep cargo's output as it is, then close with one total over every test binary (the last
# binary cargo runs is usually a doc-test one with 0 tests, which says nothing on its own).
log=$(mktemp)
status=0
# The whole workspace, unless the arguments name packages (`-p`/`--package`).
scope=(--workspace)
packages=()
next_is_package=0
for arg in "$@"; do
  if ((next_is_package)); then
    packages+=("$arg")
    next_is_package=0
    continue
  fi
  case $arg in
    --) break ;;
    -p | --package) scope=() next_is_package=1 ;;
    --package=*) scope=() packages+=("${arg#--package=}") ;;
    -p*) scope=() packages+=("${arg#-p}") ;;
  esac
done
# The services' failpoint tests (docs/failpoints.md) are their own test binaries, built
# only with the `failpoints` feature: enabled in the same cargo run (one build), for the
# services it tests. Cargo refuses a feature of a package the run does not build.
features=()
for service in seckill-api order-service; do
  if ((${#scope[@]} > 0)) || [[ " ${packages[*]-} " == *" $service "* ]]; then
    features+=("$service/failpoints")
  fi
done
if ((${#features[@]} > 0)); then
  scope+=(--features "$(IFS=,; echo "${features[*]}")")
fi
# Where the run's time goes: each step's wall time, listed at the end.
step_times=()
step_name=
step_started=$SECONDS
step() { # step NAME: ends the step under way, if any, and starts NAME ("" starts none)
  [ -z "$step_name" ] || step_times+=("$step_name $((SECONDS - step_started)) s")
  step_name=$1
  step_started=$SECONDS
}
# The Kubernetes manifests, rendered and checked offline (a few seconds), for the whole
# suite; SECKILL_TEST_KUBERNETES=0 skips it, =1 runs it with arguments too.
kubernetes=${SECKILL_TEST_KUBERNETES:-$((($# == 0) ? 1 : 0))}
if [ "$kubernetes" = 1 ]; then
  step "kubernetes"
  say "the Kubernetes manifests: scripts/check-kubernetes.sh"
  kubernetes_status=0
  "$SCRIPTS/check-kubernetes.sh" 2>&1 | tee -a "$log" || kubernetes_status=$?
  if ((kubernetes_status != 0)); then
    status=$kubernetes_status
    grep -Eq '^kubernetes: [0-9]+ passed, [0-9]+ failed$' "$log" ||
      echo "kubernetes: 0 passed, 1 failed" | tee -a "$log"
  fi
fi
# The test binaries, built once for both passes.
step "test build"
say "cargo nextest run --no-run ${scope[*]-} $*"
cargo nextest run --no-run "${scope[@]}" "$@" 2>&1 | tee -a "$log" || status=$?
fuzz=${SECKILL_TEST_FUZZ:-$((($# == 0) ? 1 : 0))}
if [ "$fuzz" = 1 ]; then
  # The fuzz targets' instrumented build (a target dir of its own) goes on while the tests
  # run: they wait on servers more than they use the CPU.
  fuzz_build_log=$(mktemp)
  # A process group of its own, so that an early end stops cargo with it.
  setsid "$SCRIPTS/fuzz.sh" --build-only >"$fuzz_build_log" 2>&1 &
  fuzz_build_pid=$!
fi
for mode in $modes; do
  case "$mode" in
    single)
      unset SECKILL_TEST_REDIS_CLUSTER
      profile=default
      ;;
    cluster)
      SECKILL_TEST_REDIS_CLUSTER=$("$SCRIPTS/redis-cluster.sh" url)
      export SECKILL_TEST_REDIS_CLUSTER
      profile=cluster
      ;;
    *) die "unknown Redis mode '$mode' (single or cluster)" ;;
  esac
  step "Redis $mode pass"
  say "cargo nextest run --profile $profile ${scope[*]-} $* (Redis: $mode)"
  # The pass, in the log too: the list of failures at the end says which one failed.
  echo "test pass: Redis $mode" >>"$log"
  cargo nextest run --profile "$profile" "${scope[@]}" "$@" 2>&1 | tee -a "$log" || status=$?
  junit="$ROOT/target/nextest/$profile/junit.xml"
  [ ! -f "$junit" ] || cp "$junit" "$log.$profile.xml"
done
# nextest runs no doc-tests: cargo's own runner does, once (they touch no server).
if ((${#packages[@]} == 0)) && [[ " $* " != *" -E "* ]]; then
  step "doc-tests"
  say "cargo test --doc ${scope[*]-}"
  cargo test --doc "${scope[@]}" 2>&1 | tee -a "$log" || status=$?
fi
chaos=${SECKILL_TEST_CHAOS:-$((($# == 0) ? 1 : 0))}
if [ "$chaos" = 1 ]; then
  # After a whole-workspace test build, the binaries it made (seckill-chaos too: loadtest has
  # an integration test) are the ones to run; after a subset, chaos.sh builds them.
  chaos_args=(--debug-build --fast)
  ((${#packages[@]} > 0)) || chaos_args+=(--prebuilt)
  step "fault matrix"
  say "fault matrix, fast scenarios: scripts/chaos.sh ${chaos_args[*]}"
  chaos_status=0
  "$SCRIPTS/chaos.sh" "${chaos_args[@]}" 2>&1 | tee -a "$log" || chaos_status=$?
  if ((chaos_status != 0)); then
    status=$chaos_status
    # A matrix that could not run at all printed no total of its own: count it as a failure.
    grep -Eq '^chaos: [0-9]+ passed, [0-9]+ failed$' "$log" || echo "chaos: 0 passed, 1 failed" | tee -a "$log"
  fi
fi
if [ "$fuzz" = 1 ]; then
  fuzz_seconds=${SECKILL_TEST_FUZZ_SECONDS:-20}
  step "fuzzing (the rest of its build included)"
  say "the HTTP/1.1 parsers and the HS256 check fuzzed: scripts/fuzz.sh --seconds $fuzz_seconds"
  fuzz_status=0
  # The build started before the tests: its log, and its failure, count here.
  wait "$fuzz_build_pid" || fuzz_status=$?
  fuzz_build_pid=
  cat "$fuzz_build_log" >>"$log"
  if ((fuzz_status != 0)); then
    tail -n 40 "$fuzz_build_log"
    echo "fuzz: build FAILED" | tee -a "$log"
  else
    "$SCRIPTS/fuzz.sh" --seconds "$fuzz_seconds" 2>&1 | tee -a "$log" || fuzz_status=$?
  fi
  rm -f "$fuzz_build_log"
  if ((fuzz_status != 0)); then
    status=$fuzz_status
    grep -Eq '^fuzz: [0-9]+ passed, [0-9]+ failed$' "$log" || echo "fuzz: 0 passed, 1 failed" | tee -a "$log"
  fi
fi
step ""
# nextest's summary of each pass (`Summary [...] N tests run: P passed (S slow), F failed,
# ...`), cargo's doc-test results, and the chaos and fuzz totals.
totals=$(awk '
  /^ *Summary \[.*tests? run:/ {
    if (match($0, /[0-9]+ passed/)) passed += substr($0, RSTART, RLENGTH) + 0
    if (match($0, /[0-9]+ failed/)) failed += substr($0, RSTART, RLENGTH) + 0
    if (match($0, /[0-9]+ timed out/)) failed += substr($0, RSTART, RLENGTH) + 0
    next
  }
  /^test result:/ { passed += $4; failed += $6 }
  /^(chaos|fuzz|kubernetes): [0-9]+ passed, [0-9]+ failed$/ { passed += $2; failed += $4 }
  END { printf "%d passed, %d failed", passed, failed }' "$log")
# The slowest tests of the run, from nextest's JUnit reports: where the time goes.
slowest=$(python3 "$SCRIPTS/slowest-tests.py" 15 "$log".*.xml 2>/dev/null || true)
if [ -n "$slowest" ]; then
  echo "slowest tests:"
  sed 's/^/  /' <<<"$slowest"
fi
# What failed, named again at the very end: a kept tail of a long log then says which test,
# scenario or target it was, and where it panicked.
failures=$(awk '
  /^test pass: / { pass = $0; next }
  /^thread .+ panicked at / { print; if ((getline message) > 0) print "  " message; next }
  /^  process didn.t exit successfully: .*signal/ { print; next }
  /^seckill-chaos: (.* \.\.\.|starting .*)$/ { next }
  /^test .+ \.\.\. FAILED$/ { print $0 (pass == "" ? "" : "  (" pass ")"); next }
  /^ *(FAIL|TIMEOUT|SIGSEGV|SIGABRT|SIGKILL|ABORT|LEAK-FAIL) \[/ {
    sub(/^ +/, ""); print $0 (pass == "" ? "" : "  (" pass ")"); next
  }
  /^(FAIL|ERROR): test|^FAIL |^fuzz: .+ FAILED|^seckill-chaos: |^error(\[E[0-9]+\])?: / { print }
' "$log" | awk '!seen[$0]++' | head -n 60 || true)
if ((${#step_times[@]} > 0)); then
  echo "time per step:"
  printf '  %s\n' "${step_times[@]}"
fi
if ((status != 0)) && [ -n "$failures" ]; then
  echo "failures:"
  sed 's/^/  /' <<<"$failures"
fi
echo "tests: $totals"
exit "$status"
