// SPDX-License-Identifier: Apache-2.0
// An experiment for issue 32's contract question: do Hopper's warpgroup MMAs
// (wgmma.mma_async m64n32k16 and m64n128k16, FP16 in, FP32 accumulators) give the same
// bits as the mma.sync m16n8k16 chain that the selection scorers use today, for the same
// operands and the same k order? The PTX ISA promises neither way, and the selection contract needs
// a row's scores to be the same bits on every route (batch invariance), so a warpgroup scorer for
// prefill chunks is only a drop-in if the answer is yes (docs/selection.md).
//
// Each CTA (one warpgroup) takes a 64 x 128 A (queries: rows x dims) and a 32 x 128 B
// (keys), or (the warpgroup scorer's shape) a 64 x 128 A of keys and a 128 x 128 B of
// queries, computes D = A B^T both ways over the 8 k-steps in ascending order, and writes
// both; the host counts the outputs whose bits differ and the largest difference in units
// of the last place, for operand sets that mimic the scorer's: normal FP16 queries and
// keys, keys that are E4M3 values (what the scorer's MMAs see for E4M3 index keys), and
// operands spread over 2^-12 .. 2^12 (long alignments inside the accumulation).
//
// Result on an H200 (docs/perf.md runs 37-39): no output of any of the seven cases differs
// in any bit (the last two, A from registers, since run 39).
//
// Build and run on an SM90 GPU (not part of the library or its tests):
//   nvcc -O3 -std=c++17 -arch=sm_90a -Ikernels -o /tmp/mma_bits tools/mma_bits.cu && /tmp/mma_bits
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/mma.cuh"
#include "cuda/smem_tile.cuh"
#include "cuda/wgmma.cuh"

namespace {

constexpr int kM = 64, kK = 128, kMaxN = 128;
constexpr int kAtomBytesA = kM * 128;  // one 64-column atom

using qsakv::cuda::sw128_offset;

// N = 32: the grouped attention's shape; N = 128: the selection's warpgroup scorer's (keys
// as A, 32 rows x 4 heads of queries as B).
// kRs: A from registers (mma.sync's A fragments per warp: the second warpgroup scorer's
// keys), not from shared memory.
template <int kN, bool kRs>
__global__ void __launch_bounds__(128)
    both_ways(const __half* a, const __half* b, float* d_wg, float* d_mma) {
  constexpr int kAtomBytesB = kN * 128;
  __shared__ __align__(1024) uint8_t sa[kM * kK * 2];
  __shared__ __align__(1024) uint8_t sb[kN * kK * 2];
  const __half* ga = a + static_cast<size_t>(blockIdx.x) * kM * kK;
  const __half* gb = b + static_cast<size_t>(blockIdx.x) * kN * kK;
  // Both operands K-major, 128-byte swizzled, atom-major (wgmma.cuh's layout).
  for (int c = threadIdx.x; c < kM * kK / 8; c += blockDim.x) {
    const int row = c / (kK / 8), chunk = c % (kK / 8);
    *reinterpret_cast<uint4*>(sa + sw128_offset(kM, row, chunk)) =
        *reinterpret_cast<const uint4*>(ga + row * kK + chunk * 8);
  }
  for (int c = threadIdx.x; c < kN * kK / 8; c += blockDim.x) {
    const int row = c / (kK / 8), chunk = c % (kK / 8);
    *reinterpret_cast<uint4*>(sb + sw128_offset(kN, row, chunk)) =
        *reinterpret_cast<const uint4*>(gb + row * kK + chunk * 8);
  }
  qsakv::cuda::fence_smem_for_wgmma();
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = 16 * warp + lane / 4, c0 = 2 * (lane % 4);
  float* wg_out = d_wg + static_cast<size_t>(blockIdx.x) * kM * kN;
  float* mma_out = d_mma + static_cast<size_t>(blockIdx.x) * kM * kN;

  // Warpgroup MMAs: k-step ks at byte offset (atom ks / 4, 32 (ks % 4)) of each operand.
  {
    float d[kN / 8][4] = {};
    const uint64_t da = qsakv::cuda::sw128_desc(qsakv::cuda::smem_addr(sa), 16, 1024);
    const uint64_t db = qsakv::cuda::sw128_desc(qsakv::cuda::smem_addr(sb), 16, 1024);
    auto pair = [](const __half* p) { return *reinterpret_cast<const uint32_t*>(p); };
    uint32_t fa[kK / 16][4];
#pragma unroll
    for (int ks = 0; ks < kK / 16; ++ks) {
      const int k0 = 16 * ks + c0;
      fa[ks][0] = pair(ga + r0 * kK + k0);
      fa[ks][1] = pair(ga + (r0 + 8) * kK + k0);
      fa[ks][2] = pair(ga + r0 * kK + k0 + 8);
      fa[ks][3] = pair(ga + (r0 + 8) * kK + k0 + 8);
    }
    qsakv::cuda::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kK / 16; ++ks)
      if constexpr (kRs)
        qsakv::cuda::wgmma_m64n128k16_rs<false>(
            d, fa[ks], db + ((ks >> 2) * kAtomBytesB + (ks & 3) * 32) / 16);
      else if constexpr (kN == 32)
        qsakv::cuda::wgmma_m64n32k16_ss<false>(d,
                                               da + ((ks >> 2) * kAtomBytesA + (ks & 3) * 32) / 16,
                                               db + ((ks >> 2) * kAtomBytesB + (ks & 3) * 32) / 16);
      else
        qsakv::cuda::wgmma_m64n128k16_ss<false>(
            d, da + ((ks >> 2) * kAtomBytesA + (ks & 3) * 32) / 16,
            db + ((ks >> 2) * kAtomBytesB + (ks & 3) * 32) / 16);
    qsakv::cuda::wgmma_commit();
    qsakv::cuda::wgmma_wait<0>();
    qsakv::cuda::pin_accumulators(d);
    qsakv::cuda::pin_fragments(fa);
    for (int i = 0; i < kN / 8; ++i) {
      wg_out[r0 * kN + 8 * i + c0] = d[i][0];
      wg_out[r0 * kN + 8 * i + c0 + 1] = d[i][1];
      wg_out[(r0 + 8) * kN + 8 * i + c0] = d[i][2];
      wg_out[(r0 + 8) * kN + 8 * i + c0 + 1] = d[i][3];
    }
  }
  // mma.sync m16n8k16: warp w rows 16w .. 16w + 15, the same k order, fragments from global.
  {
    auto pair = [](const __half* p) { return *reinterpret_cast<const uint32_t*>(p); };
    for (int i = 0; i < kN / 8; ++i) {
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      const int n = 8 * i + lane / 4;
      for (int ks = 0; ks < kK / 16; ++ks) {
        const int k0 = 16 * ks + c0;
        const uint32_t fa[4] = {pair(ga + r0 * kK + k0), pair(ga + (r0 + 8) * kK + k0),
                                pair(ga + r0 * kK + k0 + 8), pair(ga + (r0 + 8) * kK + k0 + 8)};
        qsakv::cuda::mma_16816<false>(d, fa, pair(gb + n * kK + k0), pair(gb + n * kK + k0 + 8));
      }
      mma_out[r0 * kN + 8 * i + c0] = d[0];
      mma_out[r0 * kN + 8 * i + c0 + 1] = d[1];
      mma_out[(r0 + 8) * kN + 8 * i + c0] = d[2];
      mma_out[(r0 + 8) * kN + 8 * i + c0 + 1] = d[3];
    }
  }
}

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

