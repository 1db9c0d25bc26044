#!/usr/bin/env bash
# The next device call for the two held issue-32 patches (held/README.md), written in a
# session without a device machine so that the next one starts from a tested plan.
# Run from the repository root on the device machine (carry .deps-device: cmocka debs):
#   bash held/next-call.sh          benches, then tests, sanitizer and digests (one call)
#   NCU=1 bash held/next-call.sh    the same builds, then the first scoring launch of
#                                   case 13 under ncu, p1 against tree (a second call)
# Three builds beside each other: base = the tree as carried (main), p1 = main + the grid
# rule, tree = main + both patches (built in build-gpu with the tests). Benches go first,
# with their table (run 48's lesson: the 600 s limit takes whatever runs last).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader
apply() {  # patch file, in the current directory (no .git needed)
  git apply "$1" 2> /dev/null || patch -p1 --forward --silent < "$1" || { echo "apply $1 failed"; exit 1; }
}
copy_tree() { rm -rf "$1"; mkdir -p "$1"; tar --exclude='./build*' --exclude=./.venv --exclude=./.deps-device -cf - . | tar -xf - -C "$1"; }
copy_tree /tmp/b-base
copy_tree /tmp/b-p1 && (cd /tmp/b-p1 && apply held/issue32-wg-grid-per-sm.patch) || exit 1
apply held/issue32-wg-grid-per-sm.patch; apply held/issue32-wg-score-64-rows.patch
# The tree also takes test_graph's FP64 check of each replay (held/test-graph-replay-fp64.patch).
apply held/test-graph-replay-fp64.patch
export QSAKV_REQUIRE_GPU=1  # a CUDA case that finds no GPU fails (tests/testutil.h)
build_beside() {  # name
  local d=/tmp/b-$1
  cmake -S $d -B $d/build -DCMAKE_BUILD_TYPE=Release -DQSAKV_CUDA_ARCHS=90 -DQSAKV_BUILD_TESTS=OFF > "$OUT/build-$1.log" 2>&1 &&
    cmake --build $d/build -j4 --target qsakv qsakv_bench >> "$OUT/build-$1.log" 2>&1
  echo "build $1 rc=$? $(el)" >> "$OUT/beside.txt"
}
(renice -n 10 $BASHPID > /dev/null; build_beside base) & B1=$!
(renice -n 10 $BASHPID > /dev/null; build_beside p1) & B2=$!
BUILD_TARGETS="qsakv test_select test_graph test_store test_calib test_cache_memory test_attention qsakv_bench" bash tools/device-run.sh none > "$OUT/device-run.log" 2>&1
echo "build tree rc=$? $(el)"; grep -E "build:|error" "$OUT/device-run.log" | head -5
wait $B1 $B2; cat "$OUT/beside.txt"
export LD_LIBRARY_PATH=$(dirname "$(find /tmp/cmocka -name 'libcmocka.so*' | head -1)"):${LD_LIBRARY_PATH:-}

