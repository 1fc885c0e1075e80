#!/usr/bin/env bash
# scripts/test.sh -- `make test`: every suite, each even when an earlier one failed, then one summary line
#   N passed, N failed
# over all of them. Counted: each ctest test (C tests on the default ISA path and with MXFP8_ISA=scalar, and the
# ASan+UBSan build of them), each pytest test (Python tests on both paths; the bench and packaging tests once),
# the TSan and valgrind steps (one each), and each libFuzzer target. A suite that dies before reporting counts as
# one failure.
# Run by the Makefile after `make build python`; environment: BUILD, VENV, JOBS, FUZZ_SECONDS.
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
VENV=${VENV:-.venv}
JOBS=${JOBS:-2}
PY=$VENV/bin/python
LOGS=$BUILD/test-logs
mkdir -p "$LOGS"
passed=0 failed=0 skipped=0
summary=()

# count SUITE LOG RC: add the counts that LOG reports (ctest, pytest, fuzz.sh or sanitize.sh lines).
count() {
  local name=$1 log=$2 rc=$3 p=0 f=0 s=0 found=0 line n
  while IFS= read -r line; do # ctest: "100% tests passed, 0 tests failed out of 10"
    if [[ $line =~ tests\ passed,\ ([0-9]+)\ tests?\ failed\ out\ of\ ([0-9]+) ]]; then
      f=$((f + BASH_REMATCH[1])); p=$((p + BASH_REMATCH[2] - BASH_REMATCH[1])); found=1
    fi
  done < <(grep -a "tests passed, .* failed out of" "$log")
  n=$(grep -acE "^[[:space:]]+[0-9]+ - .* \(Skipped\)$" "$log") # ctest counts its skips as passed
  p=$((p - n)); s=$((s + n))
  line=$(grep -aE "^(=+ )?[0-9]+ (passed|failed|skipped|error)" "$log" | tail -1) # pytest's last line
  if [ -n "$line" ]; then
    found=1
    for kind in passed failed error errors skipped; do
      n=$(grep -oE "[0-9]+ $kind\b" <<<"$line" | grep -oE "^[0-9]+" || true)
      case $kind in passed) p=$((p + ${n:-0})) ;; skipped) s=$((s + ${n:-0})) ;; *) f=$((f + ${n:-0})) ;; esac
    done
  fi
  n=$(grep -acE "^fuzz: [a-z_]+ ok:" "$log"); [ "$n" -gt 0 ] && { p=$((p + n)); found=1; }
  n=$(grep -acE "^fuzz: [a-z_]+ FAILED" "$log"); [ "$n" -gt 0 ] && { f=$((f + n)); found=1; }
  n=$(grep -acE "^sanitize: (TSan|valgrind) passed" "$log"); [ "$n" -gt 0 ] && { p=$((p + n)); found=1; }
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=$((f + 1)); fi # died, or failed in a way no line counts
  if [ "$found" -eq 0 ] && [ "$rc" -eq 0 ]; then p=$((p + 1)); fi
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  summary+=("$(printf '%-32s %5d passed, %d failed%s' "$name" "$p" "$f" "$([ "$s" -gt 0 ] && echo ", $s skipped")")")
}

# suite NAME CMD...: run, show the output, count.
suite() {
  local name=$1 log
  shift
  log=$LOGS/$(tr ' /=' '___' <<<"$name").log
  echo "==== $name"
  "$@" 2>&1 | tee "$log"
  count "$name" "$log" "${PIPESTATUS[0]}"
}

CTEST=(ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS")
PYTEST=("$PY" -m pytest tests/python -q -p no:cacheprovider)
suite "C tests" "${CTEST[@]}"
suite "C tests, MXFP8_ISA=scalar" env MXFP8_ISA=scalar "${CTEST[@]}"
suite "Python tests" "${PYTEST[@]}"
suite "Python tests, MXFP8_ISA=scalar" env MXFP8_ISA=scalar "${PYTEST[@]}"
suite "bench (what it reports)" "$PY" -m pytest tests/bench -q -p no:cacheprovider
suite "packaging and README" "$PY" -m pytest tests/packaging -q -p no:cacheprovider
suite "ASan+UBSan" env BUILD="$BUILD" JOBS="$JOBS" SANITIZE_STEPS=asan scripts/sanitize.sh
suite "ThreadSanitizer" env BUILD="$BUILD" JOBS="$JOBS" SANITIZE_STEPS=tsan scripts/sanitize.sh
suite "valgrind" env BUILD="$BUILD" JOBS="$JOBS" SANITIZE_STEPS=valgrind scripts/sanitize.sh
suite "fuzzers" env FUZZ_SECONDS="${FUZZ_SECONDS:-60}" JOBS="$JOBS" scripts/fuzz.sh

echo "==== summary (logs in $LOGS)"
printf '%s\n' "${summary[@]}"
[ "$skipped" -gt 0 ] && echo "($skipped skipped: the logs say which and why)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
