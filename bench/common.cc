// Shared helpers of the benchmark harness (bench/common.h).
#include "bench/common.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace tsar::bench {

void Die(const std::string& what) {
  std::fprintf(stderr, "tsar_bench: %s\n", what.c_str());
  std::exit(1);
}

namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

Recorder::Recorder(const std::string& path) : out_(std::fopen(path.c_str(), "w")) {
  if (!out_) Die(Errno("cannot write " + path));
  Row({"bench", "case", "variant", "unit", "run", "value"});
}

Recorder::~Recorder() { std::fclose(out_); }

void Recorder::Row(const std::vector<std::string>& fields) {
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) line += (i ? "," : "") + Quote(fields[i]);
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void Recorder::Add(const std::string& bench, const std::string& kase, const std::string& variant,
                   const std::string& unit, int run, double value) {
  char v[64];
  std::snprintf(v, sizeof v, "%.6g", value);
  Row({bench, kase, variant, unit, std::to_string(run), v});
  std::fprintf(stderr, "  %-3s %-24s %-52s run %2d: %10s %s\n", bench.c_str(), kase.c_str(),
               variant.c_str(), run, v, unit.c_str());
}

void Recorder::Info(const std::string& key, const std::string& value) {
  Row({"info", key, "", "", "0", value});
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) Die(Errno("cannot stat " + path));
  return static_cast<uint64_t>(st.st_size);
}

std::vector<char> ReadFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die(Errno("cannot open " + path));
  struct stat st;
  fstat(fd, &st);
  std::vector<char> buf(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t n = read(fd, buf.data() + done, buf.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Die(Errno("cannot read " + path));
    done += static_cast<size_t>(n);
  }
  close(fd);
  return buf;
}

void FsyncFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die(Errno("cannot open " + path));
  if (fsync(fd) != 0) Die(Errno("cannot fsync " + path));
  close(fd);
}

uint64_t PageCount(const std::string& path) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (FileSize(path) + page - 1) / page;
}

uint64_t ResidentPages(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die(Errno("cannot open " + path));
  const size_t len = static_cast<size_t>(FileSize(path));
  void* p = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) Die(Errno("cannot map " + path));
  std::vector<unsigned char> vec(static_cast<size_t>(PageCount(path)));
  if (mincore(p, len, vec.data()) != 0) Die(Errno("mincore " + path));
  munmap(p, len);
  uint64_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

uint64_t EvictFile(const std::string& path) {
  sync();
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die(Errno("cannot open " + path));
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  uint64_t left = ResidentPages(path);
  if (left != 0 && geteuid() == 0) {
    std::ofstream("/proc/sys/vm/drop_caches") << "1\n";
    left = ResidentPages(path);
  }
  return left;
}

uint64_t TouchEveryByte(const void* p, uint64_t n) {
  const auto* w = static_cast<const uint64_t*>(p);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  uint64_t i = 0;
  for (; i + 4 <= n / 8; i += 4) {
    a += w[i];
    b ^= w[i + 1];
    c += w[i + 2];
    d ^= w[i + 3];
  }
  for (; i < n / 8; ++i) a += w[i];
  const auto* tail = static_cast<const unsigned char*>(p) + (n / 8) * 8;
  for (uint64_t k = 0; k < n % 8; ++k) a += tail[k];
  return a ^ b ^ c ^ d;
}

namespace {

pid_t Spawn(const std::vector<std::string>& argv, int in_fd, int out_fd) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (in_fd >= 0) posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
  if (out_fd >= 0) posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  pid_t pid;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    errno = rc;
    Die(Errno("cannot start " + argv[0]));
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) Die(Errno("waitpid"));
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace

Child::Child(const std::vector<std::string>& argv, bool stdout_to_null) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) Die(Errno("pipe"));
  int child_out = -1;
  if (stdout_to_null) {
    child_out = open("/dev/null", O_WRONLY | O_CLOEXEC);
    out[0] = out[1] = -1;
  } else {
    if (pipe2(out, O_CLOEXEC) != 0) Die(Errno("pipe"));
    child_out = out[1];
  }
  pid_ = Spawn(argv, in[0], child_out);
  close(in[0]);
  close(child_out);
  in_ = in[1];
  if (!stdout_to_null) out_ = fdopen(out[0], "r");
}

Child::Child(Child&& o) noexcept : pid_(o.pid_), in_(o.in_), out_(o.out_) {
  o.pid_ = -1;
  o.in_ = -1;
  o.out_ = nullptr;
}

Child::~Child() {
  if (pid_ > 0) Finish();
}

std::string Child::ReadLine() {
  if (!out_) return "";
  std::string line;
  for (int c; (c = std::fgetc(out_)) != EOF && c != '\n';) line += static_cast<char>(c);
  return line;
}

int Child::Finish() {
  if (in_ >= 0) close(in_);
  in_ = -1;
  const int rc = pid_ > 0 ? Wait(pid_) : 0;
  pid_ = -1;
  if (out_) std::fclose(out_);
  out_ = nullptr;
  return rc;
}

int RunCommand(const std::vector<std::string>& argv, bool keep_output) {
  const int null_fd = keep_output ? -1 : open("/dev/null", O_WRONLY | O_CLOEXEC);
  const pid_t pid = Spawn(argv, -1, null_fd);
  if (null_fd >= 0) close(null_fd);
  return Wait(pid);
}

int RunCommandPeakAnon(const std::vector<std::string>& argv, uint64_t* peak_anon_kb) {
  const int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  const pid_t pid = Spawn(argv, -1, null_fd);
  close(null_fd);
  *peak_anon_kb = 0;
  const std::string status_path = "/proc/" + std::to_string(pid) + "/status";
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done < 0 && errno != EINTR) Die(Errno("waitpid"));
    if (done == pid) return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    std::ifstream in(status_path);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("RssAnon:", 0) == 0) {
        *peak_anon_kb = std::max<uint64_t>(*peak_anon_kb, std::strtoull(line.c_str() + 8, nullptr, 10));
      }
    }
    usleep(1000);
  }
}

std::map<std::string, uint64_t> SmapsRollup(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  if (!in) Die("cannot read /proc/" + std::to_string(pid) + "/smaps_rollup");
  std::map<std::string, uint64_t> out;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || line.find(" kB") == std::string::npos) continue;
    out[line.substr(0, colon)] = std::strtoull(line.c_str() + colon + 1, nullptr, 10);
  }
  return out;
}

uint64_t MappingPss(pid_t pid, const std::string& prefix) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps");
  if (!in) Die("cannot read /proc/" + std::to_string(pid) + "/smaps");
  uint64_t kb = 0;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    // A mapping header is "start-end perms offset dev inode [path]"; the
    // field lines below it are "Name: value".
    const size_t colon = line.find(':');
    const size_t space = line.find(' ');
    if (space != std::string::npos && (colon == std::string::npos || colon > space)) {
      const size_t slash = line.find(" /");
      inside = slash != std::string::npos && line.compare(slash + 1, prefix.size(), prefix) == 0;
    } else if (inside && line.rfind("Pss:", 0) == 0) {
      kb += std::strtoull(line.c_str() + 4, nullptr, 10);
    }
  }
  return kb;
}

std::map<std::string, std::string> ParseKeyValues(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t sp = line.find(' ');
    if (sp != std::string::npos) out[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return out;
}

}  // namespace tsar::bench
