// MappedInput and MakeView (writer/importer.h): the zero-copy base of every importer.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "format/extent.h"
#include "loader/open_file.h"
#include "writer/importer.h"

namespace tsar::importer {

// The live mappings, for the SIGBUS handler: a slot per MappedInput, found by
// a scan (a fault is rare; registering is O(1) amortized). More inputs than
// slots (above vm.max_map_count's default of 65530) go unregistered: a
// truncation of one of them still ends the process with SIGBUS.
struct MappedInputRegistry {
  // What the handler reads is here, never in a MappedInput (which another
  // thread may be destroying).
  struct Slot {
    std::atomic<uintptr_t> base;
    std::atomic<uint64_t> size;
    std::atomic<int> truncated;             // set by the handler
    std::atomic<const MappedInput*> input;  // read under `mutex` only
  };
  static constexpr size_t kSlots = size_t{1} << 17;
  static Slot* slots;                        // kSlots, made at the first Open
  static std::atomic<size_t> high;           // slots [0, high) may be in use
  static std::atomic<uint64_t> truncations;  // faults caught, ever
  static size_t hint;                        // where to look for a free slot
  static std::mutex mutex;                   // registration; the handler only reads
  static struct sigaction old_bus;
  static uintptr_t page;

  static long Tid() { return static_cast<long>(syscall(SYS_gettid)); }

  static void Handler(int sig, siginfo_t* info, void* ctx) {
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    Slot* table = slots;
    if (info->si_code == BUS_ADRERR && table != nullptr) {
      const size_t n = high.load(std::memory_order_acquire);
      for (size_t i = 0; i < n; ++i) {
        const uintptr_t base = table[i].base.load(std::memory_order_acquire);
        const uint64_t size = table[i].size.load(std::memory_order_acquire);
        if (base == 0 || addr < base || addr - base >= size) continue;
        // The file ended before this page: zeros from here to the end of the
        // mapping (one fault, not one per page), and the input is marked.
        const uintptr_t from = addr & ~(page - 1);
        const uintptr_t end = (base + size + page - 1) & ~(page - 1);
        void* p = mmap(reinterpret_cast<void*>(from), end - from, PROT_READ,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p == MAP_FAILED) break;  // as if never caught
        table[i].truncated.store(1, std::memory_order_release);
        truncations.fetch_add(1, std::memory_order_acq_rel);
        return;  // the read is retried, and finds zeros
      }
    }
    // Not ours: what the handler before it would have done.
    if ((old_bus.sa_flags & SA_SIGINFO) && old_bus.sa_sigaction != nullptr) {
      old_bus.sa_sigaction(sig, info, ctx);
      return;
    }
    if (old_bus.sa_handler != SIG_DFL && old_bus.sa_handler != SIG_IGN &&
        old_bus.sa_handler != nullptr) {
      old_bus.sa_handler(sig);
      return;
    }
    // The default action: the faulting read runs again and ends the process.
    signal(sig, SIG_DFL);
    if (info->si_code <= 0) raise(sig);  // sent, not a fault: nothing runs again
  }

  static void Register(MappedInput* m) {
    std::lock_guard<std::mutex> lock(mutex);
    if (slots == nullptr) {
      // calloc: zero pages, touched only up to `high`.
      auto* table = static_cast<Slot*>(std::calloc(kSlots, sizeof(Slot)));
      if (table == nullptr) return;
      page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
      slots = table;
      struct sigaction sa;
      std::memset(&sa, 0, sizeof sa);
      sa.sa_sigaction = &Handler;
      sa.sa_flags = SA_SIGINFO;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGBUS, &sa, &old_bus);
    }
    for (size_t tries = 0; tries < kSlots; ++tries, hint = (hint + 1) % kSlots) {
      Slot& s = slots[hint];
      if (s.input.load(std::memory_order_relaxed) != nullptr) continue;
      m->slot_ = hint;
      m->owner_ = Tid();
      s.input.store(m, std::memory_order_relaxed);
      s.truncated.store(0, std::memory_order_relaxed);
      s.size.store(m->size_, std::memory_order_relaxed);
      s.base.store(reinterpret_cast<uintptr_t>(m->data_), std::memory_order_release);
      if (hint + 1 > high.load(std::memory_order_relaxed))
        high.store(hint + 1, std::memory_order_release);
      hint = (hint + 1) % kSlots;
      return;
    }
  }