// The value of E4M3 code c (finite codes only; the caller skips 0x7F and 0xFF).
float e4m3_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                         : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  return s ? -v : v;
}

int64_t ulps(float x, float y) {
  int32_t a, b;
  std::memcpy(&a, &x, 4);
  std::memcpy(&b, &y, 4);
  if (a < 0) a = INT32_MIN - a;  // to a monotonic integer line
  if (b < 0) b = INT32_MIN - b;
  return std::llabs(static_cast<int64_t>(a) - b);
}

}  // namespace

int main() {
  int dev = 0, major = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major != 9) {
    printf("skipped: wgmma needs an SM90 GPU (this one is SM%d.x)\n", major);
    return 0;
  }
  const int ctas = 512;
  const size_t na = static_cast<size_t>(ctas) * kM * kK,
               nb_max = static_cast<size_t>(ctas) * kMaxN * kK,
               nd_max = static_cast<size_t>(ctas) * kM * kMaxN;
  std::vector<__half> ha(na), hb(nb_max);
  std::vector<float> wg(nd_max), mm(nd_max);
  __half *da, *db;
  float *dwg, *dmm;
  CHECK(cudaMalloc(&da, na * 2));
  CHECK(cudaMalloc(&db, nb_max * 2));
  CHECK(cudaMalloc(&dwg, nd_max * 4));
  CHECK(cudaMalloc(&dmm, nd_max * 4));
  // Kinds 0-2: the grouped attention's m64n32k16, queries as A and keys as B. Kinds 3-4: the
  // warpgroup selection scorer's m64n128k16, keys as A (kind 3: E4M3 codes as the scorer
  // stages them, the bitcast FP16 of the code's value x 2^-8, often subnormal) and 128
  // query columns as B. Kinds 5-6: the same with the keys' A fragments in registers (the
  // second warpgroup scorer's wgmma m64n128k16 with A from registers).
  const char* names[7] = {"normal FP16 queries and keys",   "normal queries, E4M3-valued keys",
                          "operands over 2^-12 .. 2^12",    "n128: E4M3 bitcast keys as A",
                          "n128: FP16 keys as A",           "n128 RS: E4M3 bitcast keys in regs",
                          "n128 RS: FP16 keys in registers"};
  int differing_cases = 0, broken = 0;
  for (int kind = 0; kind < 7; ++kind) {
    const bool keys_e4m3 = kind == 3 || kind == 5, from_regs = kind >= 5;
    const int n_cols = kind < 3 ? 32 : 128;
    const size_t nb = static_cast<size_t>(ctas) * n_cols * kK,
                 nd = static_cast<size_t>(ctas) * kM * n_cols;
    std::mt19937_64 rng(1234 + kind);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> code(0, 255), expo(-12, 12);
    auto finite_code = [&] {
      int c;
      do c = code(rng);
      while ((c & 0x7F) == 0x7F);
      return static_cast<uint8_t>(c);
    };
    for (auto& x : ha) {
      if (keys_e4m3) {  // select_score.cuh's e4m3_pair_as_half2_scaled, one code
        const uint16_t v = static_cast<uint16_t>(finite_code()) << 8;
        const uint16_t bits = static_cast<uint16_t>(((v >> 1) & 0x3F80u) | (v & 0x8000u));
        std::memcpy(&x, &bits, 2);
      } else {
        x = __float2half(kind == 2 ? std::ldexp(normal(rng), expo(rng)) : normal(rng));
      }
    }
    for (size_t i = 0; i < nb; ++i) {
      float v = normal(rng);
      if (kind == 1)
        v = e4m3_value(finite_code());
      else if (kind == 2)
        v = std::ldexp(v, expo(rng));
      hb[i] = __float2half(v);
    }
    CHECK(cudaMemcpy(da, ha.data(), na * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, hb.data(), nb * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dwg, 0xFF, nd * 4));  // NaN: an output left unwritten shows
    CHECK(cudaMemset(dmm, 0xFF, nd * 4));
    if (n_cols == 32)
      both_ways<32, false><<<ctas, 128>>>(da, db, dwg, dmm);
    else if (from_regs)
      both_ways<128, true><<<ctas, 128>>>(da, db, dwg, dmm);
    else
      both_ways<128, false><<<ctas, 128>>>(da, db, dwg, dmm);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(wg.data(), dwg, nd * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(mm.data(), dmm, nd * 4, cudaMemcpyDeviceToHost));
    // Sanity: both against an FP64 dot product (they must be close, or the layouts are wrong).
    size_t differ = 0, unwritten = 0;
    int64_t max_ulps = 0;
    double worst_rel_wg = 0, worst_rel_mma = 0;
    for (int cta = 0; cta < ctas; ++cta)
      for (int m = 0; m < kM; ++m)
        for (int n = 0; n < n_cols; ++n) {
          const size_t i = (static_cast<size_t>(cta) * kM + m) * n_cols + n;
          if (std::isnan(wg[i]) || std::isnan(mm[i])) {
            ++unwritten;
            continue;
          }
          double ref = 0, mag = 0;
          for (int k = 0; k < kK; ++k) {
            const double t = static_cast<double>(
                                 __half2float(ha[(static_cast<size_t>(cta) * kM + m) * kK + k])) *
                             __half2float(hb[(static_cast<size_t>(cta) * n_cols + n) * kK + k]);
            ref += t;
            mag += std::fabs(t);
          }
          if (mag > 0) {
            worst_rel_wg = std::fmax(worst_rel_wg, std::fabs(wg[i] - ref) / mag);
            worst_rel_mma = std::fmax(worst_rel_mma, std::fabs(mm[i] - ref) / mag);
          }
          if (std::memcmp(&wg[i], &mm[i], 4) != 0) {
            ++differ;
            max_ulps = std::max(max_ulps, ulps(wg[i], mm[i]));
          }
        }
    printf(
        "%-36s %zu outputs: %zu differ in bits (largest %lld ulp), %zu unwritten; "
        "|error| / sum|terms| vs FP64: wgmma %.2e, mma.sync %.2e\n",
        names[kind], nd, differ, static_cast<long long>(max_ulps), unwritten, worst_rel_wg,
        worst_rel_mma);
    // FP32 accumulation of 128 terms stays far inside 1e-4 of their magnitude; beyond it
    // (or an unwritten output) the experiment itself is wrong, not the hardware.
    if (unwritten || worst_rel_wg > 1e-4 || worst_rel_mma > 1e-4) ++broken;
    if (differ) ++differing_cases;
  }
  if (broken) {
    printf("BROKEN: an output is unwritten or far from FP64; no verdict\n");
    return 3;
  }
  printf("%s\n", differing_cases ? "DIFFERENT: wgmma is not a drop-in for the scorers' mma.sync"
                                 : "SAME BITS on every output of every case");
  return 0;
}
