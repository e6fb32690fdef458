// The zip container of torch.save and TorchScript files, read with minizip
// (Debian's libminizip) over bytes already in memory (a read-only mapping).
// No LibTorch: the torch.save importer and the import fuzzer use it as is.
//
// What it adds to minizip is the checking a packer needs, since the records
// are handed out as zero-copy views of the file: a stored record's bytes are
// located exactly, and the central directory, the local header and the data
// descriptor must all agree on its name, method and size (torch.load reads
// the central directory, a naive reader the local header: two readers must
// never see different bytes). Inflated records are read with a size cap and
// their CRC-32 checked.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace tsar::zip {

struct Record {
  std::string name;   // full name in the zip, "archive/data.pkl"
  uint64_t size = 0;  // uncompressed size, from the central directory
  uint64_t compressed_size = 0;
  uint16_t method = 0;  // 0 stored, 8 deflate
  uint16_t flags = 0;
  uint32_t crc = 0;
  uint64_t dir_pos = 0;  // minizip's position of the central directory entry
  uint64_t dir_num = 0;  // and its number
};

class Reader {
 public:
  // Reads the central directory of the zip in [data, data + size); `path`
  // names the file in errors. Throws kBadInput ("not a readable zip file:
  // ..."), also for two records with one name. The bytes must outlive it.
  Reader(const uint8_t* data, uint64_t size, std::string path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::vector<Record>& records() const { return records_; }
  // The record with this full name, or nullptr.
  const Record* Find(const std::string& name) const;
  // The directory every record of a torch.save or TorchScript zip is under,
  // with its slash ("archive/"), from the first record; "" when there is none.
  const std::string& prefix() const { return prefix_; }

  // Offset in the file of the bytes of a stored (uncompressed) record of
  // `expected` bytes. Throws kBadInput naming the record unless the record is
  // stored, the central directory, the local header (with its zip64 extra
  // field) and any data descriptor all give `expected` bytes, and the local
  // header names the same record.
  uint64_t StoredData(const Record& r, uint64_t expected) const;

  // The whole record, inflated if compressed. Throws kBadInput when it would
  // be larger than `max_bytes` (checked before anything is read), when the
  // data does not inflate to exactly the central directory's size, or when
  // its CRC-32 does not match.
  std::string Read(const Record& r, uint64_t max_bytes) const;

 private:
  struct Stream;
  [[noreturn]] void Bad(const std::string& what) const;
  // Makes `r` minizip's current file, opens it, and checks its local header
  // and data descriptor against the central directory; returns the offset of
  // its data. The caller closes the current file (unzCloseCurrentFile).
  uint64_t OpenChecked(const Record& r) const;

  const uint8_t* data_;
  uint64_t size_;
  std::string path_;
  struct Closer {
    void operator()(void* unz) const;
  };
  std::unique_ptr<Stream> stream_;
  // Closed also when the constructor throws (a member, not the destructor).
  std::unique_ptr<void, Closer> unz_holder_;
  void* unz_ = nullptr;
  std::vector<Record> records_;
  std::unordered_map<std::string, size_t> by_name_;
  std::string prefix_;
};

}  // namespace tsar::zip
