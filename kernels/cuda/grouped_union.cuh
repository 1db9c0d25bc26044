// SPDX-License-Identifier: Apache-2.0
// The grouped route's first kernel (sparse): one CTA per row group (up to 16 consecutive
// rows of one request) splits its rows' top-k lists by how many of the rows select each
// token, on the device at every launch (so one captured graph routes each replay by that
// replay's lists):
//   - tokens that at least grouped_share_min_rows(n, ...) of the group's n rows select
//     form its list: ascending, each with the mask of the rows that select it and its K
//     row offset (block table resolved once), read once for all rows by the grouped
//     attention kernel on tensor cores;
//   - a row left with at most kGroupedOwnMax entries of its own moves them into the list
//     as well (with its bit only), so it needs no pass of its own;
//   - every other valid entry is the row's own: it is written, in list order, to the
//     row's own list, which the decode route computes, folding in the row's shared part
//     (decode_attention.cuh).
// So the work on each route follows what the rows actually share, and no list outgrows a
// workspace: each token the rule shares stands for at least n / 2 of the n x width
// entries, so the rule never shares more than 2 x width, and moved rows add at most
// kGroupedOwnMax each (grouped_union_cap). A window in which the rule shares fewer than
// kGroupedMinShared tokens lists none (limits.hpp says why for each number).
//
// Work: each warp takes a part of one row's list (the row warp-uniform, so a row's bit,
// validity bound and counts need no per-entry arithmetic), and each phase touches an entry
// with a handful of instructions; the masks are scanned only up to the group's last
// position. Per window of positions (one window up to 64K tokens):
//   1. each thread holds up to kUnionEntries of its row's entries in registers, loaded
//      once (valid: t >= 0 and t <= its row's position; -1 otherwise);
//   2. each entry ORs its row's bit into its position's 16-bit mask (shared memory);
//   3. the positions the rule shares, and those any row selects, are counted (one scan);
//      the entries the rule shares are marked in a per-thread bit set, once;
//   4. each row's other entries are counted by warp ballots: rows left with at most
//      kGroupedOwnMax move them to the list; when none or all rows move, step 3's scan
//      already numbers the listed positions, else a second scan does;
//   5. the listed positions are written to the list, their K offsets resolved with four
//      loads in flight per thread;
//   6. each entry's own bit by warp ballot (a warp's 32 entries are one word of its
//      row); a block scan of the words' popcounts gives each own entry its place in its
//      row's own list.
// A group that lists nothing (rows that share almost nothing, as independent selections
// do) skips step 6: its rows' own lists are their top-k rows, and row_split says so
// (kOwnIsTopk), so such groups cost steps 1-3 and no writes. With several windows that
// is known only at the last one, so step 6 waits for the first window that lists; if that
// is not window 0, the loop goes back to window 0 once. (docs/perf.md run 35: groups
// that list nothing took 241 us at 128K, writing every window's own entries, against
// 58 us at 32K, where they skip step 6.)
// A token on an unmapped page keeps its place in the list with offset -1 and an empty
// mask (the attention kernel reads zeros for it, and no row sees it).
//
// The wide variant (kUnionWide) keeps one window of up to kGroupedUnionWideWindow
// positions (128K) where the several-window variant would take two: instead of a 16-bit
// row mask per position it keeps an 8-bit count of the rows that select it (half the
// bytes), so step 2 adds where it ORed and step 3 compares counts. Which rows select a
// listed token is then rebuilt for the listed tokens only: the listed positions are a
// bitmap (the rule's, plus the moved rows' entries), numbered by a scan of its words, and
// each listed entry ORs its row's bit into its token's mask at that number. A group that
// lists nothing exits after step 3 as in one window (docs/perf.md run 41: at 128K the
// several-window variant took 190 us where such groups list nothing).
#pragma once

#include <stdint.h>

#include "limits.hpp"
#include "paged_address.cuh"
#include "params.hpp"
#include "cuda/block_scan.cuh"
#include "cuda/dependent_launch.cuh"

