// tsar::LiveModule and tsar::LiveNnModule: a module that follows the archive
// at a path. When a new file is published there (renamed over it, as
// `tsar pack` does), a background thread opens and verifies it, binds it into
// a fresh module and only then swaps that module in. Requests running on the
// old version finish on it; new requests get the new one; a bad file is
// refused and the old version keeps serving. No restart, no copy.
//
//   tsar::LiveModule live("model.tsar", [] {
//     auto m = torch::jit::load("model_arch_ts.pt");  // the architecture
//     m.eval();
//     return m;
//   });
//   // per request:
//   auto v = live.current();          // {module, version, archive}, held to the end
//   auto y = v.module->forward({x});  // always one version's weights, never a mix
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tsar/archive.h"
#include "tsar/bind.h"
#include "tsar/error.h"

namespace torch::jit {
struct Module;
}

namespace tsar {

// What happened to a new file at the watched path.
struct LiveEvent {
  enum class Kind {
    kSwapped,  // the new file now serves as `version`
    kRefused,  // the new file was refused (`error` says why); `version` serves on
  };
  Kind kind;
  std::string path;   // the watched path
  uint64_t version;   // the version serving after this event
  std::string error;  // kRefused: the one-line message (tsar::Error::what() or make's)
  double load_ms;     // open + verify + make + bind + warm_up of the new file
  double open_ms;     // of which open + verify (what tsar does before make)
};

struct LiveOptions {
  // How each version is opened. Defaults to VerifyMode::kFull: every storage's
  // checksum is checked before a version serves (it also reads the file into
  // the page cache, so a new version's first requests do not fault pages in).
  OpenOptions open = FullVerify();
  BindOptions bind;
  // Watching: inotify on the path's directory notices a rename at once; every
  // poll_interval the path is also stat()ed, which is what notices changes
  // inotify cannot see (network file systems, a symbolic link retargeted
  // elsewhere) and is all there is where inotify is unavailable. A zero
  // poll_interval turns polling off; inotify false turns inotify off; with
  // both off only check() looks for a new file.
  bool inotify = true;
  std::chrono::milliseconds poll_interval{1000};
  // Added to the watching thread's nice value (setpriority on its thread),
  // so that on a host whose cores are all busy serving, loading a new
  // version (verify, make, bind, warm_up: CPU work) yields to requests
  // instead of slowing them; the new version then serves later. 0 keeps
  // the process's priority; 19 is the lowest.
  int loader_nice = 0;
  // Called on the watching thread (or check()'s caller) after each swap or
  // refusal, for logging. It must not call check(); what it throws is ignored.
  std::function<void(const LiveEvent&)> on_event;

  static OpenOptions FullVerify() {
    OpenOptions o;
    o.verify = VerifyMode::kFull;
    return o;
  }
};

// Counters of a live module, for monitoring.
struct LiveStats {
  uint64_t version = 0;   // serving now
  uint64_t swaps = 0;     // versions published after the first
  uint64_t refused = 0;   // new files refused
  uint64_t retained = 0;  // old versions still held by a request
  bool inotify = false;   // whether inotify is watching (else polling only)
};

// The engine under LiveModule and LiveNnModule: the watching thread, the
// current version, the old versions still in use. Its build step turns an
// opened archive into a bound module; everything else does not depend on
// the kind of module.
class LiveBase {
 public:
  LiveBase(const LiveBase&) = delete;
  LiveBase& operator=(const LiveBase&) = delete;
  // Stops watching. Versions still held by requests stay valid.
  ~LiveBase();

  const std::string& path() const;
  uint64_t version() const;  // 1 for the first archive, +1 per swap
  // Why the latest new file was refused; "" once a later file was taken.
  std::string last_error() const;
  LiveStats stats() const;
  // Looks at the path now, on this thread; true when a new version was
  // published. The watching thread calls the same; calls are serialized.
  bool check();

 protected:
  // Builds a new version from an opened archive: a fresh module bound to it,
  // type-erased. `serving` is the module of the version now serving (null for
  // the first), so a build can refuse to hand back the same object.
  using Build = std::function<std::shared_ptr<void>(
      const Archive& archive, const BindOptions& bind_options, const void* serving)>;
  // Opens the first version now, on this thread: throws tsar::Error (or what
  // the build throws) if it cannot serve. Then starts watching.
  LiveBase(std::string path, Build build, LiveOptions options);

  // Both pointers share one count, that of the whole version (module,
  // archive, mapping): the version is released, on the watching thread, once
  // no request holds either.
  struct Version {
    std::shared_ptr<void> module;
    uint64_t version = 0;
    std::shared_ptr<const Archive> archive;
  };
  Version Current() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A TorchScript module that follows the archive at `path`. `make` builds a
// fresh module of the architecture each time it is called, in eval mode:
// torch::jit::load of an architecture file (`tsar pack --arch` writes one
// without weights). Prefer it to clone() of a template: LibTorch 1.13's
// Module::clone() never frees the copy of the parameters it makes (4 MiB
// lost per clone of a module with 4 MiB of parameters, measured), so memory
// would grow with every swap. Its weights are then bound to the new archive. `warm_up`, if given,
// runs on the bound module before it is published: one forward pass on a sample input checks the
// architecture end to end and lets TorchScript's profiling executor compile, so the first request
// on a new version is not slow. A throw from make, bind or warm_up refuses the file.
class LiveModule : public LiveBase {
 public:
  using Make = std::function<torch::jit::Module()>;
  using WarmUp = std::function<void(torch::jit::Module&)>;
  LiveModule(std::string path, Make make, LiveOptions options = {}, WarmUp warm_up = {});

  struct Snapshot {
    std::shared_ptr<torch::jit::Module> module;
    uint64_t version = 0;
    std::shared_ptr<const Archive> archive;  // the version's archive (its metadata, its path)
  };
  // The current version; it stays valid (module, weights, mapping) while the
  // caller holds it, however many swaps happen meanwhile. Thread-safe.
  Snapshot current() const;
  std::shared_ptr<torch::jit::Module> get() const { return current().module; }
};

// The same for a torch::nn::Module subclass M: `make` returns a fresh
// std::shared_ptr<M> (std::make_shared<Net>(), in eval mode).
template <class M>
class LiveNnModule : public LiveBase {
 public:
  using Make = std::function<std::shared_ptr<M>()>;
  using WarmUp = std::function<void(M&)>;
  LiveNnModule(std::string path, Make make, LiveOptions options = {}, WarmUp warm_up = {})
      : LiveBase(std::move(path), BuildWith(std::move(make), std::move(warm_up)),
                 std::move(options)) {}

  struct Snapshot {
    std::shared_ptr<M> module;
    uint64_t version = 0;
    std::shared_ptr<const Archive> archive;
  };
  Snapshot current() const {
    Version v = Current();
    return {std::shared_ptr<M>(v.module, static_cast<M*>(v.module.get())), v.version,
            std::move(v.archive)};
  }
  std::shared_ptr<M> get() const { return current().module; }

 private:
  static Build BuildWith(Make make, WarmUp warm_up) {
    return [make = std::move(make), warm_up = std::move(warm_up)](
               const Archive& archive, const BindOptions& bind_options,
               const void* serving) -> std::shared_ptr<void> {
      std::shared_ptr<M> m = make();
      if (!m || m.get() == serving) {
        throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                    m ? "make returned the module that is serving; it must build a new one"
                      : "make returned no module");
      }
      tsar::bind(*m, archive, bind_options);
      if (warm_up) warm_up(*m);
      return m;
    };
  }
};

}  // namespace tsar
