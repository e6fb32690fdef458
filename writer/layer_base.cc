// writer::LayerBase (writer/layer_base.h).
#include "writer/layer_base.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "format/checksum.h"
#include "format/reader.h"
#include "loader/archive_core.h"

namespace tsar::writer {
namespace {

constexpr uint64_t kChunk = 4u << 20;

// The base's path relative to the directory `out` will be in, as §4.11
// records it: '/'-separated, from the real directories of both.
std::string RelativePath(const std::string& base, const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(fs::absolute(out).parent_path(), ec);
  const fs::path target = fs::weakly_canonical(fs::absolute(base), ec);
  const fs::path rel = target.lexically_relative(dir);
  return rel.generic_string();
}

}  // namespace

LayerBase::LayerBase(const std::string& base_path, const std::string& out_path)
    : base_(ArchiveFile::open(base_path)) {
  struct stat b, o;
  if (stat(out_path.c_str(), &o) == 0 && stat(base_path.c_str(), &b) == 0 && b.st_dev == o.st_dev &&
      b.st_ino == o.st_ino) {
    throw Error(ErrorCode::kInvalidArgument, out_path, std::nullopt,
                "the output is the base " + format::Quote(base_path) +
                    " itself: a layer is written beside its base, never over it");
  }
  const auto& index = base_.core()->index;
  const uint32_t depth = index.is_layer() ? index.layer().depth : 0;
  if (depth >= format::kMaxLayerDepth) {
    throw Error(ErrorCode::kInvalidArgument, out_path, std::nullopt,
                "base " + format::Quote(base_path) + " is already a layer of depth " +
                    std::to_string(depth) + ", the most the format allows (" +
                    std::to_string(format::kMaxLayerDepth) +
                    "): flatten it first (tsar pack --flatten)");
  }
  const format::Hash128 id = index.Identity();
  layer_.base_id_low = id.low;
  layer_.base_id_high = id.high;
  layer_.base_file_size = base_.file_size();
  layer_.base_storage_count = static_cast<uint32_t>(index.storages().size());
  layer_.depth = depth + 1;
  layer_.base_path = RelativePath(base_path, out_path);
  if (!format::IsRelativePath(layer_.base_path)) {
    throw Error(ErrorCode::kInvalidArgument, out_path, std::nullopt,
                "base " + format::Quote(base_path) +
                    ": no relative path leads there from the "
                    "output's directory (found " +
                    format::Quote(layer_.base_path) + ")");
  }
  for (uint32_t i = 0; i < index.storages().size(); ++i) {
    const auto& s = index.storages()[i];
    if (s.nbytes > 0) by_content_[{s.nbytes, s.xxh3}].push_back(i);
  }
}

uint32_t LayerBase::Find(const Storage& storage, uint64_t begin, uint64_t n) const {
  if (n == 0 || by_content_.empty()) return format::kNone;
  std::vector<uint8_t> buffer;
  format::Xxh3Stream hash;
  for (uint64_t off = 0; off < n; off += kChunk) {
    const uint64_t len = std::min(kChunk, n - off);
    hash.Update(storage.Bytes(begin + off, len, buffer), static_cast<size_t>(len));
  }
  const auto it = by_content_.find({n, hash.Digest()});
  if (it == by_content_.end()) return format::kNone;
  for (const uint32_t candidate : it->second) {  // a hash narrows; bytes decide
    const auto* theirs = static_cast<const uint8_t*>(base_.storage_data(candidate));
    bool equal = true;
    for (uint64_t off = 0; off < n && equal; off += kChunk) {
      const uint64_t len = std::min(kChunk, n - off);
      equal = std::memcmp(storage.Bytes(begin + off, len, buffer), theirs + off, len) == 0;
    }
    if (equal) return candidate;
  }
  return format::kNone;
}

}  // namespace tsar::writer
