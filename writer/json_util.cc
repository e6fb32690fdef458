// tsar::json (writer/json_util.h).
#include "writer/json_util.h"

#include <utility>
#include <vector>

namespace tsar::json {

using Json = nlohmann::ordered_json;

void Append(Json& object, std::string key, Json value) {
  // ordered_map is a std::vector of pairs with a linear find in front of
  // every insertion; the vector's own emplace_back is the same without it.
  using Members = std::vector<std::pair<const std::string, Json>>;
  static_cast<Members&>(object.get_ref<Json::object_t&>())
      .emplace_back(std::move(key), std::move(value));
}

namespace {

// nlohmann's SAX events to a DOM, appending object members (json::Append).
class Builder final : public nlohmann::json_sax<Json> {
 public:
  Json Take() { return std::move(root_); }

  bool null() override { return Put(nullptr); }
  bool boolean(bool v) override { return Put(v); }
  bool number_integer(number_integer_t v) override { return Put(v); }
  bool number_unsigned(number_unsigned_t v) override { return Put(v); }
  bool number_float(number_float_t v, const string_t&) override { return Put(v); }
  bool string(string_t& v) override { return Put(std::move(v)); }
  bool binary(binary_t&) override { return Put(nullptr); }
  bool start_object(std::size_t) override { return Open(Json::object()); }
  bool start_array(std::size_t) override { return Open(Json::array()); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  // Where the next value goes: the root, the end of the open array, or the
  // member of the open object named by the last key. Only the innermost open
  // container grows, so pointers to the open ones stay valid.
  Json* Slot() {
    if (stack_.empty()) return &root_;
    Json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(nullptr);
    } else {
      Append(top, std::move(key_), nullptr);
    }
    return &top.back();
  }
  bool Put(Json v) {
    *Slot() = std::move(v);
    return true;
  }
  bool Open(Json v) {
    if (stack_.size() >= kMaxDepth) return false;
    Json* slot = Slot();
    *slot = std::move(v);
    stack_.push_back(slot);
    return true;
  }
  bool Close() {
    stack_.pop_back();
    return true;
  }

  static constexpr size_t kMaxDepth = 256;  // deeper only costs stack
  Json root_;
  std::vector<Json*> stack_;
  std::string key_;
};

}  // namespace

std::optional<Json> ParseOrdered(std::string_view text) {
  Builder b;
  if (!Json::sax_parse(text.begin(), text.end(), &b, nlohmann::detail::input_format_t::json,
                       /*strict=*/true)) {
    return std::nullopt;
  }
  return b.Take();
}

}  // namespace tsar::json
