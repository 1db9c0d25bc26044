#!/usr/bin/env bash
# Session 19's second device call: main's GPU suites with this session's test changes
# (QSAKV_REQUIRE_GPU, test_graph's FP64 check, poisoned store images, Python GPU tests),
# issue 28's filter-kernel profile, then tools/sanitize-gpu.sh's wider coverage until the
# deadline. Logs under $OUT (one archive).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader
# test_graph's FP64 check of each replay (held: written in session 19 without a GPU).
git apply held/test-graph-replay-fp64.patch 2> /dev/null || patch -p1 --forward --silent < held/test-graph-replay-fp64.patch
bash tools/device-run.sh none > "$OUT/device-run.log" 2>&1
echo "build rc=$? $(el)"; grep -E "build:|error" "$OUT/device-run.log" | head -5
export LD_LIBRARY_PATH=$(dirname "$(find /tmp/cmocka -name 'libcmocka.so*' | head -1)"):${LD_LIBRARY_PATH:-}
export QSAKV_REQUIRE_GPU=1
(cd build-gpu && timeout 240 ctest -j4 --timeout 230 -R "test_(graph|store|calib|cache_memory|context|select|attention)$|pytest_bindings" \
   > "$OUT/ctest.log" 2>&1); echo "ctest rc=$? $(el)"
grep -E "Test +#|tests passed|tests failed" "$OUT/ctest.log" | sed -E 's/ +/ /g' | head -20
grep -hE "rel_l2 vs FP64|SKIP|FAILED" build-gpu/Testing/Temporary/LastTest.log | head -12
NCU_WARP_SAMPLING=0 timeout 150 bash tools/profile.sh select build-gpu 4 > "$OUT/profile.log" 2>&1
echo "profile rc=$? $(el)"; tail -25 "$OUT/profile.log"
left=$((T0 + 560 - $(date +%s))); [ $left -lt 10 ] && left=10
timeout $left bash tools/sanitize-gpu.sh build-gpu > "$OUT/sanitize.log" 2>&1
echo "sanitize rc=$? (limit ${left} s) $(el)"; grep -E "^==|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize.log" | head -30
(cd "$OUT" && tar czf s19call2.tgz --remove-files ./*.log ./*.txt ./*.csv ./*.dis ./*.ncu-rep 2> /dev/null; ls)
