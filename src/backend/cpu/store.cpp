// SPDX-License-Identifier: Apache-2.0
// Reference stores: K/V quantisation by slot mapping, index-key row scatters.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_kernels.hpp"
#include "backend/cpu/element.hpp"

namespace qsakv {
namespace cpu {

void store_kv(const StoreKvParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t capacity = c.num_blocks * c.block_size;
  const int64_t row = static_cast<int64_t>(c.kv_heads) * c.head_dim;
  const bool fp8 = c.dtype == QSAKV_DTYPE_E4M3;
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = p.slot_mapping[i];
    if (slot < 0 || slot >= capacity) continue;  // -1 is padding; out of range is dropped
    const int64_t block = slot / c.block_size, offset = slot % c.block_size;
    for (int kv = 0; kv < 2; ++kv) {
      const void* src = kv == 0 ? p.k : p.v;
      const float scale = c.scales[kv];
      for (int h = 0; h < c.kv_heads; ++h) {
        const int64_t dst0 =
            block * c.stride_block + kv * c.stride_kv + offset * c.stride_token + h * c.stride_head;
        for (int d = 0; d < c.head_dim; ++d) {
          const int64_t s = i * row + static_cast<int64_t>(h) * c.head_dim + d;
          if (fp8) {
            // FP32 division, then saturating round-to-nearest-even (DOMAIN section 3).
            const uint8_t b = e4m3::quantize(load_f32(src, s, p.act_dtype), scale);
            static_cast<uint8_t*>(c.data)[dst0 + d] = b;
            if ((b & 0x7Fu) == e4m3::kNaN) *c.nan_flag = 1;
          } else {
            const uint16_t x = static_cast<const uint16_t*>(src)[s];
            static_cast<uint16_t*>(c.data)[dst0 + d] = x;
            // A non-finite V value (the CUDA grouped route checks flagged layers' V).
            const uint16_t exp = p.act_dtype == QSAKV_DTYPE_BF16 ? 0x7F80u : 0x7C00u;
            if (kv == 1 && (x & exp) == exp) *c.nan_flag = 1;
          }
        }
      }
    }
  }
}

static void copy_row(const StoreRowsParams& p, int64_t src_row, int64_t dst_row) {
  std::memcpy(static_cast<uint16_t*>(p.dst) + dst_row * p.row_elems, p.src + src_row * p.row_elems,
              sizeof(uint16_t) * p.row_elems);
}

void store_ring(const StoreRowsParams& p) {
  for (int64_t i = 0; i < p.num_rows; ++i) {
    const int32_t r = p.request_slots[i];
    const int64_t pos = p.positions[i];
    if (pos < 0 || r < 0 || r >= p.max_requests) continue;
    copy_row(p, i, static_cast<int64_t>(r) * p.ring_length + pos % p.ring_length);
  }
}

void store_compressed(const StoreCompressedParams& p) {
  const CompressedKeysView& c = p.cache;
  const int64_t entries = c.num_blocks * c.keys_per_block;
  for (int64_t i = 0; i < p.num_keys; ++i) {
    const int64_t slot = p.slot_mapping[i];
    if (slot < 0) continue;
    const int64_t entry = slot / p.compress_ratio;
    if (entry >= entries) continue;
    const uint16_t* x = p.src + i * c.dim;
    const CompressedKeyAddress a = compressed_key_address(c, entry);
    if (!a.scale) {
      std::memcpy(a.codes, x, sizeof(uint16_t) * c.dim);
      continue;
    }
    float amax = 0.0f;
    bool finite = true;
    for (int d = 0; d < c.dim; ++d) {
      const float v = std::fabs(halfbits::fp16_to_f32(x[d]));
      if (!std::isfinite(v))
        finite = false;
      else if (v > amax)
        amax = v;
    }
    const float scale = e4m3::key_scale(amax, finite);
    for (int d = 0; d < c.dim; ++d)
      reinterpret_cast<uint8_t*>(a.codes)[d] = e4m3::key_code(halfbits::fp16_to_f32(x[d]), scale);
    *a.scale = scale;
  }
}

}  // namespace cpu
}  // namespace qsakv
