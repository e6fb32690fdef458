// tsar::LiveModule (include/tsar/live.h): the TorchScript build step.
#include <torch/csrc/jit/api/module.h>

#include "tsar/live.h"

namespace tsar {

LiveModule::LiveModule(std::string path, Make make, LiveOptions options, WarmUp warm_up)
    : LiveBase(
          std::move(path),
          [make = std::move(make), warm_up = std::move(warm_up)](
              const Archive& archive, const BindOptions& bind_options,
              const void* serving) -> std::shared_ptr<void> {
            auto m = std::make_shared<torch::jit::Module>(make());
            // A jit::Module is a handle: make returning one module each time
            // (not a new torch::jit::load) would rebind the version serving.
            if (serving != nullptr &&
                m->_ivalue().get() ==
                    static_cast<const torch::jit::Module*>(serving)->_ivalue().get()) {
              throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                          "make returned the module that is serving; it must build a new one "
                          "(torch::jit::load of the architecture)");
            }
            bind(*m, archive, bind_options);
            if (warm_up) warm_up(*m);
            return m;
          },
          std::move(options)) {}

LiveModule::Snapshot LiveModule::current() const {
  Version v = Current();
  auto* m = static_cast<torch::jit::Module*>(v.module.get());
  return {std::shared_ptr<torch::jit::Module>(std::move(v.module), m), v.version,
          std::move(v.archive)};
}

}  // namespace tsar
