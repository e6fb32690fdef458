// tsar::LiveModule / LiveNnModule (include/tsar/live.h): a module that moves
// to each new archive published at its path, never serving a mix of two.
#include "tsar/live.h"

#include <dirent.h>
#include <fcntl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <set>
#include <thread>

#include "tests/loader/test_helpers.h"
#include "tsar/writer.h"

namespace tsar {
namespace {

using namespace tsar::testing;
using std::chrono::milliseconds;

constexpr int64_t kWidth = 64;

// A TorchScript model whose output tells its weights apart: version k has
// a = k and b = 1000 k, so forward(ones) = 64 k + 64000 k; any mix of two
// versions' tensors gives a value no version gives.
torch::jit::Module Template() {
  torch::jit::Module m("Net");
  m.register_parameter("a", torch::zeros({kWidth}), false);
  m.register_parameter("b", torch::zeros({kWidth}), false);
  m.define("def forward(self, x):\n  return (x * self.a).sum() + (x * self.b).sum()\n");
  m.eval();
  return m;
}

double Expected(int k) { return 64.0 * k + 64000.0 * k; }

void Publish(const std::string& path, int k) {
  pack(path, std::vector<std::pair<std::string, at::Tensor>>{
                 {"a", torch::full({kWidth}, static_cast<float>(k))},
                 {"b", torch::full({kWidth}, 1000.0f * k)}});
}

// Renames `bytes` over `path`, as a publisher would.
void PublishBytes(const std::string& path, const std::string& bytes) {
  WriteAll(path + ".tmp", bytes);
  ASSERT_EQ(rename((path + ".tmp").c_str(), path.c_str()), 0);
}

double Forward(torch::jit::Module& m) {
  torch::NoGradGuard no_grad;
  return m.forward({torch::ones({kWidth})}).toTensor().item<double>();
}

template <typename F>
bool WaitFor(F&& done, milliseconds limit = milliseconds{10000}) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(milliseconds{2});
  }
  return true;
}

// What this process maps or holds open under `dir`: each file once, with
// " (deleted)" when the name is gone.
struct Held {
  std::set<std::string> mapped, open_fds;
};
Held HeldUnder(const std::string& dir) {
  Held h;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t at = line.find(dir);
    if (at != std::string::npos) h.mapped.insert(line.substr(at));
  }
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) {
    char target[PATH_MAX];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    if (std::string(target).find(dir) != std::string::npos) h.open_fds.insert(target);
  }
  closedir(d);
  return h;
}

LiveOptions Quiet() {
  LiveOptions o;
  o.poll_interval = milliseconds{0};
  o.inotify = false;  // only check() looks: each step of a test is deterministic
  return o;
}

TEST(LiveTest, ServesTheFirstVersionThenMovesToEachFileRenamedOverThePath) {
  const std::string dir = TempDir(), path = dir + "/model.tsar";
  Publish(path, 1);
  const torch::jit::Module tmpl = Template();
  LiveModule live(
      path, [&] { return tmpl.clone(); }, Quiet());
  EXPECT_EQ(live.version(), 1u);
  EXPECT_EQ(Forward(*live.get()), Expected(1));
  EXPECT_EQ(live.last_error(), "");

  LiveModule::Snapshot old = live.current();
  EXPECT_FALSE(live.check());  // the same file: nothing to do
  Publish(path, 2);
  EXPECT_TRUE(live.check());
  EXPECT_EQ(live.version(), 2u);
  EXPECT_EQ(Forward(*live.get()), Expected(2));
  // A request that began on version 1 finishes on version 1.
  EXPECT_EQ(old.version, 1u);
  EXPECT_EQ(Forward(*old.module), Expected(1));
  EXPECT_EQ(old.archive->path(), path);
  // The template never served: each version is a clone.
  EXPECT_EQ(tmpl.attr("a").toTensor().sum().item<double>(), 0.0);
  EXPECT_EQ(live.stats().swaps, 1u);
}

