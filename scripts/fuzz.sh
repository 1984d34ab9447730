#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, docs/fuzzing.md) into ./build-fuzz with clang, ASan and UBSan,
# then runs each for SECONDS (default 60) and prints executions, coverage and findings per target.
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 600 shard_header safetensors
# Environment:
#   CEMFRAC_FUZZ_BUILD_DIR  build directory (default ./build-fuzz); extra cmake arguments for the first
#                           configure go in CEMFRAC_FUZZ_CMAKE_ARGS (e.g. -DCCACHE_PROGRAM=...)
#   CEMFRAC_FUZZ_PARALLEL=1 run the targets at the same time instead of one after another
#   CEMFRAC_FUZZ_NICE       niceness of the fuzz processes (default 19)
#   CEMFRAC_FUZZ_ARGS       extra libFuzzer flags (e.g. -rss_limit_mb=4096)
#   CEMFRAC_FUZZ_NO_BUILD=1 run what is built, without building
# Each target reads the committed seeds fuzz/corpus/<target>/ (never written) and keeps what it finds
# in <build>/corpus/<target>/; a crashing input lands in <build>/findings/<target>/ and the script
# exits 1. Logs: <build>/logs/<target>.log. The normal build (./build) and CI are not touched.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CEMFRAC_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${1:-60}"
[[ $# -gt 0 ]] && shift
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -lt 1 ]]; then
  echo "fuzz.sh: SECONDS must be a positive integer, not '$seconds'" >&2
  exit 2
fi

if [[ "${CEMFRAC_FUZZ_NO_BUILD:-0}" != 1 ]]; then
  if [[ ! -f "$build/build.ninja" ]]; then
    # shellcheck disable=SC2086
    CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCEMFRAC_BUILD_FUZZ=ON -DCEMFRAC_BUILD_TESTS=OFF -DCEMFRAC_BUILD_BENCH=OFF \
      ${CEMFRAC_FUZZ_CMAKE_ARGS:-}
  fi
  cmake --build "$build" --target fuzz_all -- -j"$(nproc)"
fi

if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  targets=()
  for src in "$root"/fuzz/fuzz_*.cpp; do
    name="$(basename "$src" .cpp)"
    targets+=("${name#fuzz_}")
  done
fi

mkdir -p "$build/logs"
# LibTorch's and OpenBLAS's thread pools are not part of what is fuzzed; one thread keeps runs cheap.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

run_one() {
  local t="$1" exe="$build/fuzz/fuzz_$1"
  if [[ ! -x "$exe" ]]; then
    echo "fuzz.sh: $exe is not built (unknown target '$t'?)" >&2
    return 2
  fi
  mkdir -p "$build/corpus/$t" "$build/findings/$t"
  # shellcheck disable=SC2086
  nice -n "${CEMFRAC_FUZZ_NICE:-19}" "$exe" -max_total_time="$seconds" -timeout=60 \
    -rss_limit_mb=3072 -print_final_stats=1 -artifact_prefix="$build/findings/$t/" \
    ${CEMFRAC_FUZZ_ARGS:-} "$build/corpus/$t" "$root/fuzz/corpus/$t" >"$build/logs/$t.log" 2>&1
}

pids=()
status=0
for t in "${targets[@]}"; do
  echo "fuzz.sh: $t for ${seconds}s (log: $build/logs/$t.log)"
  if [[ "${CEMFRAC_FUZZ_PARALLEL:-0}" == 1 ]]; then
    run_one "$t" &
    pids+=($!)
  else
    run_one "$t" || status=1
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done

printf '\n%-20s %12s %8s %8s %8s  %s\n' target executions cov ft corpus findings
for t in "${targets[@]}"; do
  log="$build/logs/$t.log"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  last="$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)"
  # -fork=N runs (e.g. CEMFRAC_FUZZ_ARGS="-fork=1 -ignore_crashes=1") print no final stats.
  [[ -z "$execs" ]] && execs="$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
  corp="$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")"
  found="$(find "$build/findings/$t" -type f 2>/dev/null | wc -l)"
  printf '%-20s %12s %8s %8s %8s  %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$found"
  if [[ "$found" != 0 ]]; then
    status=1
    find "$build/findings/$t" -type f | sed 's/^/    /'
  fi
done
exit "$status"
