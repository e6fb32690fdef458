// The platform layer of the loader: a file's bytes in memory, by mmap (shared
// or copy-on-write) or by pread into private memory, freed by RAII.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "tsar/archive_file.h"

namespace tsar {

class Mapping {
 public:
  // Maps the whole file open as `fd`, whose fstat the caller has (`st`: its
  // size, device and inode). Throws kIo; for kShared and kCopyOnWrite,
  // *refused is set (and nothing thrown) when the kernel refuses mmap itself,
  // so the caller can fall back to kRead.
  static std::unique_ptr<Mapping> Create(int fd, const struct stat& st, MapMode mode,
                                         Prefetch prefetch, const std::string& path,
                                         bool* refused);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  MapMode mode() const { return mode_; }
  // Whether the memory shows the file itself, as it is on disk: a kShared
  // mmap (kRead memory is a copy; a kCopyOnWrite mapping may hold the
  // process's writes). Then reading the file (device `dev`, inode `ino`)
  // gives the same bytes without faulting the mapping in
  // (loader/file_regions.h). No descriptor is kept: a server's archives hold
  // none open.
  bool shows_file() const { return shows_file_; }
  dev_t dev() const { return dev_; }
  ino_t ino() const { return ino_; }

 private:
  Mapping() = default;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  MapMode mode_ = MapMode::kShared;
  bool is_mmap_ = false;
  bool locked_ = false;
  bool shows_file_ = false;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace tsar
