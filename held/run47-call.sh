#!/usr/bin/env bash
# Run 47, call 3 (docs/perf.md): the final code. tree = main 725a49d + the one-CTA top-k's many-rows
# forms (one warp finds each digit, the bucket sort takes the winners' bounds), chosen for
# waves of more rows than SMs, a shift for the ratio; the contract tests' prefill shape at
# 256 rows. base = main. Tests and sanitizer (automatic choices) on the tree, digests tree
# vs base, then benches, three rounds.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader
build_beside() {  # name tar
  local d=/tmp/b-$1; rm -rf $d; mkdir -p $d; tar -xf "$2" -C $d
  cmake -S $d -B $d/build -DCMAKE_BUILD_TYPE=Release -DQSAKV_CUDA_ARCHS=90 -DQSAKV_BUILD_TESTS=OFF > "$OUT/build-$1.log" 2>&1 &&
    cmake --build $d/build -j4 --target qsakv qsakv_bench >> "$OUT/build-$1.log" 2>&1
  echo "build $1 rc=$? $(el)" >> "$OUT/beside.txt"
}
(renice -n 10 $BASHPID > /dev/null; build_beside base .deps-device/base.tar) &
BESIDE=$!
BUILD_TARGETS="qsakv test_select test_graph qsakv_bench" bash tools/device-run.sh none > "$OUT/device-run.log" 2>&1
echo "build tree rc=$? $(el)"; grep -E "build:" "$OUT/device-run.log" | head -2
export LD_LIBRARY_PATH=$(dirname "$(find /tmp/cmocka -name 'libcmocka.so*' | head -1)"):${LD_LIBRARY_PATH:-}
run() { local dl=$1 name=$2; shift 2; local left=$((dl - $(date +%s))); [ $left -lt 1 ] && left=1
  timeout $left "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|SKIPPED' "$OUT/$name.log" | paste -sd' ' | cut -c1-160) $(el)" >> "$OUT/tests.txt"; }
DL=$((T0 + ${TEST_UNTIL:-320}))
pids=()
(run $DL plain-auto build-gpu/tests/test_select) & pids+=($!)
(export QSAKV_CUDA_TIER=sm70; run $DL plain-sm70 build-gpu/tests/test_select) & pids+=($!)
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
# Digests, tree vs base, once base is built (outputs only; their timing does not matter).
( wait_for_base() { while ! grep -q "build base" "$OUT/beside.txt" 2>/dev/null; do sleep 5; done; }; wait_for_base
  export PYTHONPATH=bindings/python
  for v in tree base; do lib=build-gpu/libqsakv.so; [ $v = base ] && lib=/tmp/b-base/build/libqsakv.so
    ( QSAKV_LIBRARY=$lib timeout 150 python3 tools/output_digest.py > "$OUT/digest-$v.txt" 2> "$OUT/digest-$v.err"
      echo "digest $v rc=$? $(wc -l < "$OUT/digest-$v.txt") lines $(el)" >> "$OUT/digest.txt" ) & done; wait
  diff "$OUT/digest-base.txt" "$OUT/digest-tree.txt" > "$OUT/digest.diff"
  echo "digest lines differing: $(grep -c '^[<>]' "$OUT/digest.diff")" >> "$OUT/digest.txt" ) & DIG=$!
wait "${pids[@]}"
echo "== tests $(el)"; sort "$OUT/tests.txt" | cut -c1-230
echo "== sanitizer clean: $(grep -cE 'rc=0 .*(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)' "$OUT/tests.txt") of 24"
wait $BESIDE; cat "$OUT/beside.txt"; wait $DIG; cat "$OUT/digest.txt"
bench() {  # name dir cases env...
  [ $(($(date +%s) - T0)) -gt ${BENCH_UNTIL:-385} ] && { echo "no time for $1"; return; }
  local n=$1 d=$2 c=$3; shift 3
  env "$@" timeout 60 $d/qsakv_bench --select-only --no-multirow --select-cases $c --index-keys both \
    --json "$OUT/sel-$n.json" > "$OUT/sel-$n.log" 2>&1
  echo "bench $n rc=$? $(el)"
}
ALL=0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22
bench warm build-gpu 4 X=1
for r in 1 2 3; do
  bench base-$r /tmp/b-base/build $ALL X=1; bench tree-$r build-gpu $ALL X=1
done
bench tree-runs build-gpu 9,10,11,12,13,14,15,16,17,18,19,20,21,22 QSAKV_SELECT_SORT=runs
python3 - "$OUT" <<'PY'
import json, sys, os, glob, statistics as st
out = sys.argv[1]; R = {}
for p in sorted(glob.glob(f"{out}/sel-*.json")):
    n = os.path.basename(p)[4:-5]
    if n == "warm": continue
    try: R[n] = {(x["kind"], x["requests"], x["rows"], x["tokens"], x["index_keys"]): x for x in json.load(open(p))["select"]}
    except Exception as e: print(n, e)
names = [n for n in ["base-1", "base-2", "base-3", "tree-1", "tree-2", "tree-3", "tree-runs"] if n in R]
keys = sorted(set(k for v in R.values() for k in v))
print("whole us L2-flushed (score) | " + " | ".join(names))
for k in keys:
    cells = []
    for n in names:
        x = R[n].get(k)
        cells.append("-" if not x else "%.1f(%s)" % (x["us_l2_flushed"], "%.1f" % x["score_us_l2_flushed"] if x.get("score_us_l2_flushed") else "-"))
    print(*k, "|", " ".join(cells))
PY
(cd "$OUT" && tar czf s17call3.tgz --remove-files *.log *.json *.txt *.err *.diff 2>/dev/null; ls)
