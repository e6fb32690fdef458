// PathWatch (loader/path_watch.h).
#include "loader/path_watch.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "loader/open_file.h"

namespace tsar {

std::optional<FileIdentity> IdentityOf(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  FileIdentity id;
  id.dev = st.st_dev;
  id.ino = st.st_ino;
  id.size = static_cast<int64_t>(st.st_size);
  id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return id;
}

PathWatch::PathWatch(const std::string& path, bool use_inotify) : dir_(DirOf(path)) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  if (use_inotify) {
    inotify_fd_ = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (inotify_fd_ >= 0) AddWatch();
  }
}

PathWatch::~PathWatch() {
  if (inotify_fd_ >= 0) close(inotify_fd_);
  close(wake_fd_);
}

void PathWatch::AddWatch() {
  // A rename over the path (tsar pack, mv, a symbolic link swapped by
  // rename) is IN_MOVED_TO; a file written in place is IN_CLOSE_WRITE once
  // complete (not IN_MODIFY, which a half-copied file sends all along).
  // The directory itself going away ends the watch (IN_IGNORED); Wait adds
  // it again when the directory is back.
  watch_ = inotify_add_watch(inotify_fd_, dir_.c_str(),
                             IN_MOVED_TO | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF);
}

PathWatch::Woke PathWatch::Wait(std::chrono::milliseconds timeout) {
  if (inotify_fd_ >= 0 && watch_ < 0) AddWatch();
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {inotify_fd_, POLLIN, 0}};
  const int nfds = inotify_fd_ >= 0 ? 2 : 1;
  int ms = timeout.count() < 0 ? -1 : static_cast<int>(std::min<int64_t>(timeout.count(), 1 << 30));
  int n;
  do {
    n = poll(fds, nfds, ms);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return Woke::kTimeout;
  if (fds[0].revents & POLLIN) {
    uint64_t v;
    ssize_t unused = read(wake_fd_, &v, sizeof v);
    (void)unused;
    return Woke::kWake;
  }
  // Drain every queued event: the caller looks at the path once for all.
  alignas(inotify_event) char buf[16384];
  for (;;) {
    const ssize_t len = read(inotify_fd_, buf, sizeof buf);
    if (len <= 0) break;
    for (ssize_t at = 0; at < len;) {
      const auto* e = reinterpret_cast<const inotify_event*>(buf + at);
      if (e->mask & IN_IGNORED) watch_ = -1;
      at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
    }
  }
  return Woke::kEvent;
}

void PathWatch::Wake() {
  const uint64_t one = 1;
  ssize_t unused = write(wake_fd_, &one, sizeof one);
  (void)unused;
}

}  // namespace tsar
