// cli/tensor_parallel.h.
#include "cli/tensor_parallel.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "format/reader.h"
#include "format/tensor_parallel.h"
#include "tsar/error.h"

namespace tsar::cli {

TpPlan DescribeTp(const ArchiveFile& a) {
  TpPlan p;
  p.world = a.tp_world();
  if (p.world == 0) return p;
  const auto storages = a.storages();
  std::vector<const TensorInfo*> blocked(storages.size(), nullptr);
  const auto infos = a.infos();
  for (const TensorInfo& t : infos) {
    if (t.shard_dim < 0) continue;
    ++p.sharded_tensors;
    ++p.by_dim[t.shard_dim];
    if (!blocked[t.storage]) blocked[t.storage] = &t;
  }
  p.ranges.resize(p.world);
  for (const StorageInfo& s : storages) {
    const TensorInfo* t = blocked[s.id];
    if (!t) {
      p.replicated_bytes += s.nbytes;
      if (s.layer == 0 && s.nbytes)
        for (auto& r : p.ranges) r.emplace_back(s.offset, s.nbytes);
      continue;
    }
    format::ShardLayout l;
    format::ComputeShardLayout(t->sizes.data(), static_cast<uint32_t>(t->sizes.size()),
                               static_cast<uint32_t>(t->shard_dim), ElementSize(t->dtype),
                               p.world, a.alignment(), &l);  // validated at open
    p.sharded_bytes += l.slice_bytes * p.world;
    p.rank_bytes += l.slice_bytes;
    if (s.layer == 0 && l.slice_bytes) {
      for (uint32_t r = 0; r < p.world; ++r)
        p.ranges[r].emplace_back(s.offset + r * l.block_stride, l.slice_bytes);
    }
  }
  p.rank_bytes += p.replicated_bytes;
  for (auto& r : p.ranges) std::sort(r.begin(), r.end());
  return p;
}

namespace {

[[noreturn]] void Bad(const std::string& path, const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, path, std::nullopt, message);
}

bool ParseDim(const std::string& v, int64_t* out) {
  if (v.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long d = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || d < -64 || d > 63) return false;
  *out = d;
  return true;
}

}  // namespace

void ApplyShardArgs(uint32_t tp, const std::vector<std::string>& shard,
                    const std::string& plan_file, PackOptions* options) {
  for (const std::string& s : shard) {
    const size_t eq = s.rfind('=');
    int64_t dim = 0;
    if (eq == std::string::npos || eq == 0 || !ParseDim(s.substr(eq + 1), &dim)) {
      Bad("", "--shard " + format::Quote(s) +
                  ": expected PATTERN=DIM (a glob over tensor names, a dimension like 0, 1 or -1)");
    }
    options->shard.emplace_back(s.substr(0, eq), dim);
  }
  uint32_t plan_tp = 0;
  if (!plan_file.empty()) {
    std::ifstream in(plan_file);
    if (!in) Bad(plan_file, "--shard-plan: cannot read the file");
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(text.str());
    } catch (const nlohmann::json::exception& e) {
      Bad(plan_file, std::string("--shard-plan: expected JSON, found: ") + e.what());
    }
    const char* shape = "{\"tp\": W (optional), \"shard\": {\"PATTERN\": DIM, ...}}";
    if (!j.is_object() || !j.contains("shard") || !j["shard"].is_object()) {
      Bad(plan_file, std::string("--shard-plan: expected an object ") + shape);
    }
    for (const auto& [key, value] : j.items()) {
      if (key != "tp" && key != "shard" && key != "comment") {
        Bad(plan_file, "--shard-plan: unknown key " + format::Quote(key) + ", expected " + shape);
      }
    }
    if (j.contains("tp")) {
      if (!j["tp"].is_number_unsigned() || j["tp"].get<uint64_t>() > format::kMaxWorld) {
        Bad(plan_file, "--shard-plan: \"tp\": expected a number of ranks 2 to " +
                           std::to_string(format::kMaxWorld) + ", found " + j["tp"].dump());
      }
      plan_tp = j["tp"].get<uint32_t>();
    }
    for (const auto& [pattern, dim] : j["shard"].items()) {
      if (!dim.is_number_integer()) {
        Bad(plan_file, "--shard-plan: pattern " + format::Quote(pattern) +
                           ": expected an integer dimension, found " + dim.dump());
      }
      options->shard.emplace_back(pattern, dim.get<int64_t>());
    }
  }
  if (tp != 0 && plan_tp != 0 && tp != plan_tp) {
    Bad(plan_file, "--tp " + std::to_string(tp) + " and the plan's \"tp\": " +
                       std::to_string(plan_tp) + " disagree");
  }
  options->tp = tp != 0 ? tp : plan_tp;
  if (options->tp == 0 && !options->shard.empty()) {
    Bad("", "--shard/--shard-plan: expected --tp W (the number of tensor-parallel ranks)");
  }
  if (options->tp != 0 && options->shard.empty()) {
    Bad("", "--tp " + std::to_string(options->tp) +
                ": expected --shard PATTERN=DIM or --shard-plan FILE saying what to split");
  }
}

}  // namespace tsar::cli