if [ -n "${NCU:-}" ]; then  # the first scoring launch of 8192 rows at 32K, E4M3 keys
  for v in p1 tree; do d=build-gpu; [ $v = p1 ] && d=/tmp/b-p1/build
    timeout 200 ncu --clock-control none -k regex:select_score_rows --launch-count 1 \
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
      $d/qsakv_bench --select-only --no-multirow --select-cases 13 --index-keys e4m3 > "$OUT/ncu-$v.log" 2>&1
    echo "== ncu $v rc=$?"; grep -E "select_score_rows|duration|inst_executed|registers|warps_active" "$OUT/ncu-$v.log" | sed -E 's/ +/ /g'
  done
  (cd "$OUT" && tar czf next-call-ncu.tgz --remove-files ./*.log ./*.txt 2> /dev/null; ls)
  exit 0
fi

bench() {  # name dir cases env...
  [ $(($(date +%s) - T0)) -gt ${BENCH_UNTIL:-330} ] && { echo "no time for $1"; return; }
  local n=$1 d=$2 c=$3; shift 3
  env "$@" timeout 60 $d/qsakv_bench --select-only --no-multirow --select-cases $c --index-keys both \
    --json "$OUT/sel-$n.json" > "$OUT/sel-$n.log" 2>&1
  echo "bench $n rc=$? $(el)"
}
MR=12,13,14,15,16,17,18,19,20,21,22,23,24,25
bench warm build-gpu 13 X=1
for r in $(seq 1 ${ROUNDS:-1}); do  # ROUNDS=2 where the call has the time
  bench base-$r /tmp/b-base/build $MR X=1; bench p1-$r /tmp/b-p1/build $MR X=1; bench tree-$r build-gpu $MR X=1
done
bench tree-wg build-gpu $MR QSAKV_SELECT_MMA=wgmma; bench tree-sync build-gpu $MR QSAKV_SELECT_MMA=sync
bench p1-wg /tmp/b-p1/build $MR QSAKV_SELECT_MMA=wgmma
bench p1-score /tmp/b-p1/build 13,14,15,23,24,25 QSAKV_SELECT_STAGES=score
bench tree-score build-gpu 13,14,15,23,24,25 QSAKV_SELECT_STAGES=score
python3 - "$OUT" << 'PY'
import json, sys, os, glob
out = sys.argv[1]; R = {}
for p in sorted(glob.glob(f"{out}/sel-*.json")):
    n = os.path.basename(p)[4:-5]
    if n == "warm": continue
    try: R[n] = {(x["kind"], x["requests"], x["rows"], x["tokens"], x["index_keys"]): x for x in json.load(open(p))["select"]}
    except Exception as e: print(n, e)
order = ["base-1", "base-2", "p1-1", "p1-2", "tree-1", "tree-2", "p1-wg", "tree-wg", "tree-sync", "p1-score", "tree-score"]
names = [n for n in order if n in R]
keys = sorted(set(k for v in R.values() for k in v))
print("us, one call, L2 flushed | " + " | ".join(names))
for k in keys:
    print(*k, "|", " ".join("-" if not R[n].get(k) else "%.1f" % R[n][k]["us_l2_flushed"] for n in names))
PY

DL=$((T0 + ${TEST_UNTIL:-560}))
run() { local dl=$1 name=$2; shift 2; local left=$((dl - $(date +%s))); [ $left -lt 1 ] && left=1
  timeout $left "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|SKIPPED' "$OUT/$name.log" | paste -sd' ' | cut -c1-160) $(el)" >> "$OUT/tests.txt"; }
pids=()
(run $DL plain-auto build-gpu/tests/test_select) & pids+=($!)
(QSAKV_SELECT_MMA=wgmma run $DL plain-wgmma build-gpu/tests/test_select) & pids+=($!)
(run $DL plain-graph build-gpu/tests/test_graph) & pids+=($!)
for t in store calib cache_memory attention; do (run $DL plain-$t build-gpu/tests/test_$t) & pids+=($!); done
for t in test_select_cuda test_select_contract_cuda test_select_e4m3_keys_contract_cuda test_select_e4m3_keys_cuda \
         test_select_many_rows_cuda test_select_index_geometries_cuda test_select_special_cuda \
         test_select_e4m3_keys_special_cuda test_select_sorts_agree_cuda test_select_score_only_cuda \
         test_select_repeated_cuda test_select_warpgroup_scorer_cuda; do
  for tool in memcheck racecheck; do
    ( export QSAKV_TEST_FILTER=$t QSAKV_SELECT_MMA=wgmma
      run $DL "wg-${tool%check}-$t" compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/test_select ) & pids+=($!)
  done
done
export PYTHONPATH=bindings/python
for v in tree base; do lib=build-gpu/libqsakv.so; [ $v = base ] && lib=/tmp/b-base/build/libqsakv.so
  ( left=$((DL - $(date +%s))); QSAKV_LIBRARY=$lib timeout $left python3 tools/output_digest.py > "$OUT/digest-$v.txt" 2> "$OUT/digest-$v.err"
    echo "digest $v rc=$? $(wc -l < "$OUT/digest-$v.txt") lines $(el)" >> "$OUT/tests.txt" ) & pids+=($!)
done
wait "${pids[@]}"
echo "== tests $(el)"; sort "$OUT/tests.txt" | cut -c1-200
echo "== sanitizer clean: $(grep -cE 'rc=0 .*(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)' "$OUT/tests.txt") of 24"
echo "digest lines differing: $(diff "$OUT/digest-base.txt" "$OUT/digest-tree.txt" | grep -c '^[<>]')"
(cd "$OUT" && tar czf next-call.tgz --remove-files ./*.log ./*.json ./*.txt ./*.err 2> /dev/null; ls)