  static void Unregister(const MappedInput* m) {
    if (m->slot_ == SIZE_MAX) return;
    std::lock_guard<std::mutex> lock(mutex);
    Slot& s = slots[m->slot_];
    s.base.store(0, std::memory_order_release);
    s.input.store(nullptr, std::memory_order_release);
  }

  static void Check(bool check_sizes) {
    if (!check_sizes && truncations.load(std::memory_order_acquire) == 0) return;
    std::lock_guard<std::mutex> lock(mutex);
    if (slots == nullptr) return;
    const long self = Tid();
    const size_t n = high.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i) {
      const MappedInput* m = slots[i].input.load(std::memory_order_acquire);
      if (m == nullptr || m->owner_ != self) continue;
      struct stat st;
      const bool shorter = check_sizes && stat(m->path_.c_str(), &st) == 0 &&
                           static_cast<uint64_t>(st.st_size) < m->size_;
      if (!slots[i].truncated.load(std::memory_order_acquire) && !shorter) continue;
      throw Error(ErrorCode::kBadInput, m->path_, std::nullopt,
                  "changed while being read: the file is shorter than the " +
                      std::to_string(m->size_) +
                      " bytes it had when opened (truncated or rewritten in place while tsar "
                      "read it), or its pages could not be read; nothing was written");
    }
  }
};

MappedInputRegistry::Slot* MappedInputRegistry::slots = nullptr;
std::atomic<size_t> MappedInputRegistry::high{0};
std::atomic<uint64_t> MappedInputRegistry::truncations{0};
size_t MappedInputRegistry::hint = 0;
std::mutex MappedInputRegistry::mutex;
struct sigaction MappedInputRegistry::old_bus;
uintptr_t MappedInputRegistry::page = 4096;

void CheckInputsUnchanged(bool check_sizes) { MappedInputRegistry::Check(check_sizes); }

std::shared_ptr<const MappedInput> MappedInput::Open(const std::string& path) {
  struct stat st;
  const int fd = OpenRegularFile(path, &st, ErrorCode::kBadInput);
  return Open(fd, static_cast<uint64_t>(st.st_size), path);
}

std::shared_ptr<const MappedInput> MappedInput::Open(int fd, uint64_t size,
                                                     const std::string& path) {
  std::shared_ptr<MappedInput> m;
  try {
    m.reset(new MappedInput());
    m->path_ = path;
  } catch (...) {
    close(fd);
    throw;
  }
  m->size_ = size;
  if (m->size_ > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(m->size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      close(fd);
      throw Error(ErrorCode::kIo, path, std::nullopt,
                  std::string("cannot mmap: ") + std::strerror(err));
    }
    m->data_ = static_cast<const uint8_t*>(p);
    MappedInputRegistry::Register(m.get());
  }
  close(fd);
  return m;
}

MappedInput::~MappedInput() {
  MappedInputRegistry::Unregister(this);
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

std::shared_ptr<const writer::Storage> MappedInput::Storage(
    const std::shared_ptr<const MappedInput>& self, uint64_t offset, uint64_t nbytes) {
  auto s = std::make_shared<writer::Storage>();
  s->data = self->data_ + offset;
  s->nbytes = nbytes;
  s->keep = self;
  return s;
}

writer::TensorRef MakeView(std::shared_ptr<const writer::Storage> storage, DType dtype,
                           const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                           uint64_t storage_offset, const std::string& what,
                           const std::string& path) {
  // The spec's view rules (R48-R52, R78): past them LibTorch could not build
  // the tensor ("numel: integer multiplication overflow", even for an empty
  // one). Refuse first, naming the input.
  const auto ndim = static_cast<uint32_t>(sizes.size());
  const uint64_t esize = ElementSize(dtype);
  const format::ViewExtent v =
      format::ComputeViewExtent(sizes.data(), strides.data(), ndim, storage_offset, esize);
  if (v.fault != format::ViewExtent::Fault::kNone) {
    const format::ViewFaultText text =
        format::DescribeViewFault(v, sizes.data(), strides.data(), storage_offset, esize);
    throw Error(ErrorCode::kBadInput, path, std::nullopt,
                what + ": " + text.field + ": expected " + text.expected + ", found " + text.found);
  }
  writer::TensorRef t;
  t.storage = std::move(storage);
  t.dtype = dtype;
  t.sizes = sizes;
  t.strides = strides;
  t.storage_offset = storage_offset;
  return t;
}

}  // namespace tsar::importer