namespace qsakv {
namespace cuda {

constexpr int kUnionThreads = kGroupedUnionThreads;
constexpr int kUnionWarps = kUnionThreads / 32;
static_assert(kUnionWarps % kGroupedMaxRows == 0, "each row of a group takes whole warps");
// List entries per thread per pass, in registers: a row's two warps take 64 of its
// entries per slot, so 36 slots hold the reference geometry's 2051-entry rows in one
// pass. Wider lists take several passes, each reading its entries again.
constexpr int kUnionEntries = 36;
static_assert(kUnionEntries % 2 == 0 && kUnionEntries <= 64, "slots pair up; one bit each");
static_assert(kGroupedUnionWindow <= 65536, "a slot keeps its offset in its window in 16 bits");
static_assert(kGroupedUnionWideWindow <= 131072, "the wide variant keeps one more offset bit");
// row_split's own count of a row whose own list is its top-k row (its group listed
// nothing): the decode kernel reads the top-k row instead.
constexpr int kOwnIsTopk = -1;

struct UnionParams {
  PlanMetaView meta;
  const int32_t* topk;
  int64_t topk_stride;
  int32_t topk_width;
  int32_t block_size;
  int64_t num_blocks;
  int64_t stride_block;  // bytes
  int64_t stride_token;  // bytes
  int32_t share_rows;    // grouped_share_min_rows' cost term for this cache type
  int32_t window;        // positions per pass (grouped_union_window)
  int32_t entry_words;   // rows_per_group x union_row_words(topk_width)
  int32_t union_cap;
  int32_t* union_count;
  int64_t* union_off;
  uint32_t* union_mask;
  int32_t* own_lists;  // [max_rows, topk_width]
  int2* row_split;
};

// A row's entries take whole 32-entry words (a warp's ballot), so rows start on words.
// A bit per register slot, in two words (every slot index is a compile-time constant, so
// each test and set is one instruction on one word, with none of 64-bit shifts' cost).
struct SlotBits {
  uint32_t lo = 0u, hi = 0u;
  __device__ __forceinline__ void set(int k) {
    if (k < 32)
      lo |= 1u << k;
    else
      hi |= 1u << (k - 32);
  }
  __device__ __forceinline__ bool test(int k) const {
    return ((k < 32 ? lo >> k : hi >> (k - 32)) & 1u) != 0u;
  }
};

__host__ __device__ constexpr int union_row_words(int topk_width) { return (topk_width + 31) / 32; }

// Dynamic shared memory, in 32-bit words: the window's per-position words (masks, two
// positions a word; the wide variant's below), the window's listed tokens and their masks,
// the own-entry words and their prefixes.
struct UnionLayout {
  int tokens, token_masks, own, own_prefix, words;
};
// The wide variant's per-position words: a count byte per position, a listed bit per
// position, and the number of the listed positions before each 32.
__host__ __device__ constexpr int union_wide_position_words(int window) {
  return window / 4 + 2 * (window / 32);
}
__host__ __device__ inline UnionLayout union_layout(int window, bool wide, int union_cap,
                                                    int entry_words) {
  UnionLayout L;
  L.tokens = wide ? union_wide_position_words(window) : window / 2;
  L.token_masks = L.tokens + union_cap;
  L.own = L.token_masks + (union_cap + 1) / 2;
  L.own_prefix = L.own + entry_words;
  L.words = L.own_prefix + entry_words;
  return L;
}
// The dynamic shared memory of a launch, in bytes.
inline int union_smem_bytes(int window, bool wide, const UnionParams& p) {
  return static_cast<int>(sizeof(uint32_t)) *
         union_layout(window, wide, p.union_cap, p.entry_words).words;
}

// The kernel's variants (each launch takes one for the whole plan):
//   kUnionOneWindow: every group is one window of one pass, loaded once; no reloading code
//     (fewer live registers);
//   kUnionReload: the plan's context can outgrow one window (each window loads its
//     entries), or its lists one pass (then each phase reloads its pass of the window);
//   kUnionWide: one window of up to kGroupedUnionWideWindow positions and one pass, with
//     counts instead of masks (above).
enum UnionVariant { kUnionOneWindow, kUnionReload, kUnionWide };

template <int kVariant>
__global__ void __launch_bounds__(kUnionThreads, 1) grouped_union_kernel(const UnionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
  // Not part of the SM70 tier (its plans make no groups), so never launched in sm_70 code,
  // where this body spills at 64 registers (CUDA 12.9): a V100 build carries a stub.
  (void)p;
  __trap();
#else
  constexpr bool kReload = kVariant == kUnionReload;
  constexpr bool kWide = kVariant == kUnionWide;
  wait_for_predecessors();  // the top-k lists (dependent_launch.cuh)
  allow_dependents();
  const int group = blockIdx.x;
  if (group >= p.meta.header->num_groups) return;
  extern __shared__ uint4 union_smem_raw[];
  uint32_t* union_smem = reinterpret_cast<uint32_t*>(union_smem_raw);
  const UnionLayout L = union_layout(p.window, kWide, p.union_cap, p.entry_words);
  uint32_t* pmask = union_smem;  // position x's mask: bits 16 (x & 1) .. of word x / 2
  // Wide: position x's count is byte x (little-endian bytes of the words), its listed bit
  // bit x & 31 of listed_bits[x / 32], and listed_rank[x / 32] numbers the listed
  // positions before that word.
  uint32_t* counts = union_smem;
  uint32_t* listed_bits = union_smem + p.window / 4;
  int32_t* listed_rank = reinterpret_cast<int32_t*>(listed_bits + p.window / 32);
  int32_t* tokens = reinterpret_cast<int32_t*>(union_smem + L.tokens);
  uint16_t* token_masks = reinterpret_cast<uint16_t*>(union_smem + L.token_masks);
  uint32_t* own = union_smem + L.own;                                           // this window's
  int32_t* own_prefix = reinterpret_cast<int32_t*>(union_smem + L.own_prefix);  // exclusive
  __shared__ long long warp_totals[kUnionWarps];  // the position scans (two sums a value)
  __shared__ int32_t word_totals[kUnionWarps];    // the own-word scan
  __shared__ int32_t row_own[kGroupedMaxRows];    // this window's own entries by the rule
  __shared__ int32_t row_done[kGroupedMaxRows];   // own entries written, earlier windows

  const int row0 = p.meta.group_row0[group];
  const int rows = p.meta.group_rows[group];
  const int pos0 = p.meta.row_pos[row0];  // the group's rows sit at pos0 .. pos0 + rows - 1
  const int req = p.meta.row_request[row0];
  const int32_t* bt =
      p.meta.header->block_table + static_cast<int64_t>(req) * p.meta.header->block_table_stride;
  const int W = p.topk_width;
  const int row_words = union_row_words(W);
  const int used_words = rows * row_words;
  const int T = grouped_share_min_rows(rows, p.share_rows);
  const int last = pos0 + rows - 1;
  const int per = p.window / kUnionThreads;  // positions this thread owns, consecutive
  const int64_t base = static_cast<int64_t>(group) * p.union_cap;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid < kGroupedMaxRows) row_done[tid] = 0;

