// The SIGSEGV/SIGBUS diagnostic (Python's load_into installs it on its first
// read-only bind; C++ opts in): names the archive and tensor a fault hit
// before the process dies. Only async-signal-safe calls in the handler.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "loader/archive_core.h"

namespace tsar {
namespace {

constexpr int kSlots = 256;
std::atomic<const ArchiveCore*> g_slots[kSlots];
std::mutex g_mutex;  // serializes registration; the handler only reads
struct sigaction g_old_segv, g_old_bus;
std::atomic<bool> g_installed{false};
// Set by the first thread to fault. Several threads can fault at once (one
// write per intra-op thread): the first prints and ends the process, the rest
// wait for that, so the message is never cut short by a second thread taking
// the default action first (which SA_RESETHAND used to allow).
std::atomic<bool> g_reporting{false};

void Put(const char* s) {
  const size_t n = std::strlen(s);
  ssize_t unused = write(STDERR_FILENO, s, n);
  (void)unused;
}
void PutN(std::string_view s) {
  ssize_t unused = write(STDERR_FILENO, s.data(), s.size() > 200 ? 200 : s.size());
  (void)unused;
}
void PutU(uint64_t v) {
  char buf[24];
  int i = 23;
  buf[i] = '\0';
  do {
    buf[--i] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v && i > 0);
  Put(buf + i);
}

void Handler(int sig, siginfo_t* info, void* ctx) {
  if (g_reporting.exchange(true)) {
    for (;;) pause();  // the reporting thread ends the process
  }
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (auto& slot : g_slots) {
    const ArchiveCore* core = slot.load(std::memory_order_acquire);
    if (core == nullptr) continue;
    const auto base = reinterpret_cast<uintptr_t>(core->mapping->data());
    if (addr < base || addr - base >= core->mapping->size()) continue;
    const uint64_t off = addr - base;
    Put(sig == SIGBUS ? "tsar: SIGBUS reading archive " : "tsar: write to read-only archive ");
    Put(core->path.c_str());
    Put(" at file offset ");
    PutU(off);
    const auto& storages = core->index.storages();
    for (uint32_t i = 0; i < core->index.own_storage_count(); ++i) {
      if (off < storages[i].offset || off - storages[i].offset >= storages[i].nbytes) continue;
      Put(": storage #");
      PutU(i);
      for (const auto& t : core->index.tensors()) {
        if (t.storage != i) continue;
        Put(", tensor \"");
        PutN(t.name);
        Put("\"");
        break;
      }
      break;
    }
    Put(sig == SIGBUS ? " (was the file truncated while mapped?)\n"
                      : ". Its tensors are the file's pages, mapped read-only: an optimizer's "
                        "step, backward() into them or any in-place write faults. To train or "
                        "change weights, open the archive copy-on-write (Python: "
                        "tsar.open(path, mode=\"copy_on_write\"), then load_into(module, that "
                        "archive); C++ MapMode::kCopyOnWrite): writes stay private to the "
                        "process\n");
    break;
  }
  // Re-raise with the previous disposition so the process dies as it would have.
  struct sigaction* old = sig == SIGBUS ? &g_old_bus : &g_old_segv;
  if (old->sa_flags & SA_SIGINFO && old->sa_sigaction != nullptr) {
    old->sa_sigaction(sig, info, ctx);
    g_reporting.store(false);  // it returned: a later fault is reported afresh
    return;
  }
  if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN && old->sa_handler != nullptr) {
    old->sa_handler(sig);
    g_reporting.store(false);
    return;
  }
  // The default action, delivered when this handler returns (the signal is
  // blocked until then), ends the whole process, the waiting threads too.
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void RegisterMapping(const ArchiveCore* core) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& slot : g_slots) {
    if (slot.load() == nullptr) {
      slot.store(core, std::memory_order_release);
      return;
    }
  }
  // More than kSlots live archives: the diagnostic just does not name this one.
}

void UnregisterMapping(const ArchiveCore* core) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& slot : g_slots) {
    if (slot.load() == core) slot.store(nullptr, std::memory_order_release);
  }
}

void InstallFaultHandler() {
  if (g_installed.exchange(true)) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = &Handler;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_old_segv);
  sigaction(SIGBUS, &sa, &g_old_bus);
}

}  // namespace tsar
