// tsar::ArchiveFile: open, validate and map an archive, and everything it
// gives without LibTorch (spec/FORMAT.md §4, §6). Archive (archive.cc) adds
// tensors.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "format/checksum.h"
#include "format/reader.h"
#include "format/value_tree.h"
#include "loader/archive_core.h"
#include "loader/hash_storages.h"
#include "loader/not_an_archive.h"
#include "loader/open_file.h"
#include "loader/read_ahead.h"
#include "loader/value_tree.h"

namespace tsar {
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

void PreadAll(int fd, uint8_t* out, uint64_t n, const std::string& path) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t got =
        pread(fd, out + done, static_cast<size_t>(n - done), static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw Error(ErrorCode::kIo, path, done, std::string("cannot read: ") + std::strerror(errno));
    if (got == 0) throw Error(ErrorCode::kTruncated, path, done, "file shrank while being read");
    done += static_cast<uint64_t>(got);
  }
}

std::string QuoteName(const std::string& s) { return format::Quote(s); }

}  // namespace

ArchiveCore::ArchiveCore(std::string p, format::Index i, std::unique_ptr<Mapping> m)
    : path(std::move(p)), index(std::move(i)), mapping(std::move(m)) {
  sources.resize(index.storages().size());
  for (uint32_t s = 0; s < index.own_storage_count(); ++s) {
    sources[s] = {mapping->data() + index.storages()[s].offset, this, s, 0};
  }
  RegisterMapping(this);
}
ArchiveCore::~ArchiveCore() { UnregisterMapping(this); }

uint32_t ArchiveCore::FindSparse(uint32_t entry, std::string_view name) const {
  const auto& sparse = index.sparse();
  for (uint32_t i = 0; i < sparse.size(); ++i) {
    if (sparse[i].entry == entry && sparse[i].name == name) return i;
  }
  return format::kNone;
}

uint32_t ArchiveCore::BindEntry(const std::string& entry) const {
  const auto& entries = index.entries();
  if (!entry.empty() || entries.size() <= 1) return Entry(entry);
  // Several entries (a checkpoint: model, optimizer state, ema...): never
  // whichever came first. "model", else the one entry of parameters or
  // buffers, else the caller must say.
  const uint32_t model = index.FindEntry("model");
  if (model != format::kNone) return model;
  std::vector<uint32_t> modules;
  for (uint32_t e = 0; e < entries.size(); ++e) {
    for (uint32_t i = 0; i < entries[e].tensor_count; ++i) {
      const auto role = index.tensors()[entries[e].first_tensor + i].role;
      if (role == format::Role::kParameter || role == format::Role::kBuffer) {
        modules.push_back(e);
        break;
      }
    }
  }
  if (modules.size() == 1) return modules[0];
  std::string have;
  for (const auto& x : entries) have += (have.empty() ? "" : ", ") + QuoteName(std::string(x.name));
  throw Error(ErrorCode::kNotFound, path, std::nullopt,
              "bind: which entry? The archive has " + std::to_string(entries.size()) +
                  " entries (" + have + "), none named \"model\" and " +
                  (modules.empty() ? std::string("none") : std::to_string(modules.size())) +
                  " of parameters or buffers; name one with BindOptions::entry (Python: "
                  "entry=, CLI: --entry)");
}

uint32_t ArchiveCore::Entry(const std::string& entry) const {
  const auto& entries = index.entries();
  if (entry.empty()) {
    if (entries.empty())
      throw Error(ErrorCode::kNotFound, path, std::nullopt, "the archive has no entries");
    return 0;
  }
  const uint32_t e = index.FindEntry(entry);
  if (e == format::kNone) {
    std::string have;
    for (const auto& x : entries)
      have += (have.empty() ? "" : ", ") + QuoteName(std::string(x.name));
    throw Error(ErrorCode::kNotFound, path, std::nullopt,
                "entry " + QuoteName(entry) + ": expected one of " + have);
  }
  return e;
}

uint32_t ArchiveCore::Find(const std::string& name, const std::string& entry) const {
  const uint32_t e = Entry(entry);
  const uint32_t t = index.FindTensor(e, name);
  if (t == format::kNone) {
    throw Error(ErrorCode::kNotFound, path, std::nullopt,
                "tensor " + QuoteName(name) + ": not in entry " +
                    QuoteName(std::string(index.entries()[e].name)));
  }
  return t;
}

