// tsar::ArchiveFile: opens a .tsar file (spec/FORMAT.md) with mmap and gives
// its index, metadata, value tree and bytes, without LibTorch (what the `tsar`
// command reads archives with). tsar::Archive (archive.h) is the same with
// tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tsar/dtype.h"
#include "tsar/error.h"
#include "tsar/value.h"

namespace tsar {

// How the file's bytes become memory.
enum class MapMode {
  // PROT_READ + MAP_SHARED: every process mapping the file shares its
  // page-cache pages. Tensors alias READ-ONLY memory: any in-place write
  // (add_, copy_, BatchNorm in train()) kills the process with SIGSEGV.
  kShared,
  // PROT_READ|PROT_WRITE + MAP_PRIVATE: writes are private copy-on-write
  // pages; the file never changes.
  kCopyOnWrite,
  // pread() into private heap memory: for file systems where mmap fails or
  // is slow (FUSE, some network file systems). Costs a full copy.
  kRead,
};

enum class Prefetch {
  kNone,      // pages come in on first touch
  kWillNeed,  // the whole file read into the page cache by a thread of its own,
              // while open() returns at once (loader/read_ahead.h)
  kPopulate,  // MAP_POPULATE: every page mapped before open() returns
  kLock,      // mlock: populated and pinned in RAM (needs RLIMIT_MEMLOCK)
};

enum class VerifyMode {
  kIndex,  // header and index checksum only (always done)
  kFull,   // also every storage's XXH3-64 before open() returns
};

struct OpenOptions {
  MapMode mode = MapMode::kShared;
  // When mmap is refused (ENODEV, EACCES...), fall back to kRead with a
  // warning on stderr instead of throwing.
  bool fallback_to_read = true;
  Prefetch prefetch = Prefetch::kNone;
  VerifyMode verify = VerifyMode::kIndex;
  // A layer (an archive packed with a base, spec §4.11) finds its base at the
  // path it records, relative to its own directory; then in each of these
  // directories, as that relative path and as its last name. The base found
  // must be exactly the one the layer was packed against (kBaseMismatch
  // otherwise); none found is kNotFound. Bases are opened with the same
  // mode and prefetch. When empty: the directories of the environment
  // variable TSAR_BASE_PATH (separated by ':'), if set.
  std::vector<std::string> base_dirs;
};

// Role of a tensor in its entry (spec §4.5).
enum class Role : uint8_t { kTensor = 0, kParameter = 1, kBuffer = 2, kSparseComponent = 3 };
// "tensor", "parameter", "buffer", "sparse_component": as inspect --json and
// Python's TensorInfo.role spell it.
const char* RoleName(Role role) noexcept;

// What the index says about one tensor, without touching its bytes.
struct TensorInfo {
  std::string name;
  std::string entry;
  DType dtype;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  uint64_t storage_offset;  // in elements
  uint32_t storage;         // equal for tensors that share a storage
  Role role;
  bool requires_grad;
  // §4.12: the dimension a tensor-parallel archive splits it along for its
  // ranks (its storage then holds the ranks' slices, not the tensor in C
  // order), or -1 for a tensor stored whole.
  int64_t shard_dim = -1;
};

// A tensor group (spec §4.13, format 1.5): one tensor made of several, as a
// torchao quantized weight is. C++ gives its parts; Python's tsar rebuilds
// the class (tsar.open(p).state_dict()). `members` are the component tensors'
// names in the archive ("w.qdata"), in component order; `description` is the
// JSON text that names the class, each component's role ("qdata") and the
// class's attributes.
struct GroupInfo {
  std::string name;
  std::string entry;
  DType dtype;  // the outer tensor's
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  std::vector<std::string> members;
  std::string description;
};

struct StorageInfo {
  uint32_t id;
  uint64_t offset;  // absolute offset in the file that holds it (layers()[layer])
  uint64_t nbytes;
  uint64_t xxh3;
  // Which file of a layer chain holds its bytes: 0 this archive, 1 its base,
  // 2 the base's base... (always 0 for a plain archive); and its storage
  // index in that file.
  uint32_t layer = 0;
  uint32_t layer_storage = 0;
};

// Bytes metadata values (type 4), distinct from UTF-8 strings (type 1).
struct Bytes {
  std::string data;
  bool operator==(const Bytes& o) const { return data == o.data; }
};
using MetadataValue = std::variant<std::string, int64_t, double, Bytes>;

struct ArchiveCore;  // loader/archive_core.h

// An open archive without LibTorch: everything tsar::Archive gives but
// tensors. Cheap to copy (copies share the mapping). Immutable after open():
// every const member may be called from many threads at once. If the file is
// truncated while mapped, touching a lost page raises SIGBUS: replace
// archives by renaming a new file over the old one (as `tsar pack` does),
// never by rewriting in place.
class ArchiveFile {
 public:
  // Opens and validates header and index (spec §6), and for a layer its
  // bases (§4.11). Throws tsar::Error: kNotFound / kIo for the file or a
  // base, any decode code for bad bytes, kBaseMismatch for a base that is
  // not the one packed against (or a cycle), kChecksumMismatch under
  // VerifyMode::kFull (which covers the base storages the layer uses).
  static ArchiveFile open(const std::string& path, const OpenOptions& options = {});

