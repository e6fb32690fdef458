// `tsar inspect ARCHIVE [--json]`: what an archive holds, for people and scripts.
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/describe.h"
#include "tsar/archive.h"
#include "writer/json_util.h"

namespace tsar::cli {
namespace {

bool Contiguous(const TensorInfo& t) {
  int64_t expect = 1;
  for (size_t i = t.sizes.size(); i-- > 0;) {
    if (t.sizes[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.sizes[i];
  }
  return true;
}

// Logical bytes (numel x element size). The spec bounds numel by 2^63 - 1,
// not numel x element size: a broadcast view such as expand(2^31, 2^31) of a
// float has 2^64 logical bytes while its storage holds 4. Exact in 128 bits.
unsigned __int128 TensorBytes(const TensorInfo& t) {
  unsigned __int128 n = 1;
  for (int64_t s : t.sizes) n *= static_cast<uint64_t>(s);
  return n * ElementSize(t.dtype);
}

// As a JSON number: an integer when it fits 64 bits, else a double.
nlohmann::ordered_json JsonBytes(unsigned __int128 n) {
  if (n <= UINT64_MAX) return static_cast<uint64_t>(n);
  return static_cast<double>(n);
}

int RunInspect(const std::string& path, bool json) {
  const Archive a = Archive::open(path);
  const auto infos = a.infos();
  const auto storages = a.storages();
  std::map<uint32_t, int> users;
  for (const auto& t : infos) ++users[t.storage];
  uint64_t data = 0;
  for (const auto& s : storages) data += s.nbytes;

  if (json) {
    nlohmann::ordered_json j;
    j["path"] = path;
    j["format_version"] = std::to_string(a.format_major()) + "." + std::to_string(a.format_minor());
    j["file_size"] = a.file_size();
    j["alignment"] = a.alignment();
    j["entries"] = a.entries();
    auto& tensors = j["tensors"] = nlohmann::ordered_json::array();
    for (const auto& t : infos) {
      tensors.push_back({{"name", t.name},
                         {"entry", t.entry},
                         {"dtype", std::string(DTypeName(t.dtype))},
                         {"shape", t.sizes},
                         {"strides", t.strides},
                         {"storage_offset", t.storage_offset},
                         {"storage", t.storage},
                         {"shared", users[t.storage] > 1},
                         {"nbytes", JsonBytes(TensorBytes(t))},
                         {"role", RoleName(t.role)},
                         {"requires_grad", t.requires_grad}});
    }
    auto& st = j["storages"] = nlohmann::ordered_json::array();
    for (const auto& s : storages) {
      char hex[24];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(s.xxh3));
      st.push_back({{"id", s.id}, {"offset", s.offset}, {"nbytes", s.nbytes}, {"xxh3", hex}});
    }
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : a.metadata_items()) json::Append(meta, k, MetaJson(v));
    j["metadata"] = meta;
    nlohmann::ordered_json entry_meta = nlohmann::ordered_json::object();
    for (const auto& e : a.entries()) {
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (const auto& [k, v] : a.metadata_items(e)) json::Append(m, k, MetaJson(v));
      if (!m.empty()) json::Append(entry_meta, e, std::move(m));
    }
    j["entry_metadata"] = entry_meta;
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }

  std::printf(
      "%s: tsar format %u.%u, %zu tensors in %zu entr%s, %zu storages, %s of data, %s file, "
      "alignment %u\n",
      path.c_str(), a.format_major(), a.format_minor(), infos.size(), a.entries().size(),
      a.entries().size() == 1 ? "y" : "ies", storages.size(), HumanBytes(data).c_str(),
      HumanBytes(a.file_size()).c_str(), a.alignment());
  size_t width = 4;
  for (const auto& t : infos) width = std::max(width, t.name.size());
  width = std::min<size_t>(width, 60);
  for (const auto& e : a.entries()) {
    std::printf("\nentry \"%s\"\n", e.c_str());
    std::printf("  %-*s  %-9s  %-22s %-9s %10s  %s\n", static_cast<int>(width), "NAME", "DTYPE",
                "SHAPE", "STORAGE", "BYTES", "ROLE");
    for (const auto& t : infos) {
      if (t.entry != e) continue;
      std::string shape = Dims(t.sizes);
      if (!Contiguous(t)) shape += " strides " + Dims(t.strides);
      if (t.storage_offset) shape += " +" + std::to_string(t.storage_offset);
      std::string storage =
          "#" + std::to_string(t.storage) + (users[t.storage] > 1 ? " shared" : "");
      std::printf("  %-*s  %-9s  %-22s %-9s %10s  %s%s\n", static_cast<int>(width), t.name.c_str(),
                  std::string(DTypeName(t.dtype)).c_str(), shape.c_str(), storage.c_str(),
                  HumanBytes(static_cast<double>(TensorBytes(t))).c_str(), RoleName(t.role),
                  t.requires_grad ? " requires_grad" : "");
    }
    for (const auto& [k, v] : a.metadata_items(e))
      std::printf("  metadata %s = %s\n", k.c_str(), MetaText(v).c_str());
  }
  const auto meta = a.metadata_items();
  if (!meta.empty()) {
    std::printf("\nmetadata\n");
    for (const auto& [k, v] : meta) std::printf("  %s = %s\n", k.c_str(), MetaText(v).c_str());
  }
  return kExitOk;
}

}  // namespace

Run AddInspect(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  CLI::App* sub =
      app.add_subcommand("inspect", "Show the tensors, storages and metadata of an archive");
  sub->add_option("archive", *path, "The .tsar file")->required();
  sub->add_flag("--json", *json, "One JSON object on stdout (schema in the README)");
  sub->footer(
      "Examples:\n"
      "  tsar inspect model.tsar\n"
      "  tsar inspect model.tsar --json | jq '.tensors[] | select(.shared) | .name'");
  return [path, json] { return RunInspect(*path, *json); };
}

}  // namespace tsar::cli
