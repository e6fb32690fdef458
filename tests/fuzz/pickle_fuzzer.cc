// libFuzzer harness for the restricted pickle reader (writer/pickle.h): any
// byte string must unpickle or throw tsar::Error, never crash, hang, read out
// of bounds or execute anything. It also checks the guarantees Parse documents
// for every tensor it returns.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "tsar/dtype.h"
#include "tsar/error.h"
#include "writer/pickle.h"

namespace {

using tsar::pickle::Result;
using tsar::pickle::Value;

// A documented guarantee does not hold: stop so that libFuzzer saves the input.
void Check(bool ok) {
  if (!ok) std::abort();
}

// Walks the whole tree (depth <= kMaxDepth by contract), so ASan sees every
// string and vector, and checks each tensor against its storage.
size_t Walk(const Value& v, const Result& r, size_t depth) {
  Check(depth <= tsar::pickle::kMaxDepth + 1);
  size_t sum = v.str.size() + v.keys.size();
  for (const std::string& k : v.keys) sum += k.size();
  if (v.kind == Value::Kind::kDict) Check(v.keys.size() == v.items.size());
  if (v.kind == Value::Kind::kTensor) {
    const auto& t = v.tensor;
    Check(t.storage < r.storages.size());
    Check(t.sizes.size() == t.strides.size() && t.sizes.size() <= tsar::pickle::kMaxRank);
    // Every element the view can address lies inside the storage.
    bool empty = false;
    unsigned __int128 last = 0;
    for (size_t d = 0; d < t.sizes.size(); ++d) {
      Check(t.sizes[d] >= 0 && t.strides[d] >= 0);
      if (t.sizes[d] == 0) empty = true;
      last += static_cast<unsigned __int128>(t.sizes[d] > 0 ? t.sizes[d] - 1 : 0) *
              static_cast<uint64_t>(t.strides[d]);
    }
    if (!empty) Check(t.storage_offset + last < r.storages[t.storage].numel);
  }
  if (v.attributes) sum += Walk(*v.attributes, r, depth + 1);
  for (const Value& item : v.items) sum += Walk(item, r, depth + 1);
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const Result r = tsar::pickle::Parse(data, size, "fuzz/data.pkl");
    size_t sum = Walk(r.root, r, 0);
    for (const auto& s : r.storages) {
      Check(!s.key.empty());
      Check(tsar::DTypeFromName(s.dtype).has_value());
      sum += s.key.size() + s.location.size();
    }
    return sum == 1 ? 0 : 0;
  } catch (const tsar::Error&) {
    return 0;
  }
}
