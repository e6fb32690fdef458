// Tests of the safetensors and HDF5 input readers (writer/import_*.cc) on files
// made by tests/fixtures/make_import_fixtures.py; the directory comes from
// $TSAR_IMPORT_FIXTURES, and the tests skip when it is unset.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "loader/scalar_type.h"
#include "tsar/dtype.h"
#include "tsar/error.h"
#include "writer/from_tensor.h"
#include "writer/importer.h"

namespace tsar::importer {
namespace {

using Json = nlohmann::json;
using ImportFn = std::function<Imported(const std::string&, const ImportOptions&)>;

// An imported tensor as LibTorch sees it: a view of the same bytes.
at::Tensor T(const Imported::Tensor& t) { return writer::ToTensor(t.tensor); }

std::string FixtureDir() {
  const char* dir = std::getenv("TSAR_IMPORT_FIXTURES");
  return dir == nullptr ? std::string() : std::string(dir);
}

#define REQUIRE_FIXTURES()                                                               \
  if (FixtureDir().empty()) {                                                            \
    GTEST_SKIP() << "set TSAR_IMPORT_FIXTURES to the output of make_import_fixtures.py"; \
  }

std::string Fixture(const std::string& name) { return FixtureDir() + "/" + name; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const Json& Expected() {
  static const Json json = Json::parse(ReadAll(Fixture("expected.json")));
  return json;
}

// A scratch file in a fresh directory, in memory where possible (the sweeps
// write thousands of files); both are removed at the end of the scope.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& name) {
    dir_ =
        access("/dev/shm", W_OK) == 0 ? "/dev/shm/tsar-import-XXXXXX" : "/tmp/tsar-import-XXXXXX";
    if (mkdtemp(dir_.data()) == nullptr) std::abort();
    path_ = dir_ + "/" + name;
  }
  ~ScratchFile() {
    std::remove(path_.c_str());
    rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

std::string Hex(const uint8_t* p, uint64_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (uint64_t i = 0; i < n; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

std::string Hex(const at::Tensor& t) {
  return Hex(static_cast<const uint8_t*>(t.data_ptr()), t.nbytes());
}

std::string DTypeOf(const at::Tensor& t) {
  const std::optional<DType> d = FromScalarType(t.scalar_type());
  return d ? std::string(DTypeName(*d)) : std::string("?");
}

// Start address of this process's mapping of `path` at file offset 0, or 0.
uintptr_t MappingBase(const std::string& path) {
  char real[PATH_MAX];
  const std::string want = realpath(path.c_str(), real) ? real : path;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.size() < want.size() ||
        line.compare(line.size() - want.size(), want.size(), want) != 0) {
      continue;
    }
    unsigned long lo = 0, hi = 0, off = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %*s %lx", &lo, &hi, &off) == 3 && off == 0) return lo;
  }
  return 0;
}

// Runs `fn` and returns the tsar::Error it must throw.
std::optional<Error> ImportError(const ImportFn& fn, const std::string& path,
                                 const ImportOptions& options = {}) {
  try {
    fn(path, options);
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << ": non-tsar exception: " << e.what();
    return std::nullopt;
  }
  ADD_FAILURE() << path << ": imported without an error";
  return std::nullopt;
}

void ExpectTensors(const Imported& got, const Json& want) {
  ASSERT_EQ(got.entries.size(), 1u);
  EXPECT_EQ(got.entries[0].name, "model");
  const auto& tensors = got.entries[0].tensors;
  ASSERT_EQ(tensors.size(), want.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Imported::Tensor& t = tensors[i];
    const Json& w = want[i];
    SCOPED_TRACE(w["name"].get<std::string>());
    EXPECT_EQ(t.name, w["name"].get<std::string>());
    EXPECT_EQ(t.role, Role::kTensor);
    EXPECT_EQ(DTypeOf(T(t)), w["dtype"].get<std::string>());
    EXPECT_EQ(T(t).sizes().vec(), w["shape"].get<std::vector<int64_t>>());
    EXPECT_TRUE(T(t).is_contiguous());
    EXPECT_EQ(T(t).device(), c10::Device(c10::kCPU));
    EXPECT_EQ(Hex(T(t)), w["hex"].get<std::string>());
  }
}

void ExpectMetadata(const Imported& got, const Json& want) {
  std::map<std::string, MetadataValue> have;
  for (const Imported::Meta& m : got.metadata) {
    EXPECT_EQ(m.entry, "");
    EXPECT_TRUE(have.emplace(m.key, m.value).second) << "repeated key " << m.key;
  }
  EXPECT_EQ(have.size(), want.size());
  for (const Json& w : want) {
    const std::string key = w["key"].get<std::string>();
    SCOPED_TRACE(key);
    const auto it = have.find(key);
    ASSERT_NE(it, have.end());
    const std::string type = w["type"].get<std::string>();
    if (type == "string") {
      ASSERT_TRUE(std::holds_alternative<std::string>(it->second));
      EXPECT_EQ(std::get<std::string>(it->second), w["value"].get<std::string>());
    } else if (type == "int") {
      ASSERT_TRUE(std::holds_alternative<int64_t>(it->second));
      EXPECT_EQ(std::get<int64_t>(it->second), w["value"].get<int64_t>());
    } else {
      ASSERT_TRUE(std::holds_alternative<double>(it->second));
      EXPECT_EQ(std::get<double>(it->second), w["value"].get<double>());
    }
  }
}

// Every line of `skipped` is expected to match one substring, in any order.
void ExpectSkipped(const Imported& got, const Json& want) {
  EXPECT_EQ(got.skipped.size(), want.size());
  for (const Json& w : want) {
    const std::string needle = w.get<std::string>();
    bool found = false;
    for (const std::string& line : got.skipped) {
      found = found || line.find(needle) != std::string::npos;
    }
    EXPECT_TRUE(found) << "no skipped line mentions " << needle;
  }
}

// ------------------------------------------------------------ safetensors

TEST(ImportSafetensors, MatchesWhatPythonWrote) {
  REQUIRE_FIXTURES();
  for (const auto& [name, want] : Expected()["safetensors"].items()) {
    SCOPED_TRACE(name);
    const Imported got = ImportSafetensors(Fixture(name), {});
    EXPECT_EQ(got.kind, InputKind::kSafetensors);
    ExpectTensors(got, want["tensors"]);
    ExpectMetadata(got, want["metadata"]);
    EXPECT_TRUE(got.skipped.empty());
  }
}

TEST(ImportSafetensors, UsesEntryNameFromOptions) {
  REQUIRE_FIXTURES();
  ImportOptions options;
  options.default_entry = "weights";
  const Imported got = ImportSafetensors(Fixture("no_metadata.safetensors"), options);
  ASSERT_EQ(got.entries.size(), 1u);
  EXPECT_EQ(got.entries[0].name, "weights");
}

TEST(ImportSafetensors, TensorsAreViewsOfTheMappingAndKeepItAlive) {
  REQUIRE_FIXTURES();
  const std::string path = Fixture("dtypes.safetensors");
  const Json& want = Expected()["safetensors"]["dtypes.safetensors"]["tensors"];
  std::vector<at::Tensor> kept;
  {
    const Imported got = ImportSafetensors(path, {});
    const uintptr_t base = MappingBase(path);
    ASSERT_NE(base, 0u) << "no mapping of " << path;
    const auto& tensors = got.entries.at(0).tensors;
    ASSERT_EQ(tensors.size(), want.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (T(tensors[i]).numel() == 0) continue;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(T(tensors[i]).data_ptr()),
                base + want[i]["offset"].get<uintptr_t>())
          << tensors[i].name;
      kept.push_back(T(tensors[i]));
    }
  }
  // The Imported is gone; the tensors still hold the mapping.
  EXPECT_NE(MappingBase(path), 0u);
  for (size_t i = 0, k = 0; i < want.size(); ++i) {
    if (want[i]["shape"].get<std::vector<int64_t>>() == std::vector<int64_t>{0, 3}) continue;
    EXPECT_EQ(Hex(kept[k++]), want[i]["hex"].get<std::string>());
  }
  kept.clear();
  EXPECT_EQ(MappingBase(path), 0u) << "mapping outlived its tensors";
}

// Without LibTorch, the reader knows every dtype of the format, including
// those LibTorch 1.13 lacks (its loader refuses them when building tensors).
void ExpectExactWithoutLibTorch(const Imported& got, const Json& w) {
  ASSERT_EQ(got.entries.size(), 1u);
  ASSERT_EQ(got.entries[0].tensors.size(), 1u);
  const writer::TensorRef& t = got.entries[0].tensors[0].tensor;
  EXPECT_EQ(DTypeName(t.dtype), w["dtype"].get<std::string>());
  EXPECT_EQ(t.sizes, w["shape"].get<std::vector<int64_t>>());
  const uint64_t esize = ElementSize(t.dtype);
  EXPECT_EQ(Hex(t.storage->data + t.storage_offset * esize, t.numel() * esize),
            w["hex"].get<std::string>());
}

TEST(ImportSafetensors, DtypesThisLibTorchLacksAreImportedExactly) {
  REQUIRE_FIXTURES();
  for (const Json& w : Expected()["unsupported"]) {
    SCOPED_TRACE(w["file"].get<std::string>());
    ExpectExactWithoutLibTorch(ImportSafetensors(Fixture(w["file"].get<std::string>()), {}), w);
  }
}

TEST(ImportSafetensors, InvalidFilesAreBadInputNamingFileAndTensor) {
  REQUIRE_FIXTURES();
  for (const Json& w : Expected()["invalid"]) {
    const std::string file = w["file"].get<std::string>();
    SCOPED_TRACE(file);
    const bool index = w.value("index", false);
    const std::optional<Error> e = ImportError(
        index ? ImportFn(ImportSafetensorsIndex) : ImportFn(ImportSafetensors), Fixture(file));
    if (!e) continue;
    EXPECT_EQ(e->code(), ErrorCode::kBadInput) << e->what();
    for (const Json& needle : w["contains"]) {
      EXPECT_NE(std::string(e->what()).find(needle.get<std::string>()), std::string::npos)
          << "\"" << e->what() << "\" lacks " << needle;
    }
  }
}

TEST(ImportSafetensors, GoldenMessages) {
  REQUIRE_FIXTURES();
  const std::string length = Fixture("bad_length.safetensors");
  std::optional<Error> e = ImportError(ImportSafetensors, length);
  ASSERT_TRUE(e);
  EXPECT_EQ(std::string(e->what()),
            length + ": tensor \"w\": data_offsets: expected 24 bytes for F32 [2, 3], found 20");
  EXPECT_EQ(e->offset(), std::nullopt);
  const std::string past = Fixture("bad_header_past_end.safetensors");
  e = ImportError(ImportSafetensors, past);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->offset(), 0u);
  EXPECT_NE(std::string(e->what()).find("header length: expected at most"), std::string::npos)
      << e->what();
}

TEST(ImportSafetensors, MissingFileIsNotFound) {
  REQUIRE_FIXTURES();
  const std::optional<Error> e = ImportError(ImportSafetensors, Fixture("no_such.safetensors"));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ErrorCode::kNotFound);
}

