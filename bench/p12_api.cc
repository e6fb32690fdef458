// P12, in-process half (bench/p12_scale.py times the commands): the C++ API
// against the number of tensors. For 10,000 to 100,000 tensors of f32 [8, 8]
// in blocks of 100 (a torch::nn::Module tree like a mixture of experts'):
// Writer::add_module + finish, Archive::open, open + state_dict(), and
// open + bind into a second module of the same shape. Nine runs after one
// untimed run (p12_scale.py takes the best, as it does for the commands).
#include <ATen/ops/full.h>
#include <torch/nn/module.h>

#include "bench/benchmarks.h"
#include "tsar/tsar.h"

namespace tsar::bench {
namespace {

std::shared_ptr<torch::nn::Module> Experts(int n) {
  auto root = std::make_shared<torch::nn::Module>();
  auto layers = root->register_module("layers", std::make_shared<torch::nn::Module>());
  for (int b = 0; b * 100 < n; ++b) {
    auto block = layers->register_module(std::to_string(b), std::make_shared<torch::nn::Module>());
    for (int j = 0; j < 100 && b * 100 + j < n; ++j) {
      block->register_parameter("w" + std::to_string(j), at::full({8, 8}, float(b * 100 + j)));
    }
  }
  return root;
}

// What fn returns is destroyed after the clock stops: the time is to make
// it, not to free it.
template <typename Fn>
void Time(const Context& ctx, const std::string& kase, const std::string& variant, Fn fn) {
  fn();
  for (int r = 0; r < ctx.Runs(9); ++r) {
    Stopwatch sw;
    [[maybe_unused]] const auto result = fn();
    ctx.rec->Add("P12", kase, variant, "ms", r, sw.Ms());
  }
}

}  // namespace

void RunP12Api(const Context& ctx) {
  for (int n : {10000, 20000, 40000, 100000}) {
    const std::string kase = std::to_string(n) + " tensors";
    const std::string path = ctx.Path("p12_api.tsar");
    auto source = Experts(n);
    source->eval();
    Time(ctx, kase, "C++ Writer add_module + finish", [&] {
      Writer w(path);
      w.add_module(*source);
      w.finish();
      return 0;
    });
    Time(ctx, kase, "C++ Archive::open", [&] { return Archive::open(path); });
    size_t made = 0;
    Time(ctx, kase, "C++ Archive::open + state_dict()", [&] {
      auto tensors = Archive::open(path).state_dict();
      made = tensors.size();
      return tensors;
    });
    if (made != static_cast<size_t>(n)) Die("P12: state_dict() gave " + std::to_string(made));
    auto target = Experts(n);
    target->eval();
    size_t bound = 0;
    Time(ctx, kase, "C++ Archive::open + bind", [&] {
      BindReport r = tsar::bind(*target, Archive::open(path));
      bound = r.bound.size();
      return r;
    });
    if (bound != static_cast<size_t>(n)) Die("P12: bind bound " + std::to_string(bound));
    std::remove(path.c_str());
  }
}

}  // namespace tsar::bench