  const std::string& path() const;
  MapMode mode() const;  // kRead after a fallback
  uint16_t format_major() const;
  uint16_t format_minor() const;
  uint32_t alignment() const;
  uint64_t file_size() const;

  // Entry names in file order. Functions taking `entry` use the first entry
  // when it is empty. An unknown entry throws kNotFound. Names are those a
  // user sees: a sparse tensor (spec §4.6) by its own name, in the place of
  // its first component; its components only through infos().
  std::vector<std::string> entries() const;
  std::vector<std::string> names(const std::string& entry = "") const;
  bool contains(const std::string& name, const std::string& entry = "") const;
  TensorInfo info(const std::string& name, const std::string& entry = "") const;
  std::vector<TensorInfo> infos() const;  // every tensor of every entry
  // The tensor groups of `entry` (spec §4.13), in file order; none before
  // format 1.5. names() lists a group by its own name; Archive::state_dict()
  // gives its members under theirs.
  std::vector<GroupInfo> groups(const std::string& entry = "") const;
  // Every storage a tensor may name, a layer's base storages included.
  std::vector<StorageInfo> storages() const;
  // Storage i's bytes (in this file's mapping or a base's); kNotFound past
  // the last storage.
  const void* storage_data(uint32_t i) const;
  // Storage i's bytes as its tensors' records describe them (what exporters
  // and diff read): storage_data(i), except for a storage that holds a
  // sharded tensor's slices (spec §4.12, tp_world() > 0), where it is a copy
  // holding the tensor in C order, zero-padded to the storage's nbytes, made
  // on first use and kept while the archive is open. Thread-safe.
  const void* storage_values(uint32_t i) const;

  // §4.11: true for a layer (an archive that takes some storages from a
  // base archive). layers() are the paths of the chain as opened: this
  // archive, its base, the base's base... (just path() for a plain archive).
  bool is_layer() const;
  // §4.12: the number of tensor-parallel ranks the archive was packed for
  // (pack --tp), or 0 for an archive without a plan.
  uint32_t tp_world() const;
  std::vector<std::string> layers() const;

  // Metadata; entry "" is archive-level (not the first entry here).
  std::optional<MetadataValue> metadata(const std::string& key,
                                        const std::string& entry = "") const;
  std::vector<std::pair<std::string, MetadataValue>> metadata_items(
      const std::string& entry = "") const;
  // The keys alone, in the index's order: what metadata_items() gives
  // without copying a value (attached files can be megabytes each).
  std::vector<std::string> metadata_keys(const std::string& entry = "") const;

  // What was packed, as a typed tree (spec §4.10): for a checkpoint, its dicts
  // (key order kept), lists, tuples, numbers, strings, bytes, opaque objects,
  // with each tensor named by (entry, name) for tensor() and each state_dict
  // as an entry. An archive packed without one (every format 1.0 archive, and
  // any whose structure its entries and metadata already say) gives the tree
  // they imply: its one entry's state_dict, or a dict of the entries' state_dicts
  // and the archive-level metadata.
  Value value() const;
  // True when the archive stores a tree (format 1.1, feature bit 0).
  bool has_value_tree() const;

  // Recomputes every storage's XXH3-64. Throws kChecksumMismatch naming the
  // first damaged storage and every tensor in it; damaged() lists them all.
  void verify() const;
  // Names ("entry/name") of every tensor whose storage fails its checksum.
  std::vector<std::string> damaged() const;

  // This file's mapping. In a plain archive storage i's bytes are data() +
  // storages()[i].offset; storage_data(i) serves layers too.
  const void* data() const;
  uint64_t mapped_size() const;

  const std::shared_ptr<const ArchiveCore>& core() const { return core_; }

 protected:
  explicit ArchiveFile(std::shared_ptr<const ArchiveCore> core) : core_(std::move(core)) {}

 private:
  std::shared_ptr<const ArchiveCore> core_;
};

// Installs a SIGSEGV/SIGBUS handler that, when a fault hits a live tsar
// mapping, prints "tsar: write to read-only archive <path>: storage #i used by
// tensor "<name>"..." before the process dies with the default action. Opt-in;
// chains to a previously installed handler for faults elsewhere.
void InstallFaultHandler();

}  // namespace tsar
