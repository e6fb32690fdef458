// `tsar verify ARCHIVE...`: checks every checksum and names damaged tensors.
#include <chrono>
#include <map>
#include <optional>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/describe.h"
#include "loader/hash_storages.h"
#include "tsar/archive_file.h"

namespace tsar::cli {
namespace {

int VerifyOne(const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<ArchiveFile> opened;
  try {
    opened = OpenArchive(path);
  } catch (const Error& e) {
    PrintError(e.what());
    return kExitBadInput;
  }
  const ArchiveFile& a = *opened;
  const auto storages = a.storages();
  uint64_t total = 0;
  for (const auto& s : storages) total += s.nbytes;
  Progress progress("verifying " + path, total, true);
  std::vector<ByteRange> ranges;  // a layer's base storages too, in the base file
  for (const auto& s : storages) {
    ranges.push_back({static_cast<const uint8_t*>(a.storage_data(s.id)), s.nbytes});
  }
  const std::vector<uint64_t> hashes =
      HashRanges(ranges, [&](uint64_t done) { progress.Update(done); });
  std::vector<uint32_t> bad;
  for (const auto& s : storages) {
    if (hashes[s.id] != s.xxh3) bad.push_back(s.id);
  }
  progress.Done();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (bad.empty()) {
    const auto layers = a.layers();
    std::string through;
    for (size_t i = 1; i < layers.size(); ++i)
      through += (i == 1 ? ", through " : ", ") + layers[i];
    std::printf("ok %s: %zu storages%s, %s verified in %.3f s\n", path.c_str(), storages.size(),
                through.c_str(), HumanBytes(total).c_str(), secs);
    return kExitOk;
  }
  std::map<uint32_t, std::vector<std::string>> names;
  for (const auto& t : a.infos()) names[t.storage].push_back(t.entry + "/" + t.name);
  for (uint32_t id : bad) {
    std::string list;
    for (const auto& n : names[id]) list += (list.empty() ? "" : ", ") + ("\"" + n + "\"");
    const StorageInfo& s = storages[id];
    const std::string where = s.layer == 0 ? ""
                                           : " of base " + a.layers()[s.layer] + " (its storage #" +
                                                 std::to_string(s.layer_storage) + ")";
    std::printf("DAMAGED %s: storage #%u at offset %llu%s (%s): tensors %s\n", path.c_str(), id,
                static_cast<unsigned long long>(s.offset), where.c_str(),
                HumanBytes(s.nbytes).c_str(), list.c_str());
  }
  PrintError(path + ": " + std::to_string(bad.size()) + " of " + std::to_string(storages.size()) +
             " storages fail their XXH3-64 checksum");
  return kExitCheckFailed;
}

}  // namespace

Run AddVerify(CLI::App& app) {
  auto paths = std::make_shared<std::vector<std::string>>();
  CLI::App* sub = app.add_subcommand("verify", "Check every checksum; name every damaged tensor");
  sub->add_option("archives", *paths, "The .tsar files")->required();
  sub->footer(
      "Exit status: 0 all archives intact, 1 damage found (each damaged tensor is named),\n"
      "3 an archive could not be read or its header/index is invalid.\n"
      "Example:\n"
      "  tsar verify /models/*.tsar");
  return [paths] {
    int worst = kExitOk;
    for (const auto& p : *paths) {
      const int rc = VerifyOne(p);
      if (rc == kExitBadInput || (rc == kExitCheckFailed && worst == kExitOk)) worst = rc;
    }
    return worst;
  };
}

}  // namespace tsar::cli
