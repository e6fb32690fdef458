// samples/ (spec §8): the generator reproduces every file byte for byte, valid
// samples decode to their expected.json, invalid ones fail as MANIFEST.tsv says,
// and every truncation and every header/index byte flip is rejected.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "format/attached_file.h"
#include "format/checksum.h"
#include "format/endian.h"
#include "format/reader.h"
#include "tests/format/samples_gen.h"
#include "tests/format/test_util.h"
#include "tests/test_env.h"
#include "tsar/archive_file.h"

namespace tsar::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::vector<SampleFile>& Samples() {
  static const std::vector<SampleFile> samples = GenerateSamples();
  return samples;
}

std::vector<std::string> ValidArchives() {
  std::vector<std::string> out;
  for (const auto& s : Samples()) {
    if (s.path.rfind("valid/", 0) == 0 && s.path.size() > 5 &&
        s.path.compare(s.path.size() - 5, 5, ".tsar") == 0) {
      out.push_back(s.bytes);
    }
  }
  return out;
}

// The rows of a MANIFEST.tsv (file, code, offset, message, description),
// after checking its header line and that every row has five columns.
std::vector<std::vector<std::string>> ManifestRows(const std::string& path) {
  std::istringstream lines(ReadFile(path));
  std::string line;
  std::getline(lines, line);
  EXPECT_EQ(line, "file\tcode\toffset\tmessage\tdescription") << path;
  std::vector<std::vector<std::string>> rows;
  while (std::getline(lines, line)) {
    std::vector<std::string> cols;
    std::istringstream in(line);
    for (std::string col; std::getline(in, col, '\t');) cols.push_back(col);
    EXPECT_EQ(cols.size(), 5u) << line;
    cols.resize(5);
    rows.push_back(std::move(cols));
  }
  return rows;
}

TEST(Samples, GeneratorReproducesTheCommittedFiles) {
  ASSERT_GT(Samples().size(), 20u);
  for (const auto& s : Samples()) {
    const std::string committed = ReadFile(std::string(TSAR_SAMPLES_DIR) + "/" + s.path);
    EXPECT_TRUE(committed == s.bytes)
        << s.path << " differs from the generator's output; run tsar_gen_samples samples/";
    if (s.path.find(".tsar") != std::string::npos) EXPECT_LT(s.bytes.size(), 4096u) << s.path;
  }
}

