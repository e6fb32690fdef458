// AtomicFile (writer/atomic_file.h). With O_TMPFILE the file has no name until
// it is complete; it gets one (".NAME.tmp-PID@PIDNS") for the microseconds
// between linkat and rename. A process killed in that window leaves it behind:
// the next AtomicFile in that directory removes such files of dead processes
// of its own PID namespace (a process of another namespace may be alive).
#include "writer/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "loader/open_file.h"
#include "tsar/error.h"

namespace tsar {
namespace {

// The archive is immutable once published: read-only for everyone (umask applies).
constexpr mode_t kMode = 0444;
constexpr int kMaxLinks = 40;  // as the kernel's own limit on symlink chains (ELOOP)
constexpr const char* kTempInfix = ".tmp-";

std::string BaseOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The PID namespace's inode: PIDs are comparable only within one namespace.
unsigned long long PidNamespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
}

// "PID@NS" for temporary names.
std::string TempTag() {
  return std::to_string(static_cast<long>(getpid())) + "@" + std::to_string(PidNamespace());
}

// Parses ".NAME.tmp-PID@NS" or ".NAME.tmp-PID@NS.XXXXXX"; false for others.
bool ParseTempName(const char* name, long* pid, unsigned long long* ns) {
  if (name[0] != '.') return false;
  const char* infix = std::strstr(name + 1, kTempInfix);
  const char* last = nullptr;
  for (; infix != nullptr; infix = std::strstr(infix + 1, kTempInfix)) last = infix;
  if (last == nullptr) return false;
  const char* p = last + std::strlen(kTempInfix);
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(p, &end, 10);
  if (end == p || *end != '@' || errno != 0 || v <= 0) return false;
  p = end + 1;
  const unsigned long long n = std::strtoull(p, &end, 10);
  if (end == p || errno != 0) return false;
  if (*end != '\0' && !(end[0] == '.' && std::strlen(end) == 7)) return false;
  *pid = v;
  *ns = n;
  return true;
}

// Removes temporaries of processes that no longer exist (same PID namespace).
void RemoveStaleTemporaries(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  const unsigned long long ns = PidNamespace();
  while (const dirent* e = readdir(d)) {
    long pid = 0;
    unsigned long long their_ns = 0;
    if (!ParseTempName(e->d_name, &pid, &their_ns) || their_ns != ns || pid == getpid()) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

// `path` with every symbolic link along the final component followed (the
// directories above are left to the kernel). The result may not exist yet.
std::string FollowLinks(const std::string& path) {
  std::string p = path;
  for (int hops = 0; hops <= kMaxLinks; ++hops) {
    struct stat st;
    if (lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    char buf[PATH_MAX];
    const ssize_t n = readlink(p.c_str(), buf, sizeof buf - 1);
    if (n < 0) return p;
    std::string link(buf, static_cast<size_t>(n));
    p = (link[0] == '/' || p.find('/') == std::string::npos) ? link : DirOf(p) + "/" + link;
  }
  throw Error(
      ErrorCode::kInvalidArgument, path, std::nullopt,
      "output: more than " + std::to_string(kMaxLinks) + " symbolic links to follow (a loop?)");
}

// The process's umask, read without changing it (umask(2) can only be read
// by setting it, which races with other threads creating files).
mode_t CurrentUmask() {
  if (FILE* f = std::fopen("/proc/self/status", "re")) {
    char line[256];
    unsigned mask = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) {
      found = std::sscanf(line, "Umask: %o", &mask) == 1;
    }
    std::fclose(f);
    if (found) return static_cast<mode_t>(mask);
  }
  const mode_t mask = umask(0);
  umask(mask);
  return mask;
}

}  // namespace

AtomicFile::AtomicFile(std::string path, bool named) : path_(std::move(path)) {
  if (path_.empty() || path_.back() == '/') {
    throw Error(ErrorCode::kInvalidArgument, path_, std::nullopt, "output: expected a file name");
  }
  target_ = FollowLinks(path_);
  dir_ = DirOf(target_);
  struct stat st;
  if (stat(target_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    const std::string via = target_ == path_ ? "" : " (the link's target " + target_ + ")";
    if (S_ISDIR(st.st_mode)) {
      throw Error(ErrorCode::kInvalidArgument, path_, std::nullopt,
                  "output" + via + ": is a directory, expected a file name");
    }
    throw Error(ErrorCode::kInvalidArgument, path_, std::nullopt,
                "output" + via + ": is " + FileTypeName(st.st_mode) +
                    ", expected a regular file or a new name (the output is replaced by a new "
                    "file, which would destroy it)");
  }
  RemoveStaleTemporaries(dir_);
#ifdef O_TMPFILE
  // Owner-only while written (HDF5 reopens it by path, WritablePath()); the
  // archive's mode is set when it is published. mkstemp makes it 0600 too.
  if (!named) fd_ = open(dir_.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, S_IRUSR | S_IWUSR);
#endif
  if (fd_ < 0) {
    temp_name_ = dir_ + "/." + BaseOf(target_) + kTempInfix + TempTag() + ".XXXXXX";
    fd_ = mkstemp(temp_name_.data());
    if (fd_ < 0) {
      const int err = errno;
      temp_name_.clear();
      throw Error(ErrorCode::kIo, path_, std::nullopt,
                  "cannot create a file in directory " + dir_ + ": " + std::strerror(err));
    }
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) close(fd_);
  if (!published_ && !temp_name_.empty()) unlink(temp_name_.c_str());
}

void AtomicFile::Fail(const std::string& what, int err) const {
  throw Error(ErrorCode::kIo, path_, std::nullopt, what + ": " + std::strerror(err));
}

void AtomicFile::Resize(uint64_t size) {
  if (ftruncate(fd_, static_cast<off_t>(size)) != 0)
    Fail("cannot size the output to " + std::to_string(size) + " bytes", errno);
}

void AtomicFile::WriteAt(uint64_t offset, const void* data, uint64_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, 1u << 30));
    const ssize_t n = pwrite(fd_, p, chunk, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail("cannot write", errno);
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
}

void SequentialWriter::Write(uint64_t offset, const void* data, uint64_t size) {
  if (offset < end_) {
    throw std::logic_error("SequentialWriter: a write at " + std::to_string(offset) +
                           " before the end of the previous one, " + std::to_string(end_));
  }
  if (!run_.empty() && offset - (run_offset_ + run_.size()) > kMaxGap) Flush();
  end_ = offset + size;
  const auto* p = static_cast<const uint8_t*>(data);
  // The bytes up to the next block boundary join the run (with the gap
  // before them, as zeros); the run goes out when it reaches the boundary.
  if (run_.empty()) run_offset_ = offset;
  run_.resize(offset - run_offset_, 0);
  const uint64_t head = std::min(size, (kBlock - offset % kBlock) % kBlock);
  run_.insert(run_.end(), p, p + head);
  if (head == size && (offset + head) % kBlock != 0) return;
  Flush();
  p += head;
  offset += head;
  size -= head;
  // Whole blocks straight to the file; the rest starts the next run.
  const uint64_t body = size - size % kBlock;
  if (body > 0) file_.WriteAt(offset, p, body);
  run_offset_ = offset + body;
  run_.assign(p + body, p + size);
}

void SequentialWriter::Flush() {
  if (run_.empty()) return;
  file_.WriteAt(run_offset_, run_.data(), run_.size());
  run_.clear();
}

void AtomicFile::CheckSpace(uint64_t size) const {
  struct statvfs fs;
  if (fstatvfs(fd_, &fs) != 0) return;  // unknown: the writes will say
  const unsigned __int128 free = static_cast<unsigned __int128>(fs.f_bavail) * fs.f_frsize;
  if (free < size) {
    throw Error(ErrorCode::kIo, path_, std::nullopt,
                "output: needs " + std::to_string(size) + " bytes, the file system of " + dir_ +
                    " has " + std::to_string(static_cast<uint64_t>(free)) + " free");
  }
}

std::string AtomicFile::WritablePath() const {
  if (temp_name_.empty()) {
    throw Error(ErrorCode::kInvalidArgument, path_, std::nullopt,
                "output: the temporary file has no name (construct the AtomicFile named)");
  }
  return temp_name_;
}

void AtomicFile::Publish(bool durable) {
  const mode_t mask = CurrentUmask();
  if (fchmod(fd_, kMode & ~mask) != 0) Fail("cannot set the mode of the new file", errno);
  if (durable && fsync(fd_) != 0) Fail("cannot flush", errno);
  if (temp_name_.empty()) {
    // Give the unnamed file a name in the same directory, then rename it over
    // the destination: linkat cannot replace an existing file, rename can.
    char proc[64];
    std::snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd_);
    std::string name = dir_ + "/." + BaseOf(target_) + kTempInfix + TempTag();
    unlink(name.c_str());
    if (linkat(AT_FDCWD, proc, AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) != 0) {
      Fail("cannot link the new archive into " + dir_, errno);
    }
    temp_name_ = name;
  }
  // Checked again: the destination may have been replaced since the constructor.
  struct stat st;
  if (lstat(target_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kInvalidArgument, path_, std::nullopt,
                std::string("output: became ") + FileTypeName(st.st_mode) +
                    " while being written; not replaced");
  }
  if (rename(temp_name_.c_str(), target_.c_str()) != 0) Fail("cannot rename into place", errno);
  published_ = true;
  if (durable) {
    const int dfd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      const int rc = fsync(dfd);
      const int err = errno;
      close(dfd);
      if (rc != 0) Fail("cannot flush directory " + dir_, err);
    }
  }
}

void AtomicFile::DropFromCache() const {
  if (fd_ >= 0) posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
}

}  // namespace tsar
