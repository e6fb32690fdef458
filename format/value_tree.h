// tsar::Value (include/tsar/value.h) to and from the value and link tables of
// spec §4.10. Pure C++: no LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "format/index.h"
#include "format/values.h"
#include "tsar/value.h"

namespace tsar::format {

// Looks up a tensor record by (entry, name) or an entry record by name;
// returns kNone when there is none.
using TensorLookup = std::function<uint32_t(const std::string& entry, const std::string& name)>;
using EntryLookup = std::function<uint32_t(const std::string& entry)>;

// `root` as value specs in the canonical pre-order of §4.9 (a value, then
// each of its links' subtrees in link order). Throws kInvalidArgument for a
// tensor or entry that the lookups do not know, a dict attribute that is not
// a dict, an opaque value whose segments do not surround its items, or a tree
// deeper than kMaxValueDepth.
std::vector<ValueSpec> EncodeTree(const Value& root, const TensorLookup& tensor,
                                  const EntryLookup& entry);

// The value tree of `index` (which has one: !index.values().empty()).
Value DecodeTree(const Index& index);

}  // namespace tsar::format
