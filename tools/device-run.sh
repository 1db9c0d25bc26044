#!/usr/bin/env bash
# One GPU session on the device machine: build for the local GPU, run every suite,
# the GPU cases under compute-sanitizer, and the benchmark. Logs go to $OUT.
# cmocka is not installed there: its Debian packages travel in .deps-device/.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
prefix=/tmp/cmocka
mkdir -p $prefix
for d in .deps-device/*.deb; do dpkg -x "$d" $prefix; done
libdir=$(dirname "$(find $prefix -name 'libcmocka.so*' | head -1)")
export LD_LIBRARY_PATH=$libdir:${LD_LIBRARY_PATH:-}
stage=${1:-all}
t0=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQSAKV_CUDA_ARCHS=90 \
  -DCMAKE_PREFIX_PATH=$prefix/usr -DCMOCKA_INCLUDE_DIR=$prefix/usr/include \
  -DCMOCKA_LIBRARY=$libdir/libcmocka.so.0 > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j16 > "$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [ "$stage" = all ] || [ "$stage" = test ]; then
  (cd build-gpu && ctest --output-on-failure -j4 > "$OUT/ctest.log" 2>&1); echo "ctest rc=$?"
  grep -E "tests passed|Failed|Skipped|SKIP|rel_l2|identical|differ|selected" "$OUT/ctest.log" | head -60
  (cd build-gpu && for t in test_attention test_graph test_select test_store; do ./tests/$t > "$OUT/$t.log" 2>&1; echo "$t rc=$?"; done)
  grep -hE "cuda|rel_l2|replay|PASSED|FAILED|SKIPPED" "$OUT"/test_attention.log "$OUT"/test_graph.log "$OUT"/test_select.log | head -60
fi
if [ "$stage" = all ] || [ "$stage" = bench ]; then
  build-gpu/qsakv_bench --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
fi
if [ "$stage" = all ] || [ "$stage" = sanitize ]; then
  timeout ${SANITIZE_SECONDS:-300} bash tools/sanitize-gpu.sh build-gpu > "$OUT/sanitize.log" 2>&1; echo "sanitize rc=$?"
  grep -E "^==|ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race" "$OUT/sanitize.log" | head -40
fi
[ -f "$OUT/bench.log" ] && cat "$OUT/bench.log"
exit 0
