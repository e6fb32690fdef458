// P11: hot swap (tsar::LiveModule, include/tsar/live.h). Request threads run
// resnet18 (TorchScript, 1x3x64x64) without pause while new versions of its
// archive are renamed over the served path. Measures, per swap, the time
// from the rename to the end of the first request served by the new
// version, and the longest request latency in the windows around swaps
// against the longest in as many equally long windows without one.
#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>
#include <torch/script.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>

#include "bench/benchmarks.h"
#include "tsar/tsar.h"

namespace tsar::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSwaps = 10;
constexpr int kGapMs = 400;     // between two renames
constexpr int kWindowMs = 150;  // a swap's window: from its rename on

struct Request {
  double start_ms, end_ms;  // since the run's start
  uint64_t version;
};

double Since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// What is served: how to build a fresh module, an input, the version files.
struct Model {
  std::string name;
  std::function<torch::jit::Module()> make;
  at::Tensor input;
  std::vector<std::string> versions;
};

uint64_t RssKb() { return SmapsRollup(getpid())["Rss"]; }

void RunOnce(const Context& ctx, int threads, const Model& model, int loader_nice = 0) {
  const std::string live_path = ctx.Path("p11/live.tsar");
  const auto& versions = model.versions;
  // Each version's file stays for the next run: it is hard-linked, then the
  // link renamed over the served path.
  auto publish = [&](const std::string& from) {
    const std::string tmp = live_path + ".tmp";
    unlink(tmp.c_str());
    if (link(from.c_str(), tmp.c_str()) != 0 || rename(tmp.c_str(), live_path.c_str()) != 0) {
      Die("cannot publish " + from);
    }
  };
  publish(versions[0]);
  const at::Tensor& x = model.input;
  std::mutex mu;
  std::vector<double> load_ms, open_ms;
  LiveOptions options;
  options.loader_nice = loader_nice;
  options.on_event = [&](const LiveEvent& e) {
    if (e.kind != LiveEvent::Kind::kSwapped) {
      std::fprintf(stderr, "tsar_bench: P11: a version was refused: %s\n", e.error.c_str());
    }
    std::lock_guard<std::mutex> lock(mu);
    load_ms.push_back(e.load_ms);
    open_ms.push_back(e.open_ms);
  };
  LiveModule live(live_path, model.make, options, [&](torch::jit::Module& m) {
    // Two calls: TorchScript's profiling executor profiles the first and
    // compiles on the second, which no request should pay for.
    torch::NoGradGuard no_grad;
    for (int i = 0; i < 2; ++i) m.forward({x});
  });

  const auto t0 = Clock::now();
  std::atomic<bool> stop{false};
  std::vector<std::vector<Request>> per_thread(threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      torch::NoGradGuard no_grad;
      auto& out = per_thread[i];
      out.reserve(1 << 16);
      while (!stop.load()) {
        const double start = Since(t0);
        const LiveModule::Snapshot v = live.current();
        v.module->forward({x});
        out.push_back({start, Since(t0), v.version});
      }
    });
  }
  std::vector<double> renames;
  usleep(kGapMs * 1000);
  uint64_t rss_before = 0;
  for (int k = 1; k <= kSwaps; ++k) {
    renames.push_back(Since(t0));
    publish(versions[static_cast<size_t>(k) % versions.size()]);
    usleep(kGapMs * 1000);
    // From the second version on, memory must stay flat.
    if (k == 1) rss_before = RssKb();
  }
  const uint64_t rss_after = RssKb();
  stop = true;
  for (auto& t : pool) t.join();
  const double end_ms = Since(t0);

  std::vector<Request> all;
  for (const auto& v : per_thread) all.insert(all.end(), v.begin(), v.end());
  const std::string kase = model.name + ", " + std::to_string(threads) + " request thread" +
                           (threads > 1 ? "s" : "") +
                           (loader_nice ? ", loader_nice " + std::to_string(loader_nice) : "");
  int run = 0;
  for (int k = 1; k <= kSwaps; ++k) {
    // Version k+1 is the k-th rename's (versions only move forward).
    double first = -1;
    for (const Request& r : all) {
      if (r.version == static_cast<uint64_t>(k + 1) && (first < 0 || r.end_ms < first)) {
        first = r.end_ms;
      }
    }
    if (first < 0) {
      std::fprintf(stderr, "tsar_bench: P11 %s: version %d not served within %d ms\n", kase.c_str(),
                   k + 1, kGapMs);
      continue;
    }
    ctx.rec->Add("P11", kase, "rename to the first request served by the new version", "ms", run++,
                 first - renames[k - 1]);
  }
  // Requests that overlap a swap's window [rename, rename + kWindowMs], and
  // those in windows of the same length that end before the next rename.
  auto overlaps = [](const Request& r, double lo, double hi) {
    return r.start_ms < hi && r.end_ms > lo;
  };
  double during = 0, quiet = 0;
  uint64_t n_during = 0, n_quiet = 0;
  std::vector<double> lat_during, lat_quiet;
  for (int k = 0; k < kSwaps; ++k) {
    const double lo = renames[k], hi = lo + kWindowMs;
    const double qhi = (k + 1 < kSwaps ? renames[k + 1] : end_ms) - 20, qlo = qhi - kWindowMs;
    for (const Request& r : all) {
      if (overlaps(r, lo, hi)) {
        during = std::max(during, r.end_ms - r.start_ms);
        lat_during.push_back(r.end_ms - r.start_ms);
        ++n_during;
      } else if (overlaps(r, qlo, qhi)) {
        quiet = std::max(quiet, r.end_ms - r.start_ms);
        lat_quiet.push_back(r.end_ms - r.start_ms);
        ++n_quiet;
      }
    }
  }
  ctx.rec->Add("P11", kase, "longest request in a swap's window", "ms", 0, during);
  ctx.rec->Add("P11", kase, "longest request in a window without a swap", "ms", 0, quiet);
  ctx.rec->Add("P11", kase, "what a swap added to the longest request", "ms", 0,
               std::max(0.0, during - quiet));
  auto p99 = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, v.size() * 99 / 100)];
  };
  ctx.rec->Add("P11", kase, "p99 request in a swap's window", "ms", 0, p99(lat_during));
  ctx.rec->Add("P11", kase, "p99 request in a window without a swap", "ms", 0, p99(lat_quiet));
  ctx.rec->Add("P11", kase, "requests served", "count", 0, static_cast<double>(all.size()));
  ctx.rec->Add("P11", kase, "RSS after the last swap minus after the first", "MiB", 0,
               (static_cast<double>(rss_after) - static_cast<double>(rss_before)) / 1024);
  ctx.rec->Info("P11." + std::to_string(threads) + "t.requests_in_swap_windows",
                std::to_string(n_during));
  ctx.rec->Info("P11." + std::to_string(threads) + "t.requests_in_quiet_windows",
                std::to_string(n_quiet));
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 1; i < load_ms.size(); ++i) {  // [0] is the first version, before requests
    ctx.rec->Add("P11", kase, "loader: open + verify + make + bind + warm-up", "ms",
                 static_cast<int>(i - 1), load_ms[i]);
    ctx.rec->Add("P11", kase, "loader: of which tsar's open + verify", "ms",
                 static_cast<int>(i - 1), open_ms[i]);
  }
  std::fprintf(stderr,
               "tsar_bench: P11 %s: %zu requests, longest %.2f ms in swap windows, %.2f ms "
               "without\n",
               kase.c_str(), all.size(), during, quiet);
}

}  // namespace

