// LiveBase (include/tsar/live.h): the watching thread, the current version,
// and the old versions still held by requests.
//
// Versions are immutable: each is a module built and bound once, before it
// is published, and never touched again. Publishing swaps one shared_ptr
// under a mutex; a request copies it under the same mutex and holds its copy
// to its end, so it sees one version throughout. An old version is kept in
// `retired` until no request holds it, then released on the watching thread,
// so a request never pays for the munmap and module teardown of the version
// it ran on.
#include "tsar/live.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "loader/path_watch.h"

namespace tsar {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// While an old version waits for its last request, the watching thread
// looks this often whether it can be released.
constexpr milliseconds kReleaseInterval{5};

struct Slot {
  std::shared_ptr<void> module;
  uint64_t version;
  Archive archive;
  FileIdentity id;
};

}  // namespace

struct LiveBase::State {
  std::string path;
  Build build;
  LiveOptions options;

  mutable std::mutex mu;  // guards the next four
  std::shared_ptr<const Slot> current;
  std::string last_error;
  uint64_t swaps = 0;
  uint64_t refused = 0;

  std::mutex load_mu;  // one look at the path at a time (watcher and check())
  std::optional<FileIdentity> last_tried;

  std::mutex retired_mu;
  std::vector<std::shared_ptr<const Slot>> retired;

  std::unique_ptr<PathWatch> watch;
  std::atomic<bool> stop{false};
  std::thread thread;

  std::shared_ptr<const Slot> Serving() const {
    std::lock_guard<std::mutex> lock(mu);
    return current;
  }

  void Notify(const LiveEvent& event) {
    if (!options.on_event) return;
    try {
      options.on_event(event);
    } catch (...) {  // a logging callback must not end the watching thread
    }
  }

