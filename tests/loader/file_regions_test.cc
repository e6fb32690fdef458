// FileRegions (loader/file_regions.h): the staging fill reads an archive's
// bytes from its file exactly where a shared mapping shows them, leaves
// everything else (copy-on-write and read archives, memory outside the
// mappings) to a copy from memory, and reports a file cut short since it was
// opened with its path and offset.
#include "loader/file_regions.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "loader/archive_core.h"
#include "tests/test_env.h"
#include "tsar/archive_file.h"
#include "tsar/error.h"

namespace tsar {
namespace {

std::string Sample(const char* name) {
  return std::string(TSAR_SAMPLES_DIR) + "/valid/" + name;
}

// Every storage of a layer and of its base (two files, two mappings) is read
// from its own file, and the bytes are those the mapping shows.
TEST(FileRegions, ReadsWhatEachSharedMappingOfALayerChainShows) {
  const ArchiveFile layer = ArchiveFile::open(Sample("layer.tsar"));
  const ArchiveCore& core = *layer.core();
  ASSERT_NE(core.base, nullptr) << "layer.tsar is a layer over shared.tsar";
  const FileRegions files(core);
  ASSERT_FALSE(files.empty());
  int from_base = 0, read = 0;
  for (uint32_t i = 0; i < core.index.storages().size(); ++i) {
    const uint64_t n = core.index.storages()[i].nbytes;
    if (n == 0) continue;
    const uint8_t* shown = core.StorageData(i);
    std::vector<uint8_t> got(n, 0xEE);
    ASSERT_TRUE(files.Read(got.data(), shown, n)) << "storage " << i;
    EXPECT_EQ(std::memcmp(got.data(), shown, n), 0) << "storage " << i;
    ++read;
    from_base += core.sources[i].layer > 0;
  }
  EXPECT_GT(read, 0);
  EXPECT_GT(from_base, 0) << "some storages lie in the base's file";
}

// A copy-on-write mapping may hold this process's writes and kRead memory
// is a private copy: neither is read from the file.
TEST(FileRegions, CopyOnWriteAndReadArchivesAreCopiedFromMemory) {
  for (MapMode mode : {MapMode::kCopyOnWrite, MapMode::kRead}) {
    OpenOptions o;
    o.mode = mode;
    const ArchiveFile a = ArchiveFile::open(Sample("shared.tsar"), o);
    const FileRegions files(*a.core());
    EXPECT_TRUE(files.empty()) << static_cast<int>(mode);
    uint8_t byte = 0;
    EXPECT_FALSE(files.Read(&byte, a.core()->StorageData(0), 1));
  }
}

// Memory outside every mapping, and a range that runs past a mapping's end,
// are the caller's to copy; nothing is read into dst.
TEST(FileRegions, ARangeOutsideOrPastAMappingIsLeftToTheCaller) {
  const ArchiveFile a = ArchiveFile::open(Sample("shared.tsar"));
  const FileRegions files(*a.core());
  const Mapping& m = *a.core()->mapping;
  std::vector<uint8_t> elsewhere(64, 1), dst(64, 0xEE);
  EXPECT_FALSE(files.Read(dst.data(), elsewhere.data(), elsewhere.size()));
  EXPECT_FALSE(files.Read(dst.data(), m.data() + m.size() - 8, 16));
  EXPECT_EQ(dst, std::vector<uint8_t>(64, 0xEE));
  ASSERT_TRUE(files.Read(dst.data(), m.data() + m.size() - 8, 8)) << "the last bytes are inside";
  EXPECT_EQ(std::memcmp(dst.data(), m.data() + m.size() - 8, 8), 0);
}

// A hot swap renames another file over the archive's path, or the file is
// deleted: the path no longer names the file mapped, so the mapping (the
// old file's bytes) is copied instead. The open archive itself holds no
// descriptor of the file.
TEST(FileRegions, APathThatNamesAnotherFileNowIsNotRead) {
  char dir[] = "/tmp/tsar-file-regions-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/a.tsar", next = std::string(dir) + "/b.tsar";
  std::filesystem::copy_file(Sample("shared.tsar"), path);
  std::filesystem::copy_file(Sample("shared.tsar"), next);
  {
    const ArchiveFile a = ArchiveFile::open(path);
    int held = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      held += std::filesystem::read_symlink(e.path(), ec).string() == path;
    }
    EXPECT_EQ(held, 0) << "an open archive keeps no descriptor";
    EXPECT_FALSE(FileRegions(*a.core()).empty()) << "the path names the mapped file";
    std::filesystem::rename(next, path);
    EXPECT_TRUE(FileRegions(*a.core()).empty()) << "another file renamed over it";
    std::filesystem::remove(path);
    EXPECT_TRUE(FileRegions(*a.core()).empty()) << "deleted";
  }
  std::filesystem::remove_all(dir);
}

// A file truncated after it was opened: the read says which file, where it
// now ends and that it was truncated (the mapping would be a SIGBUS there).
TEST(FileRegions, AFileTruncatedSinceItWasOpenedIsAnErrorNamingItAndTheOffset) {
  char dir[] = "/tmp/tsar-file-regions-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/a.tsar";
  std::filesystem::copy_file(Sample("shared.tsar"), path);
  {
    const ArchiveFile a = ArchiveFile::open(path);
    const FileRegions files(*a.core());
    const Mapping& m = *a.core()->mapping;
    const uint64_t keep = m.size() / 2;
    ASSERT_GT(m.size(), keep + 100);
    ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(keep)), 0);
    std::vector<uint8_t> dst(100);
    try {
      files.Read(dst.data(), m.data() + m.size() - 100, 100);
      ADD_FAILURE() << "a read past the file's new end";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kTruncated);
      EXPECT_EQ(e.path(), path);
      EXPECT_EQ(e.offset(), m.size() - 100);
      EXPECT_NE(std::string(e.what()).find("truncated since it was opened"), std::string::npos)
          << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tsar