void RunP11HotSwap(const Context& ctx) {
  RunCommand({"mkdir", "-p", ctx.Path("p11")});
  auto write_versions =
      [&](const std::string& stem,
          const std::function<std::vector<std::pair<std::string, at::Tensor>>(int)>& tensors) {
        std::vector<std::string> out;
        for (int v = 0; v < 4; ++v) {
          out.push_back(ctx.Path("p11/" + stem + std::to_string(v) + ".tsar"));
          tsar::pack(out.back(), tensors(v));
        }
        return out;
      };
  const int saved = at::get_num_threads();
  at::set_num_threads(1);  // one core per request thread
  const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));

  // An MLP (4 x 512x512, TorchScript built in C++, its architecture saved):
  // requests of about a millisecond, so the swap's own cost shows.
  {
    torch::jit::Module tmpl("Mlp");
    for (int i = 0; i < 4; ++i)
      tmpl.register_parameter("w" + std::to_string(i), at::zeros({512, 512}), false);
    tmpl.define(
        "def forward(self, x):\n"
        "  x = torch.relu(torch.mm(x, self.w0))\n  x = torch.relu(torch.mm(x, self.w1))\n"
        "  x = torch.relu(torch.mm(x, self.w2))\n  return torch.mm(x, self.w3)\n");
    tmpl.eval();
    const std::string arch = ctx.Path("p11/mlp_arch_ts.pt");
    tmpl.save(arch);
    Model mlp{
        "MLP 4x512x512, batch 1",
        [arch] {
          torch::jit::Module m = torch::jit::load(arch);
          m.eval();
          return m;
        },
        at::randn({1, 512}), write_versions("mlp", [](int v) {
          std::vector<std::pair<std::string, at::Tensor>> t;
          for (int i = 0; i < 4; ++i)
            t.emplace_back("w" + std::to_string(i), at::randn({512, 512}) * (0.05 + 0.01 * v));
          return t;
        })};
    RunOnce(ctx, 1, mlp);
    if (cores > 1) {
      RunOnce(ctx, cores, mlp);
      RunOnce(ctx, cores, mlp, 19);
    }
  }
  // resnet18 (the scripted architecture file, torch::jit::load per version):
  // a real model, whose make and warm-up dominate the time to serve.
  {
    const Archive base = Archive::open(ctx.Path("resnet18_ts.tsar"));
    const std::string arch = ctx.Path("resnet18_arch_ts.pt");
    Model resnet{"resnet18 1x3x64x64",
                 [arch] {
                   torch::jit::Module m = torch::jit::load(arch);
                   m.eval();
                   return m;
                 },
                 at::randn({1, 3, 64, 64}), write_versions("resnet18_", [&](int v) {
                   std::vector<std::pair<std::string, at::Tensor>> t;
                   for (const auto& item : base.state_dict()) {
                     const bool fc = item.key() == "fc.weight";
                     t.emplace_back(item.key(),
                                    fc ? item.value() * (1.0f + 0.01f * v) : item.value());
                   }
                   return t;
                 })};
    RunOnce(ctx, 1, resnet);
  }
  at::set_num_threads(saved);
  RunCommand({"rm", "-rf", ctx.Path("p11")});
}

}  // namespace tsar::bench