// Publishes version 2 over version 1 and waits for `options`' watching alone
// (no check()) to serve it; `inotify` is whether inotify must be in use.
void ExpectARenameNoticed(const LiveOptions& options, bool inotify) {
  const std::string dir = TempDir(), path = dir + "/model.tsar";
  Publish(path, 1);
  const torch::jit::Module tmpl = Template();
  LiveModule live(
      path, [&] { return tmpl.clone(); }, options);
  ASSERT_EQ(live.stats().inotify, inotify);
  Publish(path, 2);
  ASSERT_TRUE(WaitFor([&] { return live.version() == 2; }));
  EXPECT_EQ(Forward(*live.get()), Expected(2));
}

TEST(LiveTest, InotifyNoticesARenameWithoutPolling) {
  LiveOptions o;
  o.poll_interval = milliseconds{0};
  ExpectARenameNoticed(o, true);
}

TEST(LiveTest, PollingAloneNoticesARename) {
  LiveOptions o;
  o.inotify = false;
  o.poll_interval = milliseconds{20};
  ExpectARenameNoticed(o, false);
}

TEST(LiveTest, BadFilesAreRefusedTheOldVersionServesAndALaterGoodFileIsTaken) {
  const std::string dir = TempDir(), path = dir + "/model.tsar";
  Publish(path, 2);
  const std::string good = ReadAll(path);
  Publish(path, 1);
  const torch::jit::Module tmpl = Template();
  std::vector<LiveEvent> events;
  LiveOptions o = Quiet();
  o.on_event = [&](const LiveEvent& e) { events.push_back(e); };
  LiveModule live(
      path, [&] { return tmpl.clone(); }, o);

  // Each bad file: refused with why, version 1 serves on.
  std::string corrupt = good;
  const float twos[4] = {2, 2, 2, 2};  // a byte of tensor a: only the checksum sees it
  const size_t a_at = good.find(std::string(reinterpret_cast<const char*>(twos), 16));
  ASSERT_NE(a_at, std::string::npos);
  corrupt[a_at] ^= 1;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {corrupt, "xxh3: expected"},
      {good.substr(0, good.size() / 2), "file_size"},
      {"not an archive at all", "magic"},
  };
  for (const auto& [bytes, why] : bad) {
    PublishBytes(path, bytes);
    EXPECT_FALSE(live.check()) << why;
    EXPECT_EQ(live.version(), 1u);
    EXPECT_EQ(Forward(*live.get()), Expected(1));
    EXPECT_NE(live.last_error().find(why), std::string::npos) << live.last_error();
    EXPECT_NE(live.last_error().find(path), std::string::npos) << live.last_error();
  }
  // The wrong architecture: bind refuses before anything changes.
  pack(path, std::vector<std::pair<std::string, at::Tensor>>{{"a", torch::ones({kWidth + 1})},
                                                             {"b", torch::ones({kWidth})}});
  EXPECT_FALSE(live.check());
  EXPECT_NE(live.last_error().find("bind"), std::string::npos) << live.last_error();
  EXPECT_NE(live.last_error().find("[65]"), std::string::npos) << live.last_error();
  EXPECT_FALSE(live.check());  // a refused file is not tried again
  EXPECT_EQ(live.stats().refused, 4u);

  PublishBytes(path, good);
  EXPECT_TRUE(live.check());
  EXPECT_EQ(live.version(), 2u);
  EXPECT_EQ(Forward(*live.get()), Expected(2));
  EXPECT_EQ(live.last_error(), "");

  // The first version is an event too (the constructor's), then four refusals, one swap.
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[0].kind, LiveEvent::Kind::kSwapped);
  EXPECT_EQ(events[0].version, 1u);
  for (size_t i = 1; i < 5; ++i) {
    EXPECT_EQ(events[i].kind, LiveEvent::Kind::kRefused);
    EXPECT_EQ(events[i].version, 1u);
    EXPECT_FALSE(events[i].error.empty());
  }
  EXPECT_EQ(events[5].kind, LiveEvent::Kind::kSwapped);
  EXPECT_EQ(events[5].version, 2u);
  EXPECT_EQ(events[5].error, "");
}

