// libFuzzer harness for the archive decoder (spec/FORMAT.md §6): any byte
// string must decode or throw tsar::Error, never crash or read out of bounds.
#include <cstddef>
#include <cstdint>

#include "format/index.h"
#include "tsar/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto index = tsar::format::Index::ParseBytes(data, size, "fuzz.tsar");
    // Touch every decoded view so ASan sees any dangling or out-of-range one.
    size_t sum = 0;
    for (const auto& t : index.tensors()) {
      sum += t.name.size();
      for (uint32_t d = 0; d < t.ndim; ++d) sum += static_cast<size_t>(index.sizes(t)[d]);
    }
    for (const auto& m : index.metadata()) sum += m.key.size() + m.bytes.size();
    return sum == 1 ? 0 : 0;
  } catch (const tsar::Error&) {
    return 0;
  }
}
