// Tensors written out piece by piece: an export never holds more than one
// bounded piece of a tensor in memory, however large the tensor it makes
// contiguous (a 4-byte storage expanded to 2^28 elements is 1 GiB of output).
// No LibTorch: a tensor is its storage's bytes and its strided view.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tsar/archive_file.h"

namespace tsar::exporter {

// Up to this many bytes of a non-contiguous tensor are made contiguous at once.
inline constexpr uint64_t kPieceBytes = uint64_t{32} << 20;

// A strided view of bytes that hold every element it reaches (an archive's
// tensors, validated at open).
struct StridedView {
  const uint8_t* storage;  // the storage's first byte
  uint64_t element_size;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  uint64_t storage_offset;  // in elements
};

// Tensor `t` of `archive` (its storage in the archive's file or a base's).
StridedView ViewOf(const ArchiveFile& archive, const TensorInfo& t);

// A run of a tensor's elements in C order: `nbytes` bytes at `data`, which
// are the block of the tensor starting at index `start` (one per dimension)
// with `count` elements along each dimension.
struct Piece {
  const void* data;
  uint64_t nbytes;
  std::vector<int64_t> start;
  std::vector<int64_t> count;
};

// Calls `fn` with pieces covering every element of `x` once, in C order.
// A contiguous `x` is one piece that points into its storage (no copy); a
// strided one (an expanded or transposed view) is copied out in blocks of
// whole rows of at most `max_bytes` where a row fits, element rows otherwise.
// Nothing is called for a tensor without elements.
void ForEachPiece(const StridedView& x, const std::function<void(const Piece&)>& fn,
                  uint64_t max_bytes = kPieceBytes);

}  // namespace tsar::exporter
