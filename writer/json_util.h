// Linear-time building and parsing of JSON objects.
//
// nlohmann's ordered_json finds a key by a linear scan on every insertion
// (operator[], emplace, and its own parser's DOM builder), so an object of n
// members costs n^2: 100,000 metadata keys or module versions take minutes;
// its callback parser rescans a parent object after each child, quadratic for
// any JSON type. DomBuilder builds a DOM from SAX events without either.
// Keys are taken as they come: an ordered_json keeps a repeated key twice, in
// order, as the text has it (a subclass can refuse it in OnKey).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace tsar::json {

// Appends `key: value` to `object` (which must be a JSON object).
void Append(nlohmann::ordered_json& object, std::string key, nlohmann::ordered_json value);

// nlohmann's SAX events to a DOM of `Json` (nlohmann::json or ordered_json).
// Subclasses see each key before it is inserted, nesting past `max_depth`
// and parse errors; a hook that returns false stops the parse.
template <class Json>
class DomBuilder : public nlohmann::json_sax<Json> {
 public:
  using typename nlohmann::json_sax<Json>::number_integer_t;
  using typename nlohmann::json_sax<Json>::number_unsigned_t;
  using typename nlohmann::json_sax<Json>::number_float_t;
  using typename nlohmann::json_sax<Json>::string_t;
  using typename nlohmann::json_sax<Json>::binary_t;

  explicit DomBuilder(size_t max_depth) : max_depth_(max_depth) {}
  Json Take() { return std::move(root_); }

  bool null() override { return Put(nullptr); }
  bool boolean(bool v) override { return Put(v); }
  bool number_integer(number_integer_t v) override { return Put(v); }
  bool number_unsigned(number_unsigned_t v) override { return Put(v); }
  bool number_float(number_float_t v, const string_t&) override { return Put(v); }
  bool string(string_t& v) override { return Put(std::move(v)); }
  bool binary(binary_t&) override { return Put(nullptr); }  // JSON text has none
  bool start_object(std::size_t) override { return Open(Json::object()); }
  bool start_array(std::size_t) override { return Open(Json::array()); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override {
    if (!OnKey(*stack_.back(), k)) return false;
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    return OnError(position, e);
  }

 protected:
  // The open objects and arrays, outermost first.
  const std::vector<Json*>& stack() const { return stack_; }
  virtual bool OnKey(const Json& /*object*/, const std::string& /*key*/) { return true; }
  virtual void OnClose() {}  // after an object or array ends
  virtual bool OnTooDeep() { return false; }
  virtual bool OnError(std::size_t /*position*/, const nlohmann::detail::exception& /*e*/) {
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
      return &top.back();
    }
    if constexpr (std::is_same_v<Json, nlohmann::ordered_json>) {
      Append(top, std::move(key_), nullptr);
      return &top.back();
    } else {
      return &top[std::move(key_)];
    }
  }
  bool Put(Json v) {
    *Slot() = std::move(v);
    return true;
  }
  bool Open(Json v) {
    if (stack_.size() >= max_depth_) return OnTooDeep();
    Json* slot = Slot();
    *slot = std::move(v);
    stack_.push_back(slot);
    return true;
  }
  bool Close() {
    stack_.pop_back();
    OnClose();
    return true;
  }

  const size_t max_depth_;
  Json root_;
  std::vector<Json*> stack_;
  std::string key_;
};

// Parses one JSON value; nullopt when `text` is not valid JSON or nests
// deeper than 256 levels.
std::optional<nlohmann::ordered_json> ParseOrdered(std::string_view text);

}  // namespace tsar::json
