// A file that becomes visible at its destination only when published:
// written unnamed (O_TMPFILE) or under a temporary name in the destination
// directory, fsync'd, renamed into place, and the directory fsync'd.
//
// Destinations: a new name or a regular file (replaced). A symbolic link is
// followed: the file it points to is replaced, the link is kept (so a
// `current.tsar -> v3.tsar` link still names the file it named). Directories,
// devices, FIFOs and sockets are refused, so `-o /dev/null` never replaces a
// device node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tsar {

class AtomicFile {
 public:
  // Creates the temporary file next to `path` (after following symbolic
  // links), first removing temporaries that dead processes left in that
  // directory. Throws kInvalidArgument for a destination that is not a
  // regular file or a new name, kIo (naming the directory) when it cannot.
  // `named`: a temporary name from the start instead of O_TMPFILE.
  explicit AtomicFile(std::string path, bool named = false);
  // Without Publish(), the temporary file is removed; `path` is untouched.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void Resize(uint64_t size);
  void WriteAt(uint64_t offset, const void* data, uint64_t size);
  // Throws kIo, before anything is written, when the destination's file
  // system has fewer than `size` bytes free for this user.
  void CheckSpace(uint64_t size) const;
  // The temporary file's path, for libraries that can only write to a path
  // (HDF5, which resolves it with realpath, so an unnamed file will not do).
  // Only for an AtomicFile constructed with `named`. The file is private to
  // its owner (0600) until Publish() gives it the archive's mode.
  std::string WritablePath() const;
  // Flushes (when durable), then atomically replaces `path`.
  void Publish(bool durable);
  // After Publish(): asks the kernel to drop the file's pages from the page
  // cache (POSIX_FADV_DONTNEED; pages not yet written back stay). Advice
  // only: nothing fails.
  void DropFromCache() const;

 private:
  [[noreturn]] void Fail(const std::string& what, int err) const;
  std::string path_;    // as given, for messages
  std::string target_;  // path_ with symbolic links followed: what is replaced
  std::string dir_;
  std::string temp_name_;  // empty when O_TMPFILE is used
  int fd_ = -1;
  bool published_ = false;
};

// Writes that arrive in increasing offset order, gathered into runs that end
// on 2 MiB boundaries of the file for AtomicFile::WriteAt (kBlock): a system
// call per small tensor (or per zip record header) was a third of packing or
// exporting 100,000 tensors. A gap
// of up to one page between two writes is written as zeros, which is what the
// file holds there (never written: past its end, or Resize()d). Call Flush()
// before anything else writes the file; what is still buffered when the
// writer is destroyed without it is dropped (an error is on its way).
class SequentialWriter {
 public:
  explicit SequentialWriter(AtomicFile& file) : file_(file) {}
  // `offset` at or past the end of the previous write.
  void Write(uint64_t offset, const void* data, uint64_t size);
  void Flush();

 private:
  // Writes reach the file in whole, aligned 2 MiB blocks where they can: the
  // page cache then holds a freshly written file in PMD-sized folios, which a
  // reader maps with one page-table entry per 2 MiB (a file written in
  // unaligned 4 MiB pieces was left half in small folios: touching every page
  // of a 2 GiB model took twice as long until the cache was refilled).
  static constexpr uint64_t kBlock = 2u << 20;
  static constexpr uint64_t kMaxGap = 4096;
  AtomicFile& file_;
  std::vector<uint8_t> run_;
  uint64_t run_offset_ = 0;  // of run_[0]
  uint64_t end_ = 0;         // of the last write
};

}  // namespace tsar
