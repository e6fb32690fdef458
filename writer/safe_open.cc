// InputDir (writer/safe_open.h): files below an input directory, opened
// component by component so that no symbolic link takes a read outside it.
#include "writer/safe_open.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "format/reader.h"
#include "loader/open_file.h"

namespace tsar::importer {
namespace {

using format::Quote;

// As the kernel's MAXSYMLINKS: more links than this on one path is a loop.
constexpr int kMaxLinks = 40;

// An owned descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// The components of a relative path, without empty and "." ones.
std::vector<std::string> Split(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    std::string c = path.substr(start, slash - start);
    if (!c.empty() && c != ".") out.push_back(std::move(c));
    start = slash + 1;
  }
  return out;
}

std::string Join(const std::vector<std::string>& parts, const std::string& last) {
  std::string s;
  for (const std::string& p : parts) s += p + "/";
  return s + last;
}

// The target of the symbolic link `name` in directory `dir`.
std::string ReadLink(int dir, const std::string& name, const std::string& shown) {
  std::vector<char> buf(256);
  for (;;) {
    const ssize_t n = readlinkat(dir, name.c_str(), buf.data(), buf.size());
    if (n < 0) {
      throw Error(ErrorCode::kIo, shown, std::nullopt,
                  std::string("cannot read the symbolic link: ") + std::strerror(errno));
    }
    if (static_cast<size_t>(n) < buf.size()) return std::string(buf.data(), static_cast<size_t>(n));
    if (buf.size() > PATH_MAX * 4) {
      throw Error(
          ErrorCode::kBadInput, shown, std::nullopt,
          "a symbolic link whose target is longer than " + std::to_string(buf.size()) + " bytes");
    }
    buf.resize(buf.size() * 2);
  }
}

InputDir::Found::Kind KindOf(mode_t mode) {
  using Kind = InputDir::Found::Kind;
  if (S_ISREG(mode)) return Kind::kRegular;
  if (S_ISDIR(mode)) return Kind::kDirectory;
  return Kind::kOther;
}

}  // namespace

// Where a walk ended: the directory holding the last component (the input
// directory's own descriptor, or one the walk opened), the component, and
// what it is.
struct InputDir::Walked {
  int parent = -1;
  Fd owned;          // `parent` when the walk opened it
  std::string name;  // the last component ("." for the directory itself)
  bool found = false;
  struct stat st {};
  std::string link, target;  // the last symbolic link followed, below the directory
};

InputDir::InputDir(const std::string& dir, const std::string& input, bool follow_out)
    : dir_(dir), input_(input), follow_out_(follow_out) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  if (dir_.empty()) {
    dir_ = ".";
    prefix_ = "";  // files show as their bare names, as the input named them
  } else {
    prefix_ = dir_ == "/" ? "/" : dir_ + "/";
  }
  fd_ = ::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    throw Error(err == ENOENT    ? ErrorCode::kNotFound
                : err == ENOTDIR ? ErrorCode::kBadInput
                                 : ErrorCode::kIo,
                dir_, std::nullopt,
                err == ENOTDIR ? std::string("expected a directory, found a file")
                               : std::string("cannot open the directory: ") + std::strerror(err));
  }
  // The real path of what was opened, for absolute link targets that name a
  // place inside it. Without it, every absolute target counts as outside.
  char buf[PATH_MAX + 1];
  const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
  const ssize_t n = readlink(proc.c_str(), buf, PATH_MAX);
  if (n > 0 && buf[0] == '/') {
    real_.assign(buf, static_cast<size_t>(n));
  } else if (char* r = realpath(dir_.c_str(), nullptr)) {
    real_ = r;
    std::free(r);
  }
}

InputDir::~InputDir() {
  if (fd_ >= 0) ::close(fd_);
}

std::string InputDir::Path(const std::string& rel) const {
  if (rel.empty() || rel == ".") return dir_;
  return prefix_ + rel;
}

