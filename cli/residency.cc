// `tsar residency ARCHIVE [--json]`: how much of an archive is in the page cache
// (mincore) and which processes map it, with their Rss and Pss shares (/proc).
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/describe.h"
#include "cli/tensor_parallel.h"
#include "loader/open_file.h"
#include "tsar/archive_file.h"

namespace tsar::cli {
namespace {

// A mapped file as /proc/PID/maps names it: device major, minor, inode.
struct FileId {
  unsigned major, minor;
  unsigned long inode;
  bool operator==(const FileId& o) const {
    return major == o.major && minor == o.minor && inode == o.inode;
  }
};

// Parses "lo-hi perms offset MM:mm inode [path]", the first line of every
// mapping in maps and smaps; false for any other line.
bool ParseMapping(const char* line, uintptr_t* lo, uintptr_t* hi, FileId* id) {
  unsigned long a, b;
  if (std::sscanf(line, "%lx-%lx %*s %*s %x:%x %lu", &a, &b, &id->major, &id->minor, &id->inode) !=
      5)
    return false;
  *lo = a;
  *hi = b;
  return true;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct Measure {
  uint64_t file_size = 0, page_size = 0, pages = 0, resident_pages = 0;
  std::vector<FileId> ids;  // every (device, inode) pair the kernel may show for the file
  std::vector<uint8_t> resident;  // per page, 1 when in the page cache
};

// mincore(2) over a mapping of our own: it reports the page cache without
// faulting anything in. The same mapping tells which device and inode the
// kernel prints in maps for this file, which can differ from stat() (on
// overlayfs maps shows the underlying file).
Measure MeasureCache(const std::string& path) {
  struct stat st;
  Fd f{OpenRegularFile(path, &st, ErrorCode::kInvalidArgument)};
  Measure m;
  m.file_size = static_cast<uint64_t>(st.st_size);
  m.page_size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  m.pages = (m.file_size + m.page_size - 1) / m.page_size;
  m.ids.push_back({major(st.st_dev), minor(st.st_dev), static_cast<unsigned long>(st.st_ino)});
  if (m.file_size == 0) return m;

  void* p = mmap(nullptr, m.file_size, PROT_READ, MAP_SHARED, f.fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    throw Error(ErrorCode::kIo, path, std::nullopt,
                std::string("cannot mmap: ") + std::strerror(e));
  }
  const auto base = reinterpret_cast<uintptr_t>(p);
  constexpr uint64_t kWindow = 1u << 16;  // pages per mincore call: a 64 KiB vector
  std::vector<unsigned char> vec(kWindow);
  int err = 0;
  for (uint64_t first = 0; first < m.pages && !err; first += kWindow) {
    const uint64_t n = std::min(kWindow, m.pages - first);
    const uint64_t len = std::min(n * m.page_size, m.file_size - first * m.page_size);
    if (mincore(static_cast<char*>(p) + first * m.page_size, len, vec.data()) != 0) {
      err = errno;
      break;
    }
    for (uint64_t i = 0; i < n; ++i) {
      m.resident_pages += vec[i] & 1;
      m.resident.push_back(vec[i] & 1);
    }
  }
  if (FILE* maps = std::fopen("/proc/self/maps", "re")) {
    char line[4096];
    while (std::fgets(line, sizeof line, maps)) {
      uintptr_t lo, hi;
      FileId id;
      if (ParseMapping(line, &lo, &hi, &id) && lo <= base && base < hi) {
        if (!(id == m.ids[0])) m.ids.push_back(id);
        break;
      }
    }
    std::fclose(maps);
  }
  munmap(p, m.file_size);
  if (err) {
    throw Error(ErrorCode::kIo, path, std::nullopt, std::string("mincore: ") + std::strerror(err));
  }
  return m;
}

struct Process {
  long pid;
  std::string comm;
  uint64_t rss = 0, pss = 0, private_dirty = 0;  // bytes
};

enum class ReadResult { kOk, kGone, kDenied };

ReadResult Failure(int err) {
  return err == EACCES || err == EPERM ? ReadResult::kDenied : ReadResult::kGone;
}

// Whether /proc/PID/maps has a mapping of the file. The cheap pass: smaps,
// which walks page tables, is read only for the processes that match.
ReadResult MapsFile(const std::string& dir, const std::vector<FileId>& ids, bool* found) {
  FILE* f = std::fopen((dir + "/maps").c_str(), "re");
  if (!f) return Failure(errno);
  char line[4096];
  *found = false;
  errno = 0;
  while (!*found && std::fgets(line, sizeof line, f)) {
    uintptr_t lo, hi;
    FileId id;
    // A path longer than the buffer continues on the next fgets; it cannot
    // parse as a mapping line, so it is skipped.
    *found =
        ParseMapping(line, &lo, &hi, &id) && std::find(ids.begin(), ids.end(), id) != ids.end();
  }
  const int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  return err ? Failure(err) : ReadResult::kOk;
}

// The command name of the process whose /proc directory is `dir`; "" when
// it is gone.
std::string Comm(const std::string& dir) {
  std::string comm;
  if (FILE* c = std::fopen((dir + "/comm").c_str(), "re")) {
    char line[64];
    if (std::fgets(line, sizeof line, c)) comm = line;
    std::fclose(c);
  }
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  return comm;
}

// Sums Rss, Pss and Private_Dirty (kB in smaps) over the file's mappings.
ReadResult SmapsFile(const std::string& dir, const std::vector<FileId>& ids, Process* p) {
  FILE* f = std::fopen((dir + "/smaps").c_str(), "re");
  if (!f) return Failure(errno);
  char line[4096];
  bool inside = false;
  errno = 0;
  while (std::fgets(line, sizeof line, f)) {
    uintptr_t lo, hi;
    FileId id;
    if (ParseMapping(line, &lo, &hi, &id)) {
      inside = std::find(ids.begin(), ids.end(), id) != ids.end();
      continue;
    }
    if (!inside) continue;
    unsigned long long kb;
    if (std::sscanf(line, "Rss: %llu kB", &kb) == 1) p->rss += kb * 1024;
    if (std::sscanf(line, "Pss: %llu kB", &kb) == 1) p->pss += kb * 1024;
    if (std::sscanf(line, "Private_Dirty: %llu kB", &kb) == 1) p->private_dirty += kb * 1024;
  }
  const int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err) return Failure(err);
  p->comm = Comm(dir);
  return ReadResult::kOk;
}

struct Scan {
  std::vector<Process> processes;
  size_t denied = 0, gone = 0;
  std::vector<long> denied_pids;
};

// Whether this process holds CAP_SYS_PTRACE (capability 19) in its effective
// set, read from /proc/self/status's CapEff (false where it cannot be read).
bool HasCapSysPtrace() {
  constexpr int kCapSysPtrace = 19;
  bool has = false;
  if (FILE* f = std::fopen("/proc/self/status", "re")) {
    char line[256];
    unsigned long long eff;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "CapEff: %llx", &eff) == 1) {
        has = (eff >> kCapSysPtrace) & 1;
        break;
      }
    }
    std::fclose(f);
  }
  return has;
}

