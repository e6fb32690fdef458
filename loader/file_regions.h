// Reading an archive's bytes from its file instead of its mapping: the
// staging pipeline's fill (loader/device_pipeline.h) on the way to a GPU.
//
// Copying out of a fresh mapping faults every page in (measured on a 16-core
// H100 host: staging 30-35 GB/s from a fresh mapping, 46.5 from one already
// faulted in; pread of the page cache into pinned memory 46.3 GB/s on 16
// threads, TOOLCHAIN.md). pread copies the same page-cache pages with no
// page-table work, and on a cold cache each fill thread's read is one request
// the kernel reads ahead for, where a fault reads one read-ahead window.
// Only a shared (read-only) mapping qualifies: it shows the file's bytes. A
// copy-on-write mapping may hold the process's writes, and kRead memory is a
// private copy; their bytes are copied from memory. The files are opened
// again by path for the life of a FileRegions (one copy to a device), and
// used only where the path still names the file mapped (same device and
// inode: a hot swap renames another file over it); an open archive keeps no
// descriptor.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tsar {

struct ArchiveCore;

class FileRegions {
 public:
  // The shared mappings of `core` and of its bases (a layer's chain) whose
  // paths still name the files mapped, each file opened read-only here.
  explicit FileRegions(const ArchiveCore& core);
  FileRegions() = default;
  ~FileRegions();
  FileRegions(const FileRegions&) = delete;
  FileRegions& operator=(const FileRegions&) = delete;
  // One region by hand (tests): [data, data + size) shows bytes [0, size) of
  // the file open as `fd` (the caller's, left open), named `path` in errors.
  void Add(const uint8_t* data, uint64_t size, int fd, std::string path);

  // Reads the n bytes that [src, src + n) shows into dst, from the file, and
  // returns true; false (nothing read) where the range is not inside one
  // region: the caller copies it from memory. Throws kIo on a read error and
  // kTruncated where the file now ends before the range does, naming the
  // file and the offset.
  bool Read(void* dst, const uint8_t* src, uint64_t n) const;

  bool empty() const { return regions_.empty(); }

 private:
  struct Region {
    const uint8_t* data;
    uint64_t size;
    int fd;
    std::string path;
    bool owned;  // opened by the constructor, closed by the destructor
  };
  std::vector<Region> regions_;  // few: one per file of a layer chain
};

// The staging lane's fill of a copy to a device (RunPipeline's `fill`), as
// both to_device's run it (loader/device.cc, python/src/portable_device.cc):
// the archive's file where its shared mapping shows the bytes (the files
// opened only when `from_file` asks for it), memory elsewhere.
class StagingFill {
 public:
  StagingFill(const ArchiveCore& core, bool from_file) {
    if (from_file) files_.emplace(core);
  }
  // RunPipeline's fill; empty (its memcpy) where no file is read.
  std::function<void(void*, const uint8_t*, uint64_t)> function() {
    if (!files_ || files_->empty()) return {};
    return [this](void* dst, const uint8_t* src, uint64_t n) {
      if (files_->Read(dst, src, n)) {
        from_file_.fetch_add(n, std::memory_order_relaxed);
      } else {
        std::memcpy(dst, src, n);
      }
    };
  }
  // Of the bytes filled, those read from the file.
  uint64_t bytes_from_file() const { return from_file_.load(); }

 private:
  std::optional<FileRegions> files_;
  std::atomic<uint64_t> from_file_{0};
};

}  // namespace tsar
