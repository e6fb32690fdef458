// The value tree of an archive (spec §4.10) and the implied tree of one that
// has none (§4.10.3): what export to .pt writes and Archive::value() returns.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tsar/archive_file.h"
#include "tsar/value.h"

namespace tsar {

// The tree implied by entries and metadata alone (spec §4.10.3), which is how
// an archive without a tree (every 1.0 archive) reads as a Python object:
//   - one entry and no archive-level metadata: that entry's state_dict;
//   - otherwise a dict: each entry's state_dict under its name, in order,
//     then each archive-level metadata item (sorted by key, as stored).
// A state_dict is an OrderedDict (an entry value) whose attributes are
// {"_metadata": ...} when the entry has a string metadata item
// "torch._metadata" holding a JSON object: objects become dicts (the outer
// one an OrderedDict), arrays lists, and numbers, strings, booleans and null
// themselves. `entry_metadata(name)` gives that item of an entry, if any.
Value ImpliedValue(
    const std::vector<std::string>& entries,
    const std::function<std::optional<std::string>(const std::string&)>& entry_metadata,
    const std::vector<std::pair<std::string, MetadataValue>>& archive_metadata);

}  // namespace tsar
