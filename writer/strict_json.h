// Strict JSON for the importers that read JSON written by other tools
// (safetensors headers and indexes, TensorDict's meta.json): a key repeated
// in one object, nesting past kMaxJsonDepth and a NUL byte are errors naming
// the file and offset, where nlohmann's DOM parser lets the first two through.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tsar::importer {

// A valid safetensors header nests three levels deep ({name: {shape: [...]}})
// and a meta.json two; deeper nesting only costs memory, so it is refused
// early, as serde_json does at 128.
inline constexpr int kMaxJsonDepth = 64;

// Keys in file order (the nlohmann::json object itself is sorted by key).
struct KeyOrder {
  std::vector<std::string> root;                            // keys of the root object
  std::map<std::string, std::vector<std::string>> members;  // keys of each object under it
};

// Parses `text` (found at file offset `base` of `path`) as one JSON value,
// with only whitespace after it. A key repeated in one object is an error
// (`noun` names the root's keys in that message), so is nesting deeper than
// kMaxJsonDepth, and so is a NUL byte anywhere (nlohmann's lexer would take it
// for the end of the text and ignore the rest, while other readers see more).
// `what` names the text in messages ("header", "index"). Throws kBadInput.
// Fills `order` when given.
nlohmann::json ParseStrictJson(std::string_view text, const std::string& path, uint64_t base,
                               const std::string& what, const std::string& noun,
                               KeyOrder* order = nullptr);

// A short description of a JSON value for "found ..." (never recursive).
std::string Describe(const nlohmann::json& v);

// The value as a u64 when it is a non-negative integer.
std::optional<uint64_t> AsU64(const nlohmann::json& v);

}  // namespace tsar::importer