TEST(LiveTest, AFileCopiedInPlaceIsTakenOnceComplete) {
  const std::string dir = TempDir(), path = dir + "/model.tsar";
  Publish(path + ".v2", 2);
  const std::string good = ReadAll(path + ".v2");
  Publish(path, 1);
  const torch::jit::Module tmpl = Template();
  LiveOptions o;
  o.poll_interval = milliseconds{0};
  std::atomic<int> refused{0};
  o.on_event = [&](const LiveEvent& e) { refused += e.kind == LiveEvent::Kind::kRefused; };
  LiveModule live(
      path, [&] { return tmpl.clone(); }, o);
  // `rm model.tsar; cp v2 model.tsar`: the copy is looked at half written
  // (refused), then taken when the copier closes it (inotify IN_CLOSE_WRITE).
  ASSERT_EQ(unlink(path.c_str()), 0);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0);
  const size_t half = good.size() / 2;
  ASSERT_EQ(write(fd, good.data(), half), static_cast<ssize_t>(half));
  EXPECT_FALSE(live.check());
  EXPECT_NE(live.last_error().find("file_size: expected a file of"), std::string::npos)
      << live.last_error();
  EXPECT_EQ(Forward(*live.get()), Expected(1));  // version 1 serves from its unlinked file
  ASSERT_EQ(write(fd, good.data() + half, good.size() - half),
            static_cast<ssize_t>(good.size() - half));
  ASSERT_EQ(close(fd), 0);
  ASSERT_TRUE(WaitFor([&] { return live.version() == 2; })) << live.last_error();
  EXPECT_EQ(Forward(*live.get()), Expected(2));
  EXPECT_EQ(refused.load(), 1);
}

TEST(LiveTest, TheFirstFileMustServe) {
  const std::string dir = TempDir(), path = dir + "/model.tsar";
  const torch::jit::Module tmpl = Template();
  auto make = [&] { return tmpl.clone(); };
  EXPECT_TRUE(Throws([&] { LiveModule live(path, make, Quiet()); }, ErrorCode::kNotFound, path));
  pack(path, std::vector<std::pair<std::string, at::Tensor>>{{"a", torch::ones({kWidth})}});
  EXPECT_TRUE(Throws([&] { LiveModule live(path, make, Quiet()); }, ErrorCode::kBindMismatch, "b"));
  Publish(path, 1);
  LiveOptions o = Quiet();
  o.poll_interval = milliseconds{-1};
  EXPECT_TRUE(Throws([&] { LiveModule live(path, make, o); }, ErrorCode::kInvalidArgument,
                     "poll_interval"));
}

TEST(LiveTest, MakeMustBuildANewModuleEachTime) {
  const std::string dir = TempDir(), path = dir + "/model.tsar";
  Publish(path, 1);
  const torch::jit::Module shared = Template();
  // Returning one object twice would rebind the version serving in place.
  LiveModule live(
      path, [&] { return shared; }, Quiet());
  Publish(path, 2);
  EXPECT_FALSE(live.check());
  EXPECT_NE(live.last_error().find("make returned the module that is serving"), std::string::npos)
      << live.last_error();
  EXPECT_EQ(Forward(*live.get()), Expected(1));
}

TEST(LiveTest, AWarmUpThatThrowsRefusesTheFile) {
  const std::string dir = TempDir(), path = dir + "/model.tsar";
  Publish(path, 1);
  const torch::jit::Module tmpl = Template();
  std::vector<double> warmed;
  LiveModule live(
      path, [&] { return tmpl.clone(); }, Quiet(),
      [&](torch::jit::Module& m) {
        const double y = Forward(m);
        warmed.push_back(y);
        if (y > Expected(2)) throw std::runtime_error("output out of range");
      });
  Publish(path, 2);
  EXPECT_TRUE(live.check());
  Publish(path, 3);
  EXPECT_FALSE(live.check());
  EXPECT_EQ(live.last_error(), "output out of range");
  EXPECT_EQ(warmed, (std::vector<double>{Expected(1), Expected(2), Expected(3)}));
  EXPECT_EQ(live.version(), 2u);
}

