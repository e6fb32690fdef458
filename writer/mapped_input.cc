// MappedInput and MakeView (writer/importer.h): the zero-copy base of every importer.
#include <c10/core/TensorImpl.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "format/extent.h"
#include "loader/open_file.h"
#include "loader/scalar_type.h"
#include "writer/importer.h"

namespace tsar::importer {
namespace {
void DeleteRef(void* ctx) { delete static_cast<std::shared_ptr<const MappedInput>*>(ctx); }
}  // namespace

std::shared_ptr<const MappedInput> MappedInput::Open(const std::string& path) {
  struct stat st;
  const int fd = OpenRegularFile(path, &st, ErrorCode::kBadInput);
  std::shared_ptr<MappedInput> m(new MappedInput());
  m->path_ = path;
  m->size_ = static_cast<uint64_t>(st.st_size);
  if (m->size_ > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(m->size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      close(fd);
      throw Error(ErrorCode::kIo, path, std::nullopt,
                  std::string("cannot mmap: ") + std::strerror(err));
    }
    m->data_ = static_cast<const uint8_t*>(p);
  }
  close(fd);
  return m;
}

MappedInput::~MappedInput() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

c10::Storage MappedInput::Storage(const std::shared_ptr<const MappedInput>& self, uint64_t offset,
                                  uint64_t nbytes) {
  auto* p = const_cast<uint8_t*>(self->data_) + offset;
  c10::DataPtr dp(p, new std::shared_ptr<const MappedInput>(self), &DeleteRef,
                  c10::Device(c10::kCPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(nbytes), std::move(dp),
                      nullptr, /*resizable=*/false);
}

at::Tensor MakeView(const c10::Storage& storage, DType dtype, const std::vector<int64_t>& sizes,
                    const std::vector<int64_t>& strides, uint64_t storage_offset,
                    const std::string& what, const std::string& path) {
  // The spec's view rules (R48-R52, R78) are what LibTorch can build: past
  // them it throws its own errors ("numel: integer multiplication overflow",
  // even for an empty tensor). Refuse first, naming the input.
  const auto ndim = static_cast<uint32_t>(sizes.size());
  const uint64_t esize = ElementSize(dtype);
  const format::ViewExtent v =
      format::ComputeViewExtent(sizes.data(), strides.data(), ndim, storage_offset, esize);
  if (v.fault != format::ViewExtent::Fault::kNone) {
    const format::ViewFaultText text =
        format::DescribeViewFault(v, sizes.data(), strides.data(), storage_offset, esize);
    throw Error(ErrorCode::kBadInput, path, std::nullopt,
                what + ": " + text.field + ": expected " + text.expected + ", found " + text.found);
  }
  c10::ScalarType type;
  try {
    type = ToScalarType(dtype, what);
  } catch (const Error& e) {  // a dtype this LibTorch lacks: name the input too
    if (!e.path().empty()) throw;
    throw Error(e.code(), path, std::nullopt, e.what());
  }
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
      c10::scalarTypeToTypeMeta(type));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(sizes),
                                                 c10::IntArrayRef(strides));
  t.unsafeGetTensorImpl()->set_storage_offset(static_cast<int64_t>(storage_offset));
  return t;
}

}  // namespace tsar::importer