// Either an import or a tsar::Error; after an import, every tensor lies inside the mapping.
void ImportOrError(const std::string& path, size_t file_size) {
  try {
    const Imported got = ImportSafetensors(path, {});
    const uintptr_t base = MappingBase(path);
    for (const Imported::Tensor& t : got.entries.at(0).tensors) {
      if (T(t).numel() == 0) continue;
      const auto p = reinterpret_cast<uintptr_t>(T(t).data_ptr());
      ASSERT_GE(p, base);
      ASSERT_LE(p + T(t).nbytes(), base + file_size) << t.name;
      const auto* bytes = static_cast<const volatile uint8_t*>(T(t).data_ptr());
      unsigned sum = 0;
      for (size_t i = 0; i < T(t).nbytes(); ++i) sum += bytes[i];
      (void)sum;
    }
  } catch (const Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-tsar exception: " << e.what();
  }
}

TEST(ImportSafetensors, EveryTruncationFails) {
  REQUIRE_FIXTURES();
  const std::string bytes = ReadAll(Fixture("dtypes.safetensors"));
  const ScratchFile scratch("t.safetensors");
  const std::string& path = scratch.path();
  for (size_t n = 0; n < bytes.size(); ++n) {
    WriteAll(path, bytes.substr(0, n));
    const std::optional<Error> e = ImportError(ImportSafetensors, path);
    if (e) {
      EXPECT_EQ(e->code(), ErrorCode::kBadInput) << e->what();
    }
  }
}

