// tsar::zip::Reader (writer/zip_reader.h): minizip over a byte range.
#include "writer/zip_reader.h"

#include <unzip.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>

#include "format/endian.h"
#include "format/reader.h"
#include "tsar/error.h"

namespace tsar::zip {
namespace {

constexpr uint64_t kLocalHeaderSize = 30;
constexpr uint64_t kMinDirEntry = 46;  // a central directory entry without name or extras

}  // namespace

// minizip's I/O callbacks over [data, data + size): a position, no copies
// beyond what minizip asks to read.
struct Reader::Stream {
  const uint8_t* data;
  uint64_t size;
  uint64_t pos = 0;

  static voidpf Open(voidpf opaque, const void*, int) { return opaque; }
  static uLong Read(voidpf, voidpf s, void* buf, uLong n) {
    auto* st = static_cast<Stream*>(s);
    if (st->pos >= st->size) return 0;
    const uint64_t take = std::min<uint64_t>(n, st->size - st->pos);
    std::memcpy(buf, st->data + st->pos, take);
    st->pos += take;
    return static_cast<uLong>(take);
  }
  static uLong Write(voidpf, voidpf, const void*, uLong) { return 0; }
  static ZPOS64_T Tell(voidpf, voidpf s) { return static_cast<Stream*>(s)->pos; }
  static long Seek(voidpf, voidpf s, ZPOS64_T offset, int origin) {
    auto* st = static_cast<Stream*>(s);
    uint64_t base = 0;
    if (origin == ZLIB_FILEFUNC_SEEK_CUR) base = st->pos;
    if (origin == ZLIB_FILEFUNC_SEEK_END) base = st->size;
    if (base > st->size || offset > st->size - base) return -1;
    st->pos = base + offset;
    return 0;
  }
  static int Close(voidpf, voidpf) { return 0; }
  static int Error(voidpf, voidpf) { return 0; }
};

Reader::Reader(const uint8_t* data, uint64_t size, std::string path)
    : data_(data), size_(size), path_(std::move(path)), stream_(new Stream{data, size}) {
  zlib_filefunc64_def io{};
  io.zopen64_file = &Stream::Open;
  io.zread_file = &Stream::Read;
  io.zwrite_file = &Stream::Write;
  io.ztell64_file = &Stream::Tell;
  io.zseek64_file = &Stream::Seek;
  io.zclose_file = &Stream::Close;
  io.zerror_file = &Stream::Error;
  io.opaque = stream_.get();
  unz_ = unzOpen2_64(path_.c_str(), &io);
  unz_holder_.reset(unz_);
  if (!unz_) Bad("not a readable torch.save zip file: no valid end of central directory record");
  unz_global_info64 global{};
  if (unzGetGlobalInfo64(unz_, &global) != UNZ_OK)
    Bad("not a readable torch.save zip file: bad directory");
  // The count comes from the file: reserve no more than the file can hold.
  records_.reserve(
      static_cast<size_t>(std::min<uint64_t>(global.number_entry, size_ / kMinDirEntry)));
  std::vector<char> name(65536);
  for (int rc = unzGoToFirstFile(unz_); rc != UNZ_END_OF_LIST_OF_FILE; rc = unzGoToNextFile(unz_)) {
    if (rc != UNZ_OK) {
      Bad("not a readable torch.save zip file: central directory entry " +
          std::to_string(records_.size()) + " is damaged");
    }
    unz_file_info64 info{};
    if (unzGetCurrentFileInfo64(unz_, &info, name.data(), name.size(), nullptr, 0, nullptr, 0) !=
        UNZ_OK) {
      Bad("not a readable torch.save zip file: central directory entry " +
          std::to_string(records_.size()) + " is damaged");
    }
    Record r;
    r.name.assign(name.data(), info.size_filename);
    if (r.name.find('\0') != std::string::npos) {
      Bad("zip record " + format::Quote(r.name) + ": expected a name without NUL bytes");
    }
    r.size = info.uncompressed_size;
    r.compressed_size = info.compressed_size;
    r.method = static_cast<uint16_t>(info.compression_method);
    r.flags = static_cast<uint16_t>(info.flag);
    r.crc = static_cast<uint32_t>(info.crc);
    unz64_file_pos pos{};
    unzGetFilePos64(unz_, &pos);
    r.dir_pos = pos.pos_in_zip_directory;
    r.dir_num = pos.num_of_file;
    if (!by_name_.emplace(r.name, records_.size()).second) {
      Bad("zip record " + format::Quote(r.name) +
          ": appears twice in the central directory (readers would disagree on which to use)");
    }
    records_.push_back(std::move(r));
  }
  if (!records_.empty()) {
    const size_t slash = records_.front().name.find('/');
    if (slash != std::string::npos) prefix_ = records_.front().name.substr(0, slash + 1);
  }
}

Reader::~Reader() = default;

void Reader::Closer::operator()(void* unz) const { unzClose(unz); }

const Record* Reader::Find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &records_[it->second];
}

