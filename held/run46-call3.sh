#!/usr/bin/env bash
# Run 46, call 3: the held filter-kernel-buckets patch on main (the filter kernel sorts by
# buckets as the automatic choice); tests, sanitizer with the automatic choice, benches.
#  tests: test_select plain (auto; and QSAKV_SELECT_MMA=wgmma, every multi-row selection on
#  the warpgroup scorer), test_graph; memcheck + racecheck of each GPU test of test_select
#  with the warpgroup scorer forced; benches against main without the change (base, built
#  beside) and against the forced alternatives of the automatic choice.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
(renice -n 10 $BASHPID > /dev/null; d=/tmp/b-base; rm -rf $d; mkdir -p $d; tar -xf .deps-device/base.tar -C $d
 cmake -S $d -B $d/build -DCMAKE_BUILD_TYPE=Release -DQSAKV_CUDA_ARCHS=90 -DQSAKV_BUILD_TESTS=OFF > "$OUT/build-base.log" 2>&1 &&
 cmake --build $d/build -j4 --target qsakv qsakv_bench >> "$OUT/build-base.log" 2>&1; echo "build base rc=$? $(el)" > "$OUT/beside.txt") &
BESIDE=$!
BUILD_TARGETS="qsakv test_select test_graph qsakv_bench" bash tools/device-run.sh none > "$OUT/device-run.log" 2>&1
echo "build tree rc=$? $(el)"; grep -E "build:|H200|H100" "$OUT/device-run.log"
export LD_LIBRARY_PATH=$(dirname "$(find /tmp/cmocka -name 'libcmocka.so*' | head -1)"):${LD_LIBRARY_PATH:-}
run() {  # deadline name cmd...
  local dl=$1 name=$2; shift 2
  local left=$((dl - $(date +%s))); [ $left -lt 1 ] && left=1
  timeout $left "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|SKIPPED' "$OUT/$name.log" | paste -sd' ' | cut -c1-150) $(el)" >> "$OUT/tests.txt"
}
DL=$((T0 + ${TEST_UNTIL:-390}))
pids=()
(run $DL plain-auto build-gpu/tests/test_select) & pids+=($!)
(export QSAKV_SELECT_SORT=runs; run $DL plain-runs build-gpu/tests/test_select) & pids+=($!)
(run $DL plain-graph build-gpu/tests/test_graph) & pids+=($!)
for t in test_select_cuda test_select_contract_cuda test_select_e4m3_keys_contract_cuda test_select_e4m3_keys_cuda \
         test_select_many_rows_cuda test_select_index_geometries_cuda test_select_special_cuda \
         test_select_e4m3_keys_special_cuda test_select_sorts_agree_cuda test_select_score_only_cuda \
         test_select_repeated_cuda test_select_warpgroup_scorer_cuda; do
  for tool in memcheck racecheck; do
    ( export QSAKV_TEST_FILTER=$t
      run $DL "auto-${tool%check}-$t" compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/test_select ) & pids+=($!)
  done
done
wait "${pids[@]}"
echo "== tests $(el)"; sort "$OUT/tests.txt"
echo "== sanitizer clean: $(grep -cE 'rc=0 .*(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)' "$OUT/tests.txt") of 24"
wait $BESIDE; cat "$OUT/beside.txt"
bench() {  # name dir mma cases keys
  [ $(($(date +%s) - T0)) -gt ${BENCH_UNTIL:-545} ] && { echo "no time for $1"; return; }
  QSAKV_SELECT_MMA=$3 timeout 70 $2/qsakv_bench --select-only --no-multirow --select-cases $4 --index-keys $5 \
    --json "$OUT/sel-$1.json" > "$OUT/sel-$1.log" 2>&1
  echo "bench $1 rc=$? $(el)"
}
for r in 1 2 3; do
  bench tree-dec-$r build-gpu auto 0,1,2,3,4,5,6,7,8,9,10,11,12 both
  bench base-dec-$r /tmp/b-base/build auto 0,1,2,3,4,5,6,7,8,9,10,11,12 both
done
python3 - "$OUT" <<'PY'
import json, sys, os, glob
out = sys.argv[1]; R = {}
for p in sorted(glob.glob(f"{out}/sel-*.json")):
    n = os.path.basename(p)[4:-5]
    try: R[n] = {(x["kind"], x["requests"], x["rows"], x["tokens"], x["index_keys"]): x for x in json.load(open(p))["select"]}
    except Exception as e: print(n, e)
keys = sorted(set(k for v in R.values() for k in v))
print("case | " + " | ".join(R))
for k in keys:
    print(*k, " ".join(("%.2f/%.2f" % (R[n][k]["us"], R[n][k]["us_l2_flushed"])) if k in R[n] else "-" for n in R))
PY
(cd "$OUT" && tar czf call3-logs.tgz --remove-files *.log *.json *.txt 2>/dev/null; ls)
