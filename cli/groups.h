// What `tsar inspect` (and diff) say of a tensor group (spec §4.13, format
// 1.5): its class and members from its description, read without torchao.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tsar/archive_file.h"

namespace tsar::cli {

struct GroupSummary {
  bool valid = false;  // the description has the form of §4.13.2
  std::string library, version, cls;
  std::vector<std::pair<std::string, std::string>> members;  // (role, tensor name)
  std::string attributes;                                     // compact JSON text
};

// Reads g.description. An archive whose description breaks the grammar is
// still shown (valid false: the tensors are, the class is not known).
GroupSummary Summarize(const GroupInfo& g);

}  // namespace tsar::cli
