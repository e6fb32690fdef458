// The HDF5 importer and exporter in a build without HDF5
// (-DTSAR_WITH_HDF5=OFF: the wheel, TSAR_SELF_CONTAINED, and what
// scripts/gpu-check.sh builds on a machine without Debian's libraries): both
// refuse, saying why and where HDF5 is read.
#include "tsar/error.h"
#include "writer/export_internal.h"
#include "writer/importer.h"

namespace tsar {
namespace {
[[noreturn]] void NoHdf5(const std::string& path) {
  throw Error(ErrorCode::kUnsupported, path, std::nullopt,
              "this tsar was built without HDF5 (TSAR_WITH_HDF5=OFF; the wheel leaves it out, "
              "with the ~30 libraries libhdf5 needs), so it cannot read or write HDF5 files: use "
              "a tsar built from source beside libhdf5-dev (scripts/setup.sh; apt-get install "
              "libhdf5-dev, then pip install --no-binary tsar), or convert the file with h5py "
              "first");
}
}  // namespace

namespace importer {
Imported ImportHdf5(const std::string& path, const ImportOptions&) { NoHdf5(path); }
}  // namespace importer

namespace exporter {
std::vector<std::string> ExportHdf5(const ArchiveFile&, const std::string& path) { NoHdf5(path); }
}  // namespace exporter

}  // namespace tsar
