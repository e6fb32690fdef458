// writer/torchscript.h: the TorchScript importer and --arch, with LibTorch.
#include "writer/torchscript.h"

#include <torch/csrc/jit/serialization/import.h>

#include "format/reader.h"
#include "writer/architecture.h"
#include "writer/from_tensor.h"

namespace tsar::writer {

importer::Imported ImportTorchScript(const std::string& path,
                                     const importer::ImportOptions& options) {
  torch::jit::Module m;
  try {
    m = torch::jit::load(path, c10::Device(c10::kCPU));
  } catch (const c10::Error& e) {
    throw Error(ErrorCode::kBadInput, path, std::nullopt,
                "not a loadable TorchScript archive: " + importer::FirstLine(e));
  }
  importer::Imported out;
  out.kind = importer::InputKind::kTorchScript;
  importer::Imported::Entry e{options.default_entry, {}};
  // Every storage stays alive through its Storage's reference to it.
  TensorRefs refs;
  auto ref = [&](const std::string& name, const at::Tensor& t) {
    if (const std::string why = WhyNotPackable(t); !why.empty()) {
      throw Error(ErrorCode::kUnsupported, path, std::nullopt,
                  "tensor " + format::Quote(name) + ": " + why);
    }
    return refs.Of(t);
  };
  // state_dict() order: per module its parameters, its buffers, then children.
  std::function<void(const torch::jit::Module&, const std::string&)> walk =
      [&](const torch::jit::Module& mod, const std::string& prefix) {
        for (const auto& p : mod.named_parameters(false))
          e.tensors.push_back({prefix + p.name, ref(prefix + p.name, p.value), Role::kParameter});
        for (const auto& b : mod.named_buffers(false))
          e.tensors.push_back({prefix + b.name, ref(prefix + b.name, b.value), Role::kBuffer});
        for (const auto& c : mod.named_children()) walk(c.value, prefix + c.name + ".");
      };
  walk(m, "");  // none at all: importer::Import refuses it
  out.entries.push_back(std::move(e));
  return out;
}

TorchSupport LibTorchSupport() {
  TorchSupport t;
  t.import_torchscript = ImportTorchScript;
  t.architecture = [](const std::string& input, const std::string& output) {
    auto arch = std::make_shared<Architecture>(input, output);
    return std::function<void(bool)>([arch](bool durable) { arch->Publish(durable); });
  };
  return t;
}

}  // namespace tsar::writer
