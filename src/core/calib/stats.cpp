// SPDX-License-Identifier: Apache-2.0
#include "core/calib/stats.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include "core/checked.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/format/sha256.hpp"

namespace qsakv {
namespace calib {

int HostStats::ranks_covered() const {
  return static_cast<int>(std::count(ranks.begin(), ranks.end(), 1));
}

HostStats empty_stats(const qsakv_model_config& config) {
  HostStats s;
  s.config = config;
  // Canonical form: entries past num_qsa_layers are not part of the config (and are not
  // saved), so they are zero in every copy the library hands back.
  for (int i = config.num_qsa_layers; i < QSAKV_MAX_LAYERS; ++i) s.config.qsa_layers[i] = 0;
  s.fingerprint = config_fingerprint(config);
  s.rank = config.tp_rank;
  s.ranks.assign(config.tp_size, 0);
  s.ranks[config.tp_rank] = 1;
  s.words.assign(static_cast<size_t>(config.num_qsa_layers) * 2 * kEntryWords, 0);
  s.max_abs.assign(static_cast<size_t>(config.num_qsa_layers) * 2, 0.0f);
  return s;
}

std::string config_fingerprint(const qsakv_model_config& c) {
  std::string s = format("qsakv-calib-fingerprint-v1;layers=%d;qsa=", c.num_layers);
  for (int i = 0; i < c.num_qsa_layers; ++i) s += format(i ? ",%d" : "%d", c.qsa_layers[i]);
  s += format(";kv_heads=%d;head_dim=%d;act=%s;tp=%d", c.num_kv_heads, c.head_dim,
              dtype_name(c.activation_dtype), c.tp_size);
  return sha256_hex(s);
}

void accumulate(HostStats& a, const HostStats& b) {
  // Checked: a wrapped count would make the sum look like less data, or none (a count
  // of 2^63 + 2^63 is 0, "never observed"). Nothing is changed unless all of it fits.
  std::vector<uint64_t> sum(a.words.size());
  for (size_t i = 0; i < a.words.size(); ++i) {
    if (!add_u64(a.words[i], b.words[i], &sum[i])) {
      const size_t entry = i / kEntryWords, word = i % kEntryWords;
      const int layer = a.config.qsa_layers[entry / 2];
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "layer %d %s: the merged %s would be %llu + %llu, "
           "more than a 64-bit count holds; refusing to wrap it",
           layer, entry % 2 ? "V" : "K",
           word == kWordCount     ? "count"
           : word == kWordFinite  ? "finite count"
           : word == kWordNonzero ? "nonzero count"
                                  : format("histogram bin %zu", word - kWordHist).c_str(),
           static_cast<unsigned long long>(a.words[i]),
           static_cast<unsigned long long>(b.words[i]));
    }
  }
  a.words = std::move(sum);
  for (size_t i = 0; i < a.max_abs.size(); ++i) a.max_abs[i] = std::max(a.max_abs[i], b.max_abs[i]);
}

void check_consistent(const HostStats& s, qsakv_status status, const std::string& what) {
  const size_t entries = static_cast<size_t>(s.config.num_qsa_layers) * 2;
  for (size_t i = 0; i < entries; ++i) {
    const uint64_t* e = s.words.data() + i * kEntryWords;
    const int layer = s.config.qsa_layers[i / 2];
    const char* kind = i % 2 ? "V" : "K";
    // Summed with a check: a total that wraps modulo 2^64 could match any nonzero count.
    uint64_t total = 0;
    bool wrapped = false;
    for (int b = 0; b < kBins; ++b) wrapped |= !add_u64(total, e[kWordHist + b], &total);
    if (wrapped)
      fail(status,
           "%s: layer %d %s histogram total is more than a 64-bit count holds (it "
           "wraps); the statistics are inconsistent",
           what.c_str(), layer, kind);
    const float mx = s.max_abs[i];
    if (e[kWordFinite] > e[kWordCount] || e[kWordNonzero] > e[kWordFinite] ||
        total != e[kWordNonzero] || !std::isfinite(mx) || mx < 0.0f ||
        (mx > 0.0f) != (e[kWordNonzero] > 0))
      fail(status,
           "%s: layer %d %s statistics are inconsistent (count %llu, finite %llu, "
           "nonzero %llu, histogram total %llu, max_abs %g)",
           what.c_str(), layer, kind, (unsigned long long)e[kWordCount],
           (unsigned long long)e[kWordFinite], (unsigned long long)e[kWordNonzero],
           (unsigned long long)total, (double)mx);
  }
}

namespace {

std::string rank_list(const HostStats& s) {
  std::string r;
  for (size_t i = 0; i < s.ranks.size(); ++i)
    if (s.ranks[i]) r += format(r.empty() ? "%zu" : ",%zu", i);
  return r.empty() ? "none" : r;
}

// A merge sums counts, so an input that never observed a layer's K or V would vanish
// behind the other inputs' counts: at TP > 1 the merged scale would miss the KV heads of
// the ranks that input covers. Refuses such an input, naming it, its ranks, the layer and
// the kind(s).
void require_every_entry_observed(const HostStats& s, size_t input) {
  for (int i = 0; i < s.config.num_qsa_layers; ++i) {
    const bool k = s.entry(i, 0)[kWordCount] > 0, v = s.entry(i, 1)[kWordCount] > 0;
    if (k && v) continue;
    const int tp = s.config.tp_size;
    fail(QSAKV_ERROR_OVERLAY_INCOMPLETE,
         "input %zu (TP rank%s %s of %d) never observed layer %d %s (count 0); merged, the "
         "other inputs' counts would hide the gap%s: every input of a merge must observe "
         "every QSA layer's K and V",
         input, s.ranks_covered() > 1 ? "s" : "", rank_list(s).c_str(), tp, s.config.qsa_layers[i],
         !k && !v ? "K and V"
         : !k     ? "K"
                  : "V",
         tp > 1 ? " and the layer's scale would miss those ranks' KV heads" : "");
  }
}

}  // namespace

HostStats merge(const std::vector<const HostStats*>& in, qsakv_calib_merge_mode mode) {
  if (mode != QSAKV_CALIB_MERGE_RANKS && mode != QSAKV_CALIB_MERGE_ENVELOPE)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "merge mode is %d; RANKS (0) or ENVELOPE (1)",
         static_cast<int>(mode));
  const HostStats& first = *in[0];
  HostStats out = first;
  out.reduced = false;
  for (size_t i = 0; i < in.size(); ++i) {
    const HostStats& s = *in[i];
    if (s.fingerprint != first.fingerprint)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "input %zu has config fingerprint %s, input 0 has %s: "
           "statistics of different models, activation dtypes or TP sizes do not merge",
           i, s.fingerprint.c_str(), first.fingerprint.c_str());
    if (mode == QSAKV_CALIB_MERGE_ENVELOPE && !s.complete())
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "envelope input %zu covers TP ranks %s of %d; an "
           "envelope pools complete runs (merge the ranks of each run first)",
           i, rank_list(s).c_str(), s.config.tp_size);
    if (mode == QSAKV_CALIB_MERGE_RANKS && s.num_runs != first.num_runs)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "input %zu pools %d runs, input 0 pools %d; ranks of "
           "one run merge with RANKS, runs with ENVELOPE",
           i, s.num_runs, first.num_runs);
    if (i == 0) continue;
    if (mode == QSAKV_CALIB_MERGE_RANKS) {
      for (size_t r = 0; r < s.ranks.size(); ++r) {
        if (s.ranks[r] && out.ranks[r])
          fail(QSAKV_ERROR_INVALID_ARGUMENT,
               "input %zu holds TP rank %zu, which an earlier "
               "input already holds; counting a rank twice would skew the statistics",
               i, r);
        out.ranks[r] |= s.ranks[r];
      }
    } else {
      if (__builtin_add_overflow(out.num_runs, s.num_runs, &out.num_runs))
        fail(QSAKV_ERROR_INVALID_ARGUMENT,
             "input %zu: the envelope would pool more than %d "
             "runs",
             i, INT32_MAX);
    }
    accumulate(out, s);
  }
  // After the checks above, so that a mismatch or an overlap is named first. A single
  // input is copied as is (summarize refuses its gaps); from two on, each must be whole.
  if (in.size() > 1)
    for (size_t i = 0; i < in.size(); ++i) require_every_entry_observed(*in[i], i);
  if (in.size() > 1 || out.ranks_covered() > 1) out.rank = -1;
  return out;
}

}  // namespace calib
}  // namespace qsakv
