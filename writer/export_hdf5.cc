// Export to HDF5 as h5py lays it out: one dataset per tensor, dotted names as
// nested groups, metadata as attributes; bool as h5py's enum, complex as h5py's
// {r, i} compound, float16 as IEEE half. HDF5 writes into the AtomicFile's
// temporary file (it can only write to a path: AtomicFile::WritablePath), one
// bounded piece of a tensor at a time (writer/pieces.h), so exporting needs
// no memory in proportion to the model; the file is published when done.
#include <hdf5.h>

#include <string_view>
#include <unordered_map>

#include "format/reader.h"
#include "writer/atomic_file.h"
#include "writer/export_internal.h"
#include "writer/pieces.h"

namespace tsar::exporter {
namespace {

// Closes an HDF5 handle with its own close function.
class H5 {
 public:
  H5(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5() {
    if (id_ >= 0) close_(id_);
  }
  H5(const H5&) = delete;
  H5& operator=(const H5&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

[[noreturn]] void Fail(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kIo, path, std::nullopt, "HDF5: " + what);
}

// The file type h5py uses for a dtype, or -1 (caller owns a copy when *owned).
hid_t FileType(DType dt, bool* owned) {
  *owned = false;
  switch (dt) {
    case DType::kUInt8:
      return H5T_STD_U8LE;
    case DType::kInt8:
      return H5T_STD_I8LE;
    case DType::kInt16:
      return H5T_STD_I16LE;
    case DType::kInt32:
      return H5T_STD_I32LE;
    case DType::kInt64:
      return H5T_STD_I64LE;
    case DType::kUInt16:
      return H5T_STD_U16LE;
    case DType::kUInt32:
      return H5T_STD_U32LE;
    case DType::kUInt64:
      return H5T_STD_U64LE;
    case DType::kFloat32:
      return H5T_IEEE_F32LE;
    case DType::kFloat64:
      return H5T_IEEE_F64LE;
    case DType::kFloat16: {  // h5py's IEEE half: 1 sign, 5 exponent, 10 mantissa bits
      const hid_t t = H5Tcopy(H5T_IEEE_F32LE);
      H5Tset_fields(t, 15, 10, 5, 0, 10);
      H5Tset_size(t, 2);
      H5Tset_ebias(t, 15);
      *owned = true;
      return t;
    }
    case DType::kBool: {  // h5py: enum of int8 {FALSE: 0, TRUE: 1}
      const hid_t t = H5Tenum_create(H5T_NATIVE_INT8);
      int8_t v = 0;
      H5Tenum_insert(t, "FALSE", &v);
      v = 1;
      H5Tenum_insert(t, "TRUE", &v);
      *owned = true;
      return t;
    }
    case DType::kComplex64:
    case DType::kComplex128: {  // h5py: compound {r, i}
      const bool wide = dt == DType::kComplex128;
      const size_t half = wide ? 8 : 4;
      const hid_t t = H5Tcreate(H5T_COMPOUND, 2 * half);
      H5Tinsert(t, "r", 0, wide ? H5T_IEEE_F64LE : H5T_IEEE_F32LE);
      H5Tinsert(t, "i", half, wide ? H5T_IEEE_F64LE : H5T_IEEE_F32LE);
      *owned = true;
      return t;
    }
    default:
      return -1;
  }
}

// The groups one entry's tensors need: every proper dotted prefix of a name
// (views into the names), with a name under it, for messages, and whether the
// export has made it yet.
struct Group {
  std::string_view under;
  bool made = false;
};
using Groups = std::unordered_map<std::string_view, Group>;

// The groups of the last tensor's dotted prefix, kept open: consecutive
// tensors share most of their prefix (layers.7.mlp.weight, layers.7.mlp.bias),
// and opening each level again per tensor was most of an export's time. The
// file is new and only this class makes groups, so `groups` says which exist:
// no HDF5 lookup per tensor (a link lookup per tensor was a tenth of the
// export of 100,000 tensors).
class GroupChain {
 public:
  GroupChain(hid_t root, hid_t gcpl, Groups& groups) : root_(root), gcpl_(gcpl), groups_(groups) {}
  ~GroupChain() { CloseFrom(0); }
  GroupChain(const GroupChain&) = delete;
  GroupChain& operator=(const GroupChain&) = delete;

  // The group for the dotted prefix of `name` (every component but the last)
  // under the root, creating what is missing.
  hid_t For(std::string_view name, const std::string& path);

 private:
  void CloseFrom(size_t depth) {
    while (open_.size() > depth) {
      H5Gclose(open_.back().second);
      open_.pop_back();
    }
  }
  hid_t root_, gcpl_;
  Groups& groups_;
  std::vector<std::pair<std::string_view, hid_t>> open_;  // prefix, its group, each under the last
};

hid_t GroupChain::For(std::string_view name, const std::string& path) {
  // Keep the open groups whose prefix `name` still has; prefix i ends at a dot.
  size_t keep = 0;
  while (keep < open_.size()) {
    const std::string_view prefix = open_[keep].first;
    if (name.size() <= prefix.size() || name[prefix.size()] != '.' ||
        name.substr(0, prefix.size()) != prefix) {
      break;
    }
    ++keep;
  }
  CloseFrom(keep);
  hid_t g = keep == 0 ? root_ : open_.back().second;
  size_t start = keep == 0 ? 0 : open_.back().first.size() + 1;
  for (size_t dot = name.find('.', start); dot != std::string_view::npos;
       start = dot + 1, dot = name.find('.', start)) {
    const std::string component(name.substr(start, dot - start));
    const std::string_view prefix = name.substr(0, dot);
    Group& group = groups_.at(prefix);
    g = group.made ? H5Gopen2(g, component.c_str(), H5P_DEFAULT)
                   : H5Gcreate2(g, component.c_str(), H5P_DEFAULT, gcpl_, H5P_DEFAULT);
    if (g < 0) Fail(path, "cannot create group " + format::Quote(std::string(prefix)));
    group.made = true;
    open_.emplace_back(prefix, g);
  }
  return g;
}

void Attribute(hid_t loc, const std::string& key, const MetadataValue& v,
               std::vector<std::string>& notes, const std::string& path) {
  if (std::holds_alternative<Bytes>(v)) {
    notes.push_back("metadata " + key +
                    ": bytes values are not written as HDF5 attributes; left out");
    return;
  }
  const H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  // h5py reads a variable-length UTF-8 string attribute as str.
  const H5 str_type(std::holds_alternative<std::string>(v) ? H5Tcopy(H5T_C_S1) : -1, H5Tclose);
  hid_t type = -1;
  const void* data = nullptr;
  const char* str = nullptr;
  if (const auto* s = std::get_if<std::string>(&v)) {
    H5Tset_size(str_type.get(), H5T_VARIABLE);
    H5Tset_cset(str_type.get(), H5T_CSET_UTF8);
    type = str_type.get();
    str = s->c_str();
    data = &str;
  } else if (const auto* i = std::get_if<int64_t>(&v)) {
    type = H5T_STD_I64LE;
    data = i;
  } else {
    type = H5T_IEEE_F64LE;
    data = &std::get<double>(v);
  }
  const H5 attr(H5Acreate2(loc, key.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose);
  if (!attr.ok() || H5Awrite(attr.get(), type, data) < 0)
    Fail(path, "cannot write attribute " + format::Quote(key));
}

// HDF5 names are C strings, and '/' separates the components of a path.
void CheckName(const ArchiveFile& a, const std::string& what, const std::string& name) {
  if (name.find('\0') != std::string::npos) {
    throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                what + " " + format::Quote(name) +
                    ": holds a NUL byte, which an HDF5 name cannot; export to .pt or .safetensors");
  }
  if (name.find('/') != std::string::npos) {
    throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                what + " " + format::Quote(name) +
                    ": holds a '/', which HDF5 reads as a group separator; export to .pt or "
                    ".safetensors");
  }
}

// HDF5 paths for one entry's tensors: every proper dotted prefix of a name is
// a group, the name itself a dataset. Checked for the whole entry before
// anything is written: no component may be empty and no tensor may also be
// the prefix of another. Returns the groups.
Groups CheckTree(const ArchiveFile& a, const std::vector<const TensorInfo*>& tensors) {
  Groups groups;
  for (const TensorInfo* t : tensors) {
    const std::string_view name = t->name;
    size_t start = 0;
    while (true) {
      const size_t dot = name.find('.', start);
      if (dot == start || start == name.size()) {
        throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                    "tensor " + format::Quote(t->name) +
                        ": an empty name component cannot be an HDF5 path; export to .pt or "
                        ".safetensors");
      }
      if (dot == std::string_view::npos) break;
      groups.emplace(name.substr(0, dot), Group{name});
      start = dot + 1;
    }
  }
  for (const TensorInfo* t : tensors) {
    const auto it = groups.find(t->name);
    if (it == groups.end()) continue;
    throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                "tensor " + format::Quote(t->name) + " is also the group that holds " +
                    format::Quote(std::string(it->second.under)) +
                    ", which HDF5 cannot express (a name is a dataset or a group); export to "
                    ".pt or .safetensors");
  }
  return groups;
}

}  // namespace

