#!/usr/bin/env bash
# Session 20's second device call, on the tree as carried (main with the changes of the
# first call landed): every GPU suite under QSAKV_REQUIRE_GPU=1 with the Python bindings'
# GPU tests (session 19's test changes had never run on a GPU; session 20's launch-error,
# capture and union shared-memory fixes), then issue 28's profiles (the one-row filter
# kernel of a decode step at 128K, with warp sampling at its finest, and one-row decode
# attention), then compute-sanitizer on the suites the first call did not cover, in
# parallel, until the call's deadline. Logs under $OUT (one archive); a short table last.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader
# test_graph's FP64 check of each replay, where the tree does not have it yet.
if git apply --check held/test-graph-replay-fp64.patch 2> /dev/null; then
  git apply held/test-graph-replay-fp64.patch && echo "applied test-graph-replay-fp64.patch"
fi
bash tools/device-run.sh none > "$OUT/device-run.log" 2>&1
echo "build rc=$? $(el)"; grep -E "build:|error" "$OUT/device-run.log" | head -5
export LD_LIBRARY_PATH=$(dirname "$(find /tmp/cmocka -name 'libcmocka.so*' | head -1)"):${LD_LIBRARY_PATH:-}
export QSAKV_REQUIRE_GPU=1
(cd build-gpu && timeout ${CTEST_S:-240} ctest -j4 --timeout 230 \
   -R "test_(graph|store|calib|cache_memory|context|select|attention|api_adversarial)$|pytest_bindings" \
   > "$OUT/ctest.log" 2>&1); echo "ctest rc=$? $(el)"
grep -E "Test +#|tests passed|tests failed" "$OUT/ctest.log" | sed -E 's/ +/ /g' | head -20
grep -hE "update under capture|SKIP|FAILED" build-gpu/Testing/Temporary/LastTest.log | head -8
NCU_WARP_SAMPLING=0 timeout ${PROFILE_S:-130} bash tools/profile.sh select build-gpu 4 > "$OUT/profile-select.log" 2>&1
echo "profile select 4 rc=$? $(el)"; tail -40 "$OUT/profile-select.log"
if [ -z "${NO_DECODE_PROFILE:-}" ]; then
  timeout 90 bash tools/profile.sh decode build-gpu 1 > "$OUT/profile-decode.log" 2>&1
  echo "profile decode 1 rc=$? $(el)"; tail -30 "$OUT/profile-decode.log"
fi
DL=$((T0 + ${TEST_UNTIL:-575}))
san() {  # tool suite filter
  local left=$((DL - $(date +%s))); [ $left -lt 1 ] && left=1
  QSAKV_TEST_FILTER="$3" timeout $left compute-sanitizer --tool "$1" --error-exitcode 9 \
    build-gpu/tests/$2 > "$OUT/san-$1-$2.log" 2>&1
  echo "$1 $2 ($3) rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$1-$2.log" | tail -1) $(el)" >> "$OUT/san.txt"
}
pids=()
for t in test_store test_graph; do (san memcheck $t '*') & pids+=($!); done
for t in test_attention test_calib test_cache_memory; do (san memcheck $t '*cuda*') & pids+=($!); done
for t in test_attention test_calib; do (san racecheck $t '*cuda*') & pids+=($!); done
wait "${pids[@]}"
echo "== sanitizer (rc 124: out of time, no verdict) $(el)"; sort "$OUT/san.txt"
(cd "$OUT" && tar czf s20call2.tgz --remove-files ./*.log ./*.txt ./*.csv ./*.dis ./*.ncu-rep 2> /dev/null; ls)