std::string ArchiveCore::QualifiedName(uint32_t tensor) const {
  const auto& t = index.tensors()[tensor];
  return std::string(index.entries()[t.entry].name) + "/" + std::string(t.name);
}

ArchiveFile ArchiveFile::open(const std::string& path, const OpenOptions& options) {
  LayerChain chain;
  ArchiveFile archive(OpenCore(path, options, &chain));
  if (options.verify == VerifyMode::kFull) archive.verify();
  return archive;
}

std::shared_ptr<const ArchiveCore> OpenCore(const std::string& path, const OpenOptions& options,
                                            LayerChain* chain) {
  struct stat st;
  Fd fd(OpenRegularFile(path, &st, ErrorCode::kInvalidArgument));
  chain->emplace_back(st.st_dev, st.st_ino);  // AttachBase refuses a cycle
  const auto file_size = static_cast<uint64_t>(st.st_size);

  // Header first, then exactly [0, data_offset) into private memory: the
  // index is validated on bytes no other process can change afterwards.
  uint8_t first[format::kHeaderSize];
  const uint64_t first_n = std::min<uint64_t>(file_size, sizeof first);
  PreadAll(fd.get(), first, first_n, path);
  format::Header h;
  try {
    h = format::DecodeHeader(first, first_n, file_size, path);
  } catch (const Error& e) {
    // R1 says only that the magic is wrong: say what the file is, and what to do.
    if (e.code() == ErrorCode::kBadMagic) throw WithNotAnArchiveHint(e);
    throw;
  }
  std::vector<uint8_t> head(h.data_offset);
  PreadAll(fd.get(), head.data(), head.size(), path);
  format::Index index = format::Index::Parse(std::move(head), file_size, path);

  bool refused = false;
  std::unique_ptr<Mapping> mapping =
      Mapping::Create(fd.get(), st, options.mode, options.prefetch, path, &refused);
  if (refused) {
    if (!options.fallback_to_read) {
      throw Error(ErrorCode::kIo, path, std::nullopt,
                  std::string("cannot mmap: ") + std::strerror(errno));
    }
    std::fprintf(stderr,
                 "tsar: warning: %s: mmap refused (%s); reading into private memory instead\n",
                 path.c_str(), std::strerror(errno));
    mapping =
        Mapping::Create(fd.get(), st, MapMode::kRead, options.prefetch, path, &refused);
  }

  auto core = std::make_shared<ArchiveCore>(path, std::move(index), std::move(mapping));
  if (core->index.is_layer()) AttachBase(*core, options, chain);
  if (options.prefetch == Prefetch::kWillNeed && core->mapping->mode() != MapMode::kRead) {
    StartReadAhead(core, {{core->mapping->data(), core->mapping->size()}});
  }
  return core;
}

const char* RoleName(Role role) noexcept {
  switch (role) {
    case Role::kParameter:
      return "parameter";
    case Role::kBuffer:
      return "buffer";
    case Role::kSparseComponent:
      return "sparse_component";
    case Role::kTensor:
      break;
  }
  return "tensor";
}

const std::string& ArchiveFile::path() const { return core_->path; }
MapMode ArchiveFile::mode() const { return core_->mapping->mode(); }
uint16_t ArchiveFile::format_major() const { return core_->index.header().major; }
uint16_t ArchiveFile::format_minor() const { return core_->index.header().minor; }
uint32_t ArchiveFile::alignment() const { return core_->index.header().alignment; }
uint64_t ArchiveFile::file_size() const { return core_->index.header().file_size; }
const void* ArchiveFile::data() const { return core_->mapping->data(); }
uint64_t ArchiveFile::mapped_size() const { return core_->mapping->size(); }

std::vector<std::string> ArchiveFile::entries() const {
  std::vector<std::string> out;
  for (const auto& e : core_->index.entries()) out.emplace_back(e.name);
  return out;
}

std::vector<std::string> ArchiveFile::names(const std::string& entry) const {
  std::vector<std::string> out;
  core_->ForEachVisible(core_->Entry(entry),
                        [&](std::string_view name, uint32_t, uint32_t) { out.emplace_back(name); });
  return out;
}

