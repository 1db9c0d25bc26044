// SPDX-License-Identifier: Apache-2.0
// The device code of the SM70 kernel tier, as one translation unit for the sm_70 build
// check (tools/sm70-check.sh): CUDA 13 has no sm_70 target, and PyPI's CUDA 12.9 packages
// carry NVRTC and ptxas but not the nvcc driver, so the check compiles the tier's kernels
// with NVRTC 12.9 to sm_70 SASS (the kernels are named in sm70_check.py).
#include "cuda/decode_attention.cuh"
#include "cuda/decode_attention_simt.cuh"
#include "cuda/e4m3_decode.cuh"
#include "cuda/grouped_attention.cuh"
#include "cuda/grouped_union.cuh"
#include "cuda/select_score_simt.cuh"
#include "cuda/store.cuh"
