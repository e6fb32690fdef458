// The packer's side of layered archives (spec/FORMAT.md §4.11): the base an
// archive is packed against, and which of the new storages it already holds.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/encode.h"
#include "tsar/archive_file.h"
#include "writer/tensor_ref.h"

namespace tsar::writer {

class LayerBase {
 public:
  // Opens `base_path` (and its own bases) for the archive about to be
  // written at `out_path`. Throws what ArchiveFile::open throws, and
  // kInvalidArgument naming the output for a base that is the output itself
  // or already kMaxLayerDepth layers deep.
  LayerBase(const std::string& base_path, const std::string& out_path);

  // The storage of the base whose bytes equal bytes [begin, begin + n) of
  // `storage` (compared byte for byte, after a hash narrowed the
  // candidates), or format::kNone. Empty spans never match: they cost nothing.
  uint32_t Find(const Storage& storage, uint64_t begin, uint64_t n) const;

  // The layer record for the archive: the base's identity, its path
  // relative to the output's directory, depth 1 + the base's.
  const format::LayerSpec& layer() const { return layer_; }
  const ArchiveFile& archive() const { return base_; }

 private:
  ArchiveFile base_;
  format::LayerSpec layer_;
  // (nbytes, xxh3) of a base storage -> its lowest storage index.
  struct Key {
    uint64_t nbytes, xxh3;
    bool operator==(const Key& o) const { return nbytes == o.nbytes && xxh3 == o.xxh3; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return k.xxh3 ^ (k.nbytes * 0x9E3779B97F4A7C15ull); }
  };
  std::unordered_map<Key, std::vector<uint32_t>, KeyHash> by_content_;
};

}  // namespace tsar::writer
