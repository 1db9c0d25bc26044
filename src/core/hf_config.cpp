// SPDX-License-Identifier: Apache-2.0
#include "core/hf_config.hpp"

#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/format/file_io.hpp"
#include "core/format/json_strict.hpp"

namespace qsakv {

namespace {

constexpr uint64_t kMaxConfigBytes = 16ull << 20;  // HF configs are a few KiB

// The object the model keys live in: the root, or its "text_config" (multimodal
// checkpoints nest the language model's config there).
struct Scope {
  const json* obj;
  std::string prefix;  // "" or "text_config."
  std::string file;
};

const json* find(const Scope& s, const char* key) {
  auto it = s.obj->find(key);
  if (it == s.obj->end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void bad_key(const Scope& s, const char* key, const std::string& why) {
  fail(QSAKV_ERROR_FORMAT, "%s: key \"%s%s\" %s", s.file.c_str(), s.prefix.c_str(), key,
       why.c_str());
}

int32_t as_int(const Scope& s, const char* key, const json& v) {
  if (!v.is_number_integer())  // JSON integers only: not 4.0, not "4", not true
    bad_key(s, key,
            format("is a JSON %s (%s); expected an integer", json_kind(v),
                   v.dump().substr(0, 40).c_str()));
  if (v.is_number_unsigned() ? v.get<uint64_t>() > INT32_MAX
                             : (v.get<int64_t>() > INT32_MAX || v.get<int64_t>() < INT32_MIN))
    bad_key(s, key, format("is %s; outside the int32 range", v.dump().c_str()));
  return static_cast<int32_t>(v.get<int64_t>());
}

int32_t require_int(const Scope& s, const char* key, const char* meaning) {
  const json* v = find(s, key);
  if (!v) bad_key(s, key, format("is missing (%s)", meaning));
  return as_int(s, key, *v);
}

// One way of naming the QSA layers: its key and the layer ids it gives.
struct Pattern {
  const char* key;
  std::vector<int32_t> layers;
};

std::vector<Pattern> qsa_patterns(const Scope& s, int32_t num_layers) {
  std::vector<Pattern> found;
  if (const json* v = find(s, "qsa_layers")) {
    if (!v->is_array())
      bad_key(s, "qsa_layers",
              format("is %s; expected an array of layer "
                     "ids",
                     json_kind(*v)));
    if (v->size() > static_cast<size_t>(QSAKV_MAX_LAYERS))
      bad_key(s, "qsa_layers", format("has %zu entries; at most %d", v->size(), QSAKV_MAX_LAYERS));
    Pattern p{"qsa_layers", {}};
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string key = format("qsa_layers[%zu]", i);
      const int32_t l = as_int(s, key.c_str(), (*v)[i]);
      if (l < 0 || l >= num_layers)
        bad_key(s, key.c_str(),
                format("is layer %d, outside 0..%d (num_hidden_layers %d)", l, num_layers - 1,
                       num_layers));
      p.layers.push_back(l);
    }
    found.push_back(std::move(p));
  }
  if (const json* v = find(s, "full_attention_interval")) {
    const int32_t n = as_int(s, "full_attention_interval", *v);
    if (n <= 0) bad_key(s, "full_attention_interval", format("is %d; must be > 0", n));
    Pattern p{"full_attention_interval", {}};
    for (int32_t i = 0; i < num_layers; ++i)
      if ((i + 1) % n == 0) p.layers.push_back(i);
    found.push_back(std::move(p));
  }
  if (const json* v = find(s, "layer_types")) {
    if (!v->is_array())
      bad_key(s, "layer_types", format("is %s; expected an array of strings", json_kind(*v)));
    if (v->size() != static_cast<size_t>(num_layers))
      bad_key(s, "layer_types",
              format("has %zu entries; num_hidden_layers is %d", v->size(), num_layers));
    Pattern p{"layer_types", {}};
    for (size_t i = 0; i < v->size(); ++i) {
      const json& t = (*v)[i];
      const std::string key = format("layer_types[%zu]", i);
      if (!t.is_string()) bad_key(s, key.c_str(), format("is %s; expected a string", json_kind(t)));
      const std::string name = t.get<std::string>();
      if (name == "full_attention" || name == "qsa_attention")
        p.layers.push_back(static_cast<int32_t>(i));
      else if (name != "linear_attention")
        bad_key(s, key.c_str(),
                format("is \"%s\", an unknown layer type; known: \"full_attention\" and "
                       "\"qsa_attention\" (QSA layers), \"linear_attention\" (not QSA)",
                       name.substr(0, 64).c_str()));
    }
    found.push_back(std::move(p));
  }
  return found;
}

// The HF key behind a config field, for validation messages.
const char* hf_key_of(const std::string& field, const char* pattern_key) {
  static const struct {
    const char* field;
    const char* key;
  } kMap[] = {{"num_layers", "num_hidden_layers"},        {"num_q_heads", "num_attention_heads"},
              {"num_kv_heads", "num_key_value_heads"},    {"head_dim", "head_dim"},
              {"index_num_heads", "index_n_heads"},       {"index_head_dim", "index_head_dim"},
              {"compress_ratio", "index_compress_ratio"}, {"topk_tokens", "index_topk"}};
  for (const auto& m : kMap)
    if (field == m.field) return m.key;
  if (field == "num_qsa_layers" || field == "qsa_layers") return pattern_key;
  return nullptr;
}

}  // namespace

qsakv_model_config config_from_hf_text(const std::string& text, const std::string& file) {
  const json root = parse_json_strict(text, file);
  if (!root.is_object())
    fail(QSAKV_ERROR_FORMAT, "%s: the top level is %s; expected a JSON object", file.c_str(),
         json_kind(root));
  Scope s{&root, "", file};
  if (auto it = root.find("text_config"); it != root.end() && !it->is_null()) {
    if (!it->is_object())
      bad_key(s, "text_config", format("is %s; expected an object", json_kind(*it)));
    s = Scope{&*it, "text_config.", file};
  }

  qsakv_model_config c;
  apply_preset(c, "qwen4_exp");  // runtime defaults; every geometry field is set below
  c.num_layers = require_int(s, "num_hidden_layers", "the number of layers");
  if (c.num_layers <= 0 || c.num_layers > QSAKV_MAX_LAYERS)
    fail(QSAKV_ERROR_INVALID_CONFIG,
         "%s: key \"%snum_hidden_layers\" is %d; must be in "
         "1..%d",
         file.c_str(), s.prefix.c_str(), c.num_layers, QSAKV_MAX_LAYERS);
  c.num_q_heads = require_int(s, "num_attention_heads", "query heads");
  c.num_kv_heads = require_int(s, "num_key_value_heads", "KV heads");
  if (find(s, "head_dim")) {
    c.head_dim = require_int(s, "head_dim", "");
  } else {
    const json* h = find(s, "hidden_size");
    if (!h)
      bad_key(s, "head_dim",
              "is missing, and so is \"hidden_size\" to derive it from "
              "(hidden_size / num_attention_heads)");
    const int32_t hidden = as_int(s, "hidden_size", *h);
    if (c.num_q_heads <= 0 || hidden % c.num_q_heads != 0)
      bad_key(s, "head_dim",
              format("is missing, and hidden_size %d is not a multiple of "
                     "num_attention_heads %d",
                     hidden, c.num_q_heads));
    c.head_dim = hidden / c.num_q_heads;
  }
  c.softmax_scale = 0.0f;  // 1/sqrt(head_dim); set it yourself for another scale
  c.index_num_heads = require_int(s, "index_n_heads", "indexer query heads");
  c.index_head_dim = require_int(s, "index_head_dim", "indexer head dim");
  c.compress_ratio = require_int(s, "index_compress_ratio", "tokens per compressed index key");
  c.topk_tokens = require_int(s, "index_topk", "the top-k token budget");

  const std::vector<Pattern> patterns = qsa_patterns(s, c.num_layers);
  if (patterns.empty())
    fail(QSAKV_ERROR_FORMAT,
         "%s: no QSA layer pattern: expected one of the keys "
         "\"%sqsa_layers\" (a list of layer ids), \"%sfull_attention_interval\" (layer i is "
         "QSA when (i + 1) %% N == 0) or \"%slayer_types\"",
         file.c_str(), s.prefix.c_str(), s.prefix.c_str(), s.prefix.c_str());
  for (size_t i = 1; i < patterns.size(); ++i)
    if (patterns[i].layers != patterns[0].layers)
      fail(QSAKV_ERROR_FORMAT,
           "%s: \"%s%s\" and \"%s%s\" name different QSA layers (%zu and "
           "%zu layers)",
           file.c_str(), s.prefix.c_str(), patterns[0].key, s.prefix.c_str(), patterns[i].key,
           patterns[0].layers.size(), patterns[i].layers.size());
  c.num_qsa_layers = static_cast<int32_t>(patterns[0].layers.size());
  for (int32_t i = 0; i < c.num_qsa_layers; ++i) c.qsa_layers[i] = patterns[0].layers[i];

  try {
    validate_config(c);
  } catch (const Error& e) {
    // "model config: <field> ...": name the file and the key the field came from.
    std::string msg = e.what();
    const std::string head = "model config: ";
    std::string field;
    if (msg.compare(0, head.size(), head) == 0)
      field = msg.substr(head.size(), msg.find(' ', head.size()) - head.size());
    const char* key = hf_key_of(field, patterns[0].key);
    fail(e.status(), "%s: %s%s%s%s%s", file.c_str(), msg.c_str(), key ? " (key \"" : "",
         key ? s.prefix.c_str() : "", key ? key : "", key ? "\")" : "");
  }
  return c;
}

qsakv_model_config config_from_hf(const std::string& path) {
  std::string file = path;
  switch (path_kind(path, "checkpoint config")) {
    case PathKind::directory:
      file = join_path(path, "config.json");
      break;
    case PathKind::missing:
      fail(QSAKV_ERROR_IO,
           "%s does not exist (expected a checkpoint directory or its "
           "config.json)",
           path.c_str());
    default:
      break;
  }
  return config_from_hf_text(
      read_file(file, kMaxConfigBytes, "checkpoint config.json", QSAKV_ERROR_IO), file);
}

}  // namespace qsakv
