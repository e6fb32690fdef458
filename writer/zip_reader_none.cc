// tsar::zip::Reader in a build without minizip (-DTSAR_WITH_ZIP=OFF, what
// scripts/gpu-check.sh builds on a machine without Debian's libraries):
// torch.save and TorchScript zips cannot be read; everything else can.
#include "tsar/error.h"
#include "writer/zip_reader.h"

namespace tsar::zip {

struct Reader::Stream {};

Reader::Reader(const uint8_t* data, uint64_t size, std::string path)
    : data_(data), size_(size), path_(std::move(path)) {
  throw Error(ErrorCode::kUnsupported, path_, std::nullopt,
              "this tsar was built without minizip (TSAR_WITH_ZIP=OFF), so it cannot read "
              "torch.save or TorchScript zip files; build it with Debian's libminizip-dev");
}
Reader::~Reader() = default;
void Reader::Closer::operator()(void*) const {}
const Record* Reader::Find(const std::string&) const { return nullptr; }
uint64_t Reader::StoredData(const Record&, uint64_t) const { Bad("no zip support"); }
std::string Reader::Read(const Record&, uint64_t) const { Bad("no zip support"); }
void Reader::Bad(const std::string& what) const {
  throw Error(ErrorCode::kUnsupported, path_, std::nullopt, what);
}

}  // namespace tsar::zip