TEST(Samples, ValidOnesDecodeToTheirExpectedJson) {
  int checked = 0;
  for (const auto& s : Samples()) {
    if (s.path.find(".expected.json") == std::string::npos) continue;
    const std::string tsar_path = s.path.substr(0, s.path.size() - 14) + ".tsar";
    const std::string bytes = ReadFile(std::string(TSAR_SAMPLES_DIR) + "/" + tsar_path);
    const auto j = nlohmann::json::parse(s.bytes);
    const format::Index idx = ParseString(bytes, tsar_path);
    ASSERT_EQ(j["file_size"], bytes.size());
    ASSERT_EQ(j["tensors"].size(), idx.tensors().size()) << tsar_path;
    for (size_t i = 0; i < idx.tensors().size(); ++i) {
      const auto& t = idx.tensors()[i];
      const auto& e = j["tensors"][i];
      EXPECT_EQ(e["name"], std::string(t.name));
      EXPECT_EQ(e["entry"], std::string(idx.entries()[t.entry].name));
      EXPECT_EQ(e["dtype"], std::string(DTypeName(t.dtype)));
      EXPECT_EQ(e["storage"], t.storage);
      EXPECT_EQ(e["storage_offset"], t.storage_offset);
      EXPECT_EQ(e["requires_grad"], t.requires_grad);
      static const char* const kRoles[] = {"tensor", "parameter", "buffer", "sparse_component"};
      EXPECT_EQ(e["role"], kRoles[static_cast<int>(t.role)]) << tsar_path << " tensor #" << i;
      ASSERT_EQ(e["shape"].size(), t.ndim);
      for (uint32_t d = 0; d < t.ndim; ++d) {
        EXPECT_EQ(e["shape"][d], idx.sizes(t)[d]);
        EXPECT_EQ(e["strides"][d], idx.strides(t)[d]);
      }
    }
    ASSERT_EQ(j["storages"].size(), idx.storages().size());
    for (size_t i = 0; i < idx.storages().size(); ++i) {
      const auto& st = idx.storages()[i];
      const auto& e = j["storages"][i];
      EXPECT_EQ(e["nbytes"], st.nbytes);
      char hex[24];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(st.xxh3));
      EXPECT_EQ(e["xxh3"], hex);
      if (i >= idx.own_storage_count()) {  // §4.11: its bytes are in the base
        EXPECT_EQ(e["base_storage"], st.base_storage) << tsar_path << " storage #" << i;
        continue;
      }
      EXPECT_EQ(e["offset"], st.offset);
      EXPECT_EQ(format::Xxh3(bytes.data() + st.offset, st.nbytes), st.xxh3) << tsar_path;
    }
    EXPECT_EQ(j.contains("layer"), idx.is_layer()) << tsar_path;
    if (idx.is_layer()) {
      const format::LayerRecord& l = idx.layer();
      char id[40];
      std::snprintf(id, sizeof id, "%016llx%016llx",
                    static_cast<unsigned long long>(l.base_id_high),
                    static_cast<unsigned long long>(l.base_id_low));
      EXPECT_EQ(j["layer"]["base_id"], id);
      EXPECT_EQ(j["layer"]["base_path"], std::string(l.base_path));
      EXPECT_EQ(j["layer"]["base_file_size"], l.base_file_size);
      EXPECT_EQ(j["layer"]["base_storage_count"], l.base_storage_count);
      EXPECT_EQ(j["layer"]["depth"], l.depth);
    }
    // Every metadata record, in file order (§4.7).
    ASSERT_EQ(j["metadata"].size(), idx.metadata().size()) << tsar_path;
    static const char* const kTypes[] = {"", "string", "int", "float", "bytes"};
    for (size_t i = 0; i < idx.metadata().size(); ++i) {
      const format::MetadataRecord& m = idx.metadata()[i];
      const auto& e = j["metadata"][i];
      if (m.entry == format::kNone) {
        EXPECT_TRUE(e["entry"].is_null()) << tsar_path << " metadata #" << i;
      } else {
        EXPECT_EQ(e["entry"], m.entry) << tsar_path << " metadata #" << i;
      }
      EXPECT_EQ(e["key"], std::string(m.key)) << tsar_path << " metadata #" << i;
      EXPECT_EQ(e["type"], kTypes[static_cast<int>(m.type)]) << tsar_path << " metadata #" << i;
      switch (m.type) {
        case format::MetaType::kInt:
          EXPECT_EQ(e["value"], m.int_value) << tsar_path << " metadata #" << i;
          break;
        case format::MetaType::kFloat:
          EXPECT_EQ(e["value"].get<double>(), m.float_value) << tsar_path << " metadata #" << i;
          break;
        case format::MetaType::kString:
          EXPECT_EQ(e["value"], std::string(m.bytes)) << tsar_path << " metadata #" << i;
          break;
        case format::MetaType::kBytes: {
          std::string hex;
          char buf[4];
          for (unsigned char c : m.bytes) {
            std::snprintf(buf, sizeof buf, "%02x", c);
            hex += buf;
          }
          EXPECT_EQ(e["value"], hex) << tsar_path << " metadata #" << i;
          break;
        }
      }
    }
    // §4.7.1: the attached files, by the key grammar, as expected.json lists them.
    nlohmann::json files = nlohmann::json::object();
    for (const format::MetadataRecord& m : idx.metadata()) {
      const std::string_view name = format::AttachedFileName(m.key);
      if (m.entry != format::kNone || m.type != format::MetaType::kBytes || name.empty()) continue;
      std::string hex;
      for (const unsigned char c : std::string(m.bytes)) {
        static const char kHex[] = "0123456789abcdef";
        hex += kHex[c >> 4];
        hex += kHex[c & 15];
      }
      files[std::string(name)] = hex;
    }
    EXPECT_EQ(nlohmann::json(j.value("files", nlohmann::json::object())), files) << tsar_path;
    // Every sparse record (§4.6).
    ASSERT_EQ(j["sparse"].size(), idx.sparse().size()) << tsar_path;
    static const char* const kLayouts[] = {"", "coo", "csr", "csc", "group"};
    for (size_t i = 0; i < idx.sparse().size(); ++i) {
      const format::SparseRecord& sp = idx.sparse()[i];
      const auto& e = j["sparse"][i];
      EXPECT_EQ(e["entry"], sp.entry) << tsar_path << " sparse #" << i;
      EXPECT_EQ(e["name"], std::string(sp.name)) << tsar_path << " sparse #" << i;
      EXPECT_EQ(e["layout"], kLayouts[static_cast<int>(sp.layout)]) << tsar_path;
      EXPECT_EQ(e["coalesced"], sp.coalesced) << tsar_path << " sparse #" << i;
      ASSERT_EQ(e["shape"].size(), sp.ndim) << tsar_path << " sparse #" << i;
      for (uint32_t d = 0; d < sp.ndim; ++d) {
        EXPECT_EQ(e["shape"][d], idx.dims()[sp.dims_index + d]) << tsar_path;
      }
      EXPECT_EQ(e["first_component"], sp.first_component) << tsar_path << " sparse #" << i;
      EXPECT_EQ(e["component_count"], sp.component_count) << tsar_path << " sparse #" << i;
      if (idx.IsGroup(static_cast<uint32_t>(i))) {  // §4.13: outer dtype and strides
        EXPECT_EQ(e["dtype"], DTypeName(sp.dtype)) << tsar_path << " sparse #" << i;
        ASSERT_EQ(e["strides"].size(), sp.ndim) << tsar_path << " sparse #" << i;
        for (uint32_t d = 0; d < sp.ndim; ++d) {
          EXPECT_EQ(e["strides"][d], idx.dims()[sp.dims_index + sp.ndim + d]) << tsar_path;
        }
        EXPECT_FALSE(idx.GroupDescription(static_cast<uint32_t>(i)).empty()) << tsar_path;
      } else {
        EXPECT_FALSE(e.contains("dtype") || e.contains("strides")) << tsar_path;
      }
    }
    // The value tree (§4.10, format 1.1): every value record and link.
    EXPECT_EQ(j["format_version"], "1." + std::to_string(idx.header().minor)) << tsar_path;
    EXPECT_EQ(j.value("tp_world", 0u), idx.tp_world()) << tsar_path;  // §4.12
    for (size_t i = 0; i < idx.tensors().size(); ++i) {
      const uint32_t d = idx.tensors()[i].shard_dim;
      EXPECT_EQ(j["tensors"][i].value("shard_dim", format::kNone), d) << tsar_path << " #" << i;
    }
    const bool groups = std::any_of(idx.sparse().begin(), idx.sparse().end(), [](const auto& s) {
      return s.layout == format::SparseLayout::kGroup;
    });
    EXPECT_EQ(idx.header().minor, std::max<int>(groups                 ? 5
                                                : idx.tp_world() != 0  ? 4
                                                : idx.is_layer()       ? 2
                                                : idx.values().empty() ? 0
                                                                       : 1,
                                                std::any_of(idx.tensors().begin(),
                                                            idx.tensors().end(),
                                                            [](const auto& t) {
                                                              return static_cast<int>(t.dtype) >=
                                                                     19;
                                                            })
                                                    ? 3
                                                    : 0))
        << tsar_path << ": not the lowest minor with its features and dtypes (§7.1)";
    ASSERT_EQ(j.value("values", nlohmann::json::array()).size(), idx.values().size()) << tsar_path;
    for (size_t i = 0; i < idx.values().size(); ++i) {
      const format::ValueRecord& v = idx.values()[i];
      const auto& e = j["values"][i];
      EXPECT_EQ(e["kind"], format::ValueKindName(v.kind)) << tsar_path << " value #" << i;
      EXPECT_EQ(e["flags"], v.flags) << tsar_path << " value #" << i;
      EXPECT_EQ(e["count"], v.count) << tsar_path << " value #" << i;
      EXPECT_EQ(e["first_link"], v.first_link) << tsar_path << " value #" << i;
      if (e.contains("bytes")) {
        EXPECT_EQ(e["value_length"], v.bytes.size()) << tsar_path << " value #" << i;
        EXPECT_EQ(e["bytes"], format::HexBytes(reinterpret_cast<const uint8_t*>(v.bytes.data()),
                                               v.bytes.size() > 16 ? 16 : v.bytes.size()));
      } else {
        EXPECT_EQ(e["value"], v.value) << tsar_path << " value #" << i;
      }
    }
    EXPECT_EQ(j.value("links", nlohmann::json::array()), nlohmann::json(idx.links())) << tsar_path;
    ++checked;
  }
  EXPECT_EQ(checked, 14);
}

