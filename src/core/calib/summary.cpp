// SPDX-License-Identifier: Apache-2.0
#include "core/calib/summary.hpp"

#include <cmath>
#include <cstring>

#include "core/calib/histogram.hpp"
#include "core/error.hpp"
#include "core/versioned.hpp"

namespace qsakv {
namespace calib {

namespace {
const char* kind_name(int kind) { return kind == 0 ? "K" : "V"; }
}  // namespace

float scale_from_max(float max_abs) {
  if (!std::isfinite(max_abs) || !(max_abs > 0.0f))
    fail(QSAKV_ERROR_OVERLAY_BAD_SCALE, "max |x| is %g; a scale needs a finite maximum > 0",
         static_cast<double>(max_abs));
  float s = max_abs / QSAKV_E4M3_MAX;  // round to nearest: at most one step below
  // float * 448 needs 24 + 3 significant bits: exact in FP64, so this tests the real
  // product, not a rounded one.
  if (static_cast<double>(s) * 448.0 < static_cast<double>(max_abs))
    s = std::nextafter(s, INFINITY);
  return s;
}

void check_summarizable(const HostStats& s) {
  // Handles from files were checked when loaded; snapshots of device statistics (or of an
  // all-reduce, whose sums NCCL computes without a check) are checked here. Sums that
  // wrapped show as counts below what max |x| says was seen.
  check_consistent(s, QSAKV_ERROR_INVALID_ARGUMENT, "the statistics");
  if (!s.complete()) {
    std::string missing;
    for (size_t r = 0; r < s.ranks.size(); ++r)
      if (!s.ranks[r]) missing += format(missing.empty() ? "%zu" : ", %zu", r);
    fail(QSAKV_ERROR_OVERLAY_INCOMPLETE,
         "the statistics cover %d of %d TP ranks; missing "
         "rank(s) %s: a per-layer scale is the max over every rank (merge or all-reduce them)",
         s.ranks_covered(), s.config.tp_size, missing.c_str());
  }
  for (int i = 0; i < s.config.num_qsa_layers; ++i) {
    const int layer = s.config.qsa_layers[i];
    const uint64_t nk = s.entry(i, 0)[kWordCount], nv = s.entry(i, 1)[kWordCount];
    if (nk == 0 && nv == 0)
      fail(QSAKV_ERROR_OVERLAY_INCOMPLETE,
           "layer %d: neither K nor V was observed (a missing "
           "layer); every QSA layer needs both scales",
           layer);
    for (int kind = 0; kind < 2; ++kind) {
      const uint64_t* e = s.entry(i, kind);
      if (e[kWordCount] == 0)
        fail(QSAKV_ERROR_OVERLAY_INCOMPLETE,
             "layer %d: %s was never observed but %s was (%llu "
             "values): the K/V pair is incomplete",
             layer, kind_name(kind), kind_name(1 - kind),
             static_cast<unsigned long long>(kind ? nk : nv));
      if (e[kWordFinite] != e[kWordCount])
        fail(QSAKV_ERROR_CALIB_NON_FINITE,
             "layer %d %s: %llu of %llu observed values are NaN or "
             "infinite; calibrate on finite activations",
             layer, kind_name(kind),
             static_cast<unsigned long long>(e[kWordCount] - e[kWordFinite]),
             static_cast<unsigned long long>(e[kWordCount]));
      if (!(s.max_of(i, kind) > 0.0f))
        fail(QSAKV_ERROR_OVERLAY_BAD_SCALE,
             "layer %d %s: max |x| is 0 over %llu values; a zero "
             "scale cannot store anything",
             layer, kind_name(kind), static_cast<unsigned long long>(e[kWordCount]));
    }
  }
}

qsakv_calib_summary summarize_entry(const HostStats& s, int i, int kind) {
  auto r = blank_versioned<qsakv_calib_summary>(QSAKV_CALIB_SUMMARY_VERSION);
  const uint64_t* e = s.entry(i, kind);
  const uint64_t* hist = e + kWordHist;
  r.count = e[kWordCount];
  r.finite_count = e[kWordFinite];
  r.nonzero_count = e[kWordNonzero];
  r.max_abs = s.max_of(i, kind);
  r.scale = scale_from_max(r.max_abs);
  r.p99_9 = hist_quantile(hist, r.finite_count, r.nonzero_count, r.max_abs, 0.999);
  r.p99_99 = hist_quantile(hist, r.finite_count, r.nonzero_count, r.max_abs, 0.9999);
  // From the histogram, independently of max_abs: bins entirely above 448 * scale
  // saturate; bins entirely below the E4M3 rounding-to-zero threshold underflow.
  const double top = 448.0 * static_cast<double>(r.scale);
  const double zero_below = static_cast<double>(r.scale) * std::exp2(-10.0);
  uint64_t sat = 0, under = 0;
  for (int b = 0; b < kBins; ++b) {
    if (b > 0 && bin_lower_edge(b) > top) sat += hist[b];
    if (b < kBins - 1 && bin_lower_edge(b + 1) <= zero_below) under += hist[b];
  }
  r.saturate_fraction = r.finite_count ? static_cast<double>(sat) / r.finite_count : 0.0;
  r.underflow_fraction = r.nonzero_count ? static_cast<double>(under) / r.nonzero_count : 0.0;
  return r;
}

}  // namespace calib
}  // namespace qsakv