bool ArchiveFile::contains(const std::string& name, const std::string& entry) const {
  const uint32_t e = core_->Entry(entry);
  return core_->index.FindTensor(e, name) != format::kNone ||
         core_->FindSparse(e, name) != format::kNone;
}

namespace {
TensorInfo MakeInfo(const format::Index& index, uint32_t i) {
  const auto& t = index.tensors()[i];
  TensorInfo info;
  info.name = std::string(t.name);
  info.entry = std::string(index.entries()[t.entry].name);
  info.dtype = t.dtype;
  info.sizes.assign(index.sizes(t), index.sizes(t) + t.ndim);
  info.strides.assign(index.strides(t), index.strides(t) + t.ndim);
  info.storage_offset = t.storage_offset;
  info.storage = t.storage;
  info.role = static_cast<Role>(t.role);
  info.requires_grad = t.requires_grad;
  if (t.shard_dim != format::kNone) info.shard_dim = t.shard_dim;
  return info;
}
}  // namespace

uint32_t ArchiveFile::tp_world() const { return core_->index.tp_world(); }

std::vector<GroupInfo> ArchiveFile::groups(const std::string& entry) const {
  const format::Index& index = core_->index;
  const uint32_t e = core_->Entry(entry);
  std::vector<GroupInfo> out;
  for (uint32_t s = 0; s < index.sparse().size(); ++s) {
    const format::SparseRecord& sp = index.sparse()[s];
    if (sp.entry != e || !index.IsGroup(s)) continue;
    GroupInfo g;
    g.name = std::string(sp.name);
    g.entry = std::string(index.entries()[e].name);
    g.dtype = sp.dtype;
    const int64_t* dims = index.dims().data() + sp.dims_index;
    g.sizes.assign(dims, dims + sp.ndim);
    g.strides.assign(dims + sp.ndim, dims + 2 * sp.ndim);
    for (uint32_t k = 0; k < sp.component_count; ++k)
      g.members.emplace_back(index.tensors()[sp.first_component + k].name);
    g.description = std::string(index.GroupDescription(s));
    out.push_back(std::move(g));
  }
  return out;
}

TensorInfo ArchiveFile::info(const std::string& name, const std::string& entry) const {
  return MakeInfo(core_->index, core_->Find(name, entry));
}

std::vector<TensorInfo> ArchiveFile::infos() const {
  std::vector<TensorInfo> out;
  for (uint32_t i = 0; i < core_->index.tensors().size(); ++i)
    out.push_back(MakeInfo(core_->index, i));
  return out;
}

std::vector<StorageInfo> ArchiveFile::storages() const {
  std::vector<StorageInfo> out;
  const auto& s = core_->index.storages();
  out.reserve(s.size());
  for (uint32_t i = 0; i < s.size(); ++i) {
    const ArchiveCore::Source& src = core_->sources[i];
    out.push_back({i, src.owner->index.storages()[src.storage].offset, s[i].nbytes, s[i].xxh3,
                   src.layer, src.storage});
  }
  return out;
}

const void* ArchiveFile::storage_data(uint32_t i) const {
  if (i >= core_->sources.size()) {
    throw Error(ErrorCode::kNotFound, path(), std::nullopt,
                "storage #" + std::to_string(i) + ": the archive has " +
                    std::to_string(core_->sources.size()) + " storages");
  }
  return core_->StorageData(i);
}

bool ArchiveFile::is_layer() const { return core_->index.is_layer(); }

std::vector<std::string> ArchiveFile::layers() const {
  std::vector<std::string> out;
  for (const ArchiveCore* c = core_.get(); c != nullptr; c = c->base.get()) out.push_back(c->path);
  return out;
}

MetadataValue MetadataValueOf(const format::MetadataRecord& m) {
  switch (m.type) {
    case format::MetaType::kString:
      return std::string(m.bytes);
    case format::MetaType::kInt:
      return m.int_value;
    case format::MetaType::kFloat:
      return m.float_value;
    case format::MetaType::kBytes:
      return Bytes{std::string(m.bytes)};
  }
  return int64_t{0};
}

bool ArchiveFile::has_value_tree() const { return !core_->index.values().empty(); }