// valid/layer.tsar opens over valid/shared.tsar (§4.11): its base storages
// are the base's bytes, and verification covers them.
TEST(Samples, TheLayerSampleOpensOverItsBase) {
  const ArchiveFile a = ArchiveFile::open(std::string(TSAR_SAMPLES_DIR) + "/valid/layer.tsar");
  const ArchiveFile base = ArchiveFile::open(std::string(TSAR_SAMPLES_DIR) + "/valid/shared.tsar");
  ASSERT_TRUE(a.is_layer());
  ASSERT_EQ(a.layers().size(), 2u);
  EXPECT_EQ(a.layers()[1], std::string(TSAR_SAMPLES_DIR) + "/valid/shared.tsar");
  const auto storages = a.storages();
  ASSERT_EQ(storages.size(), 3u);
  EXPECT_EQ(storages[0].layer, 0u);
  for (uint32_t i = 1; i < 3; ++i) {
    EXPECT_EQ(storages[i].layer, 1u);
    EXPECT_EQ(storages[i].layer_storage, i);
    EXPECT_EQ(std::memcmp(a.storage_data(i), base.storage_data(i), storages[i].nbytes), 0);
  }
  EXPECT_NO_THROW(a.verify());
  EXPECT_TRUE(a.damaged().empty());
}

