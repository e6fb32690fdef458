// P7: Archive::verify() (XXH3-64 of every storage) over a warm 512 MiB archive
// against memcpy of the same mapped bytes into a pre-faulted buffer.
#include <cstdlib>
#include <cstring>

#include "bench/benchmarks.h"
#include "tsar/archive.h"

namespace tsar::bench {

void RunP7Verify(const Context& ctx) {
  const std::string kase = "512 MiB, warm";
  OpenOptions options;
  options.prefetch = Prefetch::kPopulate;
  const Archive a = Archive::open(ctx.Path("stack.tsar"), options);
  uint64_t bytes = 0;
  for (const auto& s : a.storages()) bytes += s.nbytes;
  const size_t n = static_cast<size_t>(a.mapped_size());
  void* buf = std::malloc(n);
  if (!buf) Die("cannot allocate the memcpy buffer");
  std::memset(buf, 1, n);  // pre-fault: first touch is slow in this VM
  for (int r = -1; r < ctx.Runs(9); ++r) {
    {
      Stopwatch sw;
      a.verify();
      if (r >= 0)
        ctx.rec->Add("P7", kase, "tsar verify (XXH3-64)", "GB/s", r, bytes / sw.Seconds() / kGB);
    }
    Stopwatch sw;
    std::memcpy(buf, a.data(), n);
    asm volatile("" : : "r"(buf) : "memory");
    if (r >= 0)
      ctx.rec->Add("P7", kase, "memcpy (pre-faulted destination)", "GB/s", r,
                   n / sw.Seconds() / kGB);
  }
  std::free(buf);
}

}  // namespace tsar::bench
