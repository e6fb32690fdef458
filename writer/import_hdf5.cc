// Input reader for HDF5 files laid out as h5py writes them: one dataset per
// tensor, groups as dotted name prefixes, attributes as archive metadata.
// Uses the HDF5 C API; every handle is closed by an RAII wrapper on every path.
#include <hdf5.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "format/reader.h"
#include "tsar/dtype.h"
#include "tsar/error.h"
#include "writer/importer.h"

namespace tsar::importer {
namespace {

using format::Quote;

// Groups nested deeper than this are refused (the walk is recursive).
constexpr int kMaxGroupDepth = 256;
// A dataset may hold at most this many bytes per byte stored (deflate tops
// out near 1032:1), beyond kFreeBytes; anything bigger is a hostile extent.
constexpr uint64_t kMaxExpansion = 1100;
constexpr uint64_t kFreeBytes = uint64_t{1} << 20;
// Fixed-length string attributes longer than this are skipped.
constexpr size_t kMaxStringAttribute = size_t{16} << 20;

// Row-major strides in elements, zero sizes counting as one. Computed in
// unsigned arithmetic: a shape past 2^63 elements gets strides that
// MakeView refuses (R49, R50, R78) rather than undefined behaviour here.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  uint64_t stride = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = static_cast<int64_t>(stride);
    stride *= static_cast<uint64_t>(std::max<int64_t>(sizes[d], 1));
  }
  return strides;
}

// The serial HDF5 library is not thread-safe, and error printing is global.
std::mutex hdf5_mutex;

// Owns an HDF5 identifier and closes it with the matching H5?close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      Reset();
      id_ = std::exchange(o.id_, -1);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { Reset(); }
  hid_t get() const { return id_; }

 private:
  void Reset() {
    if (id_ >= 0 && close_ != nullptr) close_(id_);
    id_ = -1;
  }
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Silences HDF5's automatic error-stack printing while alive.
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

herr_t InnermostError(unsigned, const H5E_error2_t* err, void* data) {
  if (err->desc != nullptr && err->desc[0] != '\0') *static_cast<std::string*>(data) = err->desc;
  return 0;
}

// The deepest message of HDF5's error stack (its most specific), then clears it.
std::string Hdf5Message() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, &InnermostError, &msg);
  H5Eclear2(H5E_DEFAULT);
  for (char& c : msg) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return msg.empty() ? std::string("HDF5 call failed") : msg;
}

// A type made from a copy of `base`; `base` itself (a predefined type) is never closed.
Handle CopyType(hid_t base) { return Handle(H5Tcopy(base), &H5Tclose); }

// A little-endian IEEE-style 2-byte float with the given field widths.
Handle Float16Type(size_t ebits, size_t mbits, size_t ebias) {
  Handle t = CopyType(H5T_IEEE_F32LE);
  if (t.get() < 0 || H5Tset_fields(t.get(), 15, mbits, ebits, 0, mbits) < 0 ||
      H5Tset_size(t.get(), 2) < 0 || H5Tset_ebias(t.get(), ebias) < 0) {
    return Handle();
  }
  return t;
}

// What a dataset's file type becomes: a dtype and the native memory type to
// read it with, or a description of why it cannot be a tensor.
struct Numeric {
  DType dtype;
  Handle memory;
};
using Classified = std::variant<Numeric, std::string>;

std::optional<DType> FloatDType(hid_t type) {
  size_t spos, epos, esize, mpos, msize;
  if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) return std::nullopt;
  const size_t size = H5Tget_size(type);
  if (size == 2 && esize == 5 && msize == 10) return DType::kFloat16;
  if (size == 2 && esize == 8 && msize == 7) return DType::kBFloat16;
  if (size == 4 && esize == 8 && msize == 23) return DType::kFloat32;
  if (size == 8 && esize == 11 && msize == 52) return DType::kFloat64;
  return std::nullopt;
}

Handle FloatMemoryType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return Float16Type(5, 10, 15);
    case DType::kBFloat16:
      return Float16Type(8, 7, 127);
    case DType::kFloat32:
      return CopyType(H5T_NATIVE_FLOAT);
    default:
      return CopyType(H5T_NATIVE_DOUBLE);
  }
}