void InputDir::Leaves(const std::string& link, const std::string& target) const {
  throw Error(ErrorCode::kBadInput, input_, std::nullopt,
              Quote(Path(link)) + " is a symbolic link to " + Quote(target) +
                  ", which leaves the input directory " + Quote(dir_) +
                  ": tsar reads only files inside it (links that stay inside are followed; "
                  "tsar pack --follow-symlinks follows every link)");
}

InputDir::Walked InputDir::Walk(const std::string& rel) const {
  Walked w;
  std::vector<Fd> stack;           // directories below fd_, opened on the way
  std::vector<std::string> names;  // their components, for messages
  // Components still to walk, each with the link whose target it comes from
  // (an index into `followed`; -1 for `rel` itself).
  std::deque<std::pair<std::string, int>> todo;
  std::vector<std::pair<std::string, std::string>> followed;  // link, target
  for (std::string& c : Split(rel)) todo.emplace_back(std::move(c), -1);
  const auto top = [&] { return stack.empty() ? fd_ : stack.back().get(); };
  while (!todo.empty()) {
    auto [c, origin] = std::move(todo.front());
    todo.pop_front();
    if (c == "..") {
      if (stack.empty()) {
        // Only a link's target has ".." here: the importers' paths have none.
        if (origin < 0) {
          throw Error(
              ErrorCode::kBadInput, input_, std::nullopt,
              Quote(Path(rel)) + ": expected a path inside the input directory " + Quote(dir_));
        }
        Leaves(followed[origin].first, followed[origin].second);
      }
      stack.pop_back();
      names.pop_back();
      continue;
    }
    const std::string shown = Join(names, c);
    struct stat st;
    if (fstatat(top(), c.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      const int err = errno;
      if (err == ENOENT || err == ENOTDIR) return w;  // not found
      throw Error(ErrorCode::kIo, Path(shown), std::nullopt,
                  std::string("cannot stat: ") + std::strerror(err));
    }
    if (S_ISLNK(st.st_mode)) {
      if (followed.size() >= static_cast<size_t>(kMaxLinks)) {
        throw Error(ErrorCode::kBadInput, input_, std::nullopt,
                    Quote(Path(rel)) + ": more than " + std::to_string(kMaxLinks) +
                        " symbolic links on the way (a loop of links?)");
      }
      const std::string target = ReadLink(top(), c, Path(shown));
      w.link = shown;
      w.target = target;
      followed.emplace_back(shown, target);
      const int here = static_cast<int>(followed.size() - 1);
      std::string rest = target;
      if (!target.empty() && target[0] == '/') {
        // An absolute target stays inside only below the directory's real
        // path; the walk then starts again from the directory's descriptor.
        const bool inside = !real_.empty() && (real_ == "/" || target == real_ ||
                                               (target.size() > real_.size() &&
                                                target.compare(0, real_.size(), real_) == 0 &&
                                                target[real_.size()] == '/'));
        if (!inside) Leaves(shown, target);
        stack.clear();
        names.clear();
        rest = real_ == "/" ? target : target.substr(real_.size());
      }
      std::vector<std::string> more = Split(rest);
      for (size_t i = more.size(); i-- > 0;) todo.emplace_front(std::move(more[i]), here);
      continue;
    }
    if (!todo.empty()) {                   // a directory on the way
      if (!S_ISDIR(st.st_mode)) return w;  // as ENOTDIR: nothing there
      const int fd = openat(top(), c.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) {
        const int err = errno;
        if (err == ENOENT) return w;
        throw Error(err == ENOTDIR || err == ELOOP ? ErrorCode::kBadInput : ErrorCode::kIo,
                    Path(shown), std::nullopt,
                    err == ENOTDIR || err == ELOOP
                        ? std::string("changed while being read (it was a directory)")
                        : std::string("cannot open the directory: ") + std::strerror(err));
      }
      stack.emplace_back(fd);
      names.push_back(c);
      continue;
    }
    w.found = true;
    w.st = st;
    w.name = std::move(c);
    if (!stack.empty()) {
      w.owned = std::move(stack.back());
      w.parent = w.owned.get();
    } else {
      w.parent = fd_;
    }
    return w;
  }
  // The path named the directory itself (or, through links, one below it).
  w.name = ".";
  if (!stack.empty()) {
    w.owned = std::move(stack.back());
    w.parent = w.owned.get();
  } else {
    w.parent = fd_;
  }
  if (fstat(w.parent, &w.st) != 0) {
    throw Error(ErrorCode::kIo, Path(rel), std::nullopt,
                std::string("cannot stat: ") + std::strerror(errno));
  }
  w.found = true;
  return w;
}

std::string InputDir::Found::Describe() const {
  switch (kind) {
    case Kind::kRegular:
      return "a regular file";
    case Kind::kDirectory:
      return "a directory";
    case Kind::kOther:
      return FileTypeName(st.st_mode);
    case Kind::kAbsent:
      break;
  }
  if (link.empty()) return "no such file";
  return "a symbolic link " + Quote(link) + " to " + Quote(target) + ", which names nothing";
}

InputDir::Found InputDir::Stat(const std::string& rel) const {
  Found f;
  if (follow_out_) {
    const std::string path = Path(rel);
    if (stat(path.c_str(), &f.st) == 0) {
      f.kind = KindOf(f.st.st_mode);
      return f;
    }
    const int err = errno;
    struct stat l;
    if ((err == ENOENT || err == ENOTDIR) && lstat(path.c_str(), &l) == 0 && S_ISLNK(l.st_mode)) {
      f.link = path;
      f.target = ReadLink(AT_FDCWD, path, path);
    } else if (err != ENOENT && err != ENOTDIR) {
      throw Error(ErrorCode::kIo, path, std::nullopt,
                  std::string("cannot stat: ") + std::strerror(err));
    }
    return f;
  }
  Walked w = Walk(rel);
  if (!w.found) {
    if (!w.link.empty()) f.link = Path(w.link);
    f.target = w.target;
    return f;
  }
  f.st = w.st;
  f.kind = KindOf(w.st.st_mode);
  return f;
}

int InputDir::OpenFile(const std::string& rel, struct stat* st) const {
  const std::string path = Path(rel);
  if (follow_out_) return OpenRegularFile(path, st, ErrorCode::kBadInput);
  Walked w = Walk(rel);
  if (!w.found) {
    throw Error(ErrorCode::kNotFound, path, std::nullopt,
                w.link.empty() ? std::string("cannot open: No such file or directory")
                               : "cannot open: " + Quote(Path(w.link)) + " is a symbolic link to " +
                                     Quote(w.target) + ", which names nothing");
  }
  // Refused before open(2): opening a FIFO could block, opening a device act.
  if (!S_ISREG(w.st.st_mode)) {
    throw Error(ErrorCode::kBadInput, path, std::nullopt,
                std::string("not a regular file (it is ") + FileTypeName(w.st.st_mode) + ")");
  }
  const int fd =
      openat(w.parent, w.name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) {  // replaced by a link since the walk looked
      throw Error(ErrorCode::kBadInput, path, std::nullopt,
                  "changed while being opened (it became a symbolic link)");
    }
    throw Error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, path, std::nullopt,
                std::string("cannot open: ") + std::strerror(err));
  }
  Fd guard(fd);
  if (fstat(fd, st) != 0) {
    throw Error(ErrorCode::kIo, path, std::nullopt,
                std::string("cannot stat: ") + std::strerror(errno));
  }
  if (!S_ISREG(st->st_mode) || st->st_ino != w.st.st_ino || st->st_dev != w.st.st_dev) {
    throw Error(ErrorCode::kBadInput, path, std::nullopt,
                S_ISREG(st->st_mode)
                    ? std::string("changed while being opened (another file took its name)")
                    : std::string("not a regular file (it is ") + FileTypeName(st->st_mode) + ")");
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return guard.release();
}

}  // namespace tsar::importer
