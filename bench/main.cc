// tsar_bench: the benchmark program of bench/README.md.
//
//   tsar_bench run --data DIR --samples FILE [--only P1,P4] [--quick] [--tsar PATH]
//
// DIR holds make_data.py's files; run packs the archives it needs there
// (with the tsar CLI, as a user would), writes the 100,000-tensor inputs, then
// runs P1..P7, P10, P11 and P12's in-process half and writes one CSV row per measured sample to
// FILE.
#include <ATen/Parallel.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "bench/benchmarks.h"
#include "tsar/version.h"

#ifndef TSAR_CLI_PATH
#define TSAR_CLI_PATH "tsar"
#endif

namespace tsar::bench {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string SelfPath() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) Die("cannot read /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

[[noreturn]] void Usage() {
  Die("usage: tsar_bench run --data DIR --samples FILE [--only P1,P2,...] [--quick] [--tsar PATH]");
}

int Run(const std::vector<std::string>& args) {
  Context ctx;
  ctx.self = SelfPath();
  ctx.tsar = TSAR_CLI_PATH;
  std::string samples;
  std::set<std::string> only;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--data" && has_value) {
      ctx.data = args[++i];
    } else if (a == "--samples" && has_value) {
      samples = args[++i];
    } else if (a == "--tsar" && has_value) {
      ctx.tsar = args[++i];
    } else if (a == "--only" && has_value) {
      std::istringstream in(args[++i]);
      for (std::string p; std::getline(in, p, ',');) only.insert(p);
    } else if (a == "--quick") {
      ctx.scale = 0.3;
    } else {
      Usage();
    }
  }
  if (ctx.data.empty() || samples.empty()) Usage();
  char* abs = realpath(ctx.data.c_str(), nullptr);  // P3 matches /proc/PID/smaps paths against it
  if (!abs) Die("no data directory " + ctx.data);
  ctx.data = abs;
  std::free(abs);
  Recorder rec(samples);
  ctx.rec = &rec;

  // The archives, packed from the Python-made files by the CLI.
  for (const char* name : {"stack", "resnet18"}) {
    const std::string out = ctx.Path(std::string(name) + ".tsar");
    if (Exists(out)) continue;
    std::fprintf(stderr, "tsar_bench: packing %s\n", out.c_str());
    if (RunCommand({ctx.tsar, "pack", "-q", ctx.Path(std::string(name) + "_sd.pt"), "-o", out},
                   true) != 0) {
      Die("tsar pack failed for " + out);
    }
  }
  // The architecture P2's tsar side loads, without weights: written beside
  // an archive of the scripted model, which nothing else uses.
  if (!Exists(ctx.Path("resnet18_arch_ts.pt"))) {
    if (RunCommand({ctx.tsar, "pack", "-q", ctx.Path("resnet18_ts.pt"), "-o",
                    ctx.Path("resnet18_ts.tsar"), "--arch", ctx.Path("resnet18_arch_ts.pt")},
                   true) != 0) {
      Die("tsar pack --arch failed for " + ctx.Path("resnet18_ts.pt"));
    }
  }
  if (!Exists(ctx.Path("many.tsar"))) {
    std::fprintf(stderr, "tsar_bench: writing the 100000-tensor inputs\n");
    GenerateMany(ctx.data);
  }
  for (const char* f :
       {"stack_sd.pt", "stack_ts.pt", "stack.tsar", "resnet18_sd.pt", "resnet18_ts.pt",
        "resnet18_arch_ts.pt", "resnet18.tsar", "many.tsar", "many.safetensors"}) {
    rec.Info(std::string("bytes.") + f, std::to_string(FileSize(ctx.Path(f))));
  }
  rec.Info("torch_threads", std::to_string(at::get_num_threads()));
  rec.Info("tsar_version", TSAR_VERSION_STRING);

  // Order matters: in-process runs first and their mappings dropped before
  // P3 counts Pss; P6 last, as its writes would disturb the others.
  const std::vector<std::pair<std::string, void (*)(const Context&)>> all = {
      {"P1", RunP1OpenBind},    {"P5", RunP5Index},  {"P7", RunP7Verify},
      {"P2", RunP2FirstOutput}, {"P3", RunP3Memory}, {"P10", RunP10Layers},
      {"P11", RunP11HotSwap},   {"P12", RunP12Api},  {"P4", RunP4Cold},
      {"P16", RunP16Staging}, {"P6", RunP6Pack},
  };
  for (const auto& [name, fn] : all) {
    if (!only.empty() && !only.count(name)) continue;
    std::fprintf(stderr, "tsar_bench: %s\n", name.c_str());
    Stopwatch sw;
    fn(ctx);
    rec.Info(name + ".seconds", std::to_string(sw.Seconds()));
  }
  return 0;
}

}  // namespace
}  // namespace tsar::bench

int main(int argc, char** argv) {
  using namespace tsar::bench;
  if (argc < 2) Usage();
  const std::string cmd = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (cmd == "run") return Run(args);
    if (cmd == "child-first-output") return ChildFirstOutput(args);
    if (cmd == "child-hold") return ChildHold(args);
    if (cmd == "child-hold-archive") return ChildHoldArchive(args);
  } catch (const std::exception& e) {
    Die(cmd + ": " + e.what());
  }
  Usage();
}
