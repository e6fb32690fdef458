// Page sharing across processes, read-only files and mounts, non-root users:
// the loader never writes and never copies in kShared mode.
#include <ATen/ATen.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tests/loader/test_helpers.h"
#include "tsar/tsar.h"

namespace tsar {
namespace {

using testing::Finish;
using testing::Line;
using testing::Start;
using testing::Worker;

const std::string kWorker = std::string(TSAR_TEST_WORKER);

class SharingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir();
    chmod(dir_.c_str(), 0755);
    path_ = dir_ + "/model.tsar";
    std::vector<std::pair<std::string, at::Tensor>> v;
    at::manual_seed(3);
    for (int i = 0; i < 8; ++i)
      v.push_back({"layer" + std::to_string(i), at::randn({1024, 1024})});  // 32 MiB
    pack(path_, v);
  }
  void TearDown() override {
    std::system(("umount -q " + dir_ + "/ro 2>/dev/null; rm -rf " + dir_).c_str());
  }
  std::string dir_, path_;
};

TEST_F(SharingTest, FourProcessesShareOneCopyOfTheWeights) {
  std::vector<Worker> ws;
  for (int i = 0; i < 4; ++i) ws.push_back(Start({kWorker, path_, "--hold"}));
  std::string first;
  for (auto& w : ws) {
    const std::string line = Line(w);
    ASSERT_EQ(line.rfind("ok ", 0), 0u) << line;
    if (first.empty()) first = line;
    EXPECT_EQ(line, first) << "workers disagree on the weights";
  }
  const uint64_t file_kb = testing::ReadAll(path_).size() / 1024;
  uint64_t pss = 0, rss = 0, dirty = 0;
  for (auto& w : ws) {
    pss += testing::SmapsField(w.pid, path_, "Pss");
    rss += testing::SmapsField(w.pid, path_, "Rss");
    dirty += testing::SmapsField(w.pid, path_, "Private_Dirty");
  }
  for (auto& w : ws) EXPECT_EQ(Finish(w), 0);
  EXPECT_EQ(dirty, 0u) << "a worker has private copies of archive pages";
  EXPECT_GE(rss, 4 * file_kb * 9 / 10) << "each worker should map (nearly) the whole file";
  EXPECT_LE(pss, file_kb * 105 / 100 + 64) << "summed Pss should be about one copy";
  EXPECT_GE(pss, file_kb * 90 / 100);
}

TEST_F(SharingTest, AReadOnlyFileOpensForAnUnprivilegedUser) {
  ASSERT_EQ(chmod(path_.c_str(), 0444), 0);
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch to an unprivileged user";
  // The build tree may be where nobody cannot enter (a clone under /root or
  // in a mkdtemp directory): run copies of the worker and libtsar from the
  // world-readable test directory instead.
  Dl_info info;
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&InstallFaultHandler), &info), 0);
  const std::string lib = dir_ + "/lib", worker = dir_ + "/tsar_test_worker";
  ASSERT_EQ(mkdir(lib.c_str(), 0755), 0);
  ASSERT_EQ(testing::Sh("cp " + kWorker + " " + worker + " && cp " + info.dli_fname + " " + lib +
                        "/ && chmod -R a+rX " + dir_)
                .code,
            0);
  // LibTorch itself is the torch wheel's, inside the project's .venv: too big
  // to copy, and unreachable for nobody when the clone is in a private folder.
  Dl_info torch_info;
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&c10::GetAllocator), &torch_info), 0);
  if (testing::Sh("setpriv --reuid=65534 --regid=65534 --clear-groups test -r " +
                  std::string(torch_info.dli_fname)).code != 0) {
    GTEST_SKIP() << "LibTorch (" << torch_info.dli_fname
                 << ") is not readable by uid 65534 here (a private checkout folder)";
  }
  Worker w = Start({"/usr/bin/env", "LD_LIBRARY_PATH=" + lib, worker, path_}, /*uid=*/65534);
  const std::string line = Line(w);
  EXPECT_EQ(Finish(w), 0);
  EXPECT_EQ(line.rfind("ok ", 0), 0u) << line;
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0444u);
}

TEST_F(SharingTest, WhereMmapIsRefusedTheLoaderReadsWithAWarning) {
  // The shim fails every file mmap with ENODEV, as some FUSE and network file
  // systems do; the archive must still load, through pread, with a warning.
  const testing::Result r =
      testing::Sh("LD_PRELOAD=" + std::string(TSAR_REFUSE_MMAP) + " " + kWorker + " " + path_);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("mmap refused"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("reading into private memory instead"), std::string::npos) << r.err;
  // Same weights as through a mapping.
  const testing::Result mapped = testing::Sh(kWorker + " " + path_);
  ASSERT_EQ(mapped.code, 0);
  EXPECT_EQ(r.out, mapped.out);
}

TEST_F(SharingTest, AnArchiveOnAReadOnlyBindMountLoads) {
  const std::string ro = dir_ + "/ro";
  mkdir(ro.c_str(), 0755);
  const std::string probe = "unshare -m true 2>/dev/null";
  if (std::system(probe.c_str()) != 0) GTEST_SKIP() << "unshare -m is not permitted here";
  // In a private mount namespace: bind the directory read-only and load through it.
  const std::string cmd = "unshare -m sh -c 'mount --bind " + dir_ + " " + ro +
                          " && mount -o remount,bind,ro " + ro + " && touch " + ro +
                          "/probe 2>/dev/null; test ! -e " + dir_ + "/probe && " + kWorker + " " +
                          ro + "/model.tsar'";
  Worker w = Start({"/bin/sh", "-c", cmd});
  const std::string line = Line(w);
  const int rc = Finish(w);
  if (rc != 0 && line.empty())
    GTEST_SKIP() << "mount --bind -o ro is not permitted here (rc " << rc << ")";
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(line.rfind("ok ", 0), 0u) << line;
}

}  // namespace
}  // namespace tsar