// samples/layers/: each file decodes alone but is refused when opened with
// what its base path names, as layers/MANIFEST.tsv says (opened from
// samples/layers/, as the generator did).
TEST(Samples, LayersFailToResolveAsTheManifestSays) {
  const std::string dir = std::string(TSAR_SAMPLES_DIR) + "/layers";
  const auto rows = ManifestRows(dir + "/MANIFEST.tsv");
  const int cwd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(cwd, 0);
  ASSERT_EQ(chdir(dir.c_str()), 0);
  int checked = 0;
  for (const auto& cols : rows) {
    EXPECT_NO_THROW(ParseString(ReadFile(cols[0]), cols[0])) << cols[0] << " is valid alone";
    try {
      (void)ArchiveFile::open(cols[0]);
      ADD_FAILURE() << cols[0] << " opened";
    } catch (const Error& e) {
      EXPECT_EQ(ErrorCodeName(e.code()), cols[1]) << cols[0];
      EXPECT_EQ(e.offset() ? std::to_string(*e.offset()) : "", cols[2]) << cols[0];
      EXPECT_EQ(e.what(), cols[3]) << cols[0];
    }
    ++checked;
  }
  EXPECT_EQ(fchdir(cwd), 0);
  close(cwd);
  EXPECT_EQ(checked, 7);
}

TEST(Samples, InvalidOnesFailAsTheManifestSays) {
  int checked = 0;
  for (const auto& cols : ManifestRows(std::string(TSAR_SAMPLES_DIR) + "/invalid/MANIFEST.tsv")) {
    const std::string& file = cols[0];
    const std::string& code = cols[1];
    const std::string& offset = cols[2];
    const std::string& message = cols[3];
    EXPECT_FALSE(cols[4].empty()) << file << " has no description";
    const std::string bytes = ReadFile(std::string(TSAR_SAMPLES_DIR) + "/invalid/" + file);
    try {
      ParseString(bytes, file);
      ADD_FAILURE() << file << " parsed";
    } catch (const Error& e) {
      EXPECT_EQ(ErrorCodeName(e.code()), code) << file;
      EXPECT_EQ(std::to_string(e.offset().value_or(UINT64_MAX)), offset) << file;
      EXPECT_EQ(e.what(), message) << file;
    }
    ++checked;
  }
  EXPECT_GE(checked, 40);
}

TEST(Samples, EveryTruncationIsRejected) {
  for (const std::string& f : ValidArchives()) {
    for (size_t n = 0; n < f.size(); ++n) {
      try {
        ParseString(f.substr(0, n));
        ADD_FAILURE() << "a " << n << "-byte prefix of a " << f.size() << "-byte sample parsed";
      } catch (const Error& e) {
        EXPECT_TRUE(e.code() == ErrorCode::kTruncated || e.code() == ErrorCode::kBadMagic)
            << e.what();
      }
    }
  }
}

TEST(Samples, EveryHeaderAndIndexByteFlipIsRejected) {
  for (const std::string& f : ValidArchives()) {
    const auto* p = reinterpret_cast<const uint8_t*>(f.data());
    const uint64_t data_offset = format::LoadU64(p + format::kOffDataOffset);
    for (uint64_t i = 0; i < data_offset; ++i) {
      for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
        std::string g = f;
        g[i] = static_cast<char>(g[i] ^ mask);
        EXPECT_THROW(ParseString(g), Error)
            << "flip 0x" << std::hex << int(mask) << " at " << std::dec << i;
      }
    }
  }
}

TEST(Samples, DataByteFlipsParseButChangeTheStorageChecksum) {
  for (const std::string& f : ValidArchives()) {
    const format::Index idx = ParseString(f);
    for (uint32_t k = 0; k < idx.own_storage_count(); ++k) {
      const auto& s = idx.storages()[k];
      for (uint64_t i = s.offset; i < s.offset + s.nbytes; ++i) {
        std::string g = f;
        g[i] = static_cast<char>(g[i] ^ 0x10);
        const format::Index again = ParseString(g);
        EXPECT_NE(format::Xxh3(g.data() + s.offset, s.nbytes), s.xxh3);
      }
    }
  }
}

}  // namespace
}  // namespace tsar::testing
