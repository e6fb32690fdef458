// Linear-time building and parsing of order-keeping JSON objects.
//
// nlohmann's ordered_json finds a key by a linear scan on every insertion
// (operator[], emplace, and its own parser's DOM builder), so an object of n
// members costs n^2: 100,000 metadata keys or module versions take minutes.
// These append members without the scan. Keys are taken as they come: the
// caller's keys are unique, or a key repeated in a text is kept twice, in
// order, as the text has it.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace tsar::json {

// Appends `key: value` to `object` (which must be a JSON object).
void Append(nlohmann::ordered_json& object, std::string key, nlohmann::ordered_json value);

// Parses one JSON value; nullopt when `text` is not valid JSON.
std::optional<nlohmann::ordered_json> ParseOrdered(std::string_view text);

}  // namespace tsar::json