std::string MemberName(hid_t type, unsigned i) {
  char* raw = H5Tget_member_name(type, i);
  if (raw == nullptr) return std::string();
  std::string name(raw);
  H5free_memory(raw);
  return name;
}

// h5py's bool: an enum over a 1-byte integer with exactly FALSE = 0, TRUE = 1.
bool IsH5pyBool(hid_t type) {
  Handle base(H5Tget_super(type), &H5Tclose);
  if (base.get() < 0 || H5Tget_class(base.get()) != H5T_INTEGER || H5Tget_size(base.get()) != 1 ||
      H5Tget_nmembers(type) != 2) {
    return false;
  }
  for (unsigned i = 0; i < 2; ++i) {
    int8_t value = 0;
    const std::string name = MemberName(type, i);
    if (H5Tget_member_value(type, i, &value) < 0) return false;
    if (!((name == "FALSE" && value == 0) || (name == "TRUE" && value == 1))) return false;
  }
  return true;
}

Classified Classify(hid_t type) {
  const size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
      switch (size) {
        case 1:
          return Numeric{is_signed ? DType::kInt8 : DType::kUInt8,
                         CopyType(is_signed ? H5T_NATIVE_INT8 : H5T_NATIVE_UINT8)};
        case 2:
          return Numeric{is_signed ? DType::kInt16 : DType::kUInt16,
                         CopyType(is_signed ? H5T_NATIVE_INT16 : H5T_NATIVE_UINT16)};
        case 4:
          return Numeric{is_signed ? DType::kInt32 : DType::kUInt32,
                         CopyType(is_signed ? H5T_NATIVE_INT32 : H5T_NATIVE_UINT32)};
        case 8:
          return Numeric{is_signed ? DType::kInt64 : DType::kUInt64,
                         CopyType(is_signed ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64)};
        default:
          return std::to_string(size) + "-byte integer";
      }
    }
    case H5T_FLOAT: {
      const std::optional<DType> dtype = FloatDType(type);
      if (!dtype) return std::to_string(size) + "-byte float of a non-IEEE layout";
      return Numeric{*dtype, FloatMemoryType(*dtype)};
    }
    case H5T_ENUM: {
      if (!IsH5pyBool(type)) return "enum";
      Handle memory(H5Tenum_create(H5T_NATIVE_INT8), &H5Tclose);
      const int8_t no = 0, yes = 1;
      if (memory.get() >= 0) {
        H5Tenum_insert(memory.get(), "FALSE", &no);
        H5Tenum_insert(memory.get(), "TRUE", &yes);
      }
      return Numeric{DType::kBool, std::move(memory)};
    }
    case H5T_COMPOUND: {
      // h5py's complex numbers: {r, i} of two equal IEEE floats.
      if (H5Tget_nmembers(type) == 2 && MemberName(type, 0) == "r" && MemberName(type, 1) == "i") {
        Handle r(H5Tget_member_type(type, 0), &H5Tclose);
        Handle i(H5Tget_member_type(type, 1), &H5Tclose);
        if (r.get() >= 0 && i.get() >= 0 && H5Tget_class(r.get()) == H5T_FLOAT &&
            H5Tget_class(i.get()) == H5T_FLOAT) {
          const std::optional<DType> rt = FloatDType(r.get()), it = FloatDType(i.get());
          if (rt == it && (rt == DType::kFloat32 || rt == DType::kFloat64)) {
            const size_t half = rt == DType::kFloat32 ? 4 : 8;
            const hid_t part = rt == DType::kFloat32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
            Handle memory(H5Tcreate(H5T_COMPOUND, 2 * half), &H5Tclose);
            if (memory.get() >= 0) {
              H5Tinsert(memory.get(), "r", 0, part);
              H5Tinsert(memory.get(), "i", half, part);
            }
            return Numeric{rt == DType::kFloat32 ? DType::kComplex64 : DType::kComplex128,
                           std::move(memory)};
          }
        }
      }
      return "compound";
    }
    case H5T_STRING:
      return "string";
    case H5T_REFERENCE:
      return "reference";
    case H5T_VLEN:
      return "variable-length";
    case H5T_ARRAY:
      return "array";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_BITFIELD:
      return "bitfield";
    case H5T_TIME:
      return "time";
    default:
      return "unknown-type";
  }
}

