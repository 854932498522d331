#!/usr/bin/env bash
# Fuzzes the gateway's hand-written HTTP/1.1 parsers (crates/http1) with cargo-fuzz
# (libFuzzer): the request head, the chunked body decoder and the upstream response head;
# and seckill-auth's HS256 token check against jsonwebtoken (the targets in
# fuzz/fuzz_targets), each for a bounded time, one after the other on one core.
#
#   scripts/fuzz.sh [--seconds N] [target...]     # default: 60 s each, every target
#   scripts/fuzz.sh --build-only [target...]      # build them and stop (the suite builds
#                                                 # them while its tests run)
#
# Seeds come from fuzz/corpus/<target> (committed, read only); what the fuzzer adds
# goes to $SECKILL_FUZZ_DIR/corpus/<target> and is reused by the next run. A crash or a broken
# property ends the run non-zero, with the path of the input that did it (replay it with
# `cargo fuzz run <target> <path>` from the repository root).
#
# No nightly toolchain is needed: RUSTC_BOOTSTRAP=1 lets the stable compiler take the -Z
# flags cargo-fuzz passes. cargo-fuzz is installed (into ~/.cargo/bin) when missing.
# SECKILL_FUZZ_SANITIZER=none builds without AddressSanitizer (the default is address);
# SECKILL_FUZZ_DIR (default target/fuzz under CARGO_TARGET_DIR or the repository) holds the
# build and the grown corpus.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

seconds=60
build_only=0
targets=()
while (($#)); do
  case $1 in
    --build-only) build_only=1; shift ;;
    --seconds) seconds=${2:?--seconds needs a number}; shift 2 ;;
    --seconds=*) seconds=${1#--seconds=}; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "--seconds wants a positive whole number, not '$seconds'"

require_cargo
if ! cargo fuzz --version >/dev/null 2>&1; then
  say "installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi

fuzz_project="$ROOT/fuzz"
work=${SECKILL_FUZZ_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/fuzz}
sanitizer=${SECKILL_FUZZ_SANITIZER:-address}
export RUSTC_BOOTSTRAP=1
fuzz=(cargo fuzz)
common=(--fuzz-dir "$fuzz_project" --sanitizer "$sanitizer" --target-dir "$work/build")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <("${fuzz[@]}" list --fuzz-dir "$fuzz_project")
fi

say "building ${targets[*]} (sanitizer: $sanitizer)"
for target in "${targets[@]}"; do
  "${fuzz[@]}" build "${common[@]}" "$target"
done
((build_only == 0)) || exit 0

status=0
passed=0
for target in "${targets[@]}"; do
  corpus="$work/corpus/$target"
  artifacts="$work/artifacts/$target/"
  mkdir -p "$corpus" "$artifacts"
  log="$work/$target.log"
  say "fuzzing $target for ${seconds}s (log: $log)"
  # -jobs=1 stays on one core; the grown corpus first (new inputs go there), the seeds after.
  if "${fuzz[@]}" run "${common[@]}" "$target" "$corpus" "$fuzz_project/corpus/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$artifacts" \
    -max_len=8192 -timeout=10 -rss_limit_mb=2048 >"$log" 2>&1; then
    # The last status line: executions, coverage, corpus size, the rate.
    summary=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)
    echo "fuzz: $target ok: ${summary:-no summary}"
    passed=$((passed + 1))
  else
    status=1
    tail -n 40 "$log" >&2
    found=$(grep -oE '(Test unit|artifact) written to [^ ]+' "$log" | awk '{print $NF}' | tail -n 1 || true)
    echo "fuzz: $target FAILED; input: ${found:-see $log}" >&2
  fi
done
echo "fuzz: $passed passed, $((${#targets[@]} - passed)) failed"
exit "$status"
