#!/usr/bin/env bash
# One GPU session on the device machine: build for the local GPU, run every suite,
# the GPU cases under compute-sanitizer, and the benchmark. Logs go to $OUT.
#   tools/device-run.sh [all|test|bench|sanitize|sm70|routes|attention|select|step|first-hour]
# routes: the multi-row routes only: the GPU suites that run them (test_attention,
# test_graph), the bench's overlap sweep and multi-row table ($BENCH_ARGS added), the
# decode table, and compute-sanitizer on the attention and graph tests ($SAN_FILTER).
# sm70: everything with the SM70 kernel tier forced (QSAKV_CUDA_TIER=sm70, the V100 code
# path): every suite, compute-sanitizer, and the bench labelled as such, then the bench
# again on the GPU's own tier for comparison. A
# QSAKV_CUDA_TIER already in the environment is honoured by every stage. BUILD_TARGETS, when
# set, builds only those targets.
# cmocka is not installed there: its Debian packages travel in .deps-device/.
set -uo pipefail
# A GPU run: a CUDA case that finds no GPU fails instead of skipping (tests/testutil.h).
export QSAKV_REQUIRE_GPU=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
prefix=/tmp/cmocka
mkdir -p $prefix
for d in .deps-device/*.deb; do dpkg -x "$d" $prefix; done
libdir=$(dirname "$(find $prefix -name 'libcmocka.so*' | head -1)")
export LD_LIBRARY_PATH=$libdir:${LD_LIBRARY_PATH:-}
# The Python modules pytest_bindings needs that the machine lacks (pycparser, safetensors)
# travel as wheels in .deps-device/py. ctest sets PYTHONPATH for that suite, so they are
# made visible through a .pth file in the interpreter's own site-packages instead: the
# device's python3 is a virtual environment, which does not read the user site (run 51).
if ls .deps-device/py/*.whl > /dev/null 2>&1; then
  python3 -m pip install --no-index --no-deps -q --target /tmp/pywheels .deps-device/py/*.whl \
    > "$OUT/pip.log" 2>&1 || echo "wheels from .deps-device/py not installed: $OUT/pip.log"
  purelib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo /tmp/pywheels > "$purelib/qsakv-device-wheels.pth" ||
    echo "cannot write $purelib: pytest_bindings will skip what needs the wheels"
fi
stage=${1:-all}
if [ "$stage" = first-hour ]; then
  # A GPU user's first hour (issue 29): a copy of the tree without build folders, the
  # maintainers' tools reported, `make demo` (no cmocka: the suites are not built) with its
  # first run timed, then `make gpu-test` with cmocka from .deps-device (as a user who ran
  # the command the build printed) under ${GPU_TEST_SECONDS:-400} s; BENCH_ARGS, when set,
  # runs qsakv_bench with them on the gpu-test build afterwards.
  fresh=/tmp/qsakv-fresh
  rm -rf $fresh && mkdir -p $fresh
  tar --exclude='./build*' --exclude=./.deps-device --exclude=./.venv --exclude=./.deps-cuda12 \
    -cf - . | tar -xf - -C $fresh
  for t in clang-format clang-tidy abidiff bindgen cargo go swig pkg-config; do
    printf '%s: %s\n' "$t" "$(command -v $t || echo absent)"
  done
  echo "cmocka.h: $(ls /usr/include/cmocka.h 2>/dev/null || echo absent)"
  (cd $fresh && { time make demo JOBS=16; } > "$OUT/first-demo.log" 2>&1); echo "make demo rc=$?"
  grep -E "^qsakv:|-- qsakv:|CUDA code|backend|device|real" "$OUT/first-demo.log" | head -20
  (cd $fresh && { time build/qsakv_demo; } > "$OUT/second-demo.log" 2>&1); echo "second run: $(grep real "$OUT/second-demo.log")"
  inc=$prefix/usr/include
  (cd $fresh && timeout ${GPU_TEST_SECONDS:-400} make gpu-test JOBS=16 \
    CMAKE_FLAGS="-DCMOCKA_INCLUDE_DIR=$inc -DCMOCKA_LIBRARY=$libdir/libcmocka.so.0" \
    > "$OUT/first-gpu-test.log" 2>&1); echo "make gpu-test rc=$?"
  grep -E "tests passed|tests failed|\(Failed\)|\(Skipped\)|^suites:|check_suites|^== |ERROR SUMMARY|RACECHECK SUMMARY" \
    "$OUT/first-gpu-test.log" | cut -c1-160 | head -60
  if [ -n "${BENCH_ARGS:-}" ]; then
    timeout 150 $fresh/build-gpu/qsakv_bench $BENCH_ARGS > "$OUT/first-bench.log" 2>&1
    echo "bench rc=$?"; tail -${BENCH_TAIL:-12} "$OUT/first-bench.log"
  fi
  (cd "$OUT" && tar czf first-hour-logs.tar.gz ./*.log && rm -f ./*.log)
  exit 0
fi
if [ "$stage" = sm70 ]; then
  export QSAKV_CUDA_TIER=sm70
  stage=all
fi
echo "kernel tier: ${QSAKV_CUDA_TIER:-auto (from the GPU)}"
t0=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQSAKV_CUDA_ARCHS=90 \
  -DCMAKE_PREFIX_PATH=$prefix/usr -DCMOCKA_INCLUDE_DIR=$prefix/usr/include \
  -DCMOCKA_LIBRARY=$libdir/libcmocka.so.0 > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j16 ${BUILD_TARGETS:+--target $BUILD_TARGETS} > "$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [ "$stage" = all ] || [ "$stage" = test ]; then
  (cd build-gpu && ctest --output-on-failure --timeout 400 -j4 > "$OUT/ctest.log" 2>&1); echo "ctest rc=$?"
  grep -E "tests passed|Failed|Skipped|SKIP|rel_l2|identical|differ|selected" "$OUT/ctest.log" | head -60
  (cd build-gpu && for t in test_attention test_graph test_select test_store; do timeout 300 ./tests/$t > "$OUT/$t.log" 2>&1; echo "$t rc=$?"; done)
  grep -hE "cuda|rel_l2|replay|PASSED|FAILED|SKIPPED" "$OUT"/test_attention.log "$OUT"/test_graph.log "$OUT"/test_select.log | head -60
fi
if [ "$stage" = all ] || [ "$stage" = bench ]; then
  timeout 240 build-gpu/qsakv_bench --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
  if [ "${QSAKV_CUDA_TIER:-}" = sm70 ]; then  # the GPU's own tier next to it, same build
    timeout 240 build-gpu/qsakv_bench --tier auto --json "$OUT/bench-own-tier.json" \
      > "$OUT/bench-own-tier.log" 2>&1; echo "bench (the GPU's own tier) rc=$?"
  fi
  if [ -n "${BENCH_AB:-}" ]; then  # the alternative E4M3 tile path, for comparison
    QSAKV_E4M3_STAGING=1 build-gpu/qsakv_bench --e4m3-only --rows 1,16,64,256,1024 \
      --json "$OUT/bench-staged.json" > "$OUT/bench-staged.log" 2>&1; echo "bench (staged) rc=$?"
  fi
fi
if [ "$stage" = all ] || [ "$stage" = sanitize ]; then
  timeout ${SANITIZE_SECONDS:-300} bash tools/sanitize-gpu.sh build-gpu > "$OUT/sanitize.log" 2>&1; echo "sanitize rc=$?"
  grep -E "^==|ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race" "$OUT/sanitize.log" | head -40
fi
if [ "$stage" = attention ]; then  # the attention and graph suites alone (a refactor's check)
  (cd build-gpu && for t in test_attention test_graph; do timeout 150 ./tests/$t > "$OUT/$t.log" 2>&1; echo "$t rc=$?: $(grep -E "PASSED|FAILED" "$OUT/$t.log" | paste -sd' ')"; done)
  exit 0
fi
if [ "$stage" = routes ]; then
  # ROUTES_MMA: the grouped kernel's MMA for each pass of the tests and the sweep (auto, sync,
  # wgmma: QSAKV_GROUPED_MMA; "auto sync" compares the SM90 kernel with mma.sync in one run).
  for mma in ${ROUTES_MMA:-auto}; do
    sfx=; [ "$mma" = auto ] || sfx=-$mma
    (export QSAKV_GROUPED_MMA=$mma; cd build-gpu && for t in test_attention test_graph; do
       timeout 200 ./tests/$t > "$OUT/$t$sfx.log" 2>&1; echo "$t ($mma) rc=$?"; done)
    grep -hE "FAILED|SKIP|overlap|rel_l2|replay" "$OUT"/test_attention$sfx.log "$OUT"/test_graph$sfx.log | grep -vE "^\[ +OK" | tail -40
    QSAKV_GROUPED_MMA=$mma timeout ${BENCH_SECONDS:-300} build-gpu/qsakv_bench --overlap-only --multirow-only \
      --json "$OUT/bench-routes$sfx.json" ${BENCH_ARGS:-} > "$OUT/bench-routes$sfx.log" 2>&1
    echo "bench (routes, $mma) rc=$?"
  done
  timeout 120 build-gpu/qsakv_bench --decode-only --json "$OUT/bench-decode.json" > "$OUT/bench-decode.log" 2>&1
  echo "bench (decode) rc=$?"
  if [ -n "${SAN_FILTER:-}" ]; then
    for tool in memcheck racecheck; do
      filter=$SAN_FILTER
      [ $tool = racecheck ] && filter=${SAN_RACE_FILTER:-$SAN_FILTER}
      QSAKV_TEST_FILTER="$filter" timeout ${SANITIZE_SECONDS:-200} compute-sanitizer --tool $tool \
        --error-exitcode 9 build-gpu/tests/test_attention > "$OUT/san-$tool.log" 2>&1
      echo "$tool test_attention ($filter) rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/san-$tool.log"
    done
    # The caller-errors case fails a runtime call of its own on purpose (sanitize-gpu.sh).
    QSAKV_TEST_FILTER='*replay' timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
      build-gpu/tests/test_graph > "$OUT/san-graph.log" 2>&1
    echo "memcheck test_graph rc=$?"; grep -E "ERROR SUMMARY" "$OUT/san-graph.log"
    QSAKV_TEST_FILTER='*caller_errors' timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 \
      --report-api-errors no build-gpu/tests/test_graph > "$OUT/san-graph-caller.log" 2>&1
    echo "memcheck test_graph caller errors rc=$?"; grep -E "ERROR SUMMARY" "$OUT/san-graph-caller.log"
  fi
  if [ -n "${SM70:-}" ]; then  # the SM70 kernel tier forced: its attention and graph suites
    for t in test_attention test_graph; do
      f='*cuda*'; [ $t = test_graph ] && f='*'
      QSAKV_CUDA_TIER=sm70 QSAKV_TEST_FILTER="$f" timeout 120 build-gpu/tests/$t > "$OUT/sm70-$t.log" 2>&1
      echo "sm70 tier $t rc=$?: $(grep -E "PASSED|FAILED" "$OUT/sm70-$t.log" | paste -sd' ')"
    done
  fi
  if [ -n "${NCU_F:-}" ]; then  # kernel times of the grouped route's first call, prefill 8192 at 32K
    for f in $NCU_F; do
      for dt in ${NCU_DTYPES:-e4m3}; do
        timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum \
          -k regex:"grouped_union|grouped_attention|decode_attention" --launch-count 3 \
          build-gpu/qsakv_bench --overlap-only --overlap-dtype $dt --overlap-shapes ${NCU_SHAPES:-0} \
          --overlap-f $f > "$OUT/ncu-$dt-f$f.log" 2>&1
        echo "== ncu $dt f=$f: $(grep -E "grouped_union_kernel|grouped_attention_kernel|decode_attention_kernel|gpu__time_duration" "$OUT/ncu-$dt-f$f.log" | sed -E 's/\(.*//; s/ +/ /g' | paste -sd' ')"
      done
    done
  fi
  cat "$OUT/bench-decode.log" | grep -A12 "^sparse decode"
  for f in "$OUT"/bench-routes*.log; do echo "== $f"; cat "$f"; done
  # (At most 8 files come back from the device machine: the logs travel as one archive.)
  (cd "$OUT" && tar czf routes-logs.tar.gz ./*.log && rm -f ./*.log)
  exit 0
fi
if [ "$stage" = step ]; then
  # The decode step of one QSA layer (issue 28): qsakv_bench --step-only ($BENCH_ARGS added).
  timeout ${BENCH_SECONDS:-300} build-gpu/qsakv_bench --step-only --json "$OUT/bench-step.json" ${BENCH_ARGS:-} \
    > "$OUT/bench-step.log" 2>&1; echo "bench (step) rc=$?"
  grep -A40 "^decode step" "$OUT/bench-step.log"
  exit 0
fi
if [ "$stage" = select ]; then
  # The selection and its index keys (FP16 and E4M3): the selection, store, graph, config
  # and capacity suites on the GPU's tier, the selection and store suites on the SM70 tier,
  # compute-sanitizer memcheck and racecheck of the GPU selection and store cases
  # ($SAN_SELECT_FILTER, default every CUDA case; racecheck $SAN_RACE_SELECT_FILTER if set), the selection table with both key dtypes
  # ($BENCH_ARGS added), and with NCU_SELECT set the scoring kernels' times of those cases.
  (cd build-gpu && for t in test_select test_store test_graph test_config test_capacity; do
     timeout 200 ./tests/$t > "$OUT/$t.log" 2>&1; echo "$t rc=$?: $(grep -E "PASSED|FAILED" "$OUT/$t.log" | paste -sd' ')"; done)
  grep -hE "contract|exactly|replay|fail|FAILED" "$OUT"/test_select.log "$OUT"/test_graph.log "$OUT"/test_store.log | cut -c1-170 | head -40
  for t in test_select test_store; do
    QSAKV_CUDA_TIER=sm70 QSAKV_TEST_FILTER='*cuda*' timeout 200 build-gpu/tests/$t > "$OUT/sm70-$t.log" 2>&1
    echo "sm70 tier $t rc=$?: $(grep -E "PASSED|FAILED" "$OUT/sm70-$t.log" | paste -sd' ')"
  done
  grep -hE "contract|exactly|fail" "$OUT"/sm70-test_select.log | cut -c1-170 | head -12
  for tool in memcheck racecheck; do
    for t in test_select test_store; do
      filter='*cuda*'; [ $t = test_select ] && filter=${SAN_SELECT_FILTER:-*cuda*}
      [ $t = test_select ] && [ $tool = racecheck ] && filter=${SAN_RACE_SELECT_FILTER:-$filter}
      QSAKV_TEST_FILTER="$filter" timeout ${SANITIZE_SECONDS:-200} compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/$t > "$OUT/san-$tool-$t.log" 2>&1
      echo "$tool $t rc=$?: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/san-$tool-$t.log" | paste -sd' ')"
    done
  done
  timeout ${BENCH_SECONDS:-300} build-gpu/qsakv_bench --select-only --no-multirow --json "$OUT/bench-select.json"     ${BENCH_ARGS:-} > "$OUT/bench-select.log" 2>&1; echo "bench (select) rc=$?"
  if [ -n "${NCU_SELECT:-}" ]; then
    for keys in fp16 e4m3; do
      timeout 150 ncu --clock-control none --launch-count 6 --metrics gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active         -k regex:"select_" build-gpu/qsakv_bench --select-only --no-multirow --index-keys $keys         --select-cases $NCU_SELECT > "$OUT/ncu-select-$keys.log" 2>&1
      echo "== ncu select $keys: $(grep -E "select_[a-z_]*kernel|gpu__time_duration|dram__bytes_read|inst_executed|warps_active" "$OUT/ncu-select-$keys.log" | sed -E 's/\(.*//; s/ +/ /g' | head -40 | paste -sd' ')"
    done
  fi
  cat "$OUT/bench-select.log" | grep -A40 "^indexer selection"
  (cd "$OUT" && tar czf select-logs.tar.gz ./*.log && rm -f ./*.log)
  exit 0
fi
if [ -n "${NCU:-}" ]; then  # one decode kernel of the 1024-row case, per tile path
  for st in 0 1; do
    QSAKV_E4M3_STAGING=$st timeout 120 ncu --clock-control none -k regex:decode_attention \
      --launch-skip 100 --launch-count 1 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section MemoryWorkloadAnalysis \
      build-gpu/qsakv_bench --e4m3-only --rows 1024 > "$OUT/ncu-staged$st.log" 2>&1
    echo "== ncu staged=$st"; grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers|Stall|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Block Limit" "$OUT/ncu-staged$st.log" | head -30
  done
fi
[ -f "$OUT/bench.log" ] && cat "$OUT/bench.log"
[ -f "$OUT/bench-own-tier.log" ] && { echo "== the GPU's own kernel tier"; cat "$OUT/bench-own-tier.log"; }
[ -f "$OUT/bench-staged.log" ] && { echo "== QSAKV_E4M3_STAGING=1"; tail -8 "$OUT/bench-staged.log"; }
exit 0