  // Warps 2r and 2r + 1 take row r; slot k of warp 2r + sub holds columns
  // ((pass x kUnionEntries + k) x 2 + sub) x 32 + lane, which is word (...) of the row.
  // Warps past the last row idle (a group of fewer rows takes no longer per entry). (Fixed
  // strides: compile-time offsets, which keep the slots' addresses out of registers.)
  constexpr int wpr = kUnionWarps / kGroupedMaxRows;
  const int r = warp / wpr, sub = warp % wpr;
  const bool has_row = r < rows;
  const uint32_t rbit = has_row ? 1u << r : 0u;
  // This lane's first entry of its row and its bound (slot k is entry k x 64 on from it):
  // kept in registers, so each slot's load is one instruction with a constant offset.
  const int32_t* tlane =
      p.topk + static_cast<int64_t>(row0 + (has_row ? r : 0)) * p.topk_stride + sub * 32 + lane;
  asm volatile("" : "+l"(tlane));
  const int tlim = has_row ? W - sub * 32 - lane : 0;  // entry k x 64 exists: k x 64 < tlim
  const int slot_words = kUnionEntries * wpr;          // a row's words per pass
  const int passes = kReload ? (row_words + slot_words - 1) / slot_words : 1;
  auto word_of = [&](int pass, int k) { return (pass * kUnionEntries + k) * wpr + sub; };
  // The slots' entries of the current window: offsets from the window's start, two a word
  // (a window has at most 64K positions; the wide variant's 128K keep bit 16 in `high`),
  // and a bit per slot for the valid ones (t >= 0, t <= the row's position, in the
  // window). Half the registers of whole tokens: the slots stay in registers across the
  // phases instead of spilling.
  uint32_t offs[kUnionEntries / 2];
  SlotBits valid;
  SlotBits shared_bits;  // the slots the rule shares (from step 3)
  SlotBits high;         // wide variant: bit 16 of each slot's offset (windows past 64K)
  auto load = [&](int pass, int w0) {
    valid = SlotBits();
    if constexpr (kWide) high = SlotBits();
#pragma unroll
    for (int k = 0; k < kUnionEntries; ++k) {
      const int c = (pass * kUnionEntries + k) * 32 * wpr;  // == word_of(pass, k) x 32 + lane
      uint32_t x16 = 0u;
      if (c < tlim) {
        const int x = __ldg(tlane + c);
        if (x >= 0 && x <= pos0 + r &&
            static_cast<unsigned>(x - w0) < static_cast<unsigned>(p.window)) {
          valid.set(k);
          x16 = static_cast<uint32_t>(x - w0);
          if constexpr (kWide) {  // bit 16 apart
            if (x16 >> 16) high.set(k);
            x16 &= 0xFFFFu;
          }
        }
      }
      if (k % 2 == 0)
        offs[k / 2] = x16;
      else
        offs[k / 2] |= x16 << 16;
    }
  };
  // Called at the head of each phase: the compiler must then rederive each slot's
  // addresses from the offsets instead of keeping the previous phase's per-slot values
  // live (36 more registers each, which spilled).
  auto launder = [&]() {
#pragma unroll
    for (int i = 0; i < kUnionEntries / 2; ++i) asm volatile("" : "+r"(offs[i]));
    asm volatile("" : "+r"(valid.lo), "+r"(valid.hi), "+r"(shared_bits.lo), "+r"(shared_bits.hi));
    if constexpr (kWide) asm volatile("" : "+r"(high.lo), "+r"(high.hi));
  };
  auto has = [&](int k) { return valid.test(k); };
  auto off = [&](int k) {
    const int x = static_cast<int>(offs[k / 2] >> (16 * (k % 2)) & 0xFFFFu);
    if constexpr (kWide)
      return high.test(k) ? x | 0x10000 : x;
    else
      return x;
  };
  // One pass (lists up to 2304 entries): loaded once per window (the window's offsets).
  // Several passes: each phase loads its pass of the window again.
  const bool reload = kReload && passes > 1;
  // Position x's mask (a 16-bit read: little-endian halves of the words).
  const uint16_t* pmask16 = reinterpret_cast<const uint16_t*>(pmask);
  auto mask_at = [&](int x) { return static_cast<uint32_t>(pmask16[x]); };
  const uint8_t* count8 = reinterpret_cast<const uint8_t*>(counts);
  // Step 3's rule for slot k's entry: at least T of the group's rows select its position.
  auto rule_shares = [&](int k) {
    if constexpr (kWide)
      return static_cast<int>(count8[off(k)]) >= T;
    else
      return __popc(mask_at(off(k))) >= T;
  };
  if (!kReload) load(0, 0);  // the one window's entries, once

