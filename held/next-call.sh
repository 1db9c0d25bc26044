#!/usr/bin/env bash
# The next device call (held/README.md, "The next device session"), written in session 21.
# Run from the repository root on the device machine, carrying .deps-device (cmocka debs,
# and py/: the pycparser and safetensors wheels that pytest_bindings needs there):
#   1. held/issue28-whole-step-graph-test.patch and held/issue32-large-chunk-test.patch
#      applied (neither has run on a GPU), build;
#   2. the decode attention table and the decode-step table (the current figures of
#      issue 28 on this machine: H200 when it is one);
#   3. every GPU suite under QSAKV_REQUIRE_GPU=1, pytest_bindings with the wheels, the
#      new test_graph and test_select cases under memcheck (and the graph case under
#      racecheck), the SM70 tier's plain
#      test_select_index_geometries_cuda and its racechecks of _repeated_ and
#      _index_geometries_cuda (never finished in runs 47-50), in parallel to the deadline.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader
for p in held/issue28-whole-step-graph-test.patch held/issue32-large-chunk-test.patch; do
  git apply "$p" 2> /dev/null || patch -p1 --forward --silent < "$p" || echo "$p failed"
done
python3 -m pip install --no-index --no-deps -q --target /tmp/pywheels .deps-device/py/*.whl 2> "$OUT/pip.log"
export PYTHONPATH=/tmp/pywheels${PYTHONPATH:+:$PYTHONPATH}
bash tools/device-run.sh none > "$OUT/device-run.log" 2>&1
echo "build rc=$? $(el)"; grep -E "build:|error|not found" "$OUT/device-run.log" "$OUT/configure.log" | head -8
export LD_LIBRARY_PATH=$(dirname "$(find /tmp/cmocka -name 'libcmocka.so*' | head -1)"):${LD_LIBRARY_PATH:-}
export QSAKV_REQUIRE_GPU=1
timeout 90 build-gpu/qsakv_bench --decode-only > "$OUT/decode.log" 2>&1; echo "decode table rc=$? $(el)"
tail -14 "$OUT/decode.log"
timeout 90 build-gpu/qsakv_bench --step-only > "$OUT/step.log" 2>&1; echo "step table rc=$? $(el)"
tail -20 "$OUT/step.log"
DL=$((T0 + ${TEST_UNTIL:-585}))
run() { local name=$1; shift; local left=$((DL - $(date +%s))); [ $left -lt 1 ] && left=1
  timeout $left "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|SKIPPED|tests passed|tests failed|rel_l2|DIFFERENT' "$OUT/$name.log" | paste -sd' ' | cut -c1-300) $(el)" >> "$OUT/tests.txt"; }
pids=()
(cd build-gpu && run ctest ctest -j4 --timeout 400 --output-on-failure \
   -R "test_(graph|store|calib|cache_memory|context|select|attention|api_adversarial)$|pytest_bindings") & pids+=($!)
(QSAKV_TEST_FILTER='*whole_step*' run mem-whole-step compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/test_graph) & pids+=($!)
(QSAKV_TEST_FILTER='*whole_step*' run race-whole-step compute-sanitizer --tool racecheck --error-exitcode 9 build-gpu/tests/test_graph) & pids+=($!)
(QSAKV_TEST_FILTER='*large_chunks*' run mem-large-chunks compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/test_select) & pids+=($!)
(QSAKV_CUDA_TIER=sm70 QSAKV_TEST_FILTER='test_select_index_geometries_cuda' run sm70-geometries build-gpu/tests/test_select) & pids+=($!)
for t in test_select_repeated_cuda test_select_index_geometries_cuda; do
  (QSAKV_CUDA_TIER=sm70 QSAKV_TEST_FILTER=$t run sm70-race-$t compute-sanitizer --tool racecheck --error-exitcode 9 build-gpu/tests/test_select) & pids+=($!)
done
wait "${pids[@]}"
grep -hE "\(Failed\)|\(Skipped\)|Not Run" "$OUT/ctest.log" | head -10
echo "== tests (rc 124: out of time, no verdict) $(el)"; sort "$OUT/tests.txt" | cut -c1-300
(cd "$OUT" && tar czf next-call.tgz --remove-files ./*.log ./*.txt 2> /dev/null; ls)
