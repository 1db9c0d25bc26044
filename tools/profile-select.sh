#!/usr/bin/env bash
# Nsight Compute profile of the selection kernels, one report per bench case (the case
# numbers of qsakv_bench --select-cases). Usage: profile-select.sh BUILD CASE... ; logs
# and reports go to $OUT. The top-k kernel also gets its SASS-level stall samples
# (source page), so a chain of latency-bound steps shows where it waits.
set -uo pipefail
OUT=${OUT:-/tmp/out}
build=${1:-build-gpu}
shift
for c in "$@"; do
  rep="$OUT/ncu-select-case$c"
  timeout 240 ncu --clock-control none -k regex:select_ --launch-count 4 --set full \
    --import-source yes -o "$rep" -f "$build/qsakv_bench" --select-only --select-cases "$c" \
    > "$rep.run.log" 2>&1
  echo "== case $c rc=$?"
  ncu -i "$rep.ncu-rep" --page details > "$rep.log" 2>&1
  grep -E "select_|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued" "$rep.log" | head -40
  ncu -i "$rep.ncu-rep" -k regex:select_topk --page source --csv --print-source cuda,sass \
    > "$rep.topk-source.csv" 2>&1 || true
done
