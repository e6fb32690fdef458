// P1: warm open + bind of an archive against torch::pickle_load + copy_ into
// the module and against torch::jit::load, at three sizes.
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include "bench/benchmarks.h"
#include "bench/models.h"
#include "tsar/tsar.h"

namespace tsar::bench {
namespace {

// Runs fn once untimed (warms caches and the allocator), then `runs` timed.
template <typename Fn>
void Time(const Context& ctx, const std::string& kase, const std::string& variant, int runs,
          Fn fn) {
  fn();
  for (int r = 0; r < runs; ++r) {
    Stopwatch sw;
    fn();
    ctx.rec->Add("P1", kase, variant, "ms", r, sw.Ms());
  }
}

c10::IValue PickleLoad(const std::string& path) { return torch::pickle_load(ReadFile(path)); }

}  // namespace

void RunP1OpenBind(const Context& ctx) {
  {
    const std::string kase = "512 MiB, 64 tensors";
    const std::string archive = ctx.Path("stack.tsar");
    auto bound = std::make_shared<LinearStack>();
    bound->eval();
    auto copied = std::make_shared<LinearStack>();
    copied->eval();
    Time(ctx, kase, "tsar open+bind", ctx.Runs(21),
         [&] { tsar::bind(*bound, Archive::open(archive)); });
    Time(ctx, kase, "torch::pickle_load + copy_", ctx.Runs(5),
         [&] { CopyInto(*copied, PickleLoad(ctx.Path("stack_sd.pt"))); });
    Time(ctx, kase, "torch::jit::load", ctx.Runs(5),
         [&] { torch::jit::load(ctx.Path("stack_ts.pt")); });
    torch::NoGradGuard no_grad;
    const at::Tensor x = at::randn({1, kStackWidth});
    ctx.rec->Info("P1.stack_same_output",
                  at::equal(bound->forward(x), copied->forward(x)) ? "yes" : "NO");
  }
  {
    const std::string kase = "resnet18, 122 tensors";
    const std::string archive = ctx.Path("resnet18.tsar");
    torch::jit::Module arch = torch::jit::load(ctx.Path("resnet18_arch_ts.pt"));
    arch.eval();
    torch::jit::Module copied = torch::jit::load(ctx.Path("resnet18_ts.pt"));
    copied.eval();
    Time(ctx, kase, "tsar open+bind", ctx.Runs(21),
         [&] { tsar::bind(arch, Archive::open(archive)); });
    Time(ctx, kase, "torch::pickle_load + copy_", ctx.Runs(9),
         [&] { CopyInto(copied, PickleLoad(ctx.Path("resnet18_sd.pt"))); });
    Time(ctx, kase, "torch::jit::load", ctx.Runs(9),
         [&] { torch::jit::load(ctx.Path("resnet18_ts.pt")); });
  }
  {
    const std::string kase = "100000 tensors";
    const std::string archive = ctx.Path("many.tsar");
    auto many = MakeManyModule();
    many->eval();
    Time(ctx, kase, "tsar open+bind", ctx.Runs(9),
         [&] { tsar::bind(*many, Archive::open(archive)); });
  }
}

}  // namespace tsar::bench
