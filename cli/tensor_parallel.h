// What `tsar inspect` and `tsar residency` say about an archive laid out for
// tensor-parallel ranks (spec §4.12): the plan, and which byte ranges of the
// file each rank reads (its slices of the sharded storages, and the
// storages every rank reads whole). No LibTorch. Memory and time are linear
// in the archive's storages, never in world x storages: a valid archive of
// 160 KiB can say 65536 ranks, so a rank's ranges are computed when asked
// for (RankRanges), one rank at a time.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include <string>

#include "tsar/archive_file.h"
#include "tsar/pack_options.h"

namespace tsar::cli {

struct TpPlan {
  uint32_t world = 0;                  // 0: not a tensor-parallel archive
  size_t sharded_tensors = 0;
  std::map<int64_t, size_t> by_dim;    // split dimension -> tensors
  uint64_t sharded_bytes = 0;          // all slices of the sharded storages
  uint64_t replicated_bytes = 0;       // storages every rank reads whole
  uint64_t rank_bytes = 0;             // what one rank reads: its slices + the replicated
  // This file's storages (a layer's base storages left out), by offset:
  // rank r reads [offset + r * stride, offset + r * stride + length); stride
  // 0 for a storage every rank reads whole. Empty storages left out.
  struct Run {
    uint64_t offset, stride, length;
  };
  std::vector<Run> runs;
  // [offset, offset + length) of this file that `rank` reads, sorted by
  // offset (one per run).
  std::vector<std::pair<uint64_t, uint64_t>> RankRanges(uint32_t rank) const;
};

TpPlan DescribeTp(const ArchiveFile& a);

// How many ranks `tsar residency` lists one by one (each costs a pass over
// the archive's storages); the rest are counted in a note.
inline constexpr uint32_t kMaxListedRanks = 256;

// `tsar pack --tp W --shard PATTERN=DIM ... --shard-plan FILE` into
// PackOptions::tp and ::shard: the --shard patterns first (they take
// precedence), then the plan file's, in file order. The plan file is JSON:
// {"tp": W (optional), "shard": {"PATTERN": DIM, ...}}. Throws
// kInvalidArgument naming the flag or the file (and what it expected).
void ApplyShardArgs(uint32_t tp, const std::vector<std::string>& shard,
                    const std::string& plan_file, PackOptions* options);

}  // namespace tsar::cli