  int count = 0;  // listed tokens of the earlier windows
  // Several windows: until a window lists, windows only count (steps 1-3) and write no
  // own entries, so that if none lists, the rows' own lists are their top-k rows
  // (kOwnIsTopk). The first window that lists, if not the first, sends the loop back to
  // window 0 to write the own entries of the windows before it in order; those windows
  // are then known to list nothing, so they skip the counting (steps 1-3).
  // listed_from: -1 while waiting, then the first window that lists.
  int listed_from = kReload ? -1 : 0;
  for (int w0 = 0; w0 <= last; w0 += p.window) {
    if (kReload && !reload) load(0, w0);  // this window's entries
    // Positions past the group's last row cannot be selected: the masks are cleared and
    // scanned only up to it (this thread's 8-position chunks below `chunks`).
    const bool known_empty = kReload && w0 < listed_from;  // uniform: nothing to count
    const int span = known_empty ? 0 : min(p.window, last + 1 - w0);
    const int chunks = max(0, min(per / 8, (span - tid * per + 7) / 8));
    uint4* my_masks = reinterpret_cast<uint4*>(pmask) + tid * (per / 8);
    // This thread's positions' masks, 8 at a time (16-byte reads): f(position offset, mask).
    auto for_my_masks = [&](auto&& f) {
      for (int i = 0; i < chunks; ++i) {
        const uint4 v = my_masks[i];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          f(8 * i + 2 * j, w[j] & 0xFFFFu);
          f(8 * i + 2 * j + 1, w[j] >> 16);
        }
      }
    };
    // Wide: this thread's positions as 32-position words up to the group's last (a listed-bit
    // word and two 16-byte count reads each).
    const int wpt = per / 32;
    const int my_words = kWide ? max(0, min(wpt, (span - tid * per + 31) / 32)) : 0;
    uint4* my_counts = reinterpret_cast<uint4*>(counts) + tid * (per / 16);
    uint32_t* my_bits = listed_bits + tid * wpt;
    int32_t* my_ranks = listed_rank + tid * wpt;
    if constexpr (kWide) {
      for (int i = 0; i < 2 * my_words; ++i) my_counts[i] = make_uint4(0u, 0u, 0u, 0u);
    } else {
      for (int i = 0; i < chunks; ++i) my_masks[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    if (tid < kGroupedMaxRows) row_own[tid] = 0;
    __syncthreads();
    for (int pass = 0; pass < (known_empty ? 0 : passes); ++pass) {
      if (reload) load(pass, w0);
      launder();
#pragma unroll
      for (int k = 0; k < kUnionEntries; ++k)
        if (has(k)) {
          const int x = off(k);
          // (Wide: at most `rows` per byte, as lists repeat no token. A repeating list could
          // carry into the next positions' counts in the word, listing a position up to 3
          // past the rows with an empty mask: the launch takes this variant only for blocks
          // of a multiple of 4 tokens, so that position's block is the request's last.)
          if constexpr (kWide)
            atomicAdd(&counts[x >> 2], 1u << ((x & 3) << 3));
          else
            atomicOr(&pmask[x >> 1], rbit << ((x & 1) << 4));
        }
    }
    __syncthreads();
    // The positions the rule shares (low half) and those any row selects (high half).
    long long mine = 0;
    if constexpr (kWide) {
      // Four counts a word: __vcmpgeu4 gives 0xFF in each byte at or over T, whose top bits
      // gather into the word's 32 listed bits (the rule's positions, for now).
      const uint32_t t4 = static_cast<uint32_t>(T) * 0x01010101u;
      for (int j = 0; j < wpt; ++j) {
        uint32_t bits = 0u;
        int any = 0;
        if (j < my_words) {
          const uint4 a = my_counts[2 * j], b = my_counts[2 * j + 1];
          const uint32_t c[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            const uint32_t ge = __vcmpgeu4(c[q], t4);
            bits |= ((ge >> 7 & 1u) | (ge >> 14 & 2u) | (ge >> 21 & 4u) | (ge >> 28 & 8u))
                    << (4 * q);
            any += __popc(__vcmpgtu4(c[q], 0u));
          }
        }
        my_bits[j] = bits;
        mine += __popc(bits) + (static_cast<long long>(any / 8) << 32);
      }
    } else {
      for_my_masks([&](int, uint32_t m) {
        mine += (__popc(m) >= T ? 1ll : 0ll) + (m != 0u ? 1ll << 32 : 0ll);
      });
    }
    long long totals;
    const long long before = block_exclusive_scan<kUnionWarps>(mine, warp_totals, totals);
    const int by_rule = static_cast<int>(totals & 0xFFFFFFFFll);
    const bool sharing = by_rule >= kGroupedMinShared;  // uniform
    // This pass's entries the rule shares, a bit per slot (single pass: kept for the window).
    auto rule_bits = [&]() {
      launder();
      SlotBits b;
#pragma unroll
      for (int k = 0; k < kUnionEntries; ++k)
        if (has(k) && rule_shares(k)) b.set(k);
      return b;
    };
    shared_bits = SlotBits();
    if (sharing && !reload) shared_bits = rule_bits();
    // Each row's entries the rule does not share, counted: rows left with at most
    // kGroupedOwnMax move them to the list.
    uint32_t moved = 0u;
    if (sharing) {
      int n = 0;
      for (int pass = 0; pass < passes; ++pass) {
        if (reload) {
          load(pass, w0);
          shared_bits = rule_bits();
        }
        launder();
#pragma unroll
        for (int k = 0; k < kUnionEntries; ++k)
          n += __popc(__ballot_sync(0xffffffffu, has(k) && !shared_bits.test(k)));
      }
      if (lane == 0 && has_row && n) atomicAdd(&row_own[r], n);
      __syncthreads();
      for (int q = 0; q < rows; ++q) moved |= row_own[q] <= kGroupedOwnMax ? 1u << q : 0u;
    }
    const uint32_t all_rows = rows >= 32 ? ~0u : (1u << rows) - 1u;
    // A position's mask in the list: every selecting row's where the rule shares it, else
    // the moved rows' (0: not listed). With no row moved that is the rule's positions, with
    // every row moved every selected position: the first scan numbered both.
    auto listed_mask = [&](uint32_t m) { return __popc(m) >= T ? m : m & moved; };
    int listed = 0, slot = 0;
    if (kWide && sharing) {
      // The moved rows' other entries join the rule's listed positions; then the listed
      // words are numbered in position order.
      if ((moved & rbit) != 0u) {  // warp-uniform
        launder();
#pragma unroll
        for (int k = 0; k < kUnionEntries; ++k)
          if (has(k) && !shared_bits.test(k)) {
            const int x = off(k);
            atomicOr(&listed_bits[x >> 5], 1u << (x & 31));
          }
      }
      __syncthreads();
      int n = 0;
      for (int j = 0; j < my_words; ++j) n += __popc(my_bits[j]);
      int rank = block_exclusive_scan<kUnionWarps>(n, word_totals, listed);
      for (int j = 0; j < my_words; ++j) {
        my_ranks[j] = rank;
        rank += __popc(my_bits[j]);
      }
    } else if (sharing) {
      if (moved == 0u) {
        listed = by_rule;
        slot = static_cast<int>(before & 0xFFFFFFFFll);
      } else if (moved == all_rows) {
        listed = static_cast<int>(totals >> 32);
        slot = static_cast<int>(before >> 32);
      } else {
        long long n = 0;
        for_my_masks([&](int, uint32_t m) { n += listed_mask(m) != 0u; });
        long long total;
        slot = static_cast<int>(block_exclusive_scan<kUnionWarps>(n, warp_totals, total));
        listed = static_cast<int>(total);
      }
    }
    // Uniform. (The rules keep count + listed <= union_cap; the bound is checked anyway,
    // so a broken rule costs speed, never memory safety.)
    const bool listing = sharing && count + listed <= p.union_cap;
    if (kWide && listing) {
      // The listed positions in order, from this thread's words; the masks cleared, then
      // each entry listed for its row (the rule shares it, or the row moved) ORs its bit
      // into its token's mask, found by its word's number and the listed bits before it.
      for (int j = 0; j < my_words; ++j) {
        uint32_t bits = my_bits[j];
        int at = my_ranks[j];
        const int x0 = w0 + (tid * wpt + j) * 32;
        for (; bits != 0u; bits &= bits - 1u) tokens[at++] = x0 + __ffs(bits) - 1;
      }
      uint32_t* mask_words = reinterpret_cast<uint32_t*>(token_masks);
      for (int i = tid; i < (listed + 1) / 2; i += kUnionThreads) mask_words[i] = 0u;
      __syncthreads();
      const bool row_moved = (moved & rbit) != 0u;
      launder();
#pragma unroll
      for (int k = 0; k < kUnionEntries; ++k)
        if (has(k) && (row_moved || shared_bits.test(k))) {
          const int x = off(k);
          const int at =
              listed_rank[x >> 5] + __popc(listed_bits[x >> 5] & ((1u << (x & 31)) - 1u));
          atomicOr(&mask_words[at >> 1], rbit << ((at & 1) << 4));
        }
    } else if (listing) {
      for_my_masks([&](int x, uint32_t m) {
        const uint32_t lm = listed_mask(m);
        if (lm) {
          tokens[slot] = w0 + tid * per + x;
          token_masks[slot++] = static_cast<uint16_t>(lm);
        }
      });
    }
    __syncthreads();
    if (listing) {
      constexpr int kUnroll = 4;  // independent block-table loads in flight per thread
      for (int i0 = tid; i0 < listed; i0 += kUnroll * kUnionThreads) {
        int32_t phys[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const int i = i0 + k * kUnionThreads;
          phys[k] = i < listed ? __ldg(bt + tokens[i] / p.block_size) : -1;
        }
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const int i = i0 + k * kUnionThreads;
          if (i >= listed) break;
          const bool mapped = page_mapped(phys[k], p.num_blocks);
          p.union_off[base + count + i] = mapped
                                              ? paged_row_offset(phys[k], tokens[i], p.block_size,
                                                                 p.stride_block, p.stride_token)
                                              : -1;
          p.union_mask[base + count + i] = mapped ? token_masks[i] : 0u;
        }
      }
    }
    if (kReload && listed_from < 0) {  // uniform: no window listed before this one
      if (!listing) continue;          // nothing reads the masks or row_own past the barrier above
      listed_from = w0;
      if (w0 > 0) {      // the first that lists: back to window 0 (see `listed_from`)
        w0 = -p.window;  // (the loop's increment)
        continue;
      }
    }
    if (listing) count += listed;
    // A group that listed nothing, in its one window: its rows' own lists are their top-k
    // rows.
    if (!kReload && !listing) break;
    // The own entries (valid, in the window, not listed for their row), a word per warp
    // and slot, then their places in their rows' own lists.
    const bool row_listed = listing && (moved & rbit) != 0u;  // all its entries listed
    auto own_ballot = [&](int k) {
      return __ballot_sync(0xffffffffu, has(k) && !row_listed && !(listing && shared_bits.test(k)));
    };
    // A pass's entries in registers again (multi-window variant) with the rule's bits.
    auto begin_own_pass = [&](int pass) {
      if (reload) {
        load(pass, w0);
        if (listing) shared_bits = rule_bits();
      }
      launder();
    };
    for (int pass = 0; pass < passes; ++pass) {
      begin_own_pass(pass);
#pragma unroll
      for (int k = 0; k < kUnionEntries; ++k) {
        const uint32_t ballot = own_ballot(k);
        const int word = word_of(pass, k);
        if (lane == 0 && has_row && word < row_words) own[r * row_words + word] = ballot;
      }
    }
    __syncthreads();
    int own_total;
    {
      const int per_thread = (used_words + kUnionThreads - 1) / kUnionThreads;
      const int first = tid * per_thread;
      const int last_word = min(used_words, first + per_thread);
      int n = 0;
      for (int j = first; j < last_word; ++j) n += __popc(own[j]);
      int before_words = block_exclusive_scan<kUnionWarps>(n, word_totals, own_total);
      for (int j = first; j < last_word; ++j) {
        own_prefix[j] = before_words;
        before_words += __popc(own[j]);
      }
    }
    __syncthreads();
    if (has_row) {
      // An entry's place: the own entries of its row before it, in column order.
      const int row_base = row_done[r] - own_prefix[r * row_words];
      const uint32_t lanes_before = (1u << lane) - 1u;
      const int32_t* prefix = own_prefix + r * row_words + sub;  // word_of(pass, k) on
      int32_t* own_row = p.own_lists + static_cast<int64_t>(row0 + r) * W;
      asm volatile("" : "+l"(own_row));
      for (int pass = 0; pass < passes; ++pass) {
        begin_own_pass(pass);
#pragma unroll
        for (int k = 0; k < kUnionEntries; ++k) {
          const uint32_t ballot = own_ballot(k);
          if (ballot >> lane & 1u) {
            const int place =
                row_base + prefix[(pass * kUnionEntries + k) * wpr] + __popc(ballot & lanes_before);
            own_row[place] = w0 + off(k);
          }
        }
      }
    }
    __syncthreads();
    if (tid < rows) {
      const int end = tid + 1 < rows ? own_prefix[(tid + 1) * row_words] : own_total;
      row_done[tid] += end - own_prefix[tid * row_words];
    }
    __syncthreads();  // the next window rewrites the masks, tokens and own words
  }
  if (tid < rows)
    p.row_split[row0 + tid] =
        count == 0 ? make_int2(kOwnIsTopk, 0) : make_int2(row_done[tid], count);
  if (tid == 0) p.union_count[group] = count;
#endif
}

}  // namespace cuda
}  // namespace qsakv
