// P4: cold load. The archive is evicted from the page cache before every run,
// then opened with each prefetch mode and every byte is read; the peer is
// `cat FILE > /dev/null` (the disk's sequential read bandwidth).
#include <string>

#include "bench/benchmarks.h"
#include "tsar/archive.h"

namespace tsar::bench {

void RunP4Cold(const Context& ctx) {
  const std::string path = ctx.Path("stack.tsar");
  const double size = static_cast<double>(FileSize(path));
  const std::string kase = "512 MiB, cold";
  struct Variant {
    const char* label;
    bool cat;
    Prefetch prefetch;
  };
  const Variant variants[] = {
      {"cat FILE > /dev/null", true, Prefetch::kNone},
      {"tsar prefetch=none", false, Prefetch::kNone},
      {"tsar prefetch=willneed", false, Prefetch::kWillNeed},
      {"tsar prefetch=populate", false, Prefetch::kPopulate},
  };
  uint64_t not_evicted = 0, not_read = 0, sink = 0;
  const uint64_t pages = PageCount(path);
  // Round -1 is a warm-up (the VM's disk may cache on the host side too).
  for (int r = -1; r < ctx.Runs(5); ++r) {
    for (const Variant& v : variants) {
      not_evicted += EvictFile(path);
      Stopwatch sw;
      if (v.cat) {
        if (RunCommand({"cat", path}) != 0) Die("cat " + path + " failed");
      } else {
        OpenOptions options;
        options.prefetch = v.prefetch;
        const Archive a = Archive::open(path, options);
        sink += TouchEveryByte(a.data(), a.mapped_size());
      }
      const double secs = sw.Seconds();
      not_read += pages - ResidentPages(path);
      if (r >= 0) ctx.rec->Add("P4", kase, v.label, "GB/s", r, size / secs / kGB);
    }
  }
  // Both checks must be 0: every run started with nothing cached and ended
  // with the whole file read.
  ctx.rec->Info("P4.pages_not_evicted", std::to_string(not_evicted));
  ctx.rec->Info("P4.pages_not_read", std::to_string(not_read));
  ctx.rec->Info("P4.sink", std::to_string(sink & 1));
}

}  // namespace tsar::bench
