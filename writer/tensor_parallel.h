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

using ShardPatterns = std::vector<std::pair<std::string, int64_t>>;

// The first of `patterns` whose glob matches `name` (fnmatch; '*' also
// matches dots), or patterns.size() when none does.
size_t MatchShardPattern(const std::string& name, const ShardPatterns& patterns);

// The dimension (0 to ndim - 1) along which `pattern` splits tensor `name`
// (`t`) for `world` ranks. Throws kInvalidArgument, with no path, naming the
// tensor and the pattern, for what cannot be split: a sparse component, a
// scalar, a dim outside the shape, a size not divisible by world, a view that
// is not C-contiguous. PackFiles calls it at import, to name the input.
uint32_t ShardDimOf(const std::string& name, const TensorRef& t, bool sparse_component,
                    uint32_t world, const std::pair<std::string, int64_t>& pattern);

// Applies `patterns` (glob, dim; first match decides) for `world` ranks in an
// archive of `alignment`. Throws kInvalidArgument as PackOptions::shard says.
ShardPlan ApplyShardPlan(const std::vector<ShardItem>& items, uint32_t world,
                         const std::vector<std::pair<std::string, int64_t>>& patterns,
                         uint32_t alignment);

}  // namespace tsar::writer
