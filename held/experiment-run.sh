#!/usr/bin/env bash
# One device call's measurements, from held/experiment-call.sh (which runs `build` first,
# beside the sanitizer):
#   (a) the held filter-kernel-buckets patch (the working tree) against main
#       (.deps-device/base.tar: git archive -o .deps-device/base.tar main) on the selection
#       table's decode and verify rows (cases 0-12);
#   (b) the warpgroup scorer experiment (.deps-device/exp.tar: git switch -c exp/wg eea63ee &&
#       git am held/warpgroup-scorer-experiment.patch && git archive -o .deps-device/exp.tar
#       exp/wg), built three ways: N split in two commits (split), 2 and 4 chunks of 512 keys
#       per CTA (chunks, chunks4), against the tree on the prefill rows (cases 13-15);
# two rounds with the builds alternated (the second only while the call has time), a table
# of both at the end; then, with PROFILE_BEFORE=N seconds, an ncu profile of case 13.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
build_beside() {  # name tar cuda-flags
  local d=/tmp/b-$1; rm -rf $d; mkdir -p $d; tar -xf "$2" -C $d
  cmake -S $d -B $d/build -DCMAKE_BUILD_TYPE=Release -DQSAKV_CUDA_ARCHS=90 -DQSAKV_BUILD_TESTS=OFF \
    -DCMAKE_CUDA_FLAGS="$3" > "$OUT/build-$1.log" 2>&1 &&
    cmake --build $d/build -j${BESIDE_JOBS:-3} --target qsakv qsakv_bench >> "$OUT/build-$1.log" 2>&1
  echo "build $1 rc=$? $(el)"
}
if [ "${1:-}" = build ]; then
  build_beside base .deps-device/base.tar "" &
  build_beside split .deps-device/exp.tar "-DQSAKV_EXP_SPLIT=1" &
  build_beside chunks .deps-device/exp.tar "-DQSAKV_EXP_CHUNKS=2" &
  build_beside chunks4 .deps-device/exp.tar "-DQSAKV_EXP_CHUNKS=4" &
  wait
  exit 0
fi
BUILD_TARGETS="qsakv qsakv_bench" bash tools/device-run.sh none > "$OUT/device-run2.log" 2>&1
echo "build tree rc=$? $(el)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
bench() {  # name dir cases round
  timeout 150 $2/qsakv_bench --select-only --select-cases $3 --index-keys both \
    --json "$OUT/sel-$1-$4.json" > "$OUT/sel-$1-$4.log" 2>&1
  echo "bench $1 round $4 rc=$? $(el)"
}
DEC=0,1,2,3,4,5,6,7,8,9,10,11,12 PRE=13,14,15
bench warm build-gpu 13 0
for r in 1 2; do
  [ $r = 2 ] && [ $(($(date +%s) - T0)) -gt ${ROUND2_BEFORE:-360} ] && { echo "no round 2 $(el)"; break; }
  bench tree-dec build-gpu $DEC $r; bench base-dec /tmp/b-base/build $DEC $r
  bench tree-pre build-gpu $PRE $r; bench split-pre /tmp/b-split/build $PRE $r
  bench chunks-pre /tmp/b-chunks/build $PRE $r
  bench chunks4-pre /tmp/b-chunks4/build $PRE $r
done
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
def recs(n, r):
    p = f"{out}/sel-{n}-{r}.json"
    if not os.path.exists(p): return {}
    return {(x["kind"], x["rows"], x["tokens"], x["index_keys"]): x for x in json.load(open(p))["select"]}
def table(names, fields):
    print("case | field | " + " | ".join(f"{n} r1 r2" for n in names))
    for k in sorted(recs(names[0], 1)):
        for f in fields:
            row = []
            for n in names:
                for r in (1, 2):
                    v = recs(n, r).get(k, {}).get(f)
                    row.append("%.2f" % v if v is not None else "-")
            if any(x != "-" for x in row): print(*k, f, " ".join(row))
table(["tree-dec", "base-dec"], ("us", "us_l2_flushed"))
table(["tree-pre", "split-pre", "chunks-pre", "chunks4-pre"], ("us_l2_flushed", "score_us_l2_flushed"))
PY
if [ $(($(date +%s) - T0)) -lt ${PROFILE_BEFORE:-400} ]; then
  timeout 150 bash tools/profile.sh select build-gpu 13 > "$OUT/prof13.txt" 2>&1; echo "prof13 rc=$? $(el)"
  grep -E "==|Duration|Throughput|Occupancy|Registers|Issued" "$OUT/prof13.txt" | head -30
fi
(cd "$OUT" && tar czf exp-logs.tgz --remove-files build-*.log sel-*.log sel-*.json device-run2.log 2>/dev/null; ls)
