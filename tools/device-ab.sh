#!/usr/bin/env bash
# A/B on the device machine: the decode-attention table of a baseline (a `git archive`
# of an earlier commit, carried in .deps-device/) and of the working tree, in one run,
# so both sides see the same GPU, clocks and copy ceiling. Then optional split sweeps of
# the working tree (SWEEP="rows:s1,s2,... rows:..."), e.g. SWEEP="256:1,2,3 1024:1,3".
#   git archive -o .deps-device/base.tar <commit>     (here)
#   tools/device-ab.sh [bench args...]                (there; logs under $OUT)
# The working tree is expected to be built already in build-gpu (tools/device-run.sh none).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
rows=${ROWS:-1,8,16,32,64,128,256,1024}
if [ -f .deps-device/base.tar ]; then
  rm -rf /tmp/base && mkdir -p /tmp/base && tar -xf .deps-device/base.tar -C /tmp/base
  t0=$(date +%s)
  (cmake -S /tmp/base -B /tmp/base/build -DCMAKE_BUILD_TYPE=Release -DQSAKV_CUDA_ARCHS=90 \
     -DQSAKV_BUILD_TESTS=OFF > "$OUT/base-configure.log" 2>&1 &&
   cmake --build /tmp/base/build -j16 --target qsakv_bench > "$OUT/base-build.log" 2>&1) ||
    { echo "baseline build failed"; tail -20 "$OUT/base-build.log"; }
  echo "baseline build: $(( $(date +%s) - t0 )) s"
  timeout 300 /tmp/base/build/qsakv_bench --no-multirow --select-cases 31 --rows "$rows" "$@" \
    > "$OUT/ab-base.log" 2>&1; echo "baseline bench rc=$?"
fi
timeout 300 build-gpu/qsakv_bench --decode-only --rows "$rows" --json "$OUT/ab-new.json" "$@" \
  > "$OUT/ab-new.log" 2>&1; echo "new bench rc=$?"
for case in ${SWEEP:-}; do
  r=${case%%:*}
  for s in ${case#*:}; do
    s=${s//,/ }
    for n in $s; do
      timeout 120 build-gpu/qsakv_bench --decode-only --e4m3-only --rows "$r" --splits "$n" \
        > "$OUT/sweep-$r-$n.log" 2>&1
      echo "sweep rows=$r splits=$n: $(grep -E "^ +$r " "$OUT/sweep-$r-$n.log")"
    done
  done
done
echo "== baseline"; grep -A12 "^sparse decode" "$OUT/ab-base.log" 2>/dev/null | grep -E "^ +[0-9]+ " 
echo "== working tree"; grep -A12 "^sparse decode" "$OUT/ab-new.log" | grep -E "^ +[0-9]+ "
exit 0