void Reader::Bad(const std::string& what) const {
  throw Error(ErrorCode::kBadInput, path_, std::nullopt, what);
}

namespace {

// The local header's view of a record, checked against the central
// directory's. minizip has opened the record, so `data` is where its bytes
// start and `local_extra` the length of the local extra field.
struct LocalCheck {
  const uint8_t* d;
  uint64_t file_size;
  const Record& r;
  const std::string& path;

  [[noreturn]] void Bad(std::optional<uint64_t> at, const std::string& what) const {
    throw Error(ErrorCode::kBadInput, path, at,
                "zip record " + format::Quote(r.name) + ": " + what);
  }

  void Run(uint64_t data, uint64_t local_extra) const {
    const uint64_t back = kLocalHeaderSize + r.name.size() + local_extra;
    if (data < back || data > file_size) Bad(data, "expected its local header inside the file");
    const uint64_t h = data - back;
    if (format::LoadU32(d + h) != 0x04034b50u) Bad(h, "expected a local header signature PK\\3\\4");
    if (std::memcmp(d + h + kLocalHeaderSize, r.name.data(), r.name.size()) != 0) {
      Bad(h + kLocalHeaderSize,
          "the local header names " +
              format::Quote(std::string_view(
                  reinterpret_cast<const char*>(d + h + kLocalHeaderSize), r.name.size())) +
              ", the central directory this record");
    }
    const uint16_t flags = format::LoadU16(d + h + 6);
    if ((flags | r.flags) & 0x01) Bad(h + 6, "expected no encryption, found the encrypted flag");
    if (r.compressed_size > file_size - data) {
      Bad(data, "expected " + std::to_string(r.compressed_size) +
                    " bytes of data inside the file, found the end of the file");
    }
    if (flags & 0x08) {
      // Sizes follow the data in a data descriptor: [PK 07 08] crc32,
      // compressed size, uncompressed size (4 bytes each, or 8 for zip64).
      uint64_t q = data + r.compressed_size;
      if (file_size - q >= 4 && format::LoadU32(d + q) == 0x08074b50u) q += 4;
      const uint64_t rest = file_size - q;
      const bool small = rest >= 12 && format::LoadU32(d + q) == r.crc &&
                         format::LoadU32(d + q + 4) == r.compressed_size &&
                         format::LoadU32(d + q + 8) == r.size;
      const bool big = rest >= 20 && format::LoadU32(d + q) == r.crc &&
                       format::LoadU64(d + q + 4) == r.compressed_size &&
                       format::LoadU64(d + q + 12) == r.size;
      if (!small && !big) {
        Bad(q,
            "expected a data descriptor after the data that agrees with the central directory (" +
                std::to_string(r.compressed_size) + " bytes stored, " + std::to_string(r.size) +
                " bytes of content), found none");
      }
      return;
    }
    uint64_t compressed = format::LoadU32(d + h + 18);
    uint64_t size = format::LoadU32(d + h + 22);
    if (compressed == 0xFFFFFFFFu || size == 0xFFFFFFFFu) {  // zip64: extra field 0x0001
      const uint64_t end = data;
      for (uint64_t x = h + kLocalHeaderSize + r.name.size(); x + 4 <= end;) {
        const uint16_t id = format::LoadU16(d + x), len = format::LoadU16(d + x + 2);
        if (len > end - x - 4) break;
        if (id == 0x0001) {
          uint64_t y = x + 4;
          if (size == 0xFFFFFFFFu && y + 8 <= x + 4 + len) size = format::LoadU64(d + y), y += 8;
          if (compressed == 0xFFFFFFFFu && y + 8 <= x + 4 + len)
            compressed = format::LoadU64(d + y);
          break;
        }
        x += 4 + len;
      }
    }
    if (compressed != r.compressed_size || size != r.size) {
      Bad(h + 18, "the local header gives " + std::to_string(compressed) + " bytes stored, " +
                      std::to_string(size) + " of content; the central directory " +
                      std::to_string(r.compressed_size) + " and " + std::to_string(r.size) +
                      " (readers would disagree on its bytes)");
    }
  }
};

}  // namespace

