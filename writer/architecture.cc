// tsar::writer::Architecture (writer/architecture.h).
#include "writer/architecture.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <sstream>
#include <unordered_set>

#include "tsar/error.h"
#include "writer/architecture_file.h"
#include "writer/importer.h"

namespace tsar::writer {

struct Architecture::State {
  std::function<void(bool)> publish;
};

namespace {

// Makes `t` a stride-0 view of one zero of its dtype, keeping its sizes.
void Strip(at::Tensor t) {
  if (t.numel() <= 1) return;  // one element or none: nothing to save
  const at::Tensor zero = at::zeros({1}, t.options().requires_grad(false));
  t.set_(zero.storage(), 0, t.sizes(), std::vector<int64_t>(t.dim(), 0));
}

}  // namespace

Architecture::Architecture(const std::string& torchscript, const std::string& output)
    : state_(std::make_unique<State>()) {
  torch::jit::Module m;
  try {
    m = torch::jit::load(torchscript, c10::Device(c10::kCPU));
  } catch (const c10::Error& e) {
    throw Error(ErrorCode::kBadInput, torchscript, std::nullopt,
                "--arch: not a loadable TorchScript archive: " + importer::FirstLine(e));
  }
  {
    c10::NoGradGuard no_grad;  // set_ on a leaf that requires grad
    std::unordered_set<const c10::TensorImpl*> done;
    for (const auto& p : m.named_parameters(/*recurse=*/true)) {
      if (done.insert(p.value.unsafeGetTensorImpl()).second) Strip(p.value);
    }
    for (const auto& b : m.named_buffers(/*recurse=*/true)) {
      if (done.insert(b.value.unsafeGetTensorImpl()).second) Strip(b.value);
    }
  }
  // Saved to a stream, not a path: TorchScript names its records after the
  // file it writes (the temporary one), a stream's always "archive/", so the
  // same input gives the same bytes.
  std::ostringstream bytes;
  try {
    m.save(bytes);
  } catch (const c10::Error& e) {
    throw Error(ErrorCode::kIo, output, std::nullopt,
                "--arch: could not save the architecture: " + importer::FirstLine(e));
  }
  state_->publish = WriteArchitecture(output, std::move(bytes).str());
}

Architecture::~Architecture() = default;

void Architecture::Publish(bool durable) { state_->publish(durable); }

}  // namespace tsar::writer