Scan ScanProcesses(const std::vector<FileId>& ids) {
  Scan s;
  DIR* proc = opendir("/proc");
  if (!proc)
    throw Error(ErrorCode::kIo, "/proc", std::nullopt,
                std::string("cannot open: ") + std::strerror(errno));
  const long self = static_cast<long>(getpid());
  while (const dirent* d = readdir(proc)) {
    char* end;
    const long pid = std::strtol(d->d_name, &end, 10);
    if (d->d_name[0] < '0' || d->d_name[0] > '9' || *end != '\0' || pid == self) continue;
    const std::string dir = std::string("/proc/") + d->d_name;
    bool found = false;
    Process p{pid, "", 0, 0, 0};
    ReadResult r = MapsFile(dir, ids, &found);
    if (r == ReadResult::kOk && found) r = SmapsFile(dir, ids, &p);
    if (r == ReadResult::kDenied) {
      ++s.denied;
      s.denied_pids.push_back(pid);
    }
    if (r == ReadResult::kGone) ++s.gone;
    if (r == ReadResult::kOk && found) s.processes.push_back(std::move(p));
  }
  closedir(proc);
  std::sort(s.processes.begin(), s.processes.end(),
            [](const Process& a, const Process& b) { return a.pid < b.pid; });
  return s;
}

