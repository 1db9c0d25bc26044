#!/usr/bin/env bash
# The SM70 kernel tier must keep building for sm_70 (V100), which CUDA 13 cannot target:
# compiles the tier's kernels to sm_70 SASS with NVRTC 12.9 and ptxas 12.9 from PyPI
# (tools/install-deps.sh --cuda12 puts them in .deps-cuda12/), failing on any warning,
# register spills included. Run by the sm70_build suite on every `make test`.
#
#   tools/sm70-check.sh [OUT_DIR]
#
# Without the CUDA 12.9 packages it says so and exits 77 (CTest: skipped), unless
# QSAKV_REQUIRE_SM70_CHECK=1, CI=true or QSAKV_REQUIRE_ALL_SUITES=1: then their absence
# is a failure.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${QSAKV_CUDA12_ROOT:-$repo/.deps-cuda12}
out=${1:-$(mktemp -d)}
if [ ! -f "$root/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ] || [ ! -x "$root/nvidia/cuda_nvcc/bin/ptxas" ]; then
  msg="CUDA 12.9 NVRTC/ptxas not found in $root (run: tools/install-deps.sh --cuda12)"
  if [ "${QSAKV_REQUIRE_SM70_CHECK:-0}" = 1 ] || [ "${CI:-}" = true ] ||
     [ "${QSAKV_REQUIRE_ALL_SUITES:-0}" = 1 ]; then
    echo "sm70-check: FAILED: $msg" >&2
    exit 1
  fi
  echo "sm70-check: SKIPPED: $msg"
  exit 77
fi
# NVRTC runs ptxas in-process; ptxas 12.9 is on PATH for anyone inspecting the cubin.
export PATH="$root/nvidia/cuda_nvcc/bin:$PATH"
exec "${PYTHON:-python3}" "$repo/tools/sm70/sm70_check.py" "$root" "$repo" "$out"
