// loader/cuda_host.h.
#include "loader/cuda_host.h"

#include <dlfcn.h>

#include <mutex>

namespace tsar {
namespace {

// cudaHostRegisterPortable | cudaHostRegisterReadOnly (cuda_runtime_api.h).
constexpr unsigned kPortable = 1;
constexpr unsigned kReadOnly = 8;

// The CUDA runtime already loaded into the process, newest first; never
// loads one (RTLD_NOLOAD): a runtime other than torch's would be a second
// CUDA context.
void* LoadedRuntime() {
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                           "libcudart.so"}) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) return h;
  }
  // A runtime linked into a library the process loaded, exporting its API.
  return dlsym(RTLD_DEFAULT, "cudaHostRegister") != nullptr ? RTLD_DEFAULT : nullptr;
}

}  // namespace

const CudaHost* CudaHost::Find() {
  // Found once; not found is asked again (the runtime may load later).
  static std::mutex mu;
  static const CudaHost* found = nullptr;
  const std::lock_guard<std::mutex> lock(mu);
  if (found == nullptr) found = [] () -> const CudaHost* {
    void* h = LoadedRuntime();
    if (h == nullptr) return nullptr;
    auto* c = new CudaHost;  // lives as long as the process, as the runtime does
    c->register_ = reinterpret_cast<RegisterFn>(dlsym(h, "cudaHostRegister"));
    c->unregister_ = reinterpret_cast<UnregisterFn>(dlsym(h, "cudaHostUnregister"));
    c->last_error_ = reinterpret_cast<LastErrorFn>(dlsym(h, "cudaGetLastError"));
    c->error_string_ = reinterpret_cast<ErrorStringFn>(dlsym(h, "cudaGetErrorString"));
    if (!c->register_ || !c->unregister_ || !c->last_error_ || !c->error_string_) {
      delete c;
      return nullptr;
    }
    return c;
  }();
  return found;
}

bool CudaHost::Register(const void* p, uint64_t n, std::string* error) const {
  const int err = register_(const_cast<void*>(p), static_cast<size_t>(n), kPortable | kReadOnly);
  if (err == 0) return true;
  last_error_();
  if (error != nullptr) {
    *error = "cudaHostRegister: CUDA error " + std::to_string(err) + " (" + error_string_(err) + ")";
  }
  return false;
}

void CudaHost::Unregister(const void* p) const {
  if (unregister_(const_cast<void*>(p)) != 0) last_error_();
}

}  // namespace tsar
