// tsar::bind: points a module's parameters and buffers at an archive's
// tensors in place, zero copy (the module object and its TensorImpls stay).
#pragma once

#include <string>
#include <vector>

#include "tsar/archive.h"
#include "tsar/device.h"

namespace torch::nn {
class Module;
}
namespace torch::jit {
struct Module;
}

namespace tsar {

struct BindOptions {
  // "" = the only entry; with several, the one named "model", else the only
  // one holding parameters or buffers, else bind() throws kNotFound listing
  // them (a checkpoint's optimizer state is never bound by accident).
  std::string entry;
  bool strict = true;  // throw on any missing, unexpected or mismatched name
  // Allow a module in training mode over a kShared archive. Training-mode
  // layers (BatchNorm's running stats) write their buffers: SIGSEGV.
  bool allow_training = false;
  // Names that differ by a prefix: a module name M matches the archive name
  // archive_prefix + (M without module_prefix). archive_prefix "module."
  // binds an archive of a DistributedDataParallel model ("module.fc.weight")
  // into the plain model; module_prefix "model." binds an archive of the
  // plain model into a wrapper whose names start with "model.". A module
  // name without module_prefix is missing; archive names without
  // archive_prefix are unexpected.
  std::string archive_prefix;
  std::string module_prefix;
  // Tensor parallelism (spec §4.12): with world > 1, the module is rank
  // `rank`'s of `world` (0 <= rank < world): a parameter whose shape is the
  // archive tensor's split `world` ways along one dimension gets rank's
  // slice, torch.chunk(full, world, dim)[rank] (Archive::shard: zero-copy,
  // and one contiguous run of the file for a tensor the archive was packed
  // sharded for `world` ranks); one with the whole shape gets the whole
  // tensor. For a tensor packed sharded, the split must be along its packed
  // dimension. Other shapes are mismatches naming both shapes.
  int64_t rank = 0;
  int64_t world = 0;
  // Where the bound tensors live. cpu (the default): in the archive's
  // mapping, zero copy. A CUDA device: after the match above, the bytes the
  // module's tensors would view (per storage, the range its views touch: a
  // rank copies its own slices) are copied once to that GPU through
  // to_device's staging pipeline (`staging`: bounded pinned memory, several
  // streams, several fill threads); only then do the module's tensors (the
  // same TensorImpls, as Module::to does it) become views of the device
  // copies, so ties and views stay one device storage and the mapping is
  // not referenced by the module. A training-mode module is fine there.
  // Refused before anything changes: kUnsupported when this LibTorch has no
  // CUDA or no device is present, kInvalidArgument for a device index past
  // the machine's devices or staging options out of range; a failed GPU
  // allocation or copy changes nothing either. Tensors the archive does not
  // hold stay where they are (the Python load_into moves them too).
  c10::Device device = c10::Device(c10::kCPU);
  DeviceOptions staging;
  // On the CPU over a mapped archive (kShared, kCopyOnWrite): once bound, a
  // thread of its own reads the bytes the bound tensors view into the page
  // cache and this process's page tables, in file order (loader/read_ahead.h),
  // while bind returns at once; a rank reads only its own slices. For a
  // server that binds at start and serves later: its first request then
  // touches no disk and takes no page fault. Skipped when those bytes exceed
  // half of the memory available. Off by default: where the first forward
  // follows the bind at once, the kernel's own read-ahead of the first
  // touches reads as fast (bench/README.md, "Read-ahead").
  bool read_ahead = false;
};

struct BindReport {
  std::vector<std::string> bound;       // names now pointing into the archive
  std::vector<std::string> missing;     // in the module, not in the archive
  std::vector<std::string> unexpected;  // in the archive, not in the module
  std::vector<std::string> mismatched;  // "name: shape [2, 3] vs archive [3, 2]" ...
  // Names the archive lacks whose tensor is the same object as one bound by
  // another name (a tied weight stored once, as save_pretrained stores
  // lm_head.weight): bound through that tie, in strict mode too.
  std::vector<std::string> tied;
};

// Rebinds every parameter and buffer (named as state_dict() names them) to
// the archive's tensor of the same name. Afterwards each one's data_ptr()
// lies inside the archive's mapping; tied parameters share storage again;
// requires_grad of parameters is kept. A name the archive lacks whose tensor
// is the same object as one bound by name (tied weights stored once) is
// bound through the tie and reported in `tied`, not `missing`. One tensor
// under two names the archive holds with different bytes is a mismatch.
// Strict mode throws kBindMismatch listing every mismatch before changing
// anything; non-strict binds what matches and reports the rest. kInvalidArgument for a training-mode module
// over a kShared archive. A module on the meta device (its tensors registered
// as meta tensors: LibTorch's Module::to(kMeta) refuses, set_data() keeps types),
// wholly or partly, is bound in place too: each meta tensor becomes a CPU
// tensor over the archive (same TensorImpl, so member handles stay valid);
// a meta tensor left unbound is kBindMismatch even when not strict, and a
// tensor on another device (CUDA) is kInvalidArgument; nothing is changed
// then. Not thread-safe for one module; different modules may be bound
// concurrently from one Archive.
BindReport bind(torch::nn::Module& module, const Archive& archive, const BindOptions& options = {});
BindReport bind(torch::jit::Module& module, const Archive& archive,
                const BindOptions& options = {});

}  // namespace tsar
