// P10: layered archives (spec §4.11). Four fine-tuned variants of the 512 MiB
// stack, each changing 4 of its 32 weight matrices (1/8 of the bytes), served
// by one process per variant: as layers over stack.tsar against as four full
// archives. Measures the summed Pss of the mapped model files (what the
// variants cost in RAM) and the variants' bytes on disk.
#include <ATen/ops/randn.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <cstdio>

#include "bench/benchmarks.h"
#include "bench/models.h"
#include "tsar/tsar.h"

namespace tsar::bench {
namespace {

constexpr int kVariants = 4;
constexpr int kChangedPerVariant = kStackLayers / 8;  // 1/8 of the bytes

// Variant v (0-based): the base's tensors, with weights 4v..4v+3 changed.
std::vector<std::pair<std::string, at::Tensor>> Variant(const Archive& base, int v) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : base.state_dict()) {
    const std::string& name = item.key();
    const at::Tensor& t = item.value();
    const int layer = std::stoi(name.substr(0, name.find('.')));
    const bool changed = name.find("weight") != std::string::npos &&
                         layer >= v * kChangedPerVariant && layer < (v + 1) * kChangedPerVariant;
    out.emplace_back(name, changed ? t + 0.001f * static_cast<float>(v + 1) : t);
  }
  return out;
}

double HoldAndMeasure(const Context& ctx, const std::vector<std::string>& paths) {
  std::vector<Child> children;
  for (const auto& p : paths) {
    children.emplace_back(std::vector<std::string>{ctx.self, "child-hold-archive", p});
    const std::string ready = children.back().ReadLine();
    if (ready.rfind("ready", 0) != 0) Die("child-hold-archive " + p + " failed");
  }
  usleep(200 * 1000);
  double files = 0;
  for (const Child& c : children) files += MappingPss(c.pid(), ctx.data + "/");
  for (Child& c : children) {
    if (c.Finish() != 0) Die("child-hold-archive exited with an error");
  }
  return files / 1024;  // MiB
}

}  // namespace

void RunP10Layers(const Context& ctx) {
  const std::string base_path = ctx.Path("stack.tsar");
  std::vector<std::string> layers, full;
  uint64_t own = 0, layer_files = 0;
  {
    const Archive base = Archive::open(base_path);
    for (int v = 0; v < kVariants; ++v) {
      const auto tensors = Variant(base, v);
      PackOptions o;
      o.base = base_path;
      layers.push_back(ctx.Path("variant" + std::to_string(v) + ".tsar"));
      Stopwatch sw;
      tsar::pack(layers.back(), tensors, o);
      ctx.rec->Add("P10", "4 variants", "tsar pack --base (one variant, in-process)", "ms", v,
                   sw.Ms());
      full.push_back(ctx.Path("variant" + std::to_string(v) + "_full.tsar"));
      tsar::pack(full.back(), tensors);
      const ArchiveFile l = ArchiveFile::open(layers.back());
      for (const auto& s : l.storages()) own += s.layer == 0 ? s.nbytes : 0;
      layer_files += FileSize(layers.back());
    }
  }
  const double base_mib = static_cast<double>(FileSize(base_path)) / (1 << 20);
  const double own_mib = static_cast<double>(own) / (1 << 20);
  ctx.rec->Info("P10.base_mib", std::to_string(base_mib));
  ctx.rec->Info("P10.variants_own_mib", std::to_string(own_mib));
  ctx.rec->Add("P10", "4 variants", "layers: the variants' files on disk", "MiB", 0,
               static_cast<double>(layer_files) / (1 << 20));
  ctx.rec->Add("P10", "4 variants", "layers: the variants' own bytes", "MiB", 0, own_mib);
  ctx.rec->Add("P10", "4 variants", "layers over stack.tsar: summed Pss of model files", "MiB", 0,
               HoldAndMeasure(ctx, layers));
  ctx.rec->Add("P10", "4 variants", "4 full archives: summed Pss of model files", "MiB", 0,
               HoldAndMeasure(ctx, full));
  ctx.rec->Add("P10", "4 variants", "goal: 1.05 x (base + own bytes) + 4 x 4 MiB", "MiB", 0,
               1.05 * (base_mib + own_mib) + kVariants * 4);
  for (const auto& p : layers) unlink(p.c_str());
  for (const auto& p : full) unlink(p.c_str());
}

int ChildHoldArchive(const std::vector<std::string>& args) {
  if (args.size() != 1) Die("usage: child-hold-archive ARCHIVE");
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const at::Tensor x = at::randn({1, kStackWidth});
  auto stack = std::make_shared<LinearStack>();
  stack->eval();
  Stopwatch sw;
  tsar::bind(*stack, Archive::open(args[0]));
  const at::Tensor y = stack->forward(x);  // serving touches every weight page
  std::printf("ready load_ms=%.3f checksum=%.9g\n", sw.Ms(), y.sum().item<double>());
  std::fflush(stdout);
  while (std::getchar() != EOF) {
  }
  return 0;
}

}  // namespace tsar::bench
