// P3: memory of N = 1, 2, 4, 8 processes holding the same 512 MiB model,
// summed from /proc/PID/smaps_rollup, for tsar, torch::pickle_load + copy_,
// torch::jit::load and a baseline process that loads no model.
#include <ATen/ops/randn.h>
#include <torch/script.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "bench/benchmarks.h"
#include "bench/models.h"
#include "tsar/tsar.h"

namespace tsar::bench {
namespace {

struct Mode {
  const char* arg;
  const char* label;
};
const Mode kModes[] = {
    {"none", "no model (baseline)"},
    {"tsar", "tsar"},
    {"pickle", "torch::pickle_load + copy_"},
    {"jit", "torch::jit::load"},
};

}  // namespace

void RunP3Memory(const Context& ctx) {
  for (const Mode& mode : kModes) {
    std::vector<Child> children;
    for (int n = 1; n <= 8; ++n) {
      children.emplace_back(std::vector<std::string>{ctx.self, "child-hold", mode.arg, ctx.data});
      const std::string ready = children.back().ReadLine();
      if (ready.rfind("ready", 0) != 0) Die(std::string("child-hold ") + mode.arg + " failed");
      ctx.rec->Info(std::string("P3.") + mode.arg + ".child" + std::to_string(n), ready);
      if (n != 1 && n != 2 && n != 4 && n != 8) continue;
      usleep(200 * 1000);  // let the newest process finish tearing down its temporaries
      double pss = 0, rss = 0, priv = 0, anon = 0, files = 0;
      for (const Child& c : children) {
        auto m = SmapsRollup(c.pid());
        pss += m["Pss"];
        rss += m["Rss"];
        priv += m["Private_Clean"] + m["Private_Dirty"];
        anon += m["Pss_Anon"];
        files += MappingPss(c.pid(), ctx.data + "/");  // the model files (tsar's archive) mapped
      }
      const std::string kase = "N=" + std::to_string(n);
      ctx.rec->Add("P3", kase, mode.label, "MiB summed Pss", 0, pss / 1024);
      ctx.rec->Add("P3", kase, mode.label, "MiB summed Rss", 0, rss / 1024);
      ctx.rec->Add("P3", kase, mode.label, "MiB summed Pss_Anon", 0, anon / 1024);
      ctx.rec->Add("P3", kase, mode.label, "MiB summed Pss of mapped model files", 0, files / 1024);
      ctx.rec->Add("P3", kase, mode.label, "MiB private per process", 0, priv / 1024 / n);
    }
    for (Child& c : children) {
      if (c.Finish() != 0) Die(std::string("child-hold ") + mode.arg + " exited with an error");
    }
  }
}

int ChildHold(const std::vector<std::string>& args) {
  if (args.size() != 2) Die("usage: child-hold tsar|pickle|jit|none DATA");
  const std::string& mode = args[0];
  const std::string data = args[1];
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const at::Tensor x = at::randn({1, kStackWidth});

  Stopwatch sw;
  std::shared_ptr<LinearStack> stack;
  torch::jit::Module jit;
  at::Tensor y;
  if (mode == "tsar") {
    stack = std::make_shared<LinearStack>();
    stack->eval();
    tsar::bind(*stack, Archive::open(data + "/stack.tsar"));
    y = stack->forward(x);  // serving touches every weight page
  } else if (mode == "pickle") {
    stack = std::make_shared<LinearStack>();
    stack->eval();
    CopyInto(*stack, torch::pickle_load(ReadFile(data + "/stack_sd.pt")));
    y = stack->forward(x);
  } else if (mode == "jit") {
    jit = torch::jit::load(data + "/stack_ts.pt");
    jit.eval();
    y = jit.forward({x}).toTensor();
  } else if (mode == "none") {
    // The same process, the same kernels, no model.
    y = at::addmm(at::randn({8}), at::randn({1, 8}), at::randn({8, 8}).t());
  } else {
    Die("child-hold: unknown mode " + mode);
  }
  std::printf("ready load_ms=%.3f checksum=%.9g\n", sw.Ms(), y.sum().item<double>());
  std::fflush(stdout);
  while (std::getchar() != EOF) {
  }
  return 0;
}

}  // namespace tsar::bench
