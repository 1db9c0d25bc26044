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
  auto watch = [&](int, json::parse_event_t event, json& parsed) {
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

}  // namespace qsakv
