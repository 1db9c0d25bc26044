#include "core/overlay/json_strict.hpp"

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

}  // namespace

json parse_json_strict(const std::string& text, const std::string& what, JsonDuplicate* dup) {
  JsonDuplicate first;
  std::vector<Frame> stack;
  std::string last_key;  // key most recently read, the name of a value opened next
  uint64_t values = 0;
  auto watch = [&](int depth, json::parse_event_t event, json& parsed) {
    // Every value passes here once (objects and arrays at their start), so the limits
    // hold before the tree grows past them.
    if (event != json::parse_event_t::object_end && event != json::parse_event_t::array_end) {
      if (depth > kJsonMaxDepth)
        fail(QSAKV_ERROR_FORMAT, "%s nests JSON deeper than %d levels; refusing it (no "
             "file of this kind needs more than a few)", what.c_str(), kJsonMaxDepth);
      if (++values > kJsonMaxValues)
        fail(QSAKV_ERROR_FORMAT, "%s holds more than %llu JSON values; refusing it (its "
             "parsed form would cost too much memory)", what.c_str(),
             static_cast<unsigned long long>(kJsonMaxValues));
    }
    switch (event) {
      case json::parse_event_t::object_start:
        stack.push_back(Frame{{}, last_key});
        last_key.clear();
        break;
      case json::parse_event_t::object_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::key: {
        last_key = parsed.get<std::string>();
        if (!stack.empty() && !stack.back().keys.insert(last_key).second && !first.found) {
          first.found = true;
          first.depth = static_cast<int>(stack.size());
          first.parent = stack.back().name;
          first.key = last_key;
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, watch, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    fail(QSAKV_ERROR_FORMAT, "%s is not valid JSON: %s", what.c_str(), e.what());
  }
  if (first.found) {
    if (!dup)
      fail(QSAKV_ERROR_FORMAT, "%s: key \"%s\" appears twice%s%s%s", what.c_str(),
           first.key.c_str(), first.parent.empty() ? "" : " in \"",
           first.parent.c_str(), first.parent.empty() ? "" : "\"");
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
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
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
