#!/usr/bin/env bash
# The GPU cases of the suites under compute-sanitizer: memcheck on every suite that
# launches kernels, racecheck on those with shared memory. Usage: sanitize-gpu.sh BUILD
# QSAKV_CUDA_TIER=sm70 in the environment runs them on the SM70 kernel tier.
set -uo pipefail
# A GPU run: a CUDA case that finds no GPU fails instead of skipping (tests/testutil.h).
export QSAKV_REQUIRE_GPU=1
build=${1:-build-gpu}
echo "== kernel tier: ${QSAKV_CUDA_TIER:-auto (from the GPU)}"
export QSAKV_TEST_FILTER='*cuda*'
rc=0
for t in test_store test_select test_attention; do
  echo "== memcheck $t"
  compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/$t" || rc=1
done
echo "== memcheck test_graph"
QSAKV_TEST_FILTER='*' compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/test_graph" || rc=1
for t in test_select test_attention; do
  echo "== racecheck $t"
  compute-sanitizer --tool racecheck --error-exitcode 9 "$build/tests/$t" || rc=1
done
exit $rc