TEST(ImportSafetensors, ByteFlipsNeverCrash) {
  REQUIRE_FIXTURES();
  const std::string original = ReadAll(Fixture("dtypes.safetensors"));
  const ScratchFile scratch("f.safetensors");
  const std::string& path = scratch.path();
  std::mt19937 rng(1234);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = original;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      // Most flips hit the length and JSON header, where the parser works.
      const size_t at = rng() % 4 ? rng() % 1064 : rng() % bytes.size();
      bytes[at] = static_cast<char>(rng() % 2 ? rng() % 256 : "0123456789[]{},:\"-e."[rng() % 20]);
    }
    WriteAll(path, bytes);
    ImportOrError(path, bytes.size());
  }
}

TEST(ImportSafetensorsIndex, MatchesWhatPythonWrote) {
  REQUIRE_FIXTURES();
  for (const auto& [name, want] : Expected()["index"].items()) {
    SCOPED_TRACE(name);
    const Imported got = ImportSafetensorsIndex(Fixture(name), {});
    EXPECT_EQ(got.kind, InputKind::kSafetensorsIndex);
    ExpectTensors(got, want["tensors"]);
    ExpectMetadata(got, want["metadata"]);
    ExpectSkipped(got, want["skipped"]);
    // Zero copy: each tensor views its own shard's mapping.
    const std::string dir = Fixture(name).substr(0, Fixture(name).rfind('/') + 1);
    const auto& tensors = got.entries.at(0).tensors;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const uintptr_t base = MappingBase(dir + want["tensors"][i]["file"].get<std::string>());
      ASSERT_NE(base, 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(T(tensors[i]).data_ptr()),
                base + want["tensors"][i]["offset"].get<uintptr_t>());
    }
  }
}

