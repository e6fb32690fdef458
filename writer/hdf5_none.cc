// The HDF5 importer and exporter in a build without HDF5
// (-DTSAR_WITH_HDF5=OFF, what scripts/gpu-check.sh builds on a machine
// without Debian's libraries): both refuse, saying why.
#include "tsar/error.h"
#include "writer/export_internal.h"
#include "writer/importer.h"

namespace tsar {
namespace {
[[noreturn]] void NoHdf5(const std::string& path) {
  throw Error(ErrorCode::kUnsupported, path, std::nullopt,
              "this tsar was built without HDF5 (TSAR_WITH_HDF5=OFF), so it cannot read or "
              "write HDF5 files; build it with Debian's libhdf5-dev");
}
}  // namespace

namespace importer {
Imported ImportHdf5(const std::string& path, const ImportOptions&) { NoHdf5(path); }
}  // namespace importer

namespace exporter {
std::vector<std::string> ExportHdf5(const ArchiveFile&, const std::string& path) { NoHdf5(path); }
}  // namespace exporter

}  // namespace tsar
