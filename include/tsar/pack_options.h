// tsar::PackOptions: how an archive is written (tsar/writer.h, and `tsar
// pack` through tsar::PackFiles). No LibTorch here.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tsar/dtype.h"

namespace tsar {

struct PackOptions {
  // Storages of at least this many bytes start on a multiple of it; smaller
  // ones on 64 bytes. A power of two in [64, 2^30].
  uint32_t alignment = 4096;
  // Entry that tensors go to when no add_entry() was called.
  std::string entry = "model";
  // Called as bytes are written: (bytes done, bytes total).
  std::function<void(uint64_t, uint64_t)> progress;
  // fsync the file and its directory before returning (off only in tests).
  bool durable = true;
  // When set (kFloat16, kBFloat16, kFloat32 or kFloat64): every floating-point
  // tensor (float64, float32, float16, bfloat16) is stored as this dtype,
  // converted storage by storage, so tensors that shared a storage still
  // share one. Integer, bool and complex tensors are stored as they are, and
  // so is a storage that tensors view with two dtypes. Values are rounded to
  // nearest, ties to even, as LibTorch's .to() rounds them (float64 to a
  // 16-bit dtype through float32, as there). A NaN stays a NaN: float16
  // sign | 0x7E00, bfloat16 0x7FC0, float32 and float64 quieted with their
  // payload. The converted storages are held in memory until finish() has
  // written them.
  std::optional<DType> dtype;
  // Called with a line about what finish() changed (what `dtype` converted,
  // how much a layer takes from its base).
  std::function<void(const std::string&)> note;
  // A base archive (spec §4.11): when set, the archive is written as a layer
  // over it. Every storage whose bytes equal a storage of the base (compared
  // byte for byte) is not written but referenced, so that processes opening
  // the layer share the base's pages. The layer records the base's path
  // relative to its own directory and the base's identity (the XXH3-128 of
  // its header and index): opening it later needs exactly that base file
  // (Archive::open finds it, OpenOptions::base_dirs elsewhere). A base may
  // itself be a layer, up to 8 deep. When no storage matches, a plain
  // archive is written (and `note` says so).
  std::string base;
  // Tensor parallelism (spec §4.12, format 1.4): with `tp` >= 2, every tensor
  // whose name matches a pattern of `shard` is split along that pattern's
  // dimension into `tp` equal slices, stored so that each rank's slice is one
  // contiguous run of the file starting on an `alignment` boundary (on 64
  // bytes for a slice smaller than `alignment`). Patterns are shell globs
  // (fnmatch: '*' matches any run of characters, dots included, '?' one,
  // '[...]' a set) matched against tensor names in every entry; the first
  // pattern that matches a name decides, and a dimension may be negative
  // (-1 is the last). Every other tensor is stored once, whole, for every
  // rank. Refused with kInvalidArgument, naming the pattern or the tensor: a
  // pattern that matches no tensor, a dimension out of range, a size not
  // divisible by `tp`, a sparse tensor, or a tensor that is not C-contiguous.
  // A sharded tensor tied to one that is not sharded the same way is stored
  // twice (and `note` says so). Use `alignment` 2 MiB (what `tsar pack --tp`
  // and Python default to): the kernel maps the cached pages around a fault
  // (fault-around, large folios of up to 2 MiB), so slices that start on
  // 2 MiB keep a rank's mappings off its neighbours' pages (P15: a rank maps
  // 1.01x of its bytes, against 1.03x at 512 KiB and 1.07x at 4 KiB; the
  // padding is zeros no process reads). The written archive leaves the page
  // cache (POSIX_FADV_DONTNEED), whose folios of up to 2 MiB a fault maps
  // whole: ranks started right after packing read back their own runs.
  uint32_t tp = 0;
  std::vector<std::pair<std::string, int64_t>> shard;
};

}  // namespace tsar
