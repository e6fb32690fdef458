// MappedInput and MakeView (writer/importer.h): the zero-copy base of every importer.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "format/extent.h"
#include "loader/open_file.h"
#include "writer/importer.h"

namespace tsar::importer {
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

std::shared_ptr<const writer::Storage> MappedInput::Storage(
    const std::shared_ptr<const MappedInput>& self, uint64_t offset, uint64_t nbytes) {
  auto s = std::make_shared<writer::Storage>();
  s->data = self->data_ + offset;
  s->nbytes = nbytes;
  s->keep = self;
  return s;
}

writer::TensorRef MakeView(std::shared_ptr<const writer::Storage> storage, DType dtype,
                           const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                           uint64_t storage_offset, const std::string& what,
                           const std::string& path) {
  // The spec's view rules (R48-R52, R78): past them LibTorch could not build
  // the tensor ("numel: integer multiplication overflow", even for an empty
  // one). Refuse first, naming the input.
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
  writer::TensorRef t;
  t.storage = std::move(storage);
  t.dtype = dtype;
  t.sizes = sizes;
  t.strides = strides;
  t.storage_offset = storage_offset;
  return t;
}

}  // namespace tsar::importer
