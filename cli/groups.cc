// GroupSummary (cli/groups.h).
#include "cli/groups.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace tsar::cli {

GroupSummary Summarize(const GroupInfo& g) {
  GroupSummary s;
  // nlohmann parses and frees without recursion (3.10+), so a hostile
  // nesting costs time, not the stack; only the top level is looked at.
  const nlohmann::json d = nlohmann::json::parse(g.description, nullptr, false);
  if (!d.is_object()) return s;
  const auto text = [&d](const char* key, std::string* out) {
    const auto it = d.find(key);
    if (it == d.end() || !it->is_string()) return false;
    *out = it->get<std::string>();
    return true;
  };
  const auto members = d.find("members");
  const auto attributes = d.find("attributes");
  if (!text("library", &s.library) || !text("version", &s.version) || !text("class", &s.cls) ||
      members == d.end() || !members->is_array() || members->size() != g.members.size() ||
      attributes == d.end() || !attributes->is_object()) {
    return s;
  }
  for (size_t k = 0; k < g.members.size(); ++k) {
    if (!(*members)[k].is_string()) return s;
    s.members.emplace_back((*members)[k].get<std::string>(), g.members[k]);
  }
  // Attributes of torchao's classes nest 3 deep; dump() recurses, so a
  // description nested deeper than the grammar's 32 is left unprinted.
  int depth = 0, most = 0;
  bool quoted = false, escaped = false;
  for (char c : g.description) {
    if (quoted) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        quoted = false;
      }
      continue;
    }
    if (c == '"') quoted = true;
    if (c == '[' || c == '{') most = std::max(most, ++depth);
    if (c == ']' || c == '}') --depth;
  }
  s.attributes = most <= 40 ? attributes->dump() : std::string("(nested too deep to show)");
  s.valid = true;
  return s;
}

}  // namespace tsar::cli
