// PackOptions::tp and ::shard (spec §4.12, format 1.4): the tensors a plan
// shards are replaced by contiguous views of storages that hold their ranks'
// slices blocked, one after another. The blocked bytes are gathered from the
// source as the writer streams them, so sharding costs no memory beyond the
// writer's chunk. No LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "format/spec.h"
#include "writer/tensor_ref.h"

namespace tsar::writer {

struct ShardItem {
  const std::string* name;
  TensorRef* tensor;  // replaced by its blocked view when sharded
  bool sparse_component;
};

struct ShardPlan {
  // Per item: the dimension it is split along, or format::kNone.
  std::vector<uint32_t> dims;
  // The storages made for sharded tensors: their spans cover the whole
  // storage (slices and the padding between them).
  std::vector<const Storage*> blocked;
  // Lines for the pack's notes (ties stored twice).
  std::string note;
};

// Applies `patterns` (glob, dim; first match decides) for `world` ranks in an
// archive of `alignment`. Throws kInvalidArgument as PackOptions::shard says.
ShardPlan ApplyShardPlan(const std::vector<ShardItem>& items, uint32_t world,
                         const std::vector<std::pair<std::string, int64_t>>& patterns,
                         uint32_t alignment);

}  // namespace tsar::writer
