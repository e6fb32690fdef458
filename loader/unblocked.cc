// ArchiveFile::storage_values (include/tsar/archive_file.h): the C-order
// copy of a storage holding a sharded tensor's slices (spec §4.12).
#include <algorithm>

#include "format/tensor_parallel.h"
#include "loader/archive_core.h"
#include "tsar/archive_file.h"

namespace tsar {

const void* ArchiveFile::storage_values(uint32_t i) const {
  const void* raw = storage_data(i);  // throws kNotFound past the last storage
  const format::Index& index = core_->index;
  if (index.tp_world() == 0) return raw;
  std::lock_guard<std::mutex> lock(core_->unblocked_mutex);
  std::vector<uint32_t>& of = core_->sharded_tensor_of;
  if (of.empty()) {  // storage -> its first sharded tensor (R110: all of them alike)
    of.assign(index.storages().size(), format::kNone);
    for (uint32_t k = 0; k < index.tensors().size(); ++k) {
      const format::TensorRecord& r = index.tensors()[k];
      if (r.shard_dim != format::kNone && of[r.storage] == format::kNone) of[r.storage] = k;
    }
  }
  if (of[i] == format::kNone) return raw;
  const format::ShardLayout l = index.ShardLayoutOf(index.tensors()[of[i]]);
  // Slices that fill their blocks, one after another in C order: the bytes
  // are the tensor's already (§4.12.3).
  if (l.outer <= 1 && l.block_stride == l.slice_bytes) return raw;
  auto it = core_->unblocked.find(i);
  if (it == core_->unblocked.end()) {
    std::vector<uint8_t> bytes(index.storages()[i].nbytes, 0);
    format::ScatterBlocked(l, static_cast<const uint8_t*>(raw), bytes.data());
    it = core_->unblocked.emplace(i, std::move(bytes)).first;
  }
  return it->second.data();
}

}  // namespace tsar
