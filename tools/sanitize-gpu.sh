#!/usr/bin/env bash
# The GPU cases of the suites under compute-sanitizer: memcheck on every suite that
# launches kernels, racecheck on those whose kernels share memory between threads.
# Usage: sanitize-gpu.sh BUILD. QSAKV_CUDA_TIER=sm70 in the environment runs them on the SM70 kernel tier.
set -uo pipefail
# A GPU run: a CUDA case that finds no GPU fails instead of skipping (tests/testutil.h).
export QSAKV_REQUIRE_GPU=1
build=${1:-build-gpu}
echo "== kernel tier: ${QSAKV_CUDA_TIER:-auto (from the GPU)}"
rc=0
# san TOOL SUITE FILTER: the suite's cases that FILTER names (QSAKV_TEST_FILTER).
san() {
  local tool=$1 t=$2 f=$3
  shift 3  # the rest: more compute-sanitizer options
  echo "== $tool $t ($f) $*"
  QSAKV_TEST_FILTER="$f" compute-sanitizer --tool "$tool" --error-exitcode 9 "$@" "$build/tests/$t" || rc=1
}
# Every case of test_store and test_graph (the store-step and E4M3 index-key cases launch
# kernels without "cuda" in their names); the CUDA cases of the others, test_calib's and
# test_cache_memory's included (the calibration kernel, stores and attention over
# caller-owned memory).
san memcheck test_store '*'
for t in test_select test_attention test_calib test_cache_memory; do san memcheck $t '*cuda*'; done
# test_graph's test_capture_and_caller_errors leaves a runtime error pending on purpose
# (a cudaSetDevice of an invalid ordinal, peeked and cleared by the test) to show that the
# library's calls leave it there; memcheck reports those three calls of the test's own as
# API errors (docs/perf.md run 50), so that case runs without API-error reports (its
# kernels are still checked for memory errors) and the other cases with them.
san memcheck test_graph '*replay'
san memcheck test_graph '*caller_errors' --report-api-errors no
# racecheck where kernels share memory between threads (the calibration kernel's
# histogram too).
for t in test_select test_attention test_calib; do san racecheck $t '*cuda*'; done
exit $rc