struct Link {
  std::string name;
  H5L_type_t type;
  haddr_t address;
};

herr_t CollectLink(hid_t, const char* name, const H5L_info_t* info, void* data) {
  try {
    static_cast<std::vector<Link>*>(data)->push_back(
        {name, info->type, info->type == H5L_TYPE_HARD ? info->u.address : HADDR_UNDEF});
    return 0;
  } catch (...) {
    return -1;
  }
}

herr_t CollectAttribute(hid_t, const char* name, const H5A_info_t*, void* data) {
  try {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  } catch (...) {
    return -1;
  }
}

class Hdf5Importer {
 public:
  Hdf5Importer(const std::string& path, const ImportOptions& options, uint64_t file_size)
      : path_(path), options_(options), file_size_(file_size) {}

  Imported Run() {
    Handle fapl(Check(H5Pcreate(H5P_FILE_ACCESS), "cannot create a file access list"), &H5Pclose);
    // Keep HDF5's file locking, but do not fail on file systems without it.
    H5Pset_file_locking(fapl.get(), true, true);
    Handle file(Check(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get()), "cannot open"),
                &H5Fclose);
    out_.kind = InputKind::kHdf5;
    out_.entries.push_back({options_.default_entry, {}});
    Handle root(Check(H5Gopen2(file.get(), "/", H5P_DEFAULT), "cannot open group \"/\""),
                &H5Gclose);
    ReadAttributes(root.get(), "/", "");
    VisitGroup(file.get(), root.get(), "", "", 0);
    return std::move(out_);
  }

 private:
  [[noreturn]] void Fail(const std::string& message) const {
    throw Error(ErrorCode::kBadInput, path_, std::nullopt, message);
  }
  hid_t Check(hid_t id, const std::string& what) const {
    if (id < 0) Fail(what + ": " + Hdf5Message());
    return id;
  }
  // Unsupported content: an error under options.strict, else one skipped line.
  void Unsupported(const std::string& what, const std::string& expected, const std::string& found) {
    if (options_.strict) Fail(what + ": expected " + expected + ", found " + found);
    out_.skipped.push_back(what + ": " + found + " is not " + expected);
  }

  void VisitGroup(hid_t file, hid_t group, const std::string& h5path, const std::string& dotted,
                  int depth) {
    if (depth > kMaxGroupDepth) {
      Fail("group " + Quote(h5path) + ": expected at most " + std::to_string(kMaxGroupDepth) +
           " nested groups, found more");
    }
    std::vector<Link> links;
    hsize_t idx = 0;
    if (H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &idx, &CollectLink, &links) < 0) {
      Fail("group " + Quote(h5path.empty() ? "/" : h5path) +
           ": cannot list links: " + Hdf5Message());
    }
    for (const Link& link : links) {
      const std::string child_path = h5path + "/" + link.name;
      const std::string child_dotted = dotted.empty() ? link.name : dotted + "." + link.name;
      if (link.type != H5L_TYPE_HARD) {
        Unsupported(
            "link " + Quote(child_path), "a hard link",
            link.type == H5L_TYPE_SOFT ? "a soft link" : "an external or user-defined link");
        continue;
      }
      // Hard links may make cycles or alias an object twice: visit each object once.
      if (!visited_.insert(link.address).second) {
        out_.skipped.push_back(Quote(child_path) + ": a second link to an object already read");
        continue;
      }
      Handle object(Check(H5Oopen_by_addr(file, link.address), "cannot open " + Quote(child_path)),
                    &H5Oclose);
      switch (H5Iget_type(object.get())) {
        case H5I_GROUP:
          ReadAttributes(object.get(), child_path, child_dotted);
          VisitGroup(file, object.get(), child_path, child_dotted, depth + 1);
          break;
        case H5I_DATASET:
          ReadDataset(object.get(), child_path, child_dotted);
          ReadAttributes(object.get(), child_path, child_dotted);
          break;
        default:
          out_.skipped.push_back(Quote(child_path) + ": a named datatype, not data");
          break;
      }
    }
  }

  void ReadDataset(hid_t dataset, const std::string& h5path, const std::string& name) {
    const std::string what = "dataset " + Quote(h5path);
    Handle type(Check(H5Dget_type(dataset), what + ": cannot read its type"), &H5Tclose);
    Handle space(Check(H5Dget_space(dataset), what + ": cannot read its dataspace"), &H5Sclose);
    Classified kind = Classify(type.get());
    if (std::holds_alternative<std::string>(kind)) {
      Unsupported(what, "a numeric dataset", "a " + std::get<std::string>(kind) + " dataset");
      return;
    }
    // External raw-data files and virtual datasets would read other files
    // named inside this one; they are never followed.
    Handle dcpl(Check(H5Dget_create_plist(dataset), what + ": cannot read its layout"), &H5Pclose);
    if (H5Pget_layout(dcpl.get()) == H5D_VIRTUAL || H5Pget_external_count(dcpl.get()) != 0) {
      Unsupported(what, "a dataset stored in this file", "a virtual or external-storage dataset");
      return;
    }
    Numeric& numeric = std::get<Numeric>(kind);
    if (numeric.memory.get() < 0) Fail(what + ": cannot make its memory type: " + Hdf5Message());

    std::vector<int64_t> sizes;
    const H5S_class_t extent = H5Sget_simple_extent_type(space.get());
    if (extent == H5S_NULL) {
      Unsupported(what, "a numeric dataset", "a dataset with a null dataspace (no shape)");
      return;
    }
    if (extent == H5S_SIMPLE) {
      const int rank = H5Sget_simple_extent_ndims(space.get());
      if (rank < 0 || rank > H5S_MAX_RANK) Fail(what + ": cannot read its shape: " + Hdf5Message());
      std::vector<hsize_t> dims(static_cast<size_t>(rank));
      if (H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) {
        Fail(what + ": cannot read its shape: " + Hdf5Message());
      }
      for (hsize_t d : dims) {
        if (d > static_cast<hsize_t>(std::numeric_limits<int64_t>::max())) {
          Fail(what + ": shape: expected dimensions below 2^63, found " + std::to_string(d));
        }
        sizes.push_back(static_cast<int64_t>(d));
      }
    } else if (extent != H5S_SCALAR) {
      Fail(what + ": cannot read its dataspace: " + Hdf5Message());
    }

    uint64_t nbytes = ElementSize(numeric.dtype);
    const bool empty = std::find(sizes.begin(), sizes.end(), 0) != sizes.end();
    for (int64_t d : sizes) {
      if (!empty && !format::CheckedMul(nbytes, static_cast<uint64_t>(d), &nbytes)) {
        Fail(what + ": shape: expected at most 2^64 - 1 bytes, found more");
      }
    }
    if (empty) nbytes = 0;
    // The stored size comes from the file too; no dataset stores more than the file holds.
    const uint64_t stored = std::min<uint64_t>(H5Dget_storage_size(dataset), file_size_);
    uint64_t limit = 0;
    if (!format::CheckedMul(stored, kMaxExpansion, &limit)) {
      limit = std::numeric_limits<uint64_t>::max();
    }
    if (nbytes > kFreeBytes && nbytes > limit) {
      Fail(what + ": expected at most " + std::to_string(kMaxExpansion) +
           " bytes of data per stored byte, found " + std::to_string(nbytes) + " bytes from " +
           std::to_string(stored) + " stored");
    }
    if (!IsValidName(name)) Fail(what + ": expected a UTF-8 name, found " + Quote(name));
    const auto [it, fresh] = names_.emplace(name, h5path);
    if (!fresh) {
      Fail(what + ": expected a unique tensor name, found " + Quote(name) +
           ", also the name of dataset " + Quote(it->second));
    }

    std::optional<writer::TensorRef> t =
        MappedView(dataset, dcpl.get(), type.get(), numeric, sizes, nbytes, what);
    if (!t) {
      // Chunked, compressed or converted: read into memory.
      std::vector<uint8_t> bytes(static_cast<size_t>(nbytes));
      if (nbytes > 0 &&
          H5Dread(dataset, numeric.memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) < 0) {
        Fail(what + ": cannot read: " + Hdf5Message());
      }
      t = MakeView(writer::Storage::Owning(std::move(bytes)), numeric.dtype, sizes,
                   ContiguousStrides(sizes), 0, what, path_);
    }
    if (numeric.dtype == DType::kBool) {
      const uint8_t* p = t->storage->data;
      for (uint64_t i = 0; i < nbytes; ++i) {
        if (p[i] > 1) Fail(what + ": expected bool values 0 or 1, found " + std::to_string(p[i]));
      }
    }
    out_.entries.back().tensors.push_back({name, std::move(*t), Role::kTensor});
  }

  static bool IsValidName(const std::string& s) { return format::IsValidUtf8(s); }

  // A dataset stored contiguously, unfiltered and in exactly the bytes of its
  // memory type (h5py's default layout) is a zero-copy view of the mapped
  // file, like the tensors of a torch.save or safetensors input: packing it
  // holds no copy. Nullopt for any other dataset.
  std::optional<writer::TensorRef> MappedView(hid_t dataset, hid_t dcpl, hid_t type,
                                              const Numeric& numeric,
                                              const std::vector<int64_t>& sizes, uint64_t nbytes,
                                              const std::string& what) {
    if (nbytes == 0 || H5Pget_layout(dcpl) != H5D_CONTIGUOUS || H5Pget_nfilters(dcpl) != 0 ||
        H5Tequal(type, numeric.memory.get()) <= 0) {
      return std::nullopt;
    }
    const haddr_t at = H5Dget_offset(dataset);
    if (at == HADDR_UNDEF) return std::nullopt;
    if (!input_) input_ = MappedInput::Open(path_);
    if (at > input_->size() || nbytes > input_->size() - at) {
      Fail(what + ": expected its " + std::to_string(nbytes) + " bytes at offset " +
           std::to_string(at) + " inside the file of " + std::to_string(input_->size()) + " bytes");
    }
    return MakeView(MappedInput::Storage(input_, at, nbytes), numeric.dtype, sizes,
                    ContiguousStrides(sizes), 0, what, path_);
  }

  void ReadAttributes(hid_t object, const std::string& h5path, const std::string& dotted) {
    std::vector<std::string> names;
    hsize_t idx = 0;
    if (H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, &idx, &CollectAttribute, &names) < 0) {
      Fail(Quote(h5path) + ": cannot list attributes: " + Hdf5Message());
    }
    for (const std::string& attr_name : names) {
      const std::string what = "attribute " + Quote(attr_name) + " of " + Quote(h5path);
      Handle attr(Check(H5Aopen(object, attr_name.c_str(), H5P_DEFAULT), "cannot open " + what),
                  &H5Aclose);
      std::optional<MetadataValue> value = ReadAttribute(attr.get(), what);
      if (!value) continue;
      const std::string key = dotted.empty() ? attr_name : dotted + "." + attr_name;
      if (!meta_keys_.insert(key).second) {
        out_.skipped.push_back(what + ": metadata key " + Quote(key) + " is already used");
        continue;
      }
      out_.metadata.push_back({"", key, std::move(*value)});
    }
  }

  std::optional<MetadataValue> ReadAttribute(hid_t attr, const std::string& what) {
    Handle type(Check(H5Aget_type(attr), what + ": cannot read its type"), &H5Tclose);
    Handle space(Check(H5Aget_space(attr), what + ": cannot read its dataspace"), &H5Sclose);
    const H5S_class_t extent = H5Sget_simple_extent_type(space.get());
    const hssize_t points = H5Sget_simple_extent_npoints(space.get());
    auto skip = [&](const std::string& why) -> std::optional<MetadataValue> {
      out_.skipped.push_back(what + ": " + why);
      return std::nullopt;
    };
    if (extent == H5S_NULL || points != 1) {
      return skip("an array of " + std::to_string(points) + " values is not a scalar");
    }
    const H5T_class_t cls = H5Tget_class(type.get());
    if (cls == H5T_INTEGER) {
      if (H5Tget_sign(type.get()) == H5T_SGN_NONE && H5Tget_size(type.get()) >= 8) {
        uint64_t v = 0;
        if (H5Aread(attr, H5T_NATIVE_UINT64, &v) < 0) {
          Fail(what + ": cannot read: " + Hdf5Message());
        }
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return skip("the unsigned value " + std::to_string(v) + " does not fit int64");
        }
        return static_cast<int64_t>(v);
      }
      int64_t v = 0;
      if (H5Aread(attr, H5T_NATIVE_INT64, &v) < 0) Fail(what + ": cannot read: " + Hdf5Message());
      return v;
    }
    if (cls == H5T_FLOAT) {
      double v = 0;
      if (H5Aread(attr, H5T_NATIVE_DOUBLE, &v) < 0) Fail(what + ": cannot read: " + Hdf5Message());
      return v;
    }
    if (cls != H5T_STRING) {
      const Classified kind = Classify(type.get());
      const std::string desc = std::holds_alternative<std::string>(kind)
                                   ? std::get<std::string>(kind)
                                   : std::string(DTypeName(std::get<Numeric>(kind).dtype));
      return skip("a " + desc + " attribute is not an integer, float or string");
    }
    std::string text;
    const htri_t variable = H5Tis_variable_str(type.get());
    if (variable < 0) Fail(what + ": cannot read its type: " + Hdf5Message());
    if (variable > 0) {
      Handle memory(Check(H5Tcopy(H5T_C_S1), what), &H5Tclose);
      H5Tset_size(memory.get(), H5T_VARIABLE);
      H5Tset_cset(memory.get(), H5Tget_cset(type.get()));
      char* p = nullptr;
      if (H5Aread(attr, memory.get(), &p) < 0) Fail(what + ": cannot read: " + Hdf5Message());
      if (p != nullptr) text = p;
      H5Dvlen_reclaim(memory.get(), space.get(), H5P_DEFAULT, &p);
    } else {
      const size_t size = H5Tget_size(type.get());
      if (size == 0 || size > kMaxStringAttribute) {
        return skip("a string of " + std::to_string(size) + " bytes is too long");
      }
      Handle memory(Check(H5Tcopy(type.get()), what), &H5Tclose);
      std::string buf(size, '\0');
      if (H5Aread(attr, memory.get(), buf.data()) < 0) {
        Fail(what + ": cannot read: " + Hdf5Message());
      }
      if (H5Tget_strpad(type.get()) == H5T_STR_SPACEPAD) {
        buf.erase(buf.find_last_not_of(' ') + 1);
      } else {
        buf.resize(std::strlen(buf.c_str()));
      }
      text = std::move(buf);
    }
    if (!format::IsValidUtf8(text)) return Bytes{std::move(text)};
    return text;
  }

  const std::string& path_;
  const ImportOptions& options_;
  const uint64_t file_size_;
  std::shared_ptr<const MappedInput> input_;  // mapped at the first contiguous dataset
  Imported out_;
  std::set<haddr_t> visited_;
  std::map<std::string, std::string> names_;  // tensor name -> dataset path
  std::set<std::string> meta_keys_;
};

}  // namespace

Imported ImportHdf5(const std::string& path, const ImportOptions& options) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    throw Error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, path, std::nullopt,
                std::string("cannot open: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kBadInput, path, std::nullopt, "not a regular file");
  }
  std::lock_guard<std::mutex> lock(hdf5_mutex);
  QuietErrors quiet;
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0) {
    throw Error(ErrorCode::kBadInput, path, std::nullopt,
                "expected an HDF5 file (signature 89 48 44 46 0d 0a 1a 0a), found " +
                    (is_hdf5 < 0 ? Hdf5Message() : std::string("no HDF5 signature")));
  }
  return Hdf5Importer(path, options, static_cast<uint64_t>(st.st_size)).Run();
}

}  // namespace tsar::importer
