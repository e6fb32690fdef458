// The invalid samples of samples/invalid/ (spec §8.3): each made from a valid
// sample by one mutation, with the error a reader must report.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tsar/error.h"

namespace tsar::testing::samples {

struct Invalid {
  const char* name;
  std::function<std::string()> make;
  ErrorCode code;
  std::function<uint64_t(const std::string&)> offset;
  const char* what;  // MANIFEST.tsv's description column
};

// Every invalid sample, made from the valid samples given (their bytes).
std::vector<Invalid> InvalidCatalogue(const std::string& minimal, const std::string& shared,
                                      const std::string& meta, const std::string& sparse,
                                      const std::string& aligned, const std::string& empty_views,
                                      const std::string& tree, const std::string& layer,
                                      const std::string& tp, const std::string& groups);

}  // namespace tsar::testing::samples