// §4.12: for the first kMaxListedRanks ranks of a tensor-parallel archive,
// the pages of the file each reads (its slices and the whole tensors) and
// how many are resident. One pass over the storages per rank, resident pages
// counted with sums per block of 64 pages: memory and time grow with the file
// (its pages, its storages), never with world x storages.
std::vector<std::pair<uint64_t, uint64_t>> RankPages(const TpPlan& tp, const Measure& m) {
  constexpr uint64_t kBlock = 64;
  const uint64_t known = m.resident.size();
  std::vector<uint64_t> before(known / kBlock + 1, 0);  // resident pages before block b
  for (uint64_t b = 0; b < known / kBlock; ++b) {
    uint64_t n = 0;
    for (uint64_t p = b * kBlock; p < (b + 1) * kBlock; ++p) n += m.resident[p];
    before[b + 1] = before[b] + n;
  }
  const auto resident = [&](uint64_t first, uint64_t end) {  // pages [first, end)
    uint64_t n = 0;
    const uint64_t fb = (first + kBlock - 1) / kBlock, eb = end / kBlock;
    if (fb >= eb) {
      for (uint64_t p = first; p < end; ++p) n += m.resident[p];
      return n;
    }
    for (uint64_t p = first; p < fb * kBlock; ++p) n += m.resident[p];
    for (uint64_t p = eb * kBlock; p < end; ++p) n += m.resident[p];
    return n + before[eb] - before[fb];
  };
  std::vector<std::pair<uint64_t, uint64_t>> out;  // (pages, resident)
  const uint32_t listed = std::min(tp.world, kMaxListedRanks);
  for (uint32_t rank = 0; rank < listed; ++rank) {
    uint64_t pages = 0, in_cache = 0, next = 0;  // `next`: first page not yet counted
    for (const TpPlan::Run& run : tp.runs) {
      const uint64_t off = run.offset + uint64_t{rank} * run.stride;
      const uint64_t first = std::max(off / m.page_size, next);
      const uint64_t end = std::min((off + run.length + m.page_size - 1) / m.page_size, known);
      if (first < end) {
        pages += end - first;
        in_cache += resident(first, end);
      }
      next = std::max(next, end);
    }
    out.emplace_back(pages, in_cache);
  }
  return out;
}

int RunResidency(const std::string& path, bool json) {
  Measure m;
  TpPlan tp;
  try {
    // Measured before validation: Archive::open reads the header and index,
    // which would put those pages in the cache and skew the count.
    m = MeasureCache(path);
    // Default options only map the file (no prefetch, no full verify); the
    // archive is released before the scan, which also skips our own pid.
    tp = DescribeTp(OpenArchive(path));
  } catch (const Error& e) {
    PrintError(e.what());
    return kExitBadInput;
  }
  const Scan s = ScanProcesses(m.ids);
  uint64_t total_pss = 0, total_rss = 0;
  for (const auto& p : s.processes) {
    total_pss += p.pss;
    total_rss += p.rss;
  }
  const double percent =
      m.pages ? 100.0 * static_cast<double>(m.resident_pages) / static_cast<double>(m.pages) : 0;

  if (json) {
    nlohmann::ordered_json j;
    j["path"] = path;
    j["file_size"] = m.file_size;
    j["page_size"] = m.page_size;
    j["pages"] = m.pages;
    j["resident_pages"] = m.resident_pages;
    auto& procs = j["processes"] = nlohmann::ordered_json::array();
    for (const auto& p : s.processes) {
      procs.push_back({{"pid", p.pid},
                       {"comm", p.comm},
                       {"rss_bytes", p.rss},
                       {"pss_bytes", p.pss},
                       {"private_dirty_bytes", p.private_dirty}});
    }
    if (tp.world) {
      auto& ranks = j["ranks"] = nlohmann::ordered_json::array();
      for (const auto& [pages, resident] : RankPages(tp, m))
        ranks.push_back({{"pages", pages}, {"resident_pages", resident}});
      j["ranks_not_listed"] = tp.world - ranks.size();
    }
    j["total_pss_bytes"] = total_pss;
    j["total_rss_bytes"] = total_rss;
    j["skipped_processes"] = {{"permission_denied", s.denied},
                              {"exited", s.gone},
                              {"permission_denied_pids", s.denied_pids}};
    std::printf("%s\n",
                j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
    return kExitOk;
  }

  std::printf("%s: %llu of %llu pages (%.1f%%) in page cache (%s of %s)\n", path.c_str(),
              static_cast<unsigned long long>(m.resident_pages),
              static_cast<unsigned long long>(m.pages), percent,
              HumanBytes(std::min(m.resident_pages * m.page_size, m.file_size)).c_str(),
              HumanBytes(m.file_size).c_str());
  if (tp.world) {
    const auto ranks = RankPages(tp, m);
    for (size_t r = 0; r < ranks.size(); ++r) {
      std::printf("  rank %zu of %u: %llu of the %llu pages it reads in page cache\n", r, tp.world,
                  static_cast<unsigned long long>(ranks[r].second),
                  static_cast<unsigned long long>(ranks[r].first));
    }
    if (ranks.size() < tp.world) {
      std::printf("  ... and %zu more ranks, not listed (the first %u are)\n",
                  tp.world - ranks.size(), kMaxListedRanks);
    }
  }
  if (s.processes.empty()) {
    std::printf("no process maps it\n");
  } else {
    std::printf("%8s  %-16s %12s %12s %14s\n", "PID", "COMMAND", "RSS", "PSS", "PRIVATE_DIRTY");
    for (const auto& p : s.processes) {
      std::printf("%8ld  %-16s %12s %12s %14s\n", p.pid, p.comm.c_str(), HumanBytes(p.rss).c_str(),
                  HumanBytes(p.pss).c_str(), HumanBytes(p.private_dirty).c_str());
    }
  }
  std::printf("total: Pss %s in %zu process%s (Rss %s; the file is %s)\n",
              HumanBytes(total_pss).c_str(), s.processes.size(),
              s.processes.size() == 1 ? "" : "es", HumanBytes(total_rss).c_str(),
              HumanBytes(m.file_size).c_str());
  // Processes whose maps cannot be read may map the file too: named where
  // something can be done about it. Root without CAP_SYS_PTRACE (a container's
  // default) is refused the processes that are not dumpable (a server that
  // dropped its privileges). Root with it is refused only what the kernel
  // keeps from every process here (a VM's or container's supervisor, often
  // pid 1; another user namespace's): no command can read those, so no note;
  // --json counts them.
  const bool root = geteuid() == 0;
  const bool all_reach = root && HasCapSysPtrace();
  if (s.denied && !all_reach) {
    std::string which;
    for (size_t i = 0; i < s.denied_pids.size() && i < 8; ++i) {
      which += (i ? ", " : "") + std::to_string(s.denied_pids[i]) + " (" +
               Comm("/proc/" + std::to_string(s.denied_pids[i])) + ")";
    }
    if (s.denied_pids.size() > 8) which += ", ...";
    std::fprintf(stderr,
                 "tsar: note: %zu process%s not listed (permission denied reading "
                 "/proc/PID/maps): pid %s; %s\n",
                 s.denied, s.denied == 1 ? "" : "es", which.c_str(),
                 root ? "as root, a process that is not dumpable needs CAP_SYS_PTRACE too"
                      : "run as root to see more");
  }
  if (s.gone) {
    std::fprintf(stderr, "tsar: note: %zu process%s exited during the scan\n", s.gone,
                 s.gone == 1 ? "" : "es");
  }
  return kExitOk;
}

}  // namespace

