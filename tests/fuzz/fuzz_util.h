// Shared by the LibTorch-linked fuzz harnesses (load, import, export): the
// input as a file, the index checksum fix-up, and reading every element.
#pragma once

#include <ATen/core/Tensor.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "index_fixup.h"

namespace tsar::fuzz {

// A guarantee does not hold: stop so that libFuzzer saves the input.
inline void Check(bool ok) {
  if (!ok) std::abort();
}

// The fuzzer's bytes as a regular file (memfd), named /proc/self/fd/N: the
// product's own open paths (stat, open, mmap) run unchanged.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("fuzz-input", MFD_CLOEXEC);
    Check(fd_ >= 0);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = write(fd_, data + done, size - done);
      Check(n > 0);
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Elements read by Touch at most; larger (expanded) views are read in part.
inline constexpr int64_t kTouchElements = int64_t{1} << 16;

// Reads every byte of a small tensor's elements (all of a dense one's
// contiguous copy; a sparse one's components), so ASan and the mapping's
// bounds see each access. Returns a sum that depends on them.
// The dense tensors a sparse one is made of (COO or CSR), or none.
inline std::vector<at::Tensor> Components(const at::Tensor& t) {
  if (t.layout() == at::kSparse) return {t._indices(), t._values()};
  if (t.layout() == at::kSparseCsr) return {t.crow_indices(), t.col_indices(), t.values()};
  return {};
}

inline uint64_t Touch(const at::Tensor& t) {
  if (!t.defined()) return 0;
  if (t.layout() != at::kStrided) {
    uint64_t sum = 0;
    for (const at::Tensor& c : Components(t)) sum += Touch(c);
    return sum;
  }
  if (t.numel() == 0 || t.numel() > kTouchElements) return static_cast<uint64_t>(t.numel());
  const at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  uint64_t sum = 0;
  for (size_t i = 0, n = c.numel() * c.element_size(); i < n; ++i) sum = sum * 31 + p[i];
  return sum;
}

// Bit-exact equality of two dense tensors' dtype, shape and elements.
inline bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  if (a.layout() != at::kStrided || b.layout() != at::kStrided) {
    if (a.layout() != b.layout() || a.sizes() != b.sizes()) return false;
    const auto x = Components(a), y = Components(b);
    for (size_t i = 0; i < x.size(); ++i) {
      if (!SameBits(x[i], y[i])) return false;
    }
    return true;
  }
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  const size_t n = x.numel() * x.element_size();
  return std::memcmp(x.data_ptr(), y.data_ptr(), n) == 0;
}

// A directory of this process for outputs, removed by nobody: libFuzzer runs
// in one process, and every output in it is replaced atomically.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string d =
        std::string(base && *base ? base : "/tmp") + "/tsar-fuzz-" + std::to_string(getpid());
    mkdir(d.c_str(), 0700);
    return d;
  }();
  return dir;
}

}  // namespace tsar::fuzz
