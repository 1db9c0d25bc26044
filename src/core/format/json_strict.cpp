// SPDX-License-Identifier: Apache-2.0
#include "core/format/json_strict.hpp"

#include <set>
#include <vector>

#include "core/error.hpp"

namespace qsakv {

namespace {

// One open object: the keys seen so far and the key it was opened under.
struct Frame {
  std::set<std::string> keys;
  std::string name;
};

// A SAX handler: nlohmann's own DOM builder, with the strict checks around it. (The
// callback form of json::parse, used before, rescans the enclosing array at the end of
// every element, so an array of n objects cost O(n^2) time: 4 Mi "{}" in a 12 MB header
// ran for hours. This is linear.) Every value passes here once (containers at their
// start), so the depth and value limits hold before the tree grows past them.
class StrictSax {
 public:
  using Dom = nlohmann::detail::json_sax_dom_parser<json>;
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  StrictSax(json& root, const std::string& what)
      : dom_(root, /*allow_exceptions=*/true), what_(what) {}
  const JsonDuplicate& first_duplicate() const { return first_; }

  bool null() { return count() && dom_.null(); }
  bool boolean(bool v) { return count() && dom_.boolean(v); }
  bool number_integer(number_integer_t v) { return count() && dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return count() && dom_.number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) {
    return count() && dom_.number_float(v, s);
  }
  bool string(string_t& v) { return count() && dom_.string(v); }
  bool binary(binary_t& v) { return count() && dom_.binary(v); }
  bool start_object(std::size_t n) {
    open();
    stack_.push_back(Frame{{}, last_key_});
    last_key_.clear();
    return dom_.start_object(n);
  }
  bool key(string_t& k) {
    count();
    last_key_ = k;
    if (!stack_.empty() && !stack_.back().keys.insert(k).second && !first_.found) {
      first_.found = true;
      first_.depth = static_cast<int>(stack_.size());
      first_.parent = stack_.back().name;
      first_.key = k;
    }
    return dom_.key(k);
  }
  bool end_object() {
    if (!stack_.empty()) stack_.pop_back();
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    open();
    return dom_.start_array(n);
  }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t pos, const std::string& token, const Exception& e) {
    return dom_.parse_error(pos, token, e);  // throws (allow_exceptions)
  }

 private:
  bool count() {
    if (++values_ > kJsonMaxValues)
      fail(QSAKV_ERROR_FORMAT,
           "%s holds more than %llu JSON values; refusing it (its "
           "parsed form would cost too much memory)",
           what_.c_str(), static_cast<unsigned long long>(kJsonMaxValues));
    return true;
  }
  void open() {
    count();
    if (++depth_ > kJsonMaxDepth)
      fail(QSAKV_ERROR_FORMAT,
           "%s nests JSON deeper than %d levels; refusing it (no "
           "file of this kind needs more than a few)",
           what_.c_str(), kJsonMaxDepth);
  }

  Dom dom_;
  const std::string& what_;
  std::vector<Frame> stack_;
  std::string last_key_;  // key most recently read, the name of an object opened next
  JsonDuplicate first_;
  uint64_t values_ = 0;
  int depth_ = 0;
};

}  // namespace

json parse_json_strict(const std::string& text, const std::string& what, JsonDuplicate* dup) {
  json j;
  StrictSax sax(j, what);
  try {
    json::sax_parse(text, &sax, json::input_format_t::json, /*strict=*/true,
                    /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    fail(QSAKV_ERROR_FORMAT, "%s is not valid JSON: %s", what.c_str(), e.what());
  }
  const JsonDuplicate& first = sax.first_duplicate();
  if (first.found) {
    if (!dup)
      fail(QSAKV_ERROR_FORMAT, "%s: key \"%s\" appears twice%s%s%s", what.c_str(),
           first.key.c_str(), first.parent.empty() ? "" : " in \"", first.parent.c_str(),
           first.parent.empty() ? "" : "\"");
    *dup = first;
  }
  return j;
}

const char* json_kind(const json& j) { return j.type_name(); }

bool utf8_valid(const std::string& s, size_t* bad_offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c < 0x80)
      len = 1;
    else if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c == 0xE0)
      len = 3, lo = 0xA0;
    else if (c == 0xED)
      len = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF)
      len = 3;
    else if (c == 0xF0)
      len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
      len = 4;
    else if (c == 0xF4)
      len = 4, hi = 0x8F;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned b = p[i + k];
      ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    }
    if (!ok) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

std::string utf8_escaped(const std::string& s) {
  std::string out;
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    const std::string rest = s.substr(i);
    if (utf8_valid(rest, &bad)) return out + rest;
    out += rest.substr(0, bad);
    out += format("\\x%02x", static_cast<unsigned char>(rest[bad]));
    i += bad + 1;
  }
  return out;
}

std::string json_excerpt(const json& j) {
  constexpr size_t kMax = 80;
  // Containers are summarised without dumping them whole.
  if (j.is_array() && j.size() > 8) return format("[... %zu elements]", j.size());
  if (j.is_object() && j.size() > 4) return format("{... %zu keys}", j.size());
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

}  // namespace qsakv
