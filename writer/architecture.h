// `tsar pack MODEL_TS.pt --arch ARCH.pt`: the TorchScript architecture of a
// module without its weight bytes, the file a server loads before tsar::bind
// points its weights at an archive.
#pragma once

#include <memory>
#include <string>

namespace tsar::writer {

// An architecture file being written: not visible at its path until
// Publish(), removed if never published.
class Architecture {
 public:
  // Loads the TorchScript module at `torchscript`, makes each of its
  // parameters and buffers (every submodule's, any dtype) a view of one zero
  // element with its own sizes (stride 0), in place, so every reference to
  // the tensor (an LSTM's _flat_weights list) sees the same object, and
  // saves it to a temporary file next to `output`. Names, shapes, dtypes,
  // requires_grad, attributes, constants and code are kept; the file holds
  // one element per weight. Throws kBadInput (not a loadable TorchScript
  // file), kInvalidArgument (an output that cannot be replaced), kIo.
  Architecture(const std::string& torchscript, const std::string& output);
  ~Architecture();
  Architecture(const Architecture&) = delete;
  Architecture& operator=(const Architecture&) = delete;

  void Publish(bool durable);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tsar::writer