  // Builds version serving+1 from the file at the path if it is one not
  // seen before; publishes it or records why not. Caller holds load_mu.
  bool Look() {
    const std::optional<FileIdentity> id = IdentityOf(path);
    std::shared_ptr<const Slot> serving = Serving();
    if (!id) {
      if (!serving) Archive::open(path, options.open);  // throws why (kNotFound...)
      return false;  // removed or being replaced: the current version serves on
    }
    if ((serving && *id == serving->id) || (last_tried && *id == *last_tried)) return false;
    last_tried = id;
    const auto t0 = Clock::now();
    const uint64_t next = serving ? serving->version + 1 : 1;
    auto elapsed = [&] {
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    std::string error;
    double open_ms = 0;
    try {
      // If the path changes between the stat above and this open, the slot
      // records the older identity, so the next look opens the path again.
      Archive archive = Archive::open(path, options.open);
      open_ms = elapsed();
      std::shared_ptr<void> module =
          build(archive, options.bind, serving ? serving->module.get() : nullptr);
      auto slot = std::make_shared<const Slot>(Slot{std::move(module), next, archive, *id});
      {
        std::lock_guard<std::mutex> lock(mu);
        current = slot;
        last_error.clear();
        if (serving) ++swaps;
      }
      if (serving) {
        std::lock_guard<std::mutex> lock(retired_mu);
        retired.push_back(std::move(serving));
      }
      Notify({LiveEvent::Kind::kSwapped, path, next, "", elapsed(), open_ms});
      return true;
    } catch (const std::exception& e) {
      if (!serving) throw;  // the first version: the constructor fails
      error = e.what();
    } catch (...) {
      if (!serving) throw;
      error = path + ": unknown exception while loading the new version";
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      last_error = error;
      ++refused;
    }
    Notify({LiveEvent::Kind::kRefused, path, serving->version, error, elapsed(), open_ms});
    return false;
  }

  // Releases, on this thread, every old version no request holds any more.
  // True while some are still held.
  bool ReleaseUnused() {
    std::vector<std::shared_ptr<const Slot>> done;
    bool left;
    {
      std::lock_guard<std::mutex> lock(retired_mu);
      // Only `retired` can hand out new references to an old version (the
      // current pointer moved on), so a count of 1 cannot grow again.
      auto keep = std::partition(retired.begin(), retired.end(),
                                 [](const auto& s) { return s.use_count() > 1; });
      done.assign(std::make_move_iterator(keep), std::make_move_iterator(retired.end()));
      retired.erase(keep, retired.end());
      left = !retired.empty();
    }
    done.clear();  // module, tensors, mapping: outside the lock
    return left;
  }

  void Run() {
    const milliseconds poll = options.poll_interval;
    auto next_poll = Clock::now() + poll;
    bool holding = false;
    while (!stop.load()) {
      milliseconds timeout{-1};
      if (poll.count() > 0) {
        timeout = std::max(milliseconds{0},
                           std::chrono::duration_cast<milliseconds>(next_poll - Clock::now()));
      }
      if (holding && (timeout.count() < 0 || timeout > kReleaseInterval)) {
        timeout = kReleaseInterval;
      }
      const PathWatch::Woke woke = watch->Wait(timeout);
      if (stop.load()) break;
      bool look = woke == PathWatch::Woke::kEvent;
      if (poll.count() > 0 && Clock::now() >= next_poll) {
        look = true;
        next_poll = Clock::now() + poll;
      }
      if (look) {
        std::lock_guard<std::mutex> lock(load_mu);
        Look();
      }
      holding = ReleaseUnused();
    }
  }
};

LiveBase::LiveBase(std::string path, Build build, LiveOptions options)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.path = std::move(path);
  s.build = std::move(build);
  s.options = std::move(options);
  if (s.options.poll_interval.count() < 0) {
    throw Error(ErrorCode::kInvalidArgument, s.path, std::nullopt,
                "LiveOptions::poll_interval: expected 0 (no polling) or more, found " +
                    std::to_string(s.options.poll_interval.count()) + " ms");
  }
  // The watch starts first: a file renamed over the path while the first
  // version loads is an event the thread's first wait returns at once.
  s.watch = std::make_unique<PathWatch>(s.path, s.options.inotify);
  // The first version: what open, make, bind or warm_up throws if it cannot serve.
  {
    std::lock_guard<std::mutex> lock(s.load_mu);
    s.Look();
  }
  s.thread = std::thread([&s] {
    if (s.options.loader_nice != 0) {
      // Linux: a thread's nice value is its own (setpriority on its tid).
      const int now = getpriority(PRIO_PROCESS, 0);
      setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)),
                  now + s.options.loader_nice);
    }
    s.Run();
  });
}

LiveBase::~LiveBase() {
  state_->stop.store(true);
  state_->watch->Wake();
  state_->thread.join();
}

const std::string& LiveBase::path() const { return state_->path; }

uint64_t LiveBase::version() const { return state_->Serving()->version; }

std::string LiveBase::last_error() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->last_error;
}

LiveStats LiveBase::stats() const {
  LiveStats st;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    st.version = state_->current->version;
    st.swaps = state_->swaps;
    st.refused = state_->refused;
  }
  {
    std::lock_guard<std::mutex> lock(state_->retired_mu);
    st.retained = state_->retired.size();
  }
  st.inotify = state_->watch->inotify();
  return st;
}

bool LiveBase::check() {
  bool swapped;
  {
    std::lock_guard<std::mutex> lock(state_->load_mu);
    swapped = state_->Look();
  }
  state_->watch->Wake();  // the watching thread then releases what it can
  return swapped;
}

LiveBase::Version LiveBase::Current() const {
  std::shared_ptr<const Slot> slot = state_->Serving();
  const uint64_t version = slot->version;
  void* module = slot->module.get();
  const Archive* archive = &slot->archive;
  return {std::shared_ptr<void>(slot, module), version,
          std::shared_ptr<const Archive>(std::move(slot), archive)};
}

}  // namespace tsar
