// libFuzzer harness for `tsar export` (issue 16): an archive that opens and
// verifies is exported to .pt, .safetensors and .h5, or refused with
// tsar::Error (a dtype or name the format cannot hold); every export is read
// back by the importers and must hold the same tensors, bit for bit. Inputs
// are archives (seeded from samples/), with the index checksum recomputed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "fuzz_util.h"
#include "tsar/archive.h"
#include "writer/exporter.h"
#include "writer/importer.h"

namespace {

namespace ex = tsar::exporter;

// Exports whose contiguous size passes this are skipped (expanded views).
constexpr uint64_t kMaxExportBytes = uint64_t{4} << 20;

// dtype, shape and bytes of a dense tensor, comparable across formats that
// rename tensors (entries become prefixes or groups).
using Fingerprint = std::pair<std::string, std::vector<uint8_t>>;

Fingerprint Print(const at::Tensor& t) {
  std::string head = std::string(c10::toString(t.scalar_type())) + " " + std::to_string(t.dim());
  for (int64_t d : t.sizes()) head += " " + std::to_string(d);
  const at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return {head, std::vector<uint8_t>(p, p + c.numel() * c.element_size())};
}

// The tensors an export to .pt writes: those the value tree reaches (spec
// §4.10; every tensor for an archive without a stored tree), each once.
void Reached(const tsar::Archive& a, const tsar::Value& v, std::set<std::string>& out,
             bool& opaque) {
  using K = tsar::Value::Kind;
  opaque = opaque || v.is(K::kOpaque);
  if (v.is(K::kTensor)) out.insert(v.entry() + '\0' + v.name());
  if (v.is(K::kEntry)) {
    for (const auto& n : a.names(v.entry())) out.insert(v.entry() + '\0' + n);
  }
  for (const auto& x : v.items()) Reached(a, x, out, opaque);
  for (const auto& [k, x] : v.pairs()) {
    Reached(a, k, out, opaque);
    Reached(a, x, out, opaque);
  }
  if (v.attributes()) Reached(a, *v.attributes(), out, opaque);
}

void RoundTrip(const tsar::Archive& a, ex::Format format, const std::string& name) {
  std::vector<Fingerprint> want;
  // With a stored tree, a .pt holds what the tree reaches, and a tensor object
  // met twice is read back once: compare the sets of tensors, not the lists.
  const bool tree = format == ex::Format::kTorchSave && a.has_value_tree();
  bool opaque = false;  // its pickle segments (any bytes here) may build more tensors
  if (tree) {
    std::set<std::string> reached;
    Reached(a, a.value(), reached, opaque);
    for (const auto& key : reached) {
      const size_t cut = key.find('\0');
      want.push_back(Print(a.tensor(key.substr(cut + 1), key.substr(0, cut))));
    }
  } else {
    for (const auto& info : a.infos()) want.push_back(Print(a.tensor(info.name, info.entry)));
  }
  const std::string out = tsar::fuzz::ScratchDir() + "/" + name;
  ex::ExportOptions options;
  options.materialize_shared = true;
  try {
    ex::Export(a, out, format, options);
  } catch (const tsar::Error&) {
    return;  // the format cannot hold something in this archive
  }
  const tsar::importer::Imported back = tsar::importer::Import(out);
  std::vector<Fingerprint> got;
  for (const auto& e : back.entries) {
    for (const auto& t : e.tensors) got.push_back(Print(t.tensor));
  }
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  if (tree) {
    want.erase(std::unique(want.begin(), want.end()), want.end());
    got.erase(std::unique(got.begin(), got.end()), got.end());
  }
  tsar::fuzz::Check(opaque ? std::includes(got.begin(), got.end(), want.begin(), want.end())
                           : want == got);
}

void Export(const uint8_t* data, size_t size) {
  tsar::fuzz::MemFile file(data, size);
  try {
    const tsar::Archive a = tsar::Archive::open(file.path());
    a.verify();
    uint64_t total = 0;
    for (const auto& info : a.infos()) {
      if (info.role == tsar::Role::kSparseComponent) return;  // .pt only, as components
      const at::Tensor x = a.tensor(info.name, info.entry);
      // Checked: an expanded view's numel times its element size can pass
      // 2^64 (the one finding of the first hour-long run was this harness's
      // own wrapped sum letting a 2^62-element view through to contiguous()).
      uint64_t bytes = 0;
      if (__builtin_mul_overflow(static_cast<uint64_t>(x.numel()), x.element_size(), &bytes) ||
          __builtin_add_overflow(total, bytes, &total) || total > kMaxExportBytes) {
        return;
      }
    }
    RoundTrip(a, ex::Format::kTorchSave, "export.pt");
    RoundTrip(a, ex::Format::kSafetensors, "export.safetensors");
    RoundTrip(a, ex::Format::kHdf5, "export.h5");
  } catch (const tsar::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> fixed = tsar::fuzz::WithIndexChecksum(data, size);
  if (!fixed.empty()) Export(fixed.data(), fixed.size());
  return 0;
}