// ------------------------------------------------------------------- HDF5

TEST(ImportHdf5, MatchesWhatPythonWrote) {
  REQUIRE_FIXTURES();
  for (const auto& [name, want] : Expected()["hdf5"].items()) {
    SCOPED_TRACE(name);
    const Imported got = ImportHdf5(Fixture(name), {});
    EXPECT_EQ(got.kind, InputKind::kHdf5);
    ExpectTensors(got, want["tensors"]);
    ExpectMetadata(got, want["metadata"]);
    ExpectSkipped(got, want["skipped"]);
  }
}

TEST(ImportHdf5, StrictRefusesNonNumericDatasets) {
  REQUIRE_FIXTURES();
  ImportOptions strict;
  strict.strict = true;
  for (const Json& w : Expected()["hdf5_strict"]) {
    const std::string file = w["file"].get<std::string>();
    const std::optional<Error> e = ImportError(ImportHdf5, Fixture(file), strict);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code(), ErrorCode::kBadInput);
    for (const Json& needle : w["contains"]) {
      EXPECT_NE(std::string(e->what()).find(needle.get<std::string>()), std::string::npos)
          << e->what();
    }
  }
}

TEST(ImportHdf5, DtypesThisLibTorchLacksAreImportedExactly) {
  REQUIRE_FIXTURES();
  for (const Json& w : Expected()["hdf5_unsupported"]) {
    SCOPED_TRACE(w["file"].get<std::string>());
    ExpectExactWithoutLibTorch(ImportHdf5(Fixture(w["file"].get<std::string>()), {}), w);
  }
}

TEST(ImportHdf5, InvalidFilesAreBadInput) {
  REQUIRE_FIXTURES();
  for (const Json& w : Expected()["hdf5_invalid"]) {
    const std::string file = w["file"].get<std::string>();
    SCOPED_TRACE(file);
    const std::optional<Error> e = ImportError(ImportHdf5, Fixture(file));
    ASSERT_TRUE(e) << file << " imported, but it is invalid";
    EXPECT_EQ(e->code(), ErrorCode::kBadInput) << e->what();
    for (const Json& needle : w["contains"]) {
      EXPECT_NE(std::string(e->what()).find(needle.get<std::string>()), std::string::npos)
          << e->what();
    }
  }
  const std::optional<Error> missing = ImportError(ImportHdf5, Fixture("no_such.h5"));
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->code(), ErrorCode::kNotFound);
}

TEST(ImportHdf5, TruncationsFailCleanly) {
  REQUIRE_FIXTURES();
  const std::string bytes = ReadAll(Fixture("model.h5"));
  const ScratchFile scratch("t.h5");
  const std::string& path = scratch.path();
  for (size_t n = 0; n < bytes.size(); n += 1 + bytes.size() / 97) {
    WriteAll(path, bytes.substr(0, n));
    const std::optional<Error> e = ImportError(ImportHdf5, path);
    if (e) {
      EXPECT_EQ(e->code(), ErrorCode::kBadInput) << e->what();
    }
  }
}

}  // namespace
}  // namespace tsar::importer