std::vector<std::string> ExportHdf5(const ArchiveFile& a, const std::string& path) {
  AtomicFile out(path, /*named=*/true);  // first: a bad destination fails before any work
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  std::vector<std::string> notes;
  const auto entries = a.entries();
  const auto infos = a.infos();
  const bool single = entries.size() == 1;
  // Names, types and sizes first: nothing is written for an archive HDF5
  // cannot hold.
  for (const auto& e : entries) CheckName(a, "entry", e);
  for (const auto& [k, v] : a.metadata_items()) CheckName(a, "metadata key", k);
  for (const auto& e : entries) {
    for (const auto& [k, v] : a.metadata_items(e)) CheckName(a, "metadata key", k);
  }
  std::unordered_map<std::string_view, size_t> entry_index;
  for (size_t i = 0; i < entries.size(); ++i) entry_index.emplace(entries[i], i);
  std::vector<std::vector<const TensorInfo*>> by_entry(entries.size());
  const FlatNames flat(a);
  uint64_t total = 0;
  for (const auto& t : infos) {
    if (t.name.find('\0') != std::string::npos || t.name.find('/') != std::string::npos) {
      CheckName(a, "tensor", flat(t));
    }
    bool owned = false;
    const hid_t type = FileType(t.dtype, &owned);
    if (owned) H5Tclose(type);
    if (type < 0) {
      throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                  "tensor " + format::Quote(flat(t)) + ": h5py has no dtype " +
                      std::string(DTypeName(t.dtype)) + "; export to .pt or .safetensors instead");
    }
    const std::optional<uint64_t> n = ContiguousBytes(t);
    if (!n) {
      throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                  "tensor " + format::Quote(flat(t)) +
                      ": its contiguous copy would be more than 2^64 - 1 bytes, more than an "
                      "HDF5 file can hold");
    }
    if (!format::CheckedAdd(total, *n, &total)) {
      throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                  "the export would be more than 2^64 - 1 bytes, more than an HDF5 file can hold");
    }
    by_entry[entry_index.at(t.entry)].push_back(&t);
  }
  std::vector<Groups> groups;  // by entry
  for (const auto& tensors : by_entry) groups.push_back(CheckTree(a, tensors));
  out.CheckSpace(total);
  const H5 fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_file_locking(fapl.get(), false, true);  // the file is ours alone until published
  const std::string writable = out.WritablePath();
  // No modification times in object headers (h5py's default too): the same
  // archive exports to the same bytes.
  const H5 fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  const H5 gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  const H5 dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  for (hid_t pl : {fcpl.get(), gcpl.get(), dcpl.get()}) {
    if (pl < 0 || H5Pset_obj_track_times(pl, false) < 0) Fail(path, "cannot set up HDF5");
  }
  H5 file(H5Fcreate(writable.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), H5Fclose);
  if (!file.ok()) Fail(path, "cannot create the file");
  for (const auto& [k, v] : a.metadata_items()) Attribute(file.get(), k, v, notes, path);
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string& e = entries[i];
    H5 entry_group(
        single ? -1 : H5Gcreate2(file.get(), e.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT),
        H5Gclose);
    const hid_t root = single ? file.get() : entry_group.get();
    if (root < 0) Fail(path, "cannot create group " + format::Quote(e));
    for (const auto& [k, v] : a.metadata_items(e)) Attribute(root, k, v, notes, path);
    GroupChain chain(root, gcpl.get(), groups[i]);
    for (const TensorInfo* t : by_entry[i]) {
      bool owned = false;
      const hid_t type = FileType(t->dtype, &owned);
      const H5 type_owner(owned ? type : -1, H5Tclose);
      const hid_t g = chain.For(t->name, path);
      const size_t last = t->name.rfind('.');
      const std::string leaf = last == std::string::npos ? t->name : t->name.substr(last + 1);
      std::vector<hsize_t> dims(t->sizes.begin(), t->sizes.end());
      const H5 space(t->sizes.empty()
                         ? H5Screate(H5S_SCALAR)
                         : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                     H5Sclose);
      const H5 ds(
          H5Dcreate2(g, leaf.c_str(), type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
          H5Dclose);
      if (!ds.ok()) Fail(path, "cannot create dataset " + format::Quote(t->name));
      const uint64_t whole = *ContiguousBytes(*t);
      ForEachPiece(ViewOf(a, *t), [&](const Piece& p) {
        if (p.nbytes == whole) {  // one piece: no selection to make
          if (H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data) < 0)
            Fail(path, "cannot write dataset " + format::Quote(t->name));
          return;
        }
        std::vector<hsize_t> start(p.start.begin(), p.start.end());
        std::vector<hsize_t> count(p.count.begin(), p.count.end());
        const hsize_t elements = p.nbytes / ElementSize(t->dtype);
        const H5 mem(H5Screate_simple(1, &elements, nullptr), H5Sclose);
        const H5 file_space(H5Dget_space(ds.get()), H5Sclose);
        if (!mem.ok() || !file_space.ok() ||
            H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                count.data(), nullptr) < 0 ||
            H5Dwrite(ds.get(), type, mem.get(), file_space.get(), H5P_DEFAULT, p.data) < 0) {
          Fail(path, "cannot write dataset " + format::Quote(t->name));
        }
      });
    }
  }
  if (H5Fclose(file.release()) < 0) Fail(path, "cannot finish the file");
  out.Publish(/*durable=*/true);
  return notes;
}

}  // namespace tsar::exporter
