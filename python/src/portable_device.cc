// _tsar_portable.stage_to_device: python/src/portable_device.h.
#include "python/src/portable_device.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "loader/archive_core.h"
#include "loader/device_pipeline.h"
#include "loader/file_regions.h"
#include "tsar/archive_file.h"
#include "tsar/error.h"

namespace py = pybind11;

namespace tsar::python {
namespace {

// CopyEngine over a Python object (tsar/_portable_device.py's engines):
// allocate(buffer, nbytes) -> address of pinned memory; copy(stream, src
// address, target, offset, n), record(stream, buffer), wait(buffer),
// finish(); a direct lane's engine also enter_thread() and register(address,
// n) -> bool. RunPipeline calls each engine from one thread (the staging
// lane's: the one that runs it; a direct lane's: its own), which holds no GIL
// while the fill threads copy; each call takes it.
class PyEngine : public CopyEngine {
 public:
  explicit PyEngine(py::object engine, bool direct = false)
      : allocate_(engine.attr("allocate")),
        copy_(engine.attr("copy")),
        record_(engine.attr("record")),
        wait_(engine.attr("wait")),
        finish_(engine.attr("finish")),
        enter_(direct ? engine.attr("enter_thread") : py::object()),
        register_(direct ? engine.attr("register") : py::object()) {}
  ~PyEngine() override {
    const py::gil_scoped_acquire gil;
    allocate_ = copy_ = record_ = wait_ = finish_ = enter_ = register_ = py::object();
  }
  void EnterThread() override {
    if (!enter_) return;
    const py::gil_scoped_acquire gil;
    enter_();
  }
  // Memory the caller locked already (pin="register"): the engine says
  // whether [p, p + n) lies inside it; nothing is locked here.
  bool Register(const void* p, uint64_t n) override {
    if (!register_) return false;
    const py::gil_scoped_acquire gil;
    return register_(reinterpret_cast<uintptr_t>(p), n).cast<bool>();
  }
  void* AllocatePinned(int buffer, uint64_t bytes) override {
    const py::gil_scoped_acquire gil;
    return reinterpret_cast<void*>(allocate_(buffer, bytes).cast<uintptr_t>());
  }
  void CopyAsync(int stream, const void* src, uint32_t target, uint64_t offset,
                 uint64_t n) override {
    const py::gil_scoped_acquire gil;
    copy_(stream, reinterpret_cast<uintptr_t>(src), target, offset, n);
  }
  void RecordDone(int stream, int buffer) override {
    const py::gil_scoped_acquire gil;
    record_(stream, buffer);
  }
  void WaitDone(int buffer) override {
    const py::gil_scoped_acquire gil;
    wait_(buffer);
  }
  void Finish() override {
    const py::gil_scoped_acquire gil;
    finish_();
  }

 private:
  py::object allocate_, copy_, record_, wait_, finish_, enter_, register_;
};

}  // namespace

void DefPortableDevice(py::module_& m) {
  // Copies the bytes of `storages` (archive storage numbers; storage k of
  // the list is target k) through the staging pipeline. make_engine(sizes,
  // streams) is called first, with the GIL, with each target's size in bytes
  // and the number of streams the staging rule chose; it returns the engine
  // (above), which owns the targets. options: (pinned_bytes, buffers,
  // streams, fill_threads, stage_from_file), as DeviceOptions. make_direct,
  // where not None, makes the engine of a direct lane that has the GPU read
  // memory the caller locked (pin="register": the archive's mapping) as it
  // is: the staging lane then copies only what lies outside it, on one
  // stream, as the accelerator's to_device (loader/device.cc). Returns
  // (bytes, bytes_direct, pinned_bytes, bytes_from_file, fill_threads,
  // streams), as DeviceStats.
  m.def(
      "stage_to_device",
      [](const ArchiveFile& file, const std::vector<uint32_t>& storages,
         const py::object& make_engine,
         const std::tuple<uint64_t, int, int, int, bool>& options,
         const py::object& make_direct) {
        const auto [pinned_bytes, buffers, streams, fill_threads, from_file] = options;
        if (const std::string bad = StagingOptionsError(buffers, streams, fill_threads);
            !bad.empty()) {
          throw Error(ErrorCode::kInvalidArgument, file.path(), std::nullopt,
                      "to_device: " + bad);
        }
        const auto& records = file.core()->index.storages();
        std::vector<uint64_t> sizes;
        std::vector<CopyRange> ranges;
        for (uint32_t s : storages) {
          if (s >= records.size()) {
            throw Error(ErrorCode::kNotFound, file.path(), std::nullopt,
                        "storage #" + std::to_string(s) + ": the archive has " +
                            std::to_string(records.size()) + " storages");
          }
          const uint64_t n = records[s].nbytes;
          if (n > 0) {
            ranges.push_back({static_cast<const uint8_t*>(file.storage_values(s)), n,
                              static_cast<uint32_t>(sizes.size()), 0});
          }
          sizes.push_back(n);
        }
        const PipelineOptions p = LoadPipeline(pinned_bytes, buffers, streams, fill_threads,
                                               !make_direct.is_none());
        EngineFactory direct;
        if (!make_direct.is_none()) {
          direct = [&make_direct] {
            const py::gil_scoped_acquire gil;
            return std::unique_ptr<CopyEngine>(std::make_unique<PyEngine>(make_direct(), true));
          };
        }
        PyEngine engine(make_engine(sizes, p.streams));
        // The fill: the archive's file where its mapping shows it.
        StagingFill fill(*file.core(), from_file);
        PipelineStats s;
        {
          const py::gil_scoped_release no_gil;
          s = RunPipeline(ranges, engine, p, fill.function(), direct);
        }
        return std::make_tuple(s.bytes, s.bytes_direct, s.pinned_bytes, fill.bytes_from_file(),
                               s.fill_threads, p.streams);
      },
      py::arg("file"), py::arg("storages"), py::arg("make_engine"), py::arg("options"),
      py::arg("make_direct") = py::none());
}

}  // namespace tsar::python