Run AddResidency(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand(
      "residency", "Show how much of an archive is in the page cache and which processes map it");
  sub->add_option("archive", *path, "The .tsar file")->required();
  sub->add_flag("--json", *json, "One JSON object on stdout (fields below)");
  sub->footer(
      "Page cache residency comes from mincore(2), which reads nothing in; processes and their\n"
      "Rss/Pss of the file from /proc/PID/maps and smaps. The total Pss is what all of them\n"
      "together cost: N workers sharing one copy sum to about one file size. Every process\n"
      "whose maps can be read and that maps the file is listed; the others are not. A note\n"
      "names those whose maps could not be read where running otherwise would show them:\n"
      "processes of other users (run as root), and as root without CAP_SYS_PTRACE those that\n"
      "are not dumpable. As root with CAP_SYS_PTRACE, what the kernel still refuses (a VM's or\n"
      "container's supervisor, often pid 1) is left out of the text; --json counts it.\n"
      "--json: {\"path\", \"file_size\", \"page_size\", \"pages\", \"resident_pages\", "
      "\"processes\": [{\"pid\", \"comm\",\n"
      "  \"rss_bytes\", \"pss_bytes\", \"private_dirty_bytes\"}], \"total_pss_bytes\", "
      "\"total_rss_bytes\",\n"
      "  \"skipped_processes\": {\"permission_denied\", \"exited\", \"permission_denied_pids\"}}\n"
      "An archive packed for tensor-parallel ranks (pack --tp) also gets, per rank, the pages\n"
      "it reads (its slices and the tensors stored whole) and how many are in the page cache\n"
      "(\"ranks\": [{\"pages\", \"resident_pages\"}] in --json). The first 256 ranks are listed;\n"
      "the rest are counted (\"ranks_not_listed\"): a small file can say 65536 ranks.\n"
      "Examples:\n"
      "  tsar residency /models/resnet.tsar\n"
      "  tsar residency /models/resnet.tsar --json | jq '.total_pss_bytes'");
  return [path, json] { return RunResidency(*path, *json); };
}

}  // namespace tsar::cli
