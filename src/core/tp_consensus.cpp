// SPDX-License-Identifier: Apache-2.0
#include "core/tp_consensus.hpp"

#include <cstring>
#include <map>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/overlay/overlay.hpp"
#include "core/format/sha256.hpp"

namespace qsakv {

namespace {

// A peer's fixed-size string field, never read past its end (another rank's record may
// be malformed).
template <size_t N>
std::string field_string(const char (&f)[N]) {
  return std::string(f, strnlen(f, N));
}

const char* const kFieldNames[RankRecord::kConfigFields] = {
    "num_layers",         "num_qsa_layers",   "num_q_heads",    "num_kv_heads",   "head_dim",
    "softmax_scale",      "index_num_heads",  "index_head_dim", "compress_ratio", "topk_tokens",
    "speculative_tokens", "activation_dtype", "kv_dtype",       "block_size",     "max_requests",
    "max_batched_tokens", "max_model_len",    "index_key_dtype"};

void copy_string(char* dst, size_t n, const std::string& s) {
  std::memset(dst, 0, n);
  std::strncpy(dst, s.c_str(), n - 1);
}

// "ranks 0, 2" / "rank 3"
std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Groups ranks by a value; a message when there is more than one group.
template <class Key>
void compare(const std::vector<RankRecord>& records, const std::string& what, Key key,
             std::string& out) {
  std::map<std::string, std::vector<int>> groups;
  for (size_t r = 0; r < records.size(); ++r)
    groups[key(records[r])].push_back(static_cast<int>(r));
  if (groups.size() < 2) return;
  std::string m = what + " differs:";
  bool first = true;
  for (const auto& [value, ranks] : groups) {
    m += (first ? " " : "; ") + rank_list(ranks) + (ranks.size() == 1 ? " has " : " have ") + value;
    first = false;
  }
  out += (out.empty() ? "" : "; ") + m;
}

std::string field_value(const RankRecord& r, int i) {
  const int32_t v = r.config[i];
  if (i == 5) {  // softmax_scale, carried as its bits
    float f;
    std::memcpy(&f, &v, 4);
    return format("%.9g", static_cast<double>(f));  // 9 digits: one string per float
  }
  if (i == 11 || i == 12 || i == 17) return dtype_name(static_cast<int32_t>(v));
  return std::to_string(v);
}

}  // namespace

const char* rank_record_field_name(int i) { return kFieldNames[i]; }

RankRecord make_rank_record(const qsakv_model_config& c, const qsakv_overlay* overlay,
                            int comm_rank, int comm_size) {
  RankRecord r;
  std::memset(&r, 0, sizeof r);
  r.magic = RankRecord::kMagic;
  r.version = RankRecord::kVersion;
  r.comm_rank = comm_rank;
  r.comm_size = comm_size;
  r.tp_rank = c.tp_rank;
  r.tp_size = c.tp_size;
  int32_t scale_bits;
  std::memcpy(&scale_bits, &c.softmax_scale, 4);
  const int32_t fields[RankRecord::kConfigFields] = {
      c.num_layers,         c.num_qsa_layers,   c.num_q_heads,    c.num_kv_heads,   c.head_dim,
      scale_bits,           c.index_num_heads,  c.index_head_dim, c.compress_ratio, c.topk_tokens,
      c.speculative_tokens, c.activation_dtype, c.kv_dtype,       c.block_size,     c.max_requests,
      c.max_batched_tokens, c.max_model_len,    c.index_key_dtype};
  std::memcpy(r.config, fields, sizeof fields);
  copy_string(r.qsa_layers_sha256, sizeof r.qsa_layers_sha256,
              sha256_hex(c.qsa_layers, sizeof(int32_t) * static_cast<size_t>(c.num_qsa_layers)));
  if (overlay) {
    r.has_overlay = 1;
    r.overlay_validated = overlay->validated ? 1 : 0;
    copy_string(r.scale_file_sha256, sizeof r.scale_file_sha256, overlay->scale_file_sha256);
    copy_string(r.layer_prefix, sizeof r.layer_prefix, overlay->manifest.layer_prefix);
  }
  return r;
}

std::string compare_rank_records(const std::vector<RankRecord>& records) {
  std::string out;
  for (size_t r = 0; r < records.size(); ++r) {
    const RankRecord& x = records[r];
    if (x.magic != RankRecord::kMagic || x.version != RankRecord::kVersion)
      out += format("%srank %zu sent no consensus record (another library version?)",
                    out.empty() ? "" : "; ", r);
    else if (x.comm_rank != static_cast<int>(r) || x.tp_rank != static_cast<int>(r))
      out += format("%srank numbering: communicator rank %zu has tp_rank %d",
                    out.empty() ? "" : "; ", r, x.tp_rank);
    if (x.tp_size != static_cast<int>(records.size()))
      out += format("%sthe communicator has %zu ranks but rank %zu has tp_size %d",
                    out.empty() ? "" : "; ", records.size(), r, x.tp_size);
  }
  if (!out.empty()) return out;  // the rest compares like with like only
  for (int i = 0; i < RankRecord::kConfigFields; ++i)
    compare(
        records, std::string("config.") + kFieldNames[i],
        [i](const RankRecord& x) { return field_value(x, i); }, out);
  compare(
      records, "config.qsa_layers",
      [](const RankRecord& x) {
        return "list sha256 " + field_string(x.qsa_layers_sha256).substr(0, 16);
      },
      out);
  compare(
      records, "the overlay",
      [](const RankRecord& x) {
        if (!x.has_overlay) return std::string("none");
        return "scale file sha256 " + field_string(x.scale_file_sha256) +
               (x.overlay_validated ? "" : " (not validated)");
      },
      out);
  compare(
      records, "the overlay layer prefix",
      [](const RankRecord& x) {
        return x.has_overlay ? field_string(x.layer_prefix) : std::string("(none)");
      },
      out);
  return out;
}

}  // namespace qsakv
