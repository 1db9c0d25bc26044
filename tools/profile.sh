#!/usr/bin/env bash
# Nsight Compute profiles of qsakv_bench cases on the device machine, one report per case
# (--set full, clocks left alone), with a short summary printed and the hottest kernel's
# SASS-level stall samples exported (source page), so that a latency-bound chain shows
# where it waits, and its instructions and samples by source function
# (tools/ncu-sass-by-source.py over the build's disassembly; the overlap kind: both of the
# grouped route's kernels, one export each):
#   tools/profile.sh select  BUILD CASE...     selection cases (qsakv_bench --select-cases
#                                              numbers; E4M3 index keys): the score and
#                                              top-k kernels of the first two calls
#   tools/profile.sh decode  BUILD ROWS...     the decode table's E4M3 attention at ROWS
#                                              rows (--decode-only --e4m3-only): the
#                                              decode kernel's first two launches
#   tools/profile.sh overlap BUILD SHAPE:F...  the overlap sweep's workload SHAPE
#                                              (--overlap-shapes index) at shared fraction F,
#                                              E4M3: the grouped route's kernels (the
#                                              route forced first in each sweep point)
# Logs and reports go to $OUT. NCU_WARP_SAMPLING=N samples warp stalls every 2^(5+N) cycles
# (ncu's --warp-sampling-interval; default auto): 0 for a kernel of a few microseconds on a
# few CTAs (the one-row filter kernel of a decode step), whose auto period leaves too few
# samples to rank its lines.
set -uo pipefail
OUT=${OUT:-/tmp/out}
kind=${1:?select, decode or overlap}
build=${2:?build directory}
shift 2
# The build's disassembly with line information (the library is built with -lineinfo),
# for ncu-sass-by-source.py: the cubins of the kernels profiled below.
dis="$OUT/qsakv-$kind.dis"
case $kind in select) cubins="select" ;; decode) cubins="decode_attention" ;; *) cubins="grouped_attention decode_attention" ;; esac
lib=$(realpath "$build/libqsakv.so")
(tmp=$(mktemp -d) && cd "$tmp" && cuobjdump -xelf all "$lib" > /dev/null &&
  for c in $cubins; do nvdisasm -c -gi "$c".*.cubin; done > "$dis"; rm -rf "$tmp") ||
  echo "profile.sh: no disassembly of $build/libqsakv.so (cuobjdump, nvdisasm on PATH?)" >&2
for c in "$@"; do
  case $kind in
    select)
      name="select-case$c" regex="select_" hot="select_topk|select_filter select_score" count=4
      args=(--select-only --select-cases "$c" --index-keys e4m3) ;;
    decode)
      name="decode-rows$c" regex="decode_attention" hot="decode_attention" count=2
      args=(--decode-only --e4m3-only --rows "$c") ;;
    overlap)
      name="overlap-${c/:/-f}" regex="grouped_|decode_attention" hot="grouped_union grouped_attention" count=3
      args=(--overlap-only --overlap-dtype e4m3 --overlap-shapes "${c%%:*}" --overlap-f "${c#*:}") ;;
    *) echo "profile.sh: unknown kind $kind (select, decode or overlap)" >&2; exit 2 ;;
  esac
  rep="$OUT/ncu-$name"
  timeout 240 ncu --clock-control none -k "regex:$regex" --launch-count "$count" --set full \
    --warp-sampling-interval "${NCU_WARP_SAMPLING:-auto}" \
    --import-source yes -o "$rep" -f "$build/qsakv_bench" "${args[@]}" > "$rep.run.log" 2>&1
  echo "== $name rc=$?"
  ncu -i "$rep.ncu-rep" --page details > "$rep.log" 2>&1
  grep -E "$regex|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued" \
    "$rep.log" | head -48
  for h in $hot; do
    echo "-- $h: top source lines by stall samples"
    ncu -i "$rep.ncu-rep" -k "regex:$h" --page source --csv --print-source cuda,sass \
      > "$rep.${h//|/-}.source.csv" 2>&1 || true
    python3 "$(dirname "$0")/ncu-source-top.py" "$rep.${h//|/-}.source.csv" 20 || true
    echo "-- $h: instructions and stall samples by source function (first launch)"
    ncu -i "$rep.ncu-rep" -k "regex:$h" --page source --csv --print-source sass \
      > "$rep.${h//|/-}.sass.csv" 2>&1 || true
    python3 "$(dirname "$0")/ncu-sass-by-source.py" "$dis" "$rep.${h//|/-}.sass.csv" \
      "$h" 2>&1 | head -16 || true
  done
done
