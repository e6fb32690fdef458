// A flat open-addressing hash set of names (string_views into caller-owned
// bytes): one allocation for the whole set, used to find duplicates while
// validating (§6) and to look names up after open.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace tsar::format {

class NameTable {
 public:
  static constexpr uint32_t kMissing = 0xFFFFFFFFu;

  NameTable() = default;
  // Indexes names[i] -> i. If two names are equal, returns {first, second}
  // (and the table holds the first); otherwise {kMissing, kMissing}.
  std::pair<uint32_t, uint32_t> Build(const std::vector<std::string_view>& names);
  // The index of `name`, or kMissing.
  uint32_t Find(std::string_view name) const;

 private:
  std::vector<std::string_view> names_;
  std::vector<uint32_t> slots_;
};

}  // namespace tsar::format
