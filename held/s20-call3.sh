#!/usr/bin/env bash
# Session 20's last device call, for a session with ~6 minutes of device time left: the
# final tree's store, selection and graph suites under QSAKV_REQUIRE_GPU=1, in parallel
# (the one-wave scorer rule and test_store's unit-scale fix had not run as landed).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader
BUILD_TARGETS="qsakv test_store test_select test_graph" bash tools/device-run.sh none > "$OUT/device-run.log" 2>&1
echo "build rc=$? $(el)"; grep -E "build:|error" "$OUT/device-run.log" | head -5
export LD_LIBRARY_PATH=$(dirname "$(find /tmp/cmocka -name 'libcmocka.so*' | head -1)"):${LD_LIBRARY_PATH:-}
export QSAKV_REQUIRE_GPU=1
DL=$((T0 + ${TEST_UNTIL:-270}))
for t in store graph select; do
  ( left=$((DL - $(date +%s))); [ $left -lt 1 ] && left=1
    timeout $left build-gpu/tests/test_$t > "$OUT/test_$t.log" 2>&1
    echo "test_$t rc=$? $(grep -E 'PASSED|FAILED|SKIP' "$OUT/test_$t.log" | paste -sd' ' | cut -c1-200) $(el)" >> "$OUT/tests.txt" ) &
done
wait
sort "$OUT/tests.txt"
(cd "$OUT" && tar czf s20call3.tgz --remove-files ./*.log ./*.txt 2> /dev/null; ls)
