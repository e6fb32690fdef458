// tsar::Archive: an ArchiveFile whose storages become c10::Storage views of
// the mapping, and its tensors views of those (spec/FORMAT.md §4).
#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include "format/reader.h"
#include "loader/archive_impl.h"
#include "loader/scalar_type.h"

namespace tsar {
namespace {

void Release(void* ctx) {
  auto* refs = static_cast<CoreRefs*>(ctx);
  if (refs->count.fetch_sub(1, std::memory_order_acq_rel) == 1) delete refs;
}

c10::Storage MakeStorage(CoreRefs* refs, uint32_t i, const format::StorageRecord& s) {
  uint8_t* p = refs->core->StorageData(i);
  refs->count.fetch_add(1, std::memory_order_relaxed);
  c10::DataPtr dp(p, refs, &Release, c10::Device(c10::kCPU));
  // Not resizable: an out-of-range set_ then throws instead of reallocating (a copy).
  return c10::Storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(s.nbytes), std::move(dp),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

}  // namespace

Archive::Impl::Impl(std::shared_ptr<const ArchiveCore> c)
    : core(std::move(c)),
      refs(new CoreRefs(core)),
      storages(core->index.storages().size()),
      made(std::make_unique<std::atomic<bool>[]>(storages.size())) {}

Archive::Impl::~Impl() {
  storages.clear();
  Release(refs);
}

Archive Archive::open(const std::string& path, const OpenOptions& options) {
  ArchiveFile file = ArchiveFile::open(path, options);
  auto impl = std::make_shared<Impl>(file.core());
  return Archive(std::move(file), std::move(impl));
}

const c10::Storage& Archive::Impl::Storage(uint32_t i) const {
  if (!made[i].load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(make_mutex);
    if (!made[i].load(std::memory_order_relaxed)) {
      storages[i] = MakeStorage(refs, i, index().storages()[i]);
      made[i].store(true, std::memory_order_release);
    }
  }
  return storages[i];
}

at::Tensor Archive::Impl::Make(uint32_t i) const {
  const format::TensorRecord& t = index().tensors()[i];
  if (t.shard_dim != format::kNone) return MakeFull(i);  // §4.12: loader/shards.cc
  const c10::ScalarType type =
      ToScalarType(t.dtype, [&t] { return "tensor " + format::Quote(std::string(t.name)); });
  // make_tensor skips the dispatcher (as LibTorch's own unpickler does);
  // the index validation (§6 R53) already proved the view in bounds.
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(Storage(t.storage)), c10::DispatchKeySet(c10::DispatchKey::CPU),
      c10::scalarTypeToTypeMeta(type));
  c10::TensorImpl* impl = out.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(c10::IntArrayRef(index().sizes(t), t.ndim),
                              c10::IntArrayRef(index().strides(t), t.ndim));
  impl->set_storage_offset(static_cast<int64_t>(t.storage_offset));
  if (t.requires_grad) out.set_requires_grad(true);
  return out;
}

at::Tensor Archive::tensor(const std::string& name, const std::string& entry) const {
  const uint32_t e = impl_->Entry(entry);
  if (impl_->index().FindTensor(e, name) == format::kNone) {
    const uint32_t s = impl_->FindSparse(e, name);
    if (s != format::kNone) return impl_->MakeSparse(s);
  }
  return impl_->Make(impl_->Find(name, entry));
}

torch::OrderedDict<std::string, at::Tensor> Archive::state_dict(const std::string& entry) const {
  torch::OrderedDict<std::string, at::Tensor> out;
  const uint32_t e = impl_->Entry(entry);
  const uint32_t count = impl_->index().entries()[e].tensor_count;  // components included: enough
  out.reserve(count);
  // Every tensor first, then the dict: its hash nodes then lie together.
  std::vector<std::pair<std::string_view, at::Tensor>> made;
  made.reserve(count);
  const format::Index& index = impl_->index();
  impl_->ForEachVisible(e, [&](std::string_view name, uint32_t t, uint32_t s) {
    if (t != format::kNone) {
      made.emplace_back(name, impl_->Make(t));
    } else if (!index.IsGroup(s)) {
      made.emplace_back(name, impl_->MakeSparse(s));
    } else {  // §4.13: a group's members under their own names (C++ has no torchao)
      const format::SparseRecord& sp = index.sparse()[s];
      for (uint32_t k = sp.first_component; k < sp.first_component + sp.component_count; ++k)
        made.emplace_back(index.tensors()[k].name, impl_->Make(k));
    }
  });
  for (auto& [name, tensor] : made) out.insert(std::string(name), std::move(tensor));
  return out;
}

}  // namespace tsar
