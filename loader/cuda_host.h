// Page-locking host memory for the GPU's copy engine (issue 44): the CUDA
// runtime's cudaHostRegister and cudaHostUnregister, found at run time in the
// runtime the process has already loaded (torch's: libcudart.so.13, .12...),
// so tsar links no CUDA and builds without the toolkit.
#pragma once

#include <cstdint>
#include <string>

namespace tsar {

class CudaHost {
 public:
  // The runtime the process has loaded, or nullptr where none is (a CPU-only
  // torch, or CUDA not initialized yet: call after the device is in use).
  static const CudaHost* Find();

  // Locks [p, p + n) in place for every device, read-only (the GPU reads it;
  // a read-only file mapping stays the page cache's, shared between
  // processes). On failure nothing is locked, the runtime's last error is
  // cleared (torch checks it after its own calls), and `error` says what.
  bool Register(const void* p, uint64_t n, std::string* error = nullptr) const;
  void Unregister(const void* p) const;

 private:
  using RegisterFn = int (*)(void*, size_t, unsigned);
  using UnregisterFn = int (*)(void*);
  using LastErrorFn = int (*)();
  using ErrorStringFn = const char* (*)(int);
  RegisterFn register_ = nullptr;
  UnregisterFn unregister_ = nullptr;
  LastErrorFn last_error_ = nullptr;
  ErrorStringFn error_string_ = nullptr;
};

}  // namespace tsar
