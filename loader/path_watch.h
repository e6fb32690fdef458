// PathWatch: waits until the file at a path may have changed (inotify on its
// directory), a timeout passes, or another thread wakes it. The caller
// decides by FileIdentity whether anything did change. No LibTorch.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace tsar {

// What tells one file at a path from the next: a rename over the path gives
// another inode; a rewrite in place another size or mtime.
struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileIdentity& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
  }
  bool operator!=(const FileIdentity& o) const { return !(*this == o); }
};
// stat() of the path (symbolic links followed); nullopt if it cannot be.
std::optional<FileIdentity> IdentityOf(const std::string& path);

class PathWatch {
 public:
  // With use_inotify, watches the directory of `path` for renames into it
  // and files closed after writing; if inotify is unavailable (no instances
  // left, a file system without it) inotify() is false and Wait only times out.
  PathWatch(const std::string& path, bool use_inotify);
  ~PathWatch();
  PathWatch(const PathWatch&) = delete;
  PathWatch& operator=(const PathWatch&) = delete;

  bool inotify() const { return inotify_fd_ >= 0; }

  enum class Woke { kEvent, kTimeout, kWake };
  // Waits for an event in the directory, Wake(), or `timeout` (negative:
  // no timeout). Drains every queued event.
  Woke Wait(std::chrono::milliseconds timeout);
  // Ends a Wait now, from any thread.
  void Wake();

 private:
  void AddWatch();
  std::string dir_;
  int inotify_fd_ = -1;
  int watch_ = -1;
  int wake_fd_ = -1;  // eventfd
};

}  // namespace tsar
