// Where `tsar pack` and `tsar export` write and what they read (issue 16):
// device nodes, FIFOs and sockets are never replaced or opened, a symbolic
// link keeps pointing at the file it named, and temporaries a killed pack
// left behind are removed by the next pack into that directory.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/cli/cli_fixture.h"

namespace tsar {
namespace {

using testing::Fixture;
using testing::OneErrorLine;
using testing::Result;
using testing::Sh;

// Tsar() runs under `timeout`: a hang is exit 124, which every test below rejects.
class DestinationTest : public testing::CliFixture {
 protected:
  mode_t Type(const std::string& p) const {
    struct stat st;
    return lstat(p.c_str(), &st) == 0 ? (st.st_mode & S_IFMT) : 0;
  }
};

// Returns false when this process may not make device nodes (not root).
bool MakeCharDevice(const std::string& path) {
  return mknod(path.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;  // as /dev/null
}

void MakeSocket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof addr.sun_path);
  std::strcpy(addr.sun_path, path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << path;
  close(fd);
}

TEST_F(DestinationTest, DevicesFifosAndSocketsAreNeverReplaced) {
  ASSERT_EQ(Tsar("pack -q " + Fixture("params.pt") + " -o " + Path("ok.tsar")).code, 0);
  ASSERT_EQ(mkfifo(Path("fifo.pt").c_str(), 0644), 0);
  MakeSocket(Path("sock.h5"));
  std::vector<std::pair<std::string, mode_t>> targets = {{Path("fifo.pt"), S_IFIFO},
                                                         {Path("sock.h5"), S_IFSOCK}};
  if (MakeCharDevice(Path("null.safetensors"))) {
    targets.push_back({Path("null.safetensors"), S_IFCHR});
  } else {
    std::cerr << "not root: the character-device case is not run\n";
  }
  const std::map<mode_t, std::string> names = {
      {S_IFIFO, "a FIFO"}, {S_IFSOCK, "a socket"}, {S_IFCHR, "a character device"}};
  for (const auto& [target, type] : targets) {
    for (const std::string& cmd : {"pack -q " + Fixture("tied_sd.pt") + " -o " + target,
                                   "export " + Path("ok.tsar") + " -o " + target}) {
      const Result r = Tsar(cmd);
      EXPECT_EQ(r.code, 2) << cmd << ": " << r.err;
      EXPECT_TRUE(OneErrorLine(r, "is " + names.at(type) + ", expected a regular file")) << cmd;
      EXPECT_EQ(Type(target), type) << target << " was replaced by: " << cmd;
    }
  }
}

TEST_F(DestinationTest, ASymbolicLinkKeepsNamingTheFileItPointsTo) {
  ASSERT_EQ(Tsar("pack -q " + Fixture("tied_sd.pt") + " -o " + Path("v3.tsar")).code, 0);
  ASSERT_EQ(symlink("v3.tsar", Path("current.tsar").c_str()), 0);
  const Result r = Tsar("pack -q " + Fixture("params.pt") + " -o " + Path("current.tsar"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Type(Path("current.tsar")), S_IFLNK);
  char buf[64] = {0};
  ASSERT_GT(readlink(Path("current.tsar").c_str(), buf, sizeof buf - 1), 0);
  EXPECT_STREQ(buf, "v3.tsar");
  // The link's target now holds the new archive: the same bytes as a fresh pack.
  ASSERT_EQ(Tsar("pack -q " + Fixture("params.pt") + " -o " + Path("fresh.tsar")).code, 0);
  EXPECT_EQ(testing::ReadAll(Path("v3.tsar")), testing::ReadAll(Path("fresh.tsar")));

  // A dangling link: its target is created, the link kept.
  ASSERT_EQ(symlink("next.tsar", Path("staged.tsar").c_str()), 0);
  ASSERT_EQ(Tsar("pack -q " + Fixture("params.pt") + " -o " + Path("staged.tsar")).code, 0);
  EXPECT_EQ(Type(Path("staged.tsar")), S_IFLNK);
  EXPECT_EQ(testing::ReadAll(Path("next.tsar")), testing::ReadAll(Path("fresh.tsar")));

  // A link to a FIFO is refused like the FIFO itself.
  ASSERT_EQ(mkfifo(Path("pipe").c_str(), 0644), 0);
  ASSERT_EQ(symlink("pipe", Path("to_pipe.tsar").c_str()), 0);
  const Result f = Tsar("pack -q " + Fixture("params.pt") + " -o " + Path("to_pipe.tsar"));
  EXPECT_EQ(f.code, 2);
  EXPECT_TRUE(OneErrorLine(f, "the link's target " + Path("pipe") + "): is a FIFO"));
  EXPECT_EQ(Type(Path("pipe")), S_IFIFO);
}

TEST_F(DestinationTest, FifoInputsFailAtOnceInsteadOfBlocking) {
  ASSERT_EQ(mkfifo(Path("in.pt").c_str(), 0644), 0);
  Result r = Tsar("pack " + Path("in.pt") + " -o " + Path("o.tsar"));
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(OneErrorLine(r, Path("in.pt") + ": not a regular file (it is a FIFO)"));
  for (const char* cmd : {"inspect", "verify", "residency", "export"}) {
    r = Tsar(std::string(cmd) + " " + Path("in.pt") +
             (std::string(cmd) == "export" ? " -o " + Path("x.pt") : ""));
    EXPECT_NE(r.code, 0) << cmd;
    EXPECT_NE(r.code, 124) << cmd << " blocked on the FIFO";
    EXPECT_TRUE(OneErrorLine(r, "not a regular file (it is a FIFO)")) << cmd;
  }
  r = Tsar("diff " + Path("in.pt") + " " + Path("in.pt"));
  EXPECT_EQ(r.code, 3) << r.err;
}

unsigned long long PidNamespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
}

TEST_F(DestinationTest, TemporariesOfDeadProcessesAreRemovedByTheNextPack) {
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  waitpid(dead, nullptr, 0);
  const std::string ns = std::to_string(PidNamespace());
  const std::string d = std::to_string(dead), live = std::to_string(getpid());
  // What a pack killed between linkat and rename leaves (O_TMPFILE path), and
  // what the mkstemp fallback leaves; then ones that must stay.
  const std::vector<std::string> stale = {".out.tsar.tmp-" + d + "@" + ns,
                                          ".other.tsar.tmp-" + d + "@" + ns + ".a1B2c3"};
  const std::vector<std::string> kept = {
      ".out.tsar.tmp-" + live + "@" + ns,     // a live process
      ".out.tsar.tmp-" + d + "@" + ns + "1",  // another PID namespace
      ".out.tsar.tmp-" + d,                   // not our name pattern
      "out.tsar.tmp-" + d + "@" + ns};        // not hidden
  for (const auto& n : stale) testing::WriteAll(Path(n), "partial");
  for (const auto& n : kept) testing::WriteAll(Path(n), "partial");
  const Result r = Tsar("pack -q " + Fixture("tied_sd.pt") + " -o " + Path("out.tsar"));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const auto& n : stale) EXPECT_EQ(Type(Path(n)), 0u) << n << " was left";
  for (const auto& n : kept) EXPECT_EQ(Type(Path(n)), S_IFREG) << n << " was removed";
}

}  // namespace
}  // namespace tsar
