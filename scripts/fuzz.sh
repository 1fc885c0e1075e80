#!/usr/bin/env bash
# scripts/fuzz.sh -- build the libFuzzer targets (tests/fuzz, clang, ASan+UBSan) and run each for FUZZ_SECONDS.
# `make fuzz` (FUZZ_SECONDS default 60) and `make test` call it.
#
#   targets: npy, safetensors (tools/io readers), cli (tools/cli.c argument parser), quantize (mxfp8_quantize /
#            mxfp8_dequantize vs the reference group quantizer), moe (mxfp8_moe_route and mxfp8_moe_backward on
#            arbitrary token / expert ids: accepted exactly when valid). Default: all five.
#   Seeds:   tests/fuzz/corpus/<target>/ (committed; regenerate with tests/fuzz/make_corpus.py). Inputs the run finds
#            go to $FUZZ_BUILD/corpus/<target>/ (not committed), crashes to $FUZZ_BUILD/artifacts/.
#   Limits:  inputs are at most -max_len (8 KiB; quantize 4 KiB) bytes, and -malloc_limit_mb fails the run on any
#            single allocation above 1 MiB for the readers (which must never allocate more than the file holds) and
#            above FUZZ_MALLOC_MB (64) for the others.
# Any crash, sanitizer report, leak, or failed assertion fails the script and prints the reproducer's path; add it
# to tests/fuzz/corpus/<target>/ once fixed. Reproduce with: $FUZZ_BUILD/tests/fuzz/fuzz_<target> <file>.
# Environment: FUZZ_SECONDS (60), FUZZ_TARGETS, FUZZ_BUILD (build-fuzz), JOBS (2), FUZZ_MALLOC_MB (64).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=${FUZZ_SECONDS:-60}
TARGETS=${FUZZ_TARGETS:-npy safetensors cli quantize moe}
FB=${FUZZ_BUILD:-build-fuzz}
JOBS=${JOBS:-2}
MALLOC_MB=${FUZZ_MALLOC_MB:-64}

if ! command -v clang >/dev/null; then
  echo "fuzz: clang is not installed (scripts/setup.sh installs it); cannot build the libFuzzer targets"
  exit 1
fi
t0=$(date +%s)
echo "fuzz: building the targets in $FB (clang, -fsanitize=fuzzer,address,undefined)"
CC=clang cmake -S . -B "$FB" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMXFP8_BUILD_FUZZ=ON -DMXFP8_BUILD_TOOLS=OFF \
  -DMXFP8_BUILD_TESTS=OFF >/dev/null
cmake --build "$FB" -j "$JOBS" --target $(for t in $TARGETS; do printf 'fuzz_%s ' "$t"; done) >/dev/null
echo "fuzz: built in $(( $(date +%s) - t0 )) s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export MXFP8_NUM_THREADS=${MXFP8_NUM_THREADS:-1}
mkdir -p "$FB/artifacts"
fail=0
for t in $TARGETS; do
  seeds=tests/fuzz/corpus/$t
  work=$FB/corpus/$t
  mkdir -p "$work"
  log=$FB/fuzz_$t.log
  case $t in
    quantize | moe) maxlen=4096 mlimit=$MALLOC_MB ;;
    npy | safetensors) maxlen=8192 mlimit=1 ;;
    *) maxlen=8192 mlimit=$MALLOC_MB ;;
  esac
  echo "fuzz: $t for ${SECONDS_EACH} s (seeds: $(ls "$seeds" | wc -l) files in $seeds)"
  if "$FB/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=10 -max_len=$maxlen \
      -malloc_limit_mb="$mlimit" -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$FB/artifacts/$t-" "$work" "$seeds" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
    echo "fuzz: $t ok: $runs executions, $cov, corpus $(ls "$work" | wc -l) files"
  else
    fail=1
    echo "fuzz: $t FAILED -- the end of $log:"
    tail -40 "$log"
    ls -1 "$FB/artifacts/$t-"* 2>/dev/null | sed 's/^/fuzz: reproducer: /' || true
  fi
done
echo "fuzz: done in $(( $(date +%s) - t0 )) s"
exit $fail
