// P2: time to the first output of resnet18 in a fresh process, weights warm in
// the page cache: tsar (architecture + open + bind + forward) against
// torch::jit::load of the full TorchScript file + forward. Each run is a new
// process (child-first-output); its clock starts at main().
#include <ATen/ops/randn.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>

#include "bench/benchmarks.h"
#include "bench/models.h"
#include "bench/resnet18.h"
#include "tsar/tsar.h"

namespace tsar::bench {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Variant {
  const char* mode;
  const char* total;
  std::vector<std::pair<const char*, const char*>> parts;  // key printed by the child, row label
};

const std::vector<Variant>& Variants() {
  static const std::vector<Variant> v = {
      {"tsar-cpp",
       "tsar: C++ architecture + open + bind + forward",
       {{"arch_ms", "  tsar, C++: construct the module (empty parameters)"},
        {"open_bind_ms", "  tsar, C++: open + bind"},
        {"forward_ms", "  tsar, C++: first forward"},
        {"steady_ms", "  tsar, C++: steady-state forward (best of 3 more; not in the total)"}}},
      {"pickle-cpp",
       "C++ architecture + torch::pickle_load + copy_ + forward",
       {{"open_bind_ms", "  pickle, C++: read + torch::pickle_load + copy_"},
        {"forward_ms", "  pickle, C++: first forward"},
        {"steady_ms", "  pickle, C++: steady-state forward (best of 3 more; not in the total)"}}},
      {"tsar-ts",
       "tsar: jit::load(architecture, no weights) + open + bind + forward",
       {{"arch_ms", "  tsar, TorchScript: jit::load(architecture, no weights)"},
        {"open_bind_ms", "  tsar, TorchScript: open + bind"},
        {"forward_ms", "  tsar, TorchScript: first forward"}}},
      {"jit",
       "torch::jit::load + forward",
       {{"arch_ms", "  jit: torch::jit::load"},
        {"forward_ms", "  jit: first forward"},
        {"steady_ms", "  jit: steady-state forward (best of 3 more; not in the total)"}}},
  };
  return v;
}

}  // namespace

void RunP2FirstOutput(const Context& ctx) {
  for (const char* side : {"224"}) {
    const std::string kase = std::string("resnet18, 1x3x") + side + "x" + side;
    std::vector<std::string> checksums(Variants().size());
    for (int r = -1; r < ctx.Runs(7); ++r) {
      for (size_t m = 0; m < Variants().size(); ++m) {
        const Variant& v = Variants()[m];
        const int64_t spawned = NowNs();
        Child child({ctx.self, "child-first-output", v.mode, side, ctx.data});
        std::string text;
        for (std::string line; !(line = child.ReadLine()).empty();) text += line + "\n";
        if (child.Finish() != 0) Die(std::string("child-first-output ") + v.mode + " failed");
        auto kv = ParseKeyValues(text);
        checksums[m] = kv["checksum"];
        if (r < 0) continue;  // the first round warms the page cache
        ctx.rec->Add("P2", kase, v.total, "ms", r, std::stod(kv["total_ms"]));
        for (const auto& [key, label] : v.parts)
          ctx.rec->Add("P2", kase, label, "ms", r, std::stod(kv[key]));
        if (m == 0) {
          ctx.rec->Add("P2", kase,
                       "process start before main() (LibTorch loading; not in any total)", "ms", r,
                       (std::stoll(kv["main_ns"]) - spawned) / 1e6);
        }
      }
    }
    // The same weights must give the same output whichever way they came.
    std::string all;
    bool same = true;
    for (const auto& c : checksums) {
      all += (all.empty() ? "" : " ") + c;
      same = same && std::abs(std::stod(c) - std::stod(checksums.back())) <=
                         1e-4 * (1 + std::abs(std::stod(c)));
    }
    ctx.rec->Info("P2.same_output." + std::string(side), (same ? "yes: " : "NO: ") + all);
  }
}

int ChildFirstOutput(const std::vector<std::string>& args) {
  const int64_t main_ns = NowNs();
  if (args.size() != 3) Die("usage: child-first-output tsar-cpp|pickle-cpp|tsar-ts|jit SIDE DATA");
  const std::string& mode = args[0];
  const int64_t side = std::stoll(args[1]);
  const std::string& data = args[2];
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const at::Tensor x = at::randn({1, 3, side, side});  // the request, ready before the clock starts

  Stopwatch total;
  std::function<at::Tensor()> forward;
  std::shared_ptr<ResNet18> cpp;
  torch::jit::Module jit;
  if (mode == "tsar-cpp" || mode == "pickle-cpp") {
    cpp = std::make_shared<ResNet18>();
    cpp->eval();
    forward = [&] { return cpp->forward(x); };
  } else {
    jit = torch::jit::load(data + (mode == "jit" ? "/resnet18_ts.pt" : "/resnet18_arch_ts.pt"));
    jit.eval();
    forward = [&] { return jit.forward({x}).toTensor(); };
  }
  const double arch_ms = total.Ms();
  Stopwatch bind;
  if (mode == "tsar-cpp") tsar::bind(*cpp, Archive::open(data + "/resnet18.tsar"));
  if (mode == "tsar-ts") tsar::bind(jit, Archive::open(data + "/resnet18.tsar"));
  if (mode == "pickle-cpp") CopyInto(*cpp, torch::pickle_load(ReadFile(data + "/resnet18_sd.pt")));
  const double open_bind_ms = bind.Ms();
  Stopwatch fw;
  const at::Tensor y = forward();
  const double forward_ms = fw.Ms();
  const double total_ms = total.Ms();
  double steady_ms = 1e300;  // best of 3 more forwards: the model's compute alone
  for (int k = 0; k < 3; ++k) {
    Stopwatch again;
    forward();
    steady_ms = std::min(steady_ms, again.Ms());
  }
  std::printf(
      "main_ns %lld\narch_ms %.4f\nopen_bind_ms %.4f\nforward_ms %.4f\ntotal_ms %.4f\nsteady_ms "
      "%.4f\nchecksum %.9g\n",
      static_cast<long long>(main_ns), arch_ms, open_bind_ms, forward_ms, total_ms, steady_ms,
      y.sum().item<double>());
  return 0;
}

}  // namespace tsar::bench