Value ArchiveFile::value() const {
  if (has_value_tree()) return format::DecodeTree(core_->index);
  // Each entry's "torch._metadata", found in one pass over the metadata.
  const auto& index = core_->index;
  std::vector<std::optional<std::string>> torch_metadata(index.entries().size());
  for (const auto& m : index.metadata()) {
    if (m.entry != format::kNone && m.key == "torch._metadata" &&
        m.type == format::MetaType::kString)
      torch_metadata[m.entry] = std::string(m.bytes);
  }
  return ImpliedValue(
      entries(), [&](const std::string& e) { return torch_metadata[index.FindEntry(e)]; },
      metadata_items());
}

std::optional<MetadataValue> ArchiveFile::metadata(const std::string& key,
                                                   const std::string& entry) const {
  const uint32_t e = entry.empty() ? format::kNone : core_->Entry(entry);
  for (const auto& m : core_->index.metadata()) {
    if (m.entry == e && m.key == key) return MetadataValueOf(m);
  }
  return std::nullopt;
}

std::vector<std::pair<std::string, MetadataValue>> ArchiveFile::metadata_items(
    const std::string& entry) const {
  const uint32_t e = entry.empty() ? format::kNone : core_->Entry(entry);
  std::vector<std::pair<std::string, MetadataValue>> out;
  for (const auto& m : core_->index.metadata()) {
    if (m.entry == e) out.emplace_back(std::string(m.key), MetadataValueOf(m));
  }
  return out;
}

std::vector<std::string> ArchiveFile::metadata_keys(const std::string& entry) const {
  const uint32_t e = entry.empty() ? format::kNone : core_->Entry(entry);
  std::vector<std::string> out;
  for (const auto& m : core_->index.metadata()) {
    if (m.entry == e) out.emplace_back(m.key);
  }
  return out;
}

namespace {

std::vector<uint64_t> HashStorages(const ArchiveCore& core) {
  std::vector<ByteRange> ranges;
  for (uint32_t i = 0; i < core.index.storages().size(); ++i) {
    ranges.push_back({core.StorageData(i), core.index.storages()[i].nbytes});
  }
  return HashRanges(ranges);
}

}  // namespace

std::vector<std::string> ArchiveFile::damaged() const {
  const auto& index = core_->index;
  const std::vector<uint64_t> hashes = HashStorages(*core_);
  std::vector<bool> bad(index.storages().size());
  for (uint32_t i = 0; i < index.storages().size(); ++i) {
    bad[i] = hashes[i] != index.storages()[i].xxh3;
  }
  std::vector<std::string> out;
  for (uint32_t t = 0; t < index.tensors().size(); ++t) {
    if (bad[index.tensors()[t].storage]) out.push_back(core_->QualifiedName(t));
  }
  return out;
}

void ArchiveFile::verify() const {
  const auto& index = core_->index;
  const std::vector<uint64_t> hashes = HashStorages(*core_);
  for (uint32_t i = 0; i < index.storages().size(); ++i) {  // the first damaged, in file order
    const auto& s = index.storages()[i];
    const uint64_t got = hashes[i];
    if (got == s.xxh3) continue;
    const ArchiveCore::Source& src = core_->sources[i];
    std::string tensors;
    for (uint32_t t = 0; t < index.tensors().size(); ++t) {
      if (index.tensors()[t].storage == i)
        tensors += (tensors.empty() ? "" : ", ") + QuoteName(core_->QualifiedName(t));
    }
    char want[24], found[24];
    std::snprintf(want, sizeof want, "0x%016llx", static_cast<unsigned long long>(s.xxh3));
    std::snprintf(found, sizeof found, "0x%016llx", static_cast<unsigned long long>(got));
    // A base's storage is reported in the base file, where its bytes are.
    const std::string where = src.layer == 0 ? std::string()
                                             : " (base storage of " + path() + ", storage #" +
                                                   std::to_string(src.storage) + " of this base)";
    throw Error(ErrorCode::kChecksumMismatch, src.owner->path,
                src.owner->index.storages()[src.storage].offset,
                "storage #" + std::to_string(i) + where + " (tensors " + tensors +
                    "): xxh3: expected " + want + ", found " + found);
  }
}

}  // namespace tsar
