// libFuzzer harness for `tsar export` (issue 16): an archive that opens and
// verifies is exported to .pt, .safetensors and .h5, or refused with
// tsar::Error (a dtype or name the format cannot hold); every export is read
// back by the importers and must hold the same tensors, bit for bit. Inputs
// are archives (seeded from samples/), with the index checksum recomputed.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "fuzz_util.h"
#include "tsar/archive.h"
#include "writer/exporter.h"
#include "writer/from_tensor.h"
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
  std::vector<uint8_t> bytes(p, p + c.numel() * c.element_size());
  // A bool byte other than 0 or 1 is valid (spec §5.1) and every exporter
  // keeps it, but LibTorch's copy of a strided bool tensor (contiguous()
  // above) stores each as 1: compare bools as truth values.
  if (t.scalar_type() == at::kBool) {
    for (uint8_t& b : bytes) b = b != 0;
  }
  return {head, std::move(bytes)};
}

// A dict key as Python compares it (True == 1 == 1.0, -0.0 == 0), or false
// where this harness does not model Python's equality (NaN, which Python
// matches by identity; big ints, whose encodings need not be minimal; floats
// outside int64 that may equal one; opaque objects).
bool PythonKey(const tsar::Value& v, std::string& out) {
  using K = tsar::Value::Kind;
  switch (v.kind()) {
    case K::kNone:
      out += 'n';
      return true;
    case K::kBool:
    case K::kInt:
      out += 'i' + std::to_string(v.is(K::kBool) ? v.as_bool() : v.as_int()) + ';';
      return true;
    case K::kFloat: {
      const double f = v.as_float();
      if (f != f) return false;
      if (f == std::floor(f) && f >= -0x1p63 && f < 0x1p63) {
        out += 'i' + std::to_string(static_cast<int64_t>(f)) + ';';
        return true;
      }
      if (f == std::floor(f)) return false;  // integral beyond int64: may equal a big int
      uint64_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      out += 'f' + std::to_string(bits) + ';';
      return true;
    }
    case K::kStr:
    case K::kBytes:
      out += (v.is(K::kStr) ? 's' : 'b') + std::to_string(v.bytes().size()) + ':' + v.bytes();
      return true;
    case K::kTensor:  // one record gives one Python object, hashed by identity
      out += 't' + std::to_string(v.entry().size()) + ':' + v.entry() + v.name() + ';';
      return true;
    case K::kTuple:
      out += '(' + std::to_string(v.items().size()) + ':';
      for (const auto& x : v.items()) {
        if (!PythonKey(x, out)) return false;
      }
      return true;
    default:
      return false;
  }
}

// What a round trip through .pt can be checked against.
struct Reach {
  std::set<std::string> tensors;  // entry '\0' name
  bool opaque = false;            // its pickle segments (any bytes here) may build more tensors
  bool dropped = false;           // a dict whose keys may repeat: Python keeps the last value only
};

// The tensors an export to .pt writes: those the value tree reaches (spec
// §4.10; for an archive without a stored tree, the tree its entries and
// metadata imply), each once. A key a dict repeats keeps its last value, as
// in Python (§4.10.3): the values it replaced are not reached. (An implied
// tree repeats a key when an archive-level metadata key equals an entry
// name: the metadata value replaces that entry's state_dict.)
void Reached(const tsar::Archive& a, const tsar::Value& v, Reach& r) {
  using K = tsar::Value::Kind;
  r.opaque = r.opaque || v.is(K::kOpaque);
  if (v.is(K::kTensor)) r.tensors.insert(v.entry() + '\0' + v.name());
  if (v.is(K::kEntry)) {
    for (const auto& n : a.names(v.entry())) r.tensors.insert(v.entry() + '\0' + n);
  }
  for (const auto& x : v.items()) Reached(a, x, r);
  std::map<std::string, size_t> last;  // Python key -> the pair whose value it keeps
  bool modelled = true;
  for (size_t i = 0; i < v.pairs().size(); ++i) {
    std::string key;
    modelled = modelled && PythonKey(v.pairs()[i].first, key);
    last[key] = i;
  }
  r.dropped = r.dropped || !modelled;
  for (size_t i = 0; i < v.pairs().size(); ++i) {
    Reached(a, v.pairs()[i].first, r);
    std::string key;
    if (!modelled || (PythonKey(v.pairs()[i].first, key), last[key] == i)) {
      Reached(a, v.pairs()[i].second, r);
    }
  }
  if (v.attributes()) Reached(a, *v.attributes(), r);
}

void RoundTrip(const tsar::Archive& a, ex::Format format, const std::string& name) {
  std::vector<Fingerprint> want;
  // A .pt holds what the tree (stored or implied) reaches, and a tensor object
  // met twice is read back once: compare the sets of tensors, not the lists.
  const bool tree = format == ex::Format::kTorchSave;
  Reach reach;
  if (tree) {
    Reached(a, a.value(), reach);
    for (const auto& key : reach.tensors) {
      const size_t cut = key.find('\0');
      want.push_back(Print(a.tensor(key.substr(cut + 1), key.substr(0, cut))));
    }
  } else {
    for (const auto& info : a.infos()) want.push_back(Print(a.tensor(info.name, info.entry)));
  }
  const std::string out = tsar::fuzz::ScratchDir() + "/" + name;
  ex::ExportOptions options;
  options.materialize_shared = true;
  options.torch_save = ex::ExportTorchSave;
  try {
    ex::Export(a, out, format, options);
  } catch (const tsar::Error&) {
    return;  // the format cannot hold something in this archive
  }
  const tsar::importer::Imported back = tsar::importer::Import(out);
  std::vector<Fingerprint> got;
  for (const auto& e : back.entries) {
    for (const auto& t : e.tensors) got.push_back(Print(tsar::writer::ToTensor(t.tensor)));
  }
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  if (tree) {
    want.erase(std::unique(want.begin(), want.end()), want.end());
    got.erase(std::unique(got.begin(), got.end()), got.end());
  }
  // An opaque value's segments are pickle code that no reader interprets
  // (spec §4.10.4): the export writes them back as they are, and a segment
  // that is not a well-formed fragment (one a fuzzer made) can swallow or
  // rebuild anything around it. Export and import must still end cleanly
  // (above), but what the .pt holds then is the segments' business.
  if (reach.opaque) return;
  // Without a model of what Python keeps, one side bounds the other only.
  if (reach.dropped) {
    tsar::fuzz::Check(std::includes(want.begin(), want.end(), got.begin(), got.end()));
  } else {
    tsar::fuzz::Check(want == got);
  }
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
