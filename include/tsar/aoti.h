// tsar::load_aoti: an AOTInductor program stored in an archive (spec §4.7.2,
// docs/programs.md), loaded with LibTorch's AOTIModelPackageLoader and given
// the archive's tensors as user-managed constants: the compiled code reads
// the mapping itself, nothing is copied, and every process that loads the
// same archive shares the weights' pages. The successor of TorchScript's
// torch::jit::load + tsar::bind for a C++ server, without Python.
//
//   #include <torch/csrc/inductor/aoti_package/model_package_loader.h>  // run()'s types
//   #include <tsar/aoti.h>
//
//   tsar::AotiProgram program = tsar::load_aoti(tsar::Archive::open("model.tsar"));
//   std::vector<at::Tensor> out = program.run({input});
//
// The package is native code: load archives you trust. Before it is loaded,
// load_aoti checks the program's stamp: the torch release it was compiled
// with against this LibTorch's, the platform, machine and CPU ISA it was
// compiled for against this machine's, and every weight's name, dtype and
// shape against the archive.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tsar/archive.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace tsar {

// Which torch may load a program compiled with another: kRelease (the
// default) needs the same major.minor, kExact the same version, kAny tries.
enum class TorchMatch { kRelease, kExact, kAny };

struct AotiOptions {
  // The program's name (tsar.pack(..., programs={name: ...})); "" for the
  // archive's only AOTInductor program.
  std::string name;
  TorchMatch torch_match = TorchMatch::kRelease;
};

class AotiProgram {
 public:
  AotiProgram(AotiProgram&&) noexcept;
  AotiProgram& operator=(AotiProgram&&) noexcept;
  ~AotiProgram();

  // Runs the compiled model: the inputs it was exported with, flattened, and
  // its outputs, flattened (AOTIModelPackageLoader::run).
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) const;
  // LibTorch's loader, for what run() does not cover (its call spec, metadata).
  torch::inductor::AOTIModelPackageLoader& loader() const;

  const std::string& name() const;
  // The constants bound to the archive's tensors (zero copy), and the bytes
  // of the program's own constants (buffers outside the state_dict, such as
  // rotary frequencies: private copies, small).
  const std::vector<std::string>& bound() const;
  int64_t private_constant_bytes() const;

  struct State;

 private:
  friend AotiProgram load_aoti(const Archive&, const AotiOptions&);
  explicit AotiProgram(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Loads the AOTInductor program of `archive` (see the top of this file).
// Throws tsar::Error: kNotFound (no such program), kInvalidArgument (several
// and no name, or not an AOTInductor program), kUnsupported (another torch
// release, platform or CPU ISA; a LibTorch without AOTInductor's package
// loader), kBindMismatch (a weight the archive lacks or with another dtype or
// shape, listed), kBadInput (a malformed stamp or package), naming the
// archive and the program.
AotiProgram load_aoti(const Archive& archive, const AotiOptions& options = {});

// The names of the programs an archive holds (its "program:" stamps), every kind.
std::vector<std::string> program_names(const ArchiveFile& archive);

}  // namespace tsar
