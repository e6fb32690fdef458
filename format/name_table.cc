// NameTable: linear probing over XXH3 hashes of names.
#include "format/name_table.h"

#include "format/checksum.h"

namespace tsar::format {

std::pair<uint32_t, uint32_t> NameTable::Build(const std::vector<std::string_view>& names) {
  names_ = names;
  // At most half full. An empty set allocates nothing: an index may hold
  // millions of empty entries, and each has its own table.
  size_t cap = names.empty() ? 0 : 2;
  while (cap < names.size() * 2) cap <<= 1;
  slots_.assign(cap, kMissing);
  for (uint32_t i = 0; i < names.size(); ++i) {
    size_t h = Xxh3(names[i].data(), names[i].size()) & (cap - 1);
    while (slots_[h] != kMissing) {
      if (names_[slots_[h]] == names[i]) return {slots_[h], i};
      h = (h + 1) & (cap - 1);
    }
    slots_[h] = i;
  }
  return {kMissing, kMissing};
}

uint32_t NameTable::Find(std::string_view name) const {
  if (slots_.empty()) return kMissing;
  const size_t mask = slots_.size() - 1;
  size_t h = Xxh3(name.data(), name.size()) & mask;
  while (slots_[h] != kMissing) {
    if (names_[slots_[h]] == name) return slots_[h];
    h = (h + 1) & mask;
  }
  return kMissing;
}

}  // namespace tsar::format