uint64_t Reader::OpenChecked(const Record& r) const {
  const std::string what = "zip record " + format::Quote(r.name) + ": ";
  unz64_file_pos pos{r.dir_pos, r.dir_num};
  if (unzGoToFilePos64(unz_, &pos) != UNZ_OK) Bad(what + "cannot read its central directory entry");
  if (unzOpenCurrentFile(unz_) != UNZ_OK) {
    Bad(what +
        "its local header disagrees with the central directory (method, CRC, sizes or "
        "name length)");
  }
  const uint64_t data = unzGetCurrentFileZStreamPos64(unz_);
  const int extra = unzGetLocalExtrafield(unz_, nullptr, 0);
  try {
    if (extra < 0) Bad(what + "cannot read its local extra field");
    LocalCheck{data_, size_, r, path_}.Run(data, static_cast<uint64_t>(extra));
  } catch (...) {
    unzCloseCurrentFile(unz_);
    throw;
  }
  return data;
}

uint64_t Reader::StoredData(const Record& r, uint64_t expected) const {
  const std::string what = "zip record " + format::Quote(r.name) + ": ";
  if (r.method != 0) {
    Bad(what + "expected stored (method 0), found compression method " + std::to_string(r.method));
  }
  if (r.size != expected || r.compressed_size != expected) {
    Bad(what + "expected " + std::to_string(expected) +
        " bytes (numel x element size from data.pkl), the central directory gives " +
        std::to_string(r.size));
  }
  const uint64_t data = OpenChecked(r);
  unzCloseCurrentFile(unz_);
  return data;
}

std::string Reader::Read(const Record& r, uint64_t max_bytes) const {
  const std::string what = "zip record " + format::Quote(r.name) + ": ";
  if (r.size > max_bytes) {
    Bad(what + "inflates to " + std::to_string(r.size) + " bytes, more than the " +
        std::to_string(max_bytes) + " this reader accepts");
  }
  if (r.method != 0 && r.method != 8) {
    Bad(what + "expected stored or deflate (method 0 or 8), found method " +
        std::to_string(r.method));
  }
  OpenChecked(r);
  struct CloseCurrent {
    void* unz;
    ~CloseCurrent() {
      if (unz) unzCloseCurrentFile(unz);
    }
  } closer{unz_};
  std::string out(static_cast<size_t>(r.size), '\0');
  uint64_t got = 0;
  while (got < r.size) {
    const unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(r.size - got, 1u << 20));
    const int n = unzReadCurrentFile(unz_, out.data() + got, chunk);
    if (n < 0) Bad(what + "cannot inflate it (damaged data, error " + std::to_string(n) + ")");
    if (n == 0) break;
    got += static_cast<uint64_t>(n);
  }
  if (got != r.size) {
    Bad(what + "expected " + std::to_string(r.size) + " bytes of content, found " +
        std::to_string(got));
  }
  closer.unz = nullptr;
  if (unzCloseCurrentFile(unz_) == UNZ_CRCERROR) {
    Bad(what + "its CRC-32 does not match its content");
  }
  return out;
}

}  // namespace tsar::zip
