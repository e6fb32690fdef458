// A tsar archive as an input of `tsar pack` (writer/importer.h): its entries,
// tensors (views of its storages, shared as in the archive), metadata and
// value tree. A layer's base storages are read from its base, so packing a
// layer without a base writes it standalone (flattened), and with
// PackOptions::base writes it as a layer over that base.
#include "format/index.h"
#include "loader/archive_core.h"
#include "writer/importer.h"

namespace tsar::importer {

Imported ImportTsar(const std::string& path, const ImportOptions& /*options*/) {
  const ArchiveFile archive = ArchiveFile::open(path);
  const std::shared_ptr<const ArchiveCore>& core = archive.core();
  const format::Index& index = core->index;
  if (!index.sparse().empty()) {
    throw Error(ErrorCode::kUnsupported, path, std::nullopt,
                "sparse tensor " + format::Quote(std::string(index.sparse()[0].name)) +
                    ": repacking an archive with sparse tensors is not supported yet; load it "
                    "with tsar::Archive and write it with tsar::Writer");
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
  for (const auto& e : index.entries()) {
    Imported::Entry entry;
    entry.name = std::string(e.name);
    for (uint32_t i = e.first_tensor; i < e.first_tensor + e.tensor_count; ++i) {
      const format::TensorRecord& t = index.tensors()[i];
      writer::TensorRef ref;
      ref.storage = storages[t.storage];
      ref.dtype = t.dtype;
      ref.sizes.assign(index.sizes(t), index.sizes(t) + t.ndim);
      ref.strides.assign(index.strides(t), index.strides(t) + t.ndim);
      ref.storage_offset = t.storage_offset;
      ref.requires_grad = t.requires_grad;
      entry.tensors.push_back({std::string(t.name), std::move(ref), static_cast<Role>(t.role)});
    }
    out.entries.push_back(std::move(entry));
  }
  for (const auto& m : index.metadata()) {
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
