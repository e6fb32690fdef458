// The implied value tree of spec §4.10.3 (loader/value_tree.h).
#include "loader/value_tree.h"

#include "writer/json_util.h"

namespace tsar {
namespace {

Value FromJson(const nlohmann::ordered_json& j, bool ordered) {
  if (j.is_object()) {
    std::vector<std::pair<Value, Value>> pairs;
    pairs.reserve(j.size());
    for (auto it = j.begin(); it != j.end(); ++it)
      pairs.emplace_back(Value::Str(it.key()), FromJson(it.value(), false));
    return Value::Dict(std::move(pairs), ordered);
  }
  if (j.is_array()) {
    std::vector<Value> items;
    for (const auto& x : j) items.push_back(FromJson(x, false));
    return Value::List(std::move(items));
  }
  if (j.is_boolean()) return Value::Bool(j.get<bool>());
  if (j.is_number_integer() && (j.is_number_unsigned() ? j.get<uint64_t>() <= INT64_MAX : true))
    return Value::Int(j.get<int64_t>());
  if (j.is_number()) return Value::Float(j.get<double>());
  if (j.is_string()) return Value::Str(j.get<std::string>());
  return Value::None();
}

Value StateDict(const std::string& entry,
                const std::function<std::optional<std::string>(const std::string&)>& meta) {
  Value v = Value::Entry(entry, /*ordered=*/true);
  if (const auto md = meta(entry)) {
    const auto parsed = json::ParseOrdered(*md);
    if (parsed && parsed->is_object()) {
      std::vector<std::pair<Value, Value>> attrs;
      attrs.emplace_back(Value::Str("_metadata"), FromJson(*parsed, /*ordered=*/true));
      v.set_attributes(Value::Dict(std::move(attrs)));
    }
  }
  return v;
}

Value FromMetadata(const MetadataValue& m) {
  if (const auto* s = std::get_if<std::string>(&m)) return Value::Str(*s);
  if (const auto* i = std::get_if<int64_t>(&m)) return Value::Int(*i);
  if (const auto* d = std::get_if<double>(&m)) return Value::Float(*d);
  return Value::Bytes(std::get<tsar::Bytes>(m).data);
}

}  // namespace

Value ImpliedValue(
    const std::vector<std::string>& entries,
    const std::function<std::optional<std::string>(const std::string&)>& entry_metadata,
    const std::vector<std::pair<std::string, MetadataValue>>& archive_metadata) {
  if (entries.size() == 1 && archive_metadata.empty()) return StateDict(entries[0], entry_metadata);
  std::vector<std::pair<Value, Value>> pairs;
  pairs.reserve(entries.size() + archive_metadata.size());
  for (const auto& e : entries) pairs.emplace_back(Value::Str(e), StateDict(e, entry_metadata));
  for (const auto& [k, m] : archive_metadata) pairs.emplace_back(Value::Str(k), FromMetadata(m));
  return Value::Dict(std::move(pairs));
}

}  // namespace tsar
