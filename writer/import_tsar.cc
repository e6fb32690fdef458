// A tsar archive as an input of `tsar pack` (writer/importer.h): its entries,
// tensors (views of its storages, shared as in the archive), metadata and
// value tree. A layer's base storages are read from its base, so packing a
// layer without a base writes it standalone (flattened), and with
// PackOptions::base writes it as a layer over that base.
#include <set>
#include <string_view>
#include <utility>

#include "format/index.h"
#include "loader/archive_core.h"
#include "writer/importer.h"

namespace tsar::importer {
namespace {

// Tensor group s (spec §4.13) as the writer takes it again: its members
// named "<group>.<member>", as every writer of this implementation names
// them (another writer's names are refused rather than changed).
template <typename View>
Imported::Group GroupOf(const std::string& path, const format::Index& index, uint32_t s,
                        size_t before, const View& view) {
  const format::SparseRecord& sp = index.sparse()[s];
  Imported::Group g;
  g.name = std::string(sp.name);
  g.before = before;
  g.group.layout = format::SparseLayout::kGroup;
  g.group.dtype = sp.dtype;
  const int64_t* dims = index.dims().data() + sp.dims_index;
  g.group.sizes.assign(dims, dims + sp.ndim);
  g.group.strides.assign(dims + sp.ndim, dims + 2 * sp.ndim);
  g.group.description = std::string(index.GroupDescription(s));
  for (uint32_t k = sp.first_component; k < sp.first_component + sp.component_count; ++k) {
    const std::string_view member = index.tensors()[k].name;
    if (member.size() <= g.name.size() + 1 || member.compare(0, g.name.size(), g.name) != 0 ||
        member[g.name.size()] != '.') {
      throw Error(ErrorCode::kUnsupported, path, std::nullopt,
                  "tensor group " + format::Quote(g.name) + ": member " +
                      format::Quote(std::string(member)) + " is not named \"" + g.name +
                      ".<member>\", as tsar names them: repacking it would rename it");
    }
    g.group.components.emplace_back(std::string(member.substr(g.name.size())), view(k));
  }
  return g;
}

}  // namespace

Imported ImportTsar(const std::string& path, const ImportOptions& /*options*/) {
  const ArchiveFile archive = ArchiveFile::open(path);
  const std::shared_ptr<const ArchiveCore>& core = archive.core();
  const format::Index& index = core->index;
  for (uint32_t s = 0; s < index.sparse().size(); ++s) {
    if (!index.IsGroup(s)) {
      throw Error(ErrorCode::kUnsupported, path, std::nullopt,
                  "sparse tensor " + format::Quote(std::string(index.sparse()[s].name)) +
                      ": repacking an archive with sparse tensors is not supported yet; load it "
                      "with tsar::Archive and write it with tsar::Writer");
    }
  }
  Imported out;
  out.kind = InputKind::kTsar;

  // One writer storage per archive storage (own or a base's), over the
  // mapped bytes; each keeps the archive, and so its bases, mapped.
  std::vector<std::shared_ptr<writer::Storage>> storages(index.storages().size());
  for (uint32_t i = 0; i < storages.size(); ++i) {
    auto s = std::make_shared<writer::Storage>();
    s->data = static_cast<const uint8_t*>(archive.storage_values(i));
    s->nbytes = index.storages()[i].nbytes;
    s->keep = core;
    storages[i] = std::move(s);
  }
  for (const auto& t : index.tensors()) {  // the device hint is per storage when writing
    writer::Storage& s = *storages[t.storage];
    if (s.device_type == format::DeviceType::kUnspecified) {
      s.device_type = t.device_type;
      s.device_index = t.device_index;
    }
  }
  const auto view = [&](uint32_t i) {
    const format::TensorRecord& t = index.tensors()[i];
    writer::TensorRef ref;
    ref.storage = storages[t.storage];
    ref.dtype = t.dtype;
    ref.sizes.assign(index.sizes(t), index.sizes(t) + t.ndim);
    ref.strides.assign(index.strides(t), index.strides(t) + t.ndim);
    ref.storage_offset = t.storage_offset;
    ref.requires_grad = t.requires_grad;
    return ref;
  };
  for (const auto& e : index.entries()) {
    Imported::Entry entry;
    entry.name = std::string(e.name);
    for (uint32_t i = e.first_tensor; i < e.first_tensor + e.tensor_count; ++i) {
      const format::TensorRecord& t = index.tensors()[i];
      if (t.sparse != format::kNone) {  // §4.13: a group, with its members, where they stand
        if (index.sparse()[t.sparse].first_component == i)
          entry.groups.push_back(GroupOf(path, index, t.sparse, entry.tensors.size(), view));
        continue;
      }
      entry.tensors.push_back({std::string(t.name), view(i), static_cast<Role>(t.role)});
    }
    out.entries.push_back(std::move(entry));
  }
  // A group's description (R112) goes with its group, which writes it again.
  std::set<std::pair<uint32_t, std::string_view>> groups;
  for (uint32_t s = 0; s < index.sparse().size(); ++s) {
    if (index.IsGroup(s)) groups.emplace(index.sparse()[s].entry, index.sparse()[s].name);
  }
  const std::string_view prefix = format::kGroupKeyPrefix;
  for (const auto& m : index.metadata()) {
    if (m.entry != format::kNone && m.key.substr(0, prefix.size()) == prefix &&
        groups.count({m.entry, m.key.substr(prefix.size())})) {
      continue;
    }
    Imported::Meta meta;
    meta.entry = m.entry == format::kNone ? "" : std::string(index.entries()[m.entry].name);
    meta.key = std::string(m.key);
    meta.value = MetadataValueOf(m);
    out.metadata.push_back(std::move(meta));
  }
  if (archive.has_value_tree()) out.value = archive.value();
  out.metadata_beside_tree = true;
  return out;
}

}  // namespace tsar::importer
