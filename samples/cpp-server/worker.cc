// tsar_worker: a small C++ model worker. At start it maps a tsar archive and
// binds it into a TorchScript model zero-copy, then serves requests: each line
// on stdin is a request ("run" runs the model on a fixed input), each answer a
// line on stdout. Start many: they share one copy of the weights in RAM.
//
//   tsar_worker --archive model.tsar --model model_arch_ts.pt
//   tsar_worker --archive model.tsar --model model_arch_ts.pt --watch
//   tsar_worker --baseline model_ts.pt --model model_ts.pt
//
// With --watch it follows the archive (tsar::LiveModule): a new model.tsar
// published by `tsar pack` (or any rename over it) serves from the next
// request on, without a restart; a bad one is refused and logged on stderr
// while the old version serves on. Each answer then says which version
// answered: "out 12.345678 version 2".
//
// With --baseline FILE it loads weights the usual way instead (torch::jit::load
// of FILE, a private copy per process), for comparison.
//
// With --aoti (instead of --model) it serves the archive's AOTInductor
// program (tsar::load_aoti, include/tsar/aoti.h): compiled code, no
// TorchScript, its constants the archive's tensors, shared as above.
//
//   tsar_worker --archive model.tsar --aoti
//   tsar_worker --archive llm.tsar --aoti --tokens 16   # a language model's program
//
// A language model's program (tsar.transformers.pack(..., program="aoti"))
// takes (input_ids, attention_mask): --tokens N serves N fixed token ids.
#include <torch/script.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "tsar/aoti.h"
#include "tsar/tsar.h"

namespace {

// Answers requests on stdin with `forward` of the fixed input.
template <class Forward>
void Serve(double load_ms, const Forward& forward) {
  std::printf("ready load_ms=%.3f\n", load_ms);
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "run") {
      std::printf("out %.6f\n", forward().sum().template item<double>());
    } else {
      std::printf("error unknown request\n");
    }
    std::fflush(stdout);
  }
}

int ServeAoti(const std::string& archive, const std::string& name, int64_t tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  tsar::AotiOptions options;
  options.name = name;
  const tsar::AotiProgram program = tsar::load_aoti(tsar::Archive::open(archive), options);
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  std::vector<at::Tensor> inputs;
  if (tokens > 0) {
    const auto ids = torch::arange(tokens, torch::kLong).remainder(100).add(1).unsqueeze(0);
    inputs = {ids, torch::ones_like(ids)};
  } else {
    inputs = {torch::randn({1, 3, 64, 64})};
  }
  program.run(inputs);  // first request: touches every weight page
  Serve(load_ms, [&] { return program.run(inputs).at(0).to(torch::kFloat); });
  return 0;
}

// Follows the archive and serves each request on the version current when it
// starts.
int Watch(const std::string& archive, const std::string& model, const torch::Tensor& x) {
  tsar::LiveOptions options;
  options.on_event = [](const tsar::LiveEvent& e) {
    if (e.kind == tsar::LiveEvent::Kind::kSwapped) {
      std::fprintf(stderr, "tsar_worker: %s: version %llu serving (loaded in %.1f ms)\n",
                   e.path.c_str(), static_cast<unsigned long long>(e.version), e.load_ms);
    } else {
      std::fprintf(stderr, "tsar_worker: refused a new file, version %llu serves on: %s\n",
                   static_cast<unsigned long long>(e.version), e.error.c_str());
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  tsar::LiveModule live(
      archive,
      [&] {
        torch::jit::Module m = torch::jit::load(model);  // the architecture
        m.eval();
        return m;
      },
      options,
      // Before a version serves: two forward passes (they check the
      // architecture and touch every weight page; TorchScript profiles the
      // first and compiles on the second, so no request pays for either).
      [&](torch::jit::Module& m) {
        m.forward({x});
        m.forward({x});
      });
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("ready load_ms=%.3f version=%llu\n", load_ms,
              static_cast<unsigned long long>(live.version()));
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "run") {
      const tsar::LiveModule::Snapshot v = live.current();
      const auto y = v.module->forward({x}).toTensor();
      std::printf("out %.6f version %llu\n", y.sum().item<double>(),
                  static_cast<unsigned long long>(v.version));
    } else if (line == "version") {
      std::printf("version %llu %s\n", static_cast<unsigned long long>(live.version()),
                  live.last_error().c_str());
    } else {
      std::printf("error unknown request\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string archive, model, baseline, aoti_name;
  bool watch = false, aoti = false;
  int64_t tokens = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--watch") {
      watch = true;
      continue;
    }
    if (flag == "--aoti") {
      aoti = true;
      if (i + 1 < argc && argv[i + 1][0] != '-') aoti_name = argv[++i];
      continue;
    }
    if (i + 1 >= argc) break;
    if (flag == "--archive") archive = argv[++i];
    if (flag == "--model") model = argv[++i];
    if (flag == "--baseline") baseline = argv[++i];
    if (flag == "--tokens") tokens = std::stoll(argv[++i]);
  }
  if (aoti ? (archive.empty() || watch) :
      (model.empty() || (archive.empty() && baseline.empty()) || (watch && archive.empty()))) {
    std::fprintf(stderr,
                 "usage: tsar_worker --archive A.tsar --aoti [NAME] [--tokens N]\n"
                 "       tsar_worker --archive A.tsar --model M_arch_ts.pt [--watch]\n"
                 "       tsar_worker --baseline M_ts.pt --model M_ts.pt\n");
    return 2;
  }
  try {
    if (aoti) return ServeAoti(archive, aoti_name, tokens);
    if (watch) {
      torch::NoGradGuard no_grad;
      torch::manual_seed(0);
      return Watch(archive, model, torch::randn({1, 3, 64, 64}));
    }
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
    Serve(load_ms, [&] { return m.forward({x}).toTensor(); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tsar_worker: %s\n", e.what());
    return 3;
  }
  return 0;
}
