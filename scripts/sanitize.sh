#!/usr/bin/env bash
# scripts/sanitize.sh -- the sanitizer part of `make test`. Run from anywhere; `make test-sanitize` calls it.
#
#  1. AddressSanitizer + UndefinedBehaviorSanitizer (gcc, CMake option MXFP8_SANITIZE=ON) build of the library and
#     every C test in $ASAN_BUILD (default build-asan); ctest runs them on the default ISA path and on
#     MXFP8_ISA=scalar. Leaks are errors; any UB report aborts the test (-fno-sanitize-recover).
#  2. ThreadSanitizer (clang, libomp) build of tests/c/test_threads.c in $TSAN_BUILD (default build-tsan), run with
#     4 OpenMP threads per call. libomp is made TSan-aware by its Archer tool (OMP_TOOL_LIBRARIES=libarcher.so), so
#     the library's own OpenMP threads stay on; libgomp has no such support (false positives), hence clang here.
#     A step that cannot run is a failure, not a skip: scripts/setup.sh (run by every make target) installs clang,
#     libomp-dev and valgrind.
#  3. valgrind memcheck on `mxfp8 moe-bwd` of a small problem with the CLI of $BUILD (default build, built by the
#     caller), MXFP8_ISA=scalar (valgrind cannot run AVX-512). Any memcheck error or definite leak fails.
# Environment: JOBS (default 2), SANITIZE_STEPS (default "asan tsan valgrind").
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${JOBS:-2}
BUILD=${BUILD:-build}
ASAN_BUILD=${ASAN_BUILD:-build-asan}
TSAN_BUILD=${TSAN_BUILD:-build-tsan}
STEPS=${SANITIZE_STEPS:-asan tsan valgrind}
t0=$(date +%s)
step() { echo "sanitize: $* ($(( $(date +%s) - t0 )) s)"; }

for s in $STEPS; do
  case $s in
  asan)
    step "ASan+UBSan build in $ASAN_BUILD"
    cmake -S . -B "$ASAN_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMXFP8_SANITIZE=ON -DMXFP8_BUILD_TOOLS=OFF >/dev/null
    cmake --build "$ASAN_BUILD" -j "$JOBS" >/dev/null
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    step "ASan+UBSan ctest (default ISA)"
    ctest --test-dir "$ASAN_BUILD" --output-on-failure -j "$JOBS"
    step "ASan+UBSan ctest (MXFP8_ISA=scalar)"
    MXFP8_ISA=scalar ctest --test-dir "$ASAN_BUILD" --output-on-failure -j "$JOBS"
    ;;
  tsan)
    archer=$(ls /usr/lib/llvm-*/lib/libarcher.so 2>/dev/null | sort -V | tail -1 || true)
    if ! command -v clang >/dev/null || [ -z "$archer" ]; then
      step "FAILED: ThreadSanitizer cannot run: it needs clang and libomp-dev (Archer); run scripts/setup.sh"
      exit 1
    fi
    step "TSan build (clang, libomp) of test_threads in $TSAN_BUILD"
    CC=clang cmake -S . -B "$TSAN_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMXFP8_BUILD_TOOLS=OFF \
      -DCMAKE_C_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
      -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >/dev/null
    cmake --build "$TSAN_BUILD" -j "$JOBS" --target test_threads >/dev/null
    step "TSan: test_threads (4 caller threads x 4 OpenMP threads)"
    OMP_TOOL_LIBRARIES="$archer" MXFP8_NUM_THREADS=4 \
      TSAN_OPTIONS="ignore_noninstrumented_modules=1 halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}" \
      "$TSAN_BUILD/test_threads"
    step "TSan passed"
    ;;
  valgrind)
    if ! command -v valgrind >/dev/null; then
      step "FAILED: valgrind cannot run: it is not installed; run scripts/setup.sh"
      exit 1
    fi
    if [ ! -x "$BUILD/mxfp8" ]; then
      cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
      cmake --build "$BUILD" -j "$JOBS" --target mxfp8_cli >/dev/null
    fi
    step "valgrind memcheck: mxfp8 moe-bwd (H 64, T 48, E 4, B 16, top-k 2, I 32)"
    MXFP8_ISA=scalar MXFP8_NUM_THREADS=2 valgrind -q --error-exitcode=99 --leak-check=full \
      --errors-for-leak-kinds=definite --show-leak-kinds=definite \
      "$BUILD/mxfp8" moe-bwd --H 64 --T 48 --E 4 --B 16 --topk 2 --I 32 >/dev/null
    step "valgrind memcheck: mxfp8 moe-bwd --bias --affinity on_h --grad-dtype f32"
    MXFP8_ISA=scalar MXFP8_NUM_THREADS=2 valgrind -q --error-exitcode=99 --leak-check=full \
      --errors-for-leak-kinds=definite --show-leak-kinds=definite \
      "$BUILD/mxfp8" moe-bwd --H 40 --T 20 --E 3 --B 8 --topk 2 --I 24 --bias --affinity on_h --grad-dtype f32 \
      >/dev/null
    step "valgrind passed"
    ;;
  *) echo "sanitize: unknown step '$s'"; exit 2 ;;
  esac
done
step "all sanitizer steps passed"
