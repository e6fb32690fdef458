// torchao's quantized tensors in the safetensors files transformers writes
// (save_pretrained of a model quantized with TorchAoConfig; torchao's
// torchao/prototype/safetensors): each quantized parameter `M.P` is stored as
// plain tensors `M._P_<inner>` (qdata, scale, zero_point...), and the file's
// __metadata__ says what they make: "tensor_names" is a JSON list of every
// parameter's name, and each name's own key holds JSON,
// {"_type": "Tensor"} for a plain tensor, or
// {"_type": "<class>", "_data": {attribute: value}, "_tensor_data_names": [...]}
// for a quantized one, whose values are JSON values or objects
// {"_type": "torch.dtype" | "<enum>" | "<record>", "_data": ...}.
//
// tsar keeps a quantized parameter as a tensor group (spec §4.13) named `M.P`,
// and writes one back the same way, through writer/torchao_table.h only:
// nothing here imports or calls anything by a name read from a file.
#pragma once

#include <string>
#include <vector>

#include "tsar/archive_file.h"
#include "writer/importer.h"

namespace tsar::torchao {

// Makes the groups of `in` (what the safetensors importer read from `path`, a
// file or the index of a sharded checkpoint, into one entry, its __metadata__
// as archive-level metadata): when that metadata has "tensor_names" naming at
// least one quantized tensor, each one's inner tensors become the members of
// a group of that name, standing where its first member stood, whose
// description (spec §4.13.2) has class `_type`, members in the class's order,
// attributes translated to typed values (JSON lists stay lists: JSON has no
// tuples; a JSON float becomes ["float", hex]), version "unknown" (the file
// does not say which torchao wrote it), outer sizes those of qdata (or the
// `shape` attribute), strides C-contiguous and dtype the `dtype` attribute (or
// the class's rule, writer/torchao_table.h). "tensor_names" and every key it
// names then leave the metadata: the archive says the same with its groups,
// and export writes them again (ExportSafetensors).
//
// All or nothing: metadata that does not parse or breaks torchao's layout, or
// a class, enum or record not in tsar's table, is kBadInput naming `path` and
// the tensor with `strict`; without it, `in` is left as it was (every inner
// tensor a plain tensor under its file name, the metadata kept) and a line in
// `in.skipped` says why.
void GroupTorchaoSafetensors(importer::Imported& in, const std::string& path, bool strict);

// One tensor of a safetensors file that ExportSafetensors writes: its key
// and the tensor it holds.
struct SafetensorsItem {
  std::string key;
  const TensorInfo* tensor;
};

// The torchao layout of one-entry archive `a` whose entry has groups: every
// tensor in archive order with its key (a group's member `M.P.<inner>` as
// `M._P_<inner>`, the others as named), and the __metadata__ members torchao's
// reader (and so transformers' from_pretrained) needs: "tensor_names", and
// for each name {"_type": "Tensor"} or the group's class, attributes and
// tensor names, as JSON texts. Throws kUnsupported naming the group for one
// of a library or class tsar's table does not have, or whose name has no '.'
// (torchao's keys need a module and a parameter name), kInvalidValue for a
// description that breaks the grammar of §4.13.2 or names a member,
// attribute, enum or record the table does not know, kInvalidArgument for a
// key that two tensors would have.
struct TorchaoLayout {
  std::vector<SafetensorsItem> items;
  std::vector<std::pair<std::string, std::string>> metadata;
};
TorchaoLayout TorchaoSafetensorsLayout(const ArchiveFile& a, const std::vector<TensorInfo>& infos);

}  // namespace tsar::torchao
