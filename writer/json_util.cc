// tsar::json (writer/json_util.h).
#include "writer/json_util.h"

namespace tsar::json {

using Json = nlohmann::ordered_json;

void Append(Json& object, std::string key, Json value) {
  // ordered_map is a std::vector of pairs with a linear find in front of
  // every insertion; the vector's own emplace_back is the same without it.
  using Members = std::vector<std::pair<const std::string, Json>>;
  static_cast<Members&>(object.get_ref<Json::object_t&>())
      .emplace_back(std::move(key), std::move(value));
}

std::optional<Json> ParseOrdered(std::string_view text) {
  DomBuilder<Json> b(/*max_depth=*/256);  // deeper only costs stack
  if (!Json::sax_parse(text.begin(), text.end(), &b, nlohmann::detail::input_format_t::json,
                       /*strict=*/true)) {
    return std::nullopt;
  }
  return b.Take();
}

}  // namespace tsar::json
