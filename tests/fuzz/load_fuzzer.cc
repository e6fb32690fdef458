// libFuzzer harness for the loader with LibTorch (issue 16): any byte string,
// as a file, must open and give tensors, state_dicts and metadata, or throw
// tsar::Error; never crash, read outside the mapping, or let another exception
// (LibTorch's c10::Error) escape Archive. Each input runs twice: as it is and
// with its index checksum recomputed (fuzz_util.h).
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "tsar/archive.h"

namespace {

uint64_t Load(const uint8_t* data, size_t size) {
  tsar::fuzz::MemFile file(data, size);
  uint64_t sum = 0;
  try {
    const tsar::Archive a = tsar::Archive::open(file.path());
    for (const auto& e : a.entries()) {
      for (const auto& item : a.state_dict(e)) sum += tsar::fuzz::Touch(item.value());
      for (const auto& [k, v] : a.metadata_items(e)) sum += k.size() + v.index();
    }
    for (const auto& [k, v] : a.metadata_items()) sum += k.size() + v.index();
    // The value tree (spec §4.10), stored or implied; each tensor it names exists.
    std::vector<const tsar::Value*> stack;
    const tsar::Value root = a.value();
    stack.push_back(&root);
    while (!stack.empty()) {
      const tsar::Value* v = stack.back();
      stack.pop_back();
      sum += v->bytes().size();
      if (v->is(tsar::Value::Kind::kTensor)) tsar::fuzz::Check(a.contains(v->name(), v->entry()));
      for (const auto& x : v->items()) stack.push_back(&x);
      for (const auto& [k, x] : v->pairs()) {
        stack.push_back(&k);
        stack.push_back(&x);
      }
      if (v->attributes()) stack.push_back(v->attributes());
    }
    for (const auto& t : a.infos()) {
      const at::Tensor x = a.tensor(t.name, t.entry);
      tsar::fuzz::Check(x.layout() != at::kStrided || x.sizes().vec() == t.sizes);
      sum += tsar::fuzz::Touch(x);
    }
    sum += a.damaged().size();
    a.verify();
  } catch (const tsar::Error&) {
  }
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint64_t sum = Load(data, size);
  const std::vector<uint8_t> fixed = tsar::fuzz::WithIndexChecksum(data, size);
  if (!fixed.empty()) sum += Load(fixed.data(), fixed.size());
  return sum == 1 ? 0 : 0;
}
