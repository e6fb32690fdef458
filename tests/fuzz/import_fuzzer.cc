// libFuzzer harness for the importers of `tsar pack` that tsar implements
// itself (issue 16): torch.save zips (minizip, the restricted pickle reader,
// the view checks) and safetensors files. Any byte string must import or throw
// tsar::Error; what imports must pack, and the archive must give back every
// tensor bit for bit. HDF5 and TorchScript inputs are parsed by those libraries
// (libhdf5, torch::jit::load) and are not fuzzed here; the safetensors index
// reads other files by name, so it is not either.
#include <cstddef>
#include <cstdint>
#include <map>

#include "fuzz_util.h"
#include "tsar/archive.h"
#include "writer/from_tensor.h"
#include "writer/importer.h"
#include "writer/pack_files.h"

namespace {

using tsar::importer::InputKind;

uint64_t Import(const uint8_t* data, size_t size) {
  tsar::fuzz::MemFile file(data, size);
  InputKind kind = InputKind::kUnknown;
  try {
    kind = tsar::importer::Detect(file.path());
  } catch (const tsar::Error&) {
    return 0;
  }
  if (kind != InputKind::kTorchSave && kind != InputKind::kSafetensors) return 0;
  uint64_t sum = 0;
  tsar::importer::Imported in;
  try {
    in = tsar::importer::Import(file.path());
  } catch (const tsar::Error&) {
    return 0;
  }
  // The imported tensors as LibTorch sees them; undefined for a dtype this
  // LibTorch lacks (uint16...), which the importer takes and the loader refuses.
  std::map<std::pair<std::string, std::string>, at::Tensor> by_name;
  for (const auto& e : in.entries) {
    for (const auto& t : e.tensors) {
      at::Tensor& x = by_name[{e.name, t.name}];
      try {
        x = tsar::writer::ToTensor(t.tensor);
      } catch (const tsar::Error& err) {
        tsar::fuzz::Check(err.code() == tsar::ErrorCode::kUnsupported);
        continue;
      }
      sum += tsar::fuzz::Touch(x);
    }
  }
  // What imports packs (or is refused as a whole with tsar::Error: a name
  // the format cannot hold), and reads back exactly.
  const std::string out = tsar::fuzz::ScratchDir() + "/import.tsar";
  tsar::PackFilesOptions options;
  options.pack.durable = false;
  try {
    tsar::PackFiles({{"", file.path()}}, out, options);
  } catch (const tsar::Error&) {
    return sum;
  }
  const tsar::Archive a = tsar::Archive::open(out, {});
  a.verify();
  size_t seen = 0;
  for (const auto& info : a.infos()) {
    const auto it = by_name.find({info.entry, info.name});
    tsar::fuzz::Check(it != by_name.end());
    ++seen;
    if (!it->second.defined()) continue;
    const at::Tensor x = a.tensor(info.name, info.entry);
    if (it->second.numel() <= tsar::fuzz::kTouchElements) {
      tsar::fuzz::Check(tsar::fuzz::SameBits(x, it->second));
    }
  }
  tsar::fuzz::Check(seen == by_name.size());
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return Import(data, size) == 1 ? 0 : 0;
}
