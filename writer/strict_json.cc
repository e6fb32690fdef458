// Strict JSON parsing shared by the importers (writer/strict_json.h).
#include "writer/strict_json.h"

#include <algorithm>

#include "format/reader.h"
#include "tsar/error.h"
#include "writer/json_util.h"

namespace tsar::importer {
namespace {

using Json = nlohmann::json;
using format::Quote;

[[noreturn]] void Fail(const std::string& path, std::optional<uint64_t> offset,
                       const std::string& message) {
  throw Error(ErrorCode::kBadInput, path, offset, message);
}

// nlohmann's DOM parser lets a key repeated in one object through (the
// last wins); this builder (writer/json_util.h, linear time) refuses it and
// nesting deeper than kMaxJsonDepth, names the file and offset of a syntax
// error, and records the keys under each object of the root in file order.
class StrictDom final : public json::DomBuilder<Json> {
 public:
  StrictDom(const std::string& path, uint64_t base, const std::string& what,
            const std::string& noun, KeyOrder* order)
      : DomBuilder(kMaxJsonDepth),
        path_(path),
        base_(base),
        what_(what),
        noun_(noun),
        order_(order) {}

 private:
  bool OnKey(const Json& object, const std::string& k) override {
    const size_t depth = stack().size();  // open containers; `object` is the last
    if (object.contains(k)) {
      if (depth == 1)
        Fail(path_, std::nullopt, what_ + ": " + noun_ + " " + Quote(k) + " appears twice");
      std::string where;
      for (size_t i = 0; i + 1 < keys_.size(); ++i) {
        where += (i ? "." : "") + Quote(keys_[i]);
      }
      Fail(path_, std::nullopt, what_ + ": " + where + ": key " + Quote(k) + " appears twice");
    }
    if (order_ != nullptr && depth == 1) order_->root.push_back(k);
    if (order_ != nullptr && depth == 2 && stack()[0]->is_object()) {
      order_->members[keys_[0]].push_back(k);
    }
    keys_.resize(depth);
    keys_.back() = k;
    return true;
  }
  void OnClose() override {
    if (keys_.size() > stack().size()) keys_.resize(stack().size());
  }
  bool OnTooDeep() override {
    Fail(path_, std::nullopt,
         what_ + ": expected JSON nested at most " + std::to_string(kMaxJsonDepth) +
             " levels deep, found deeper nesting");
  }
  bool OnError(std::size_t position, const nlohmann::detail::exception& e) override {
    std::string msg = e.what();
    const size_t cut = msg.find("] ");
    if (cut != std::string::npos) msg = msg.substr(cut + 2);
    for (char& c : msg) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    }
    Fail(path_, base_ + (position > 0 ? position - 1 : 0),
         what_ + ": expected valid JSON, found " + msg);
  }

  const std::string& path_;
  const uint64_t base_;
  const std::string& what_;
  const std::string& noun_;
  KeyOrder* order_;
  std::vector<std::string> keys_;  // the current key of each open object, outermost first
};

}  // namespace

std::string Describe(const Json& v) {
  switch (v.type()) {
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array: {
      // Short arrays of numbers, like most data_offsets, are shown as they are.
      const bool short_numbers =
          v.size() <= 4 && std::all_of(v.begin(), v.end(), [](const Json& e) {
            return e.is_number() || e.is_boolean() || e.is_null();
          });
      return short_numbers ? v.dump() : "an array of " + std::to_string(v.size());
    }
    case Json::value_t::string:
      return "the string " + Quote(v.get_ref<const std::string&>());
    case Json::value_t::null:
      return "null";
    default:
      return v.dump();  // a number or a boolean
  }
}

std::optional<uint64_t> AsU64(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(v.get<int64_t>());
  }
  return std::nullopt;
}

Json ParseStrictJson(std::string_view text, const std::string& path, uint64_t base,
                     const std::string& what, const std::string& noun, KeyOrder* order) {
  const size_t nul = text.find('\0');
  if (nul != std::string_view::npos) {
    Fail(path, base + nul, what + ": expected JSON text, found a NUL byte");
  }
  StrictDom dom(path, base, what, noun, order);
  Json::sax_parse(text.begin(), text.end(), &dom, nlohmann::detail::input_format_t::json,
                  /*strict=*/true);
  return dom.Take();
}

}  // namespace tsar::importer