TEST(LiveTest, AnOldVersionIsReleasedWhenItsLastRequestEnds) {
  const std::string dir = TempDir(), path = dir + "/model.tsar";
  Publish(path, 1);
  const torch::jit::Module tmpl = Template();
  LiveModule live(
      path, [&] { return tmpl.clone(); }, Quiet());
  auto request = live.current();
  Publish(path, 2);
  ASSERT_TRUE(live.check());
  // Version 1's file is gone from the directory but still mapped: a request holds it.
  Held h = HeldUnder(dir);
  EXPECT_EQ(h.mapped.size(), 2u);
  EXPECT_EQ(h.mapped.count(path + " (deleted)"), 1u);
  EXPECT_EQ(live.stats().retained, 1u);
  EXPECT_EQ(Forward(*request.module), Expected(1));
  request = {};
  ASSERT_TRUE(WaitFor([&] { return live.stats().retained == 0; }));
  h = HeldUnder(dir);
  EXPECT_EQ(h.mapped, std::set<std::string>{path});
  EXPECT_TRUE(h.open_fds.empty());
}

struct Net : torch::nn::Module {
  Net() : fc(register_module("fc", torch::nn::Linear(4, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::nn::Linear fc;
};

TEST(LiveTest, NnModulesFollowTheArchiveToo) {
  const std::string dir = TempDir(), path = dir + "/net.tsar";
  auto publish = [&](float k) {
    Net n;
    torch::NoGradGuard no_grad;
    n.fc->weight.fill_(k);
    n.fc->bias.fill_(-k);
    pack(path, n);
  };
  publish(1);
  int made = 0;
  LiveNnModule<Net> live(
      path,
      [&] {
        ++made;
        auto n = std::make_shared<Net>();
        n->eval();
        return n;
      },
      Quiet());
  auto out = [&](Net& n) { return n.forward(torch::ones({1, 4})).sum().item<double>(); };
  EXPECT_EQ(out(*live.get()), 2 * (4 * 1.0 - 1.0));
  publish(3);
  EXPECT_TRUE(live.check());
  LiveNnModule<Net>::Snapshot v = live.current();
  EXPECT_EQ(v.version, 2u);
  EXPECT_EQ(out(*v.module), 2 * (4 * 3.0 - 3.0));
  EXPECT_EQ(made, 2);
  EXPECT_TRUE(InRanges(v.module->fc->weight.data_ptr(), MappedRanges(path)));
}

// The acceptance test: 4 threads serve without pause while 30 new
// versions (and bad files between them) are published.
TEST(LiveTest, FourThreadsServeWithoutAFailureWhileThirtyVersionsArePublished) {
  const std::string dir = TempDir(), path = dir + "/model.tsar";
  Publish(path, 1);
  const torch::jit::Module tmpl = Template();
  LiveOptions o;
  o.poll_interval = milliseconds{50};
  LiveModule live(
      path, [&] { return tmpl.clone(); }, o, [](torch::jit::Module& m) { Forward(m); });

  constexpr int kVersions = 31;  // the first and 30 new ones
  std::map<double, int> known;
  for (int k = 1; k <= kVersions; ++k) known[Expected(k)] = k;

  std::atomic<bool> stop{false};
  std::atomic<int64_t> failures{0}, requests{0};
  std::mutex mu;
  std::vector<std::string> problems;
  std::map<uint64_t, int> file_of_version;  // every request on version v saw file k
  auto problem = [&](const std::string& p) {
    std::lock_guard<std::mutex> lock(mu);
    if (problems.size() < 10) problems.push_back(p);
  };
  auto serve = [&] {
    uint64_t last_version = 0;
    int last_file = 0;
    while (!stop.load()) {
      try {
        LiveModule::Snapshot v = live.current();
        const double y = Forward(*v.module);
        ++requests;
        auto it = known.find(y);
        if (it == known.end()) {
          problem("output " + std::to_string(y) + " is no version's");
          continue;
        }
        if (v.version < last_version || it->second < last_file) {
          problem("went back from version " + std::to_string(last_version) + " to " +
                  std::to_string(v.version));
        }
        last_version = v.version;
        last_file = it->second;
        std::lock_guard<std::mutex> lock(mu);
        auto [at, fresh] = file_of_version.emplace(v.version, it->second);
        if (!fresh && at->second != it->second) {
          problems.push_back("version " + std::to_string(v.version) + " answered as files " +
                             std::to_string(at->second) + " and " + std::to_string(it->second));
        }
      } catch (const std::exception& e) {
        ++failures;
        problem(e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(serve);

  const std::string good = ReadAll(path);
  for (int k = 2; k <= kVersions; ++k) {
    if (k % 7 == 0) {  // a bad file between two versions
      PublishBytes(path, good.substr(0, good.size() - 100));
      std::this_thread::sleep_for(milliseconds{40});
    }
    Publish(path, k);
    std::this_thread::sleep_for(milliseconds{100});
  }
  const bool reached = WaitFor([&] { return Forward(*live.get()) == Expected(kVersions); });
  // While requests go on: once the old versions' last requests ended, the
  // last version's file is the only one mapped, and nothing deleted is open.
  EXPECT_TRUE(WaitFor([&] { return live.stats().retained == 0; }));
  Held serving = HeldUnder(dir);
  EXPECT_EQ(serving.mapped, std::set<std::string>{path});
  EXPECT_TRUE(serving.open_fds.empty());
  stop = true;
  for (auto& t : threads) t.join();

  EXPECT_TRUE(reached) << live.last_error();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(problems.empty()) << problems.front();
  EXPECT_GT(requests.load(), 1000);
  const LiveStats st = live.stats();
  EXPECT_GE(st.refused, 1u);  // each bad file is refused unless a good one replaced it first
  EXPECT_GE(st.swaps, 15u);   // versions renamed in quick succession may be skipped
  EXPECT_LE(st.swaps, 30u);
  EXPECT_GE(file_of_version.size(), 10u);

  // And when the requests are gone.
  ASSERT_TRUE(WaitFor([&] { return live.stats().retained == 0; }));
  const Held h = HeldUnder(dir);
  EXPECT_EQ(h.mapped, std::set<std::string>{path});
  EXPECT_TRUE(h.open_fds.empty());
}

// samples/cpp-server's worker with --watch: each answer names its version;
// a new archive serves without a restart, a bad one leaves it serving.
TEST(LiveTest, TheSampleWorkerFollowsTheArchiveWithWatch) {
  const std::string dir = TempDir(), path = dir + "/resnet18.tsar";
  torch::jit::Module model = torch::jit::load(Fixture("resnet18_ts.pt"));
  pack(path, model);
  Worker w = Start(
      {TSAR_SAMPLE_WORKER, "--archive", path, "--model", Fixture("resnet18_ts.pt"), "--watch"});
  ASSERT_EQ(Line(w).rfind("ready load_ms=", 0), 0u);
  auto ask = [&](const std::string& request) {
    const std::string line = request + "\n";
    EXPECT_EQ(write(w.to_child, line.data(), line.size()), static_cast<ssize_t>(line.size()));
    return Line(w);
  };
  const std::string first = ask("run");
  ASSERT_NE(first.find(" version 1\n"), std::string::npos) << first;

  // Version 2: the same architecture, the classifier's weights doubled.
  {
    torch::NoGradGuard no_grad;
    model.attr("fc").toModule().attr("weight").toTensor().mul_(2);
  }
  pack(path, model);
  std::string answer;
  ASSERT_TRUE(WaitFor([&] {
    answer = ask("run");
    return answer.find(" version 2\n") != std::string::npos;
  })) << answer;
  EXPECT_NE(answer.substr(0, answer.find(" version")), first.substr(0, first.find(" version")));

  PublishBytes(path, "not an archive");
  std::string status;
  ASSERT_TRUE(WaitFor([&] {
    status = ask("version");
    return status.find("magic") != std::string::npos;
  })) << status;
  EXPECT_EQ(status.rfind("version 2 " + path + ": offset 0 (0x0): magic", 0), 0u) << status;
  EXPECT_EQ(ask("run"), answer);
  EXPECT_EQ(Finish(w), 0);
}

}  // namespace
}  // namespace tsar
