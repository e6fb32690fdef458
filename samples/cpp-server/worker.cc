// tsar_worker: a small C++ model worker. At start it maps a tsar archive and
// binds it into a TorchScript model zero-copy, then serves requests: each line
// on stdin is a request ("run" runs the model on a fixed input), each answer a
// line on stdout. Start many: they share one copy of the weights in RAM.
//
//   tsar_worker --archive model.tsar --model model_arch_ts.pt
//   tsar_worker --baseline model_ts.pt --model model_ts.pt
//
// With --baseline FILE it loads weights the usual way instead (torch::jit::load
// of FILE, a private copy per process), for comparison.
#include <torch/script.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "tsar/tsar.h"

int main(int argc, char** argv) {
  std::string archive, model, baseline;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--archive") archive = argv[i + 1];
    if (flag == "--model") model = argv[i + 1];
    if (flag == "--baseline") baseline = argv[i + 1];
  }
  if (model.empty() || (archive.empty() && baseline.empty())) {
    std::fprintf(stderr,
                 "usage: tsar_worker --archive A.tsar --model M_ts.pt | --baseline M_ts.pt --model "
                 "M_ts.pt\n");
    return 2;
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    torch::jit::Module m;
    if (!baseline.empty()) {
      m = torch::jit::load(baseline);  // weights read and copied into this process
      m.eval();
    } else {
      // The architecture comes from the TorchScript file; its weights are then
      // replaced by views of the shared archive mapping.
      m = torch::jit::load(model);
      m.eval();
      const auto t1 = std::chrono::steady_clock::now();
      tsar::bind(m, tsar::Archive::open(archive));
      std::fprintf(
          stderr, "bind_ms %.3f\n",
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count());
    }
    const double load_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    torch::NoGradGuard no_grad;
    torch::manual_seed(0);
    const auto x = torch::randn({1, 3, 64, 64});
    m.forward({x});  // first request: touches every weight page
    std::printf("ready load_ms=%.3f\n", load_ms);
    std::fflush(stdout);
    for (std::string line; std::getline(std::cin, line);) {
      if (line == "run") {
        const auto y = m.forward({x}).toTensor();
        std::printf("out %.6f\n", y.sum().item<double>());
      } else {
        std::printf("error unknown request\n");
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tsar_worker: %s\n", e.what());
    return 3;
  }
  return 0;
}
