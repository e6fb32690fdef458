// Layered archives (spec/FORMAT.md §4.11): a layer finds its base, checks that
// it is exactly the archive it was packed against, and takes the bytes of its
// base storages from the base's mapping, so that every layer over one base
// shares the base's page-cache pages.
#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "format/checksum.h"
#include "format/reader.h"
#include "loader/archive_core.h"
#include "loader/open_file.h"

namespace tsar {
namespace {

std::string Dec(uint64_t v) { return std::to_string(v); }

std::string Hex128(uint64_t high, uint64_t low) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 "%016" PRIx64, high, low);
  return buf;
}

std::string Join(const std::string& dir, std::string_view rel) {
  if (dir == ".") return std::string(rel);
  return dir + (dir.back() == '/' ? "" : "/") + std::string(rel);
}

// §4.11.2: the recorded path from the layer's directory, then each search
// directory with that path and with its last name. The first that exists is
// the base; `tried` lists every candidate for the not-found message.
std::string FindBase(const ArchiveCore& core, const std::vector<std::string>& dirs,
                     std::vector<std::string>* tried, struct stat* st) {
  const std::string_view rel = core.index.layer().base_path;
  const size_t slash = rel.rfind('/');
  const std::string_view last = slash == std::string_view::npos ? rel : rel.substr(slash + 1);
  tried->push_back(Join(DirOf(core.path), rel));
  // A layer opened through a symbolic link (current.tsar -> v3/model.tsar)
  // records its base relative to where it really is, as the packer saw it.
  struct stat link;
  if (lstat(core.path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    if (char* real = realpath(core.path.c_str(), nullptr)) {
      const std::string there = Join(DirOf(real), rel);
      free(real);
      if (there != tried->front()) tried->push_back(there);
    }
  }
  std::vector<std::string> env;
  if (dirs.empty()) {  // TSAR_BASE_PATH: directories separated by ':'
    if (const char* v = std::getenv("TSAR_BASE_PATH")) {
      for (std::string_view rest = v; !rest.empty();) {
        const size_t colon = rest.find(':');
        env.emplace_back(rest.substr(0, colon));
        rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
      }
    }
  }
  for (const std::string& d : dirs.empty() ? env : dirs) {
    if (d.empty()) continue;
    tried->push_back(Join(d, rel));
    if (last != rel) tried->push_back(Join(d, last));
  }
  for (const std::string& c : *tried) {
    if (stat(c.c_str(), st) == 0) return c;
  }
  return {};
}

}  // namespace

void AttachBase(ArchiveCore& core, const OpenOptions& options, LayerChain* chain) {
  const format::Index& index = core.index;
  const format::LayerRecord& layer = index.layer();
  const uint64_t rec = index.LayerRecordOffset();
  if (chain->size() > format::kMaxLayerDepth) {  // R96 bounds any chain
    throw Error(ErrorCode::kBaseMismatch, core.path, rec + 28,
                "layer depth: expected at most " + Dec(format::kMaxLayerDepth) +
                    " layers under the archive opened, found more");
  }
  std::vector<std::string> tried;
  struct stat st;
  const std::string found = FindBase(core, options.base_dirs, &tried, &st);
  if (found.empty()) {
    std::string list;
    for (const auto& t : tried) list += (list.empty() ? "" : ", ") + format::Quote(t);
    throw Error(ErrorCode::kNotFound, core.path, rec + 32,
                "layer base_path: the base archive " + format::Quote(layer.base_path) +
                    " is missing (looked for " + list +
                    "); a layer needs the exact base it was packed against (search other "
                    "directories with OpenOptions::base_dirs or the TSAR_BASE_PATH environment "
                    "variable)");
  }
  for (const auto& [dev, ino] : *chain) {  // a cycle: bounded by R96 too, named here
    if (dev == st.st_dev && ino == st.st_ino) {
      throw Error(ErrorCode::kBaseMismatch, core.path, rec + 32,
                  "layer base_path: expected a base outside this layer chain, found " +
                      format::Quote(found) + ", a file already in it (a cycle)");
    }
  }
  OpenOptions base_options = options;
  base_options.verify = VerifyMode::kIndex;  // the layer's verify covers what it uses
  std::shared_ptr<const ArchiveCore> base = OpenCore(found, base_options, chain);
  const format::Index& b = base->index;

  // §4.11.3, in order. The identity covers the base's whole head, so the
  // checks after it only name what differs more precisely.
  const auto mismatch = [&](uint64_t offset, const std::string& field, const std::string& want,
                            const std::string& have) {
    throw Error(ErrorCode::kBaseMismatch, core.path, offset,
                field + ": expected " + want + ", found " + have + " in " + format::Quote(found) +
                    ", which is not the base this layer was packed against");
  };
  if (b.header().file_size != layer.base_file_size) {  // B2
    mismatch(rec + 16, "layer base_file_size", "a base of " + Dec(layer.base_file_size) + " bytes",
             Dec(b.header().file_size) + " bytes");
  }
  const format::Hash128 id = b.Identity();
  if (id.low != layer.base_id_low || id.high != layer.base_id_high) {  // B3
    mismatch(rec, "layer base_id", Hex128(layer.base_id_high, layer.base_id_low),
             Hex128(id.high, id.low) + " (XXH3-128 of its header and index)");
  }
  const uint32_t base_depth = b.is_layer() ? b.layer().depth : 0;
  if (base_depth + 1 != layer.depth) {  // B4
    mismatch(rec + 28, "layer depth", Dec(base_depth + 1) + " (1 + the depth of the base)",
             Dec(layer.depth));
  }
  if (b.storages().size() != layer.base_storage_count) {  // B5
    mismatch(rec + 24, "layer base_storage_count", Dec(layer.base_storage_count),
             Dec(b.storages().size()) + " storages");
  }
  const auto& storages = index.storages();
  for (uint32_t i = index.own_storage_count(); i < storages.size(); ++i) {  // B6
    const format::StorageRecord& s = storages[i];
    const format::StorageRecord& t = b.storages()[s.base_storage];
    if (s.nbytes != t.nbytes || s.xxh3 != t.xxh3) {
      char want[64], have[64];
      std::snprintf(want, sizeof want, "nbytes %" PRIu64 " xxh3 0x%016" PRIx64, s.nbytes, s.xxh3);
      std::snprintf(have, sizeof have, "nbytes %" PRIu64 " xxh3 0x%016" PRIx64, t.nbytes, t.xxh3);
      mismatch(index.StorageRecordOffset(i),
               "base storage #" + Dec(i - index.own_storage_count()) + " (storage #" +
                   Dec(s.base_storage) + " of the base)",
               want, have);
    }
    ArchiveCore::Source src = base->sources[s.base_storage];
    ++src.layer;
    core.sources[i] = src;
  }
  core.base = std::move(base);
}

}  // namespace tsar
