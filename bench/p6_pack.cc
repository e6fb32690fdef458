// P6: packing 512 MiB (`tsar pack` of the torch.save file, durable) against
// `cp` of the same file followed by fsync. Both read a warm input and end
// with the output on disk; a global sync() before each run keeps earlier
// writeback out of the clock.
#include <unistd.h>

#include "bench/benchmarks.h"
#include "tsar/tsar.h"

namespace tsar::bench {

void RunP6Pack(const Context& ctx) {
  const std::string kase = "512 MiB";
  const std::string input = ctx.Path("stack_sd.pt");
  const std::string out_tsar = ctx.Path("p6_out.tsar");
  const std::string out_api = ctx.Path("p6_api.tsar");
  const std::string out_cp = ctx.Path("p6_copy.pt");
  const double bytes = static_cast<double>(FileSize(input));
  OpenOptions populate;
  populate.prefetch = Prefetch::kPopulate;
  const Archive source = Archive::open(ctx.Path("stack.tsar"), populate);
  const auto tensors = source.state_dict();
  ReadFile(input);  // warm
  // What every `tsar` run pays before it reads a byte (the dynamic loader:
  // LibTorch before issue 13), and a whole small command.
  for (int r = -1; r < ctx.Runs(20); ++r) {
    Stopwatch sw;
    if (RunCommand({ctx.tsar, "--version"}) != 0) Die("tsar --version failed");
    if (r >= 0) ctx.rec->Add("P6", kase, "tsar --version (process start only)", "ms", r, sw.Ms());
    Stopwatch inspect;
    if (RunCommand({ctx.tsar, "inspect", ctx.Path("resnet18.tsar")}) != 0)
      Die("tsar inspect failed");
    if (r >= 0) {
      ctx.rec->Add("P6", "resnet18", "tsar inspect (whole process)", "ms", r, inspect.Ms());
    }
  }
  auto clean = [&](const std::string& p) {
    unlink(p.c_str());
    sync();
  };
  for (int r = -1; r < ctx.Runs(5); ++r) {
    auto add = [&](const char* variant, double secs) {
      if (r >= 0) ctx.rec->Add("P6", kase, variant, "GB/s", r, bytes / secs / kGB);
    };
    clean(out_tsar);
    {
      Stopwatch sw;
      uint64_t anon_kb = 0;
      if (RunCommandPeakAnon({ctx.tsar, "pack", "-q", input, "-o", out_tsar}, &anon_kb) != 0) {
        Die("tsar pack failed");
      }
      add("tsar pack (CLI: process start, import, hash, write, fsync)", sw.Seconds());
      if (r >= 0) {
        ctx.rec->Add("P6", kase, "tsar pack peak anonymous memory (RssAnon)", "MiB", r,
                     static_cast<double>(anon_kb) / 1024);
      }
    }
    clean(out_cp);
    {
      Stopwatch sw;
      if (RunCommand({"cp", "--reflink=never", input, out_cp}) != 0) Die("cp failed");
      FsyncFile(out_cp);
      add("cp + fsync", sw.Seconds());
    }
    clean(out_cp);
    {
      Stopwatch sw;
      if (RunCommand({"cp", "--reflink=never", input, out_cp}) != 0) Die("cp failed");
      add("cp (no fsync: ends in the page cache)", sw.Seconds());
    }
    clean(out_api);
    {
      Stopwatch sw;
      tsar::pack(out_api, tensors);
      add("tsar::pack() in-process from mapped tensors (fsync)", sw.Seconds());
    }
  }
  clean(out_tsar);
  clean(out_api);
  clean(out_cp);
}

}  // namespace tsar::bench
