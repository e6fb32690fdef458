// cli/tensor_parallel.h.
#include "cli/tensor_parallel.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "format/reader.h"
#include "format/tensor_parallel.h"
#include "loader/open_file.h"
#include "tsar/error.h"
#include "writer/strict_json.h"

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
  for (const StorageInfo& s : storages) {
    const TensorInfo* t = blocked[s.id];
    if (!t) {
      p.replicated_bytes += s.nbytes;
      if (s.layer == 0 && s.nbytes) p.runs.push_back({s.offset, 0, s.nbytes});
      continue;
    }
    format::ShardLayout l;
    format::ComputeShardLayout(t->sizes.data(), static_cast<uint32_t>(t->sizes.size()),
                               static_cast<uint32_t>(t->shard_dim), ElementSize(t->dtype),
                               p.world, a.alignment(), &l);  // validated at open
    p.sharded_bytes += l.slice_bytes * p.world;
    p.rank_bytes += l.slice_bytes;
    if (s.layer == 0 && l.slice_bytes) p.runs.push_back({s.offset, l.block_stride, l.slice_bytes});
  }
  p.rank_bytes += p.replicated_bytes;
  // Storages do not overlap, and a rank's slice lies inside its storage: in
  // this order every rank's ranges are sorted too.
  std::sort(p.runs.begin(), p.runs.end(),
            [](const TpPlan::Run& x, const TpPlan::Run& y) { return x.offset < y.offset; });
  return p;
}

std::vector<std::pair<uint64_t, uint64_t>> TpPlan::RankRanges(uint32_t rank) const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  out.reserve(runs.size());
  for (const Run& r : runs) out.emplace_back(r.offset + uint64_t{rank} * r.stride, r.length);
  return out;
}

namespace {

[[noreturn]] void Bad(const std::string& path, const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, path, std::nullopt, message);
}

// A dimension as --shard and the plan take it: -64 to 63 (the format's
// tensors have at most 64 dimensions).
constexpr int64_t kMinDim = -static_cast<int64_t>(format::kMaxNdim);
constexpr int64_t kMaxDim = static_cast<int64_t>(format::kMaxNdim) - 1;

bool ParseDim(const std::string& v, int64_t* out) {
  if (v.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long d = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || d < kMinDim || d > kMaxDim) return false;
  *out = d;
  return true;
}

// A plan is a few lines; this bounds the read (`--shard-plan /dev/zero`).
constexpr uint64_t kMaxPlanSize = 16u << 20;

// The plan file's text: a regular file (a FIFO would block, a device never
// end) of at most kMaxPlanSize bytes.
std::string ReadPlan(const std::string& path) {
  struct stat st;
  int fd = -1;
  try {
    fd = OpenRegularFile(path, &st, ErrorCode::kInvalidArgument);
  } catch (const Error& e) {
    std::string why = e.what();
    const std::string head = path + ": ";
    if (why.compare(0, head.size(), head) == 0) why = why.substr(head.size());
    Bad(path, "--shard-plan: cannot read the file: " + why);
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > kMaxPlanSize) {
    close(fd);
    Bad(path, "--shard-plan: expected a JSON file of at most " + std::to_string(kMaxPlanSize) +
                  " bytes, found " + std::to_string(size));
  }
  std::string text(static_cast<size_t>(size), '\0');
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = pread(fd, text.data() + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      Bad(path, n == 0 ? std::string("--shard-plan: the file shrank while it was read")
                       : std::string("--shard-plan: cannot read: ") + std::strerror(err));
    }
    done += static_cast<uint64_t>(n);
  }
  close(fd);
  return text;
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
    const std::string text = ReadPlan(plan_file);
    // Strict JSON: a pattern given twice is an error, not "the last one wins".
    nlohmann::json j;
    importer::KeyOrder order;
    try {
      j = importer::ParseStrictJson(text, plan_file, 0, "plan", "key", &order);
    } catch (const Error& e) {
      std::string why = e.what();
      const std::string head = plan_file + ": ";
      if (why.compare(0, head.size(), head) == 0) why = why.substr(head.size());
      Bad(plan_file, "--shard-plan: expected JSON (" + why + ")");
    }
    const char* shape = "{\"tp\": W (optional), \"shard\": {\"PATTERN\": DIM, ...}}";
    if (!j.is_object() || !j.contains("shard") || !j["shard"].is_object()) {
      Bad(plan_file, std::string("--shard-plan: expected an object ") + shape);
    }
    for (const std::string& key : order.root) {
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
    for (const std::string& pattern : order.members["shard"]) {  // in file order
      const nlohmann::json& dim = j["shard"][pattern];
      // As --shard: -64 to 63; 18446744073709551615 is not -1.
      const bool in_range = dim.is_number_integer() &&
                            (dim.is_number_unsigned()
                                 ? dim.get<uint64_t>() <= static_cast<uint64_t>(kMaxDim)
                                 : dim.get<int64_t>() >= kMinDim && dim.get<int64_t>() <= kMaxDim);
      if (!in_range) {
        Bad(plan_file, "--shard-plan: pattern " + format::Quote(pattern) +
                           ": expected an integer dimension " + std::to_string(kMinDim) + " to " +
                           std::to_string(kMaxDim) + " (-1 = last), found " + dim.dump());
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
