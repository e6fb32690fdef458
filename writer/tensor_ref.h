// What the packer writes, without LibTorch: storages (bytes with an owner)
// and tensors viewing them (dtype, sizes, strides, offset). Importers make
// them over their mapped input; tsar::Writer makes them from at::Tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "format/spec.h"
#include "tsar/archive_file.h"
#include "tsar/dtype.h"

namespace tsar::writer {

// A storage's bytes. Tensors share a storage when they hold the same
// Storage object; the writer writes it once, only the span they cover.
struct Storage {
  // Host bytes [data, data + nbytes), or null when they must be fetched
  // (a CUDA storage): then fetch(begin, n, out) copies bytes [begin, begin + n).
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::function<void(uint64_t, uint64_t, uint8_t*)> fetch;
  // Keeps `data` alive (a mapping, a buffer, a LibTorch storage).
  std::shared_ptr<const void> keep;
  // Where the archive says the tensors live (spec §4.5).
  format::DeviceType device_type = format::DeviceType::kUnspecified;
  uint16_t device_index = 0;

  // A storage that owns `bytes`.
  static std::shared_ptr<Storage> Owning(std::vector<uint8_t> bytes);
  // Bytes [begin, begin + n): in place for host bytes, else fetched into
  // `buffer` (resized to n), which the pointer then points into.
  const uint8_t* Bytes(uint64_t begin, uint64_t n, std::vector<uint8_t>& buffer) const;
};

// A strided view of a storage; sizes and strides in elements, checked
// against the storage by whoever made it (importer::MakeView).
struct TensorRef {
  std::shared_ptr<const Storage> storage;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  uint64_t storage_offset = 0;  // in elements
  bool requires_grad = false;

  uint64_t numel() const;  // 0 when any size is 0; the caller checked overflow
  bool is_floating_point() const;
  // The bytes [*begin, *end) of its storage that the view can reach
  // (begin == end for a tensor without elements).
  void ByteSpan(uint64_t* begin, uint64_t* end) const;
};

// A sparse tensor (spec §4.6): its component tensors, in the order of the
// spec (COO: indices, values; CSR: crow_indices, col_indices, values; CSC:
// ccol_indices, row_indices, values), named "<name>.<component>".
//
// With layout kGroup, a tensor group (spec §4.13, format 1.5: a torchao
// quantized tensor): its inner tensors as components ("<name>.qdata"...),
// the outer dtype, sizes and strides, and its description, the JSON text the
// writer stores as the entry's string metadata "group:<name>".
struct SparseRef {
  format::SparseLayout layout = format::SparseLayout::kCoo;
  bool coalesced = false;
  std::vector<int64_t> sizes;
  std::vector<std::pair<std::string, TensorRef>> components;  // suffix (".values"), tensor
  // Groups only:
  DType dtype = DType::kFloat32;
  std::vector<int64_t> strides;
  std::string description;
};

}  // namespace tsar::writer
