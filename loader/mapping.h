// The platform layer of the loader: a file's bytes in memory, by mmap (shared
// or copy-on-write) or by pread into private memory, freed by RAII.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tsar/archive_file.h"

namespace tsar {

class Mapping {
 public:
  // Maps [0, size) of the open descriptor `fd`. Throws kIo; for kShared and
  // kCopyOnWrite, *refused is set (and nothing thrown) when the kernel
  // refuses mmap itself, so the caller can fall back to kRead.
  static std::unique_ptr<Mapping> Create(int fd, uint64_t size, MapMode mode, Prefetch prefetch,
                                         const std::string& path, bool* refused);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  MapMode mode() const { return mode_; }

 private:
  Mapping() = default;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  MapMode mode_ = MapMode::kShared;
  bool is_mmap_ = false;
  bool locked_ = false;
};

}  // namespace tsar
