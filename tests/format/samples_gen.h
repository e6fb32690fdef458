// The deterministic generator of samples/ (spec/FORMAT.md §8): tiny valid
// archives with their expected decoding, and invalid ones with their error.
#pragma once

#include <string>
#include <vector>

namespace tsar::testing {

struct SampleFile {
  std::string path;  // relative to samples/, e.g. "valid/minimal.tsar"
  std::string bytes;
};

// Every file of samples/, in a fixed order. Throws std::logic_error if an
// invalid sample does not fail with the code and offset it was built for.
std::vector<SampleFile> GenerateSamples();

}  // namespace tsar::testing
