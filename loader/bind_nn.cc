// tsar::bind for torch::nn::Module (include/tsar/bind.h).
#include <torch/nn/module.h>

#include "loader/bind_common.h"

namespace tsar {
namespace {

// Module::parameters_ and buffers_, read in place: named_parameters(false)
// copies it, an ordered hash map with every name, per module (a third of
// binding 100,000 tensors). A meta tensor's replacement is written there too
// (register_parameter/register_buffer refuse a name already registered).
// parameters_ is protected: a pointer to it formed through a derived class
// applies to any Module. buffers_ is private: the pointer comes from an
// explicit template instantiation, where access is not checked
// ([temp.spec.general]/6).
using Tensors = torch::OrderedDict<std::string, at::Tensor>;
using TensorsMember = Tensors torch::nn::Module::*;
TensorsMember BuffersMember();
template <TensorsMember M>
struct Buffers {
  friend TensorsMember BuffersMember() { return M; }
};
template struct Buffers<&torch::nn::Module::buffers_>;

struct MembersOf : torch::nn::Module {
  static constexpr TensorsMember kParameters = &MembersOf::parameters_;
  static inline const TensorsMember kBuffers = BuffersMember();
};

// Where a slot's tensor lives, for the meta slots that are replaced.
struct Owner {
  torch::nn::Module* module;
  const std::string* key;  // in the module's parameters_ or buffers_
  bool parameter;
};

// state_dict() names, module by module: cheaper than named_parameters(true),
// which builds one ordered hash map of every dotted name in the model.
void Collect(torch::nn::Module& m, const std::string& prefix, std::vector<BindSlot>& slots,
             std::vector<Owner>& owners) {
  for (const auto& p : m.*MembersOf::kParameters) {
    if (!p.value().defined()) continue;  // as named_parameters
    slots.push_back({prefix + p.key(), p.value().unsafeGetTensorImpl()});
    owners.push_back({&m, &p.key(), true});
  }
  for (const auto& b : m.*MembersOf::kBuffers) {
    if (!b.value().defined()) continue;
    slots.push_back({prefix + b.key(), b.value().unsafeGetTensorImpl()});
    owners.push_back({&m, &b.key(), false});
  }
  for (const auto& c : m.named_children()) Collect(*c.value(), prefix + c.key() + ".", slots, owners);
}

}  // namespace

BindReport bind(torch::nn::Module& module, const Archive& archive, const BindOptions& options) {
  std::vector<BindSlot> slots;
  std::vector<Owner> owners;
  Collect(module, "", slots, owners);
  std::vector<Replacement> replacements;
  BindReport report = BindSlots(slots, module.is_training(), archive, options, replacements);
  for (auto& r : replacements) {
    const Owner& o = owners[r.slot];
    auto& dict = o.parameter ? o.module->*MembersOf::kParameters : o.module->*MembersOf::kBuffers;
    dict[*o.key] = std::move(r.tensor);
  }
  return report;
}

}  // namespace tsar
