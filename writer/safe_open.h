// Opening the files an importer reads below an input directory (a TensorDict
// memmap() directory, the directory of a sharded safetensors index) so that
// none of them is a symbolic link that leaves it: the rule of `tsar pack`
// (README, "Hostile input"). A pipeline that packs a directory it was handed
// must not ship the build host's /etc/passwd because a KEY.memmap pointed
// there.
//
// The path below the directory is walked one component at a time from a
// descriptor of the directory: fstatat(AT_SYMLINK_NOFOLLOW), then
// openat(O_PATH | O_NOFOLLOW) for each directory and openat(O_NOFOLLOW) for
// the file, never a path string handed to open(2). A symbolic link met on
// the way is read (readlinkat) and its target walked the same way from the
// link's own directory: ".." above the input directory, or an absolute
// target outside the directory's real path, is refused (kBadInput, naming the
// input, the link and its target). A link that stays inside is followed. No
// string test decides what a path reaches: the descriptors do.
#pragma once

#include <sys/stat.h>

#include <memory>
#include <string>

#include "tsar/error.h"

namespace tsar::importer {

class InputDir {
 public:
  // Opens directory `dir` (symbolic links in `dir` itself are followed: the
  // user named it). `input` is the input as the user named it (the directory,
  // its meta.json, the index file), for messages. `follow_out`: follow links
  // wherever they point (ImportOptions::follow_symlinks). Throws kNotFound,
  // kBadInput (not a directory), kIo.
  InputDir(const std::string& dir, const std::string& input, bool follow_out = false);
  ~InputDir();
  InputDir(const InputDir&) = delete;
  InputDir& operator=(const InputDir&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& input() const { return input_; }
  // `rel` as a path for messages: dir/rel.
  std::string Path(const std::string& rel) const;

  // What `rel` (a relative path, components separated by '/') reaches.
  struct Found {
    enum class Kind { kAbsent, kRegular, kDirectory, kOther } kind = Kind::kAbsent;
    struct stat st {};  // of what was found (kRegular, kDirectory, kOther)
    // When a symbolic link led to nothing (kAbsent): the link (as Path()
    // shows it) and its target.
    std::string link, target;
    // What was found, for messages: "a regular file", "a FIFO", "a directory",
    // "a symbolic link \"d/x\" to \"y\", which names nothing", "no such file".
    std::string Describe() const;
  };
  // Throws kBadInput for a link that leaves the directory or a loop of links,
  // kIo for an error other than a missing file.
  Found Stat(const std::string& rel) const;

  // Opens the regular file `rel` read-only (O_CLOEXEC), without blocking on
  // a FIFO or opening a device (it is refused first). `st` receives its fstat.
  // Throws kNotFound (nothing there), kBadInput (a link that leaves, not a
  // regular file: naming what it is), kIo.
  int OpenFile(const std::string& rel, struct stat* st) const;

 private:
  struct Walked;
  Walked Walk(const std::string& rel) const;
  [[noreturn]] void Leaves(const std::string& link, const std::string& target) const;

  std::string dir_, input_;
  std::string prefix_;  // what Path() puts before a relative path
  std::string real_;    // the directory's real path (for absolute link targets)
  int fd_ = -1;         // O_PATH descriptor of the directory
  bool follow_out_ = false;
};

}  // namespace tsar::importer
