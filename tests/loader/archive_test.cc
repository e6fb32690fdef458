// Archive::open and tensor(): zero copy, aliasing, modes, lifetime, bad files.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "tests/loader/test_helpers.h"
#include "tsar/tsar.h"

namespace tsar {
namespace {

using testing::InRanges;
using testing::MappedRanges;
using testing::Throws;

using ArchiveTest = testing::TempDirTest;

// One tensor of every dtype LibTorch 1.13 has, with values that use every bit pattern class.
std::vector<std::pair<std::string, at::Tensor>> DtypeZoo() {
  at::manual_seed(7);
  std::vector<std::pair<std::string, at::Tensor>> v;
  const auto base = at::randn({3, 5}, at::kDouble) * 100;
  v.push_back({"bool", base.gt(0)});
  v.push_back({"uint8", base.abs().to(at::kByte)});
  v.push_back({"int8", base.to(at::kChar)});
  v.push_back({"int16", (base * 100).to(at::kShort)});
  v.push_back({"int32", (base * 1e6).to(at::kInt)});
  v.push_back({"int64", (base * 1e15).to(at::kLong)});
  v.push_back({"float16", base.to(at::kHalf)});
  v.push_back({"bfloat16", base.to(at::kBFloat16)});
  v.push_back({"float32", base.to(at::kFloat)});
  v.push_back({"float64", base});
  v.push_back({"complex64", at::complex(base.to(at::kFloat), -base.to(at::kFloat))});
  v.push_back({"complex128", at::complex(base, base * 2)});
  v.push_back({"scalar", at::scalar_tensor(3.25, at::kFloat)});
  v.push_back({"empty", at::empty({0, 4}, at::kFloat)});
  v.push_back({"transposed", base.to(at::kFloat).t()});
  v.push_back({"offset_slice", base.to(at::kFloat).narrow(1, 2, 3)});
  return v;
}

TEST_F(ArchiveTest, EveryDtypeRoundTripsExactlyAndZeroCopy) {
  const auto zoo = DtypeZoo();
  pack(Path("zoo.tsar"), zoo);
  const Archive a = Archive::open(Path("zoo.tsar"));
  ASSERT_EQ(a.names().size(), zoo.size());
  const auto ranges = MappedRanges(Path("zoo.tsar"));
  ASSERT_FALSE(ranges.empty());
  for (const auto& [name, want] : zoo) {
    const at::Tensor got = a.tensor(name);
    EXPECT_EQ(got.scalar_type(), want.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), want.sizes()) << name;
    EXPECT_EQ(got.strides(), want.strides()) << name;
    EXPECT_TRUE(at::equal(got, want)) << name;
    if (want.numel() > 0)
      EXPECT_TRUE(InRanges(got.data_ptr(), ranges)) << name << " is not in the mapping";
  }
  // Names come back in the order they were packed.
  for (size_t i = 0; i < zoo.size(); ++i) EXPECT_EQ(a.names()[i], zoo[i].first);
}

TEST_F(ArchiveTest, SharedStoragesComeBackAliasedWithTheirOffsetsAndStrides) {
  const at::Tensor full = at::arange(16, at::kFloat);
  const at::Tensor part = full.narrow(0, 4, 8).view({2, 4});
  const at::Tensor tr = full.narrow(0, 0, 12).view({3, 4}).t();
  const at::Tensor other = at::ones({3});
  pack(Path("v.tsar"),
       std::vector<std::pair<std::string, at::Tensor>>{
           {"full", full}, {"part", part}, {"tr", tr}, {"tied", full}, {"other", other}});
  const Archive a = Archive::open(Path("v.tsar"));
  EXPECT_EQ(a.storages().size(), 2u);
  const at::Tensor f = a.tensor("full"), p = a.tensor("part"), t = a.tensor("tr"),
                   tied = a.tensor("tied");
  EXPECT_TRUE(f.storage().is_alias_of(p.storage()));
  EXPECT_TRUE(f.storage().is_alias_of(t.storage()));
  EXPECT_EQ(f.data_ptr(), tied.data_ptr());
  EXPECT_EQ(p.storage_offset(), 4);
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{1, 4}));
  EXPECT_TRUE(at::equal(t, tr));
  EXPECT_FALSE(a.tensor("other").storage().is_alias_of(f.storage()));
  // Two calls give two tensors over one storage.
  EXPECT_TRUE(a.tensor("full").storage().is_alias_of(f.storage()));
}

TEST_F(ArchiveTest, OnlyTheSpanTheTensorsCoverIsWritten) {
  const at::Tensor big = at::arange(1 << 20, at::kFloat);  // 4 MiB
  pack(Path("s.tsar"),
       std::vector<std::pair<std::string, at::Tensor>>{{"slice", big.narrow(0, 1000, 10)}});
  const Archive a = Archive::open(Path("s.tsar"));
  EXPECT_LT(a.file_size(), 1024u);
  EXPECT_TRUE(at::equal(a.tensor("slice"), big.narrow(0, 1000, 10)));
}

TEST_F(ArchiveTest, TensorsKeepTheMappingAliveAfterTheArchiveIsGone) {
  pack(Path("k.tsar"),
       std::vector<std::pair<std::string, at::Tensor>>{{"x", at::arange(1000, at::kFloat)}});
  at::Tensor x;
  {
    const Archive a = Archive::open(Path("k.tsar"));
    x = a.tensor("x");
  }
  EXPECT_FALSE(MappedRanges(Path("k.tsar")).empty());
  EXPECT_EQ(x.sum().item<float>(), 499500.0f);
  x.reset();
  EXPECT_TRUE(MappedRanges(Path("k.tsar")).empty()) << "the mapping outlived its last tensor";
}

TEST_F(ArchiveTest, CopyOnWriteWritesStayPrivate) {
  pack(Path("c.tsar"), std::vector<std::pair<std::string, at::Tensor>>{{"x", at::zeros({256})}});
  const std::string before = testing::ReadAll(Path("c.tsar"));
  OpenOptions o;
  o.mode = MapMode::kCopyOnWrite;
  const Archive a = Archive::open(Path("c.tsar"), o);
  at::Tensor x = a.tensor("x");
  x.add_(5);
  EXPECT_EQ(x.sum().item<float>(), 1280.0f);
  EXPECT_EQ(testing::ReadAll(Path("c.tsar")), before);
  EXPECT_EQ(Archive::open(Path("c.tsar")).tensor("x").sum().item<float>(), 0.0f);
}

TEST_F(ArchiveTest, ReadModeReturnsEqualTensorsInPrivateMemory) {
  const auto zoo = DtypeZoo();
  pack(Path("r.tsar"), zoo);
  OpenOptions o;
  o.mode = MapMode::kRead;
  const Archive a = Archive::open(Path("r.tsar"), o);
  EXPECT_EQ(a.mode(), MapMode::kRead);
  EXPECT_TRUE(MappedRanges(Path("r.tsar")).empty());
  for (const auto& [name, want] : zoo) EXPECT_TRUE(at::equal(a.tensor(name), want)) << name;
}

TEST_F(ArchiveTest, PrefetchModesReturnTheSameBytes) {
  pack(Path("p.tsar"),
       std::vector<std::pair<std::string, at::Tensor>>{{"x", at::arange(5000, at::kInt)}});
  for (Prefetch p : {Prefetch::kNone, Prefetch::kWillNeed, Prefetch::kPopulate, Prefetch::kLock}) {
    OpenOptions o;
    o.prefetch = p;
    o.verify = VerifyMode::kFull;
    EXPECT_EQ(Archive::open(Path("p.tsar"), o).tensor("x").sum().item<int64_t>(), 12497500);
  }
}

TEST_F(ArchiveTest, WritingIntoASharedMappingDiesWithADiagnostic) {
#if TSAR_UNDER_ASAN
  GTEST_SKIP() << "AddressSanitizer handles SIGSEGV itself, before any handler of ours";
#endif
  pack(Path("w.tsar"),
       std::vector<std::pair<std::string, at::Tensor>>{{"weights.0", at::zeros({64})}});
  EXPECT_EXIT(
      {
        InstallFaultHandler();
        const Archive a = Archive::open(Path("w.tsar"));
        at::Tensor x = a.tensor("weights.0");
        x.add_(1);
      },
      ::testing::KilledBySignal(SIGSEGV),
      "write to read-only archive .*w.tsar.*tensor \"weights.0\"");
}

// Eight threads write into read-only weights at once (as intra-op threads of
// one in-place op do): the diagnostic is printed exactly once, every time,
// before the process dies of SIGSEGV.
TEST_F(ArchiveTest, FaultsInManyThreadsAtOncePrintTheDiagnosticOnce) {
#if TSAR_UNDER_ASAN
  GTEST_SKIP() << "AddressSanitizer handles SIGSEGV itself, before any handler of ours";
#endif
  constexpr int kThreads = 8;
  std::vector<std::pair<std::string, at::Tensor>> ts;
  for (int i = 0; i < kThreads; ++i) ts.push_back({"w" + std::to_string(i), at::zeros({1024})});
  pack(Path("m.tsar"), ts);
  const std::string needle = "write to read-only archive";
  for (int run = 0; run < 20; ++run) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      InstallFaultHandler();
      const Archive a = Archive::open(Path("m.tsar"));
      std::atomic<int> ready{0};
      std::vector<std::thread> threads;
      for (int i = 0; i < kThreads; ++i) {
        threads.emplace_back([&, i] {
          auto* p = static_cast<volatile float*>(a.tensor("w" + std::to_string(i)).data_ptr());
          ready.fetch_add(1);
          while (ready.load() < kThreads) {
          }
          *p = 1.0f;
        });
      }
      for (auto& t : threads) t.join();
      _exit(0);
    }
    close(fds[1]);
    std::string err;
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;)
      err.append(buf, static_cast<size_t>(n));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << "run " << run;
    size_t count = 0;
    for (size_t at = err.find(needle); at != std::string::npos; at = err.find(needle, at + 1))
      ++count;
    EXPECT_EQ(count, 1u) << "run " << run << ": " << err;
  }
}

TEST_F(ArchiveTest, VerifyNamesEveryTensorOfADamagedStorage) {
  const at::Tensor full = at::arange(64, at::kFloat);
  pack(Path("d.tsar"), std::vector<std::pair<std::string, at::Tensor>>{
                           {"a", full}, {"a_view", full.narrow(0, 8, 8)}, {"b", at::ones({4})}});
  std::string bytes = testing::ReadAll(Path("d.tsar"));
  const auto s0 = Archive::open(Path("d.tsar")).storages()[0];
  bytes[s0.offset + 17] ^= 0x01;
  chmod(Path("d.tsar").c_str(), 0644);
  testing::WriteAll(Path("d.tsar"), bytes);
  const Archive a = Archive::open(Path("d.tsar"));  // index-only verification passes
  EXPECT_TRUE(Throws([&] { a.verify(); }, ErrorCode::kChecksumMismatch, "\"model/a_view\""));
  EXPECT_EQ(a.damaged(), (std::vector<std::string>{"model/a", "model/a_view"}));
  OpenOptions o;
  o.verify = VerifyMode::kFull;
  EXPECT_TRUE(Throws([&] { Archive::open(Path("d.tsar"), o); }, ErrorCode::kChecksumMismatch,
                     "storage #0"));
}

// spec §4.11: a layer's base storages are views of the base's mapping, kept
// alive by the tensors; verify() hashes them in the base file.
TEST_F(ArchiveTest, LayersServeBaseStoragesFromTheBaseMapping) {
  const at::Tensor full = at::arange(4096, at::kFloat);  // 16 KiB: page-aligned storages
  const at::Tensor emb = at::ones({64, 64});
  pack(Path("base.tsar"), std::vector<std::pair<std::string, at::Tensor>>{
                              {"full", full}, {"emb", emb}, {"gone", at::zeros({5})}});
  PackOptions o;
  o.base = Path("base.tsar");
  const at::Tensor fresh = at::full({1024}, 3.0f);
  pack(Path("v.tsar"),
       std::vector<std::pair<std::string, at::Tensor>>{
           {"head", emb}, {"full", full.clone()}, {"part", full.narrow(0, 8, 8)}, {"new", fresh}},
       o);
  {
    const Archive a = Archive::open(Path("v.tsar"));
    ASSERT_EQ(a.layers(), (std::vector<std::string>{Path("v.tsar"), Path("base.tsar")}));
    // "part" is a view of a storage of its own: its span (32 bytes) is no base storage.
    const auto storages = a.storages();
    ASSERT_EQ(storages.size(), 4u);
    EXPECT_EQ(a.file_size(), 4096u + 4096u) << "the layer holds only its own bytes";
    at::Tensor head = a.tensor("head"), f = a.tensor("full"), n = a.tensor("new");
    EXPECT_TRUE(at::equal(head, emb) && at::equal(f, full) && at::equal(n, fresh));
    EXPECT_TRUE(at::equal(a.tensor("part"), full.narrow(0, 8, 8)));
    EXPECT_TRUE(InRanges(head.data_ptr(), MappedRanges(Path("base.tsar"))));
    EXPECT_TRUE(InRanges(f.data_ptr(), MappedRanges(Path("base.tsar"))));
    EXPECT_TRUE(InRanges(n.data_ptr(), MappedRanges(Path("v.tsar"))));
    EXPECT_NO_THROW(a.verify());
  }
  EXPECT_TRUE(MappedRanges(Path("base.tsar")).empty()) << "the base outlived its layer";

  // A damaged byte in a base storage the layer uses: verify names it in the base.
  std::string bytes = testing::ReadAll(Path("base.tsar"));
  const auto s0 = Archive::open(Path("base.tsar")).storages()[0];
  bytes[s0.offset + 5] ^= 0x01;
  chmod(Path("base.tsar").c_str(), 0644);
  testing::WriteAll(Path("base.tsar"), bytes);
  const Archive a = Archive::open(Path("v.tsar"));
  EXPECT_TRUE(Throws([&] { a.verify(); }, ErrorCode::kChecksumMismatch, "base.tsar"));
  EXPECT_EQ(a.damaged(), (std::vector<std::string>{"model/full"}));
}

TEST_F(ArchiveTest, BadFilesFailAtOpenWithTheirCode) {
  EXPECT_TRUE(
      Throws([&] { Archive::open(Path("missing.tsar")); }, ErrorCode::kNotFound, "No such file"));
  EXPECT_TRUE(
      Throws([&] { Archive::open(dir_); }, ErrorCode::kInvalidArgument, "not a regular file"));
  testing::WriteAll(Path("garbage.tsar"),
                    "PK\x03\x04 this is a zip, not an archive at "
                    "all........................................................");
  EXPECT_TRUE(Throws([&] { Archive::open(Path("garbage.tsar")); }, ErrorCode::kBadMagic,
                     "garbage.tsar: offset 0"));
  pack(Path("ok.tsar"), std::vector<std::pair<std::string, at::Tensor>>{{"x", at::ones({100})}});
  const std::string ok = testing::ReadAll(Path("ok.tsar"));
  testing::WriteAll(Path("short.tsar"), ok.substr(0, ok.size() - 1));
  EXPECT_TRUE(
      Throws([&] { Archive::open(Path("short.tsar")); }, ErrorCode::kTruncated, "file_size"));
}

TEST_F(ArchiveTest, LookupsFailWithNotFoundNamingWhatExists) {
  Writer w(Path("e.tsar"));
  w.add_entry("model");
  w.add("x", at::ones({2}));
  w.add_entry("ema");
  w.add("x", at::zeros({2}));
  w.add_metadata("step", int64_t{7});
  w.add_metadata("decay", 0.5, "ema");
  w.finish();
  const Archive a = Archive::open(Path("e.tsar"));
  EXPECT_EQ(a.entries(), (std::vector<std::string>{"model", "ema"}));
  EXPECT_EQ(a.tensor("x").sum().item<float>(), 2.0f);
  EXPECT_EQ(a.tensor("x", "ema").sum().item<float>(), 0.0f);
  EXPECT_TRUE(
      Throws([&] { a.tensor("y"); }, ErrorCode::kNotFound, "tensor \"y\": not in entry \"model\""));
  EXPECT_TRUE(Throws([&] { a.tensor("x", "swa"); }, ErrorCode::kNotFound,
                     "expected one of \"model\", \"ema\""));
  EXPECT_EQ(std::get<int64_t>(*a.metadata("step")), 7);
  EXPECT_EQ(std::get<double>(*a.metadata("decay", "ema")), 0.5);
  EXPECT_FALSE(a.metadata("decay"));
}

TEST_F(ArchiveTest, ManyThreadsReadOneArchive) {
  std::vector<std::pair<std::string, at::Tensor>> v;
  for (int i = 0; i < 200; ++i)
    v.push_back({"t" + std::to_string(i), at::full({16}, static_cast<float>(i))});
  pack(Path("m.tsar"), v);
  const Archive a = Archive::open(Path("m.tsar"));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (a.tensor("t" + std::to_string(i))[3].item<float>() != static_cast<float>(i)) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_F(ArchiveTest, SparseRecordsComeBackAsSparseTensorsOverTheirComponents) {
  // samples/valid/sparse.tsar: adj = COO [[0, 2], [1, 0]] -> [1, 2] in 3x3, coalesced;
  // m = CSR crow [0, 1, 2], col [1, 0], values [3, 4] in 2x2 (tests/format/samples_gen.cc).
  const Archive a = Archive::open(std::string(TSAR_SOURCE_DIR) + "/samples/valid/sparse.tsar");
  EXPECT_EQ(a.names(), (std::vector<std::string>{"bias", "adj", "m"}));
  EXPECT_TRUE(a.contains("adj"));
  const at::Tensor adj = a.tensor("adj");
  ASSERT_TRUE(adj.is_sparse());
  EXPECT_TRUE(adj.is_coalesced());
  at::Tensor want = at::zeros({3, 3});
  want[0][1] = 1.0;
  want[2][0] = 2.0;
  EXPECT_TRUE(at::equal(adj.to_dense(), want));
  EXPECT_EQ(adj._values().data_ptr(), a.tensor("adj.values").data_ptr())
      << "values must be a view, not a copy";
  const at::Tensor m = a.tensor("m");
  EXPECT_EQ(m.layout(), at::kSparseCsr);
  EXPECT_TRUE(at::equal(m.to_dense(), at::tensor({0.0f, 3.0f, 4.0f, 0.0f}).view({2, 2})));
  const auto sd = a.state_dict();
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"bias", "adj", "m"}));
}

TEST_F(ArchiveTest, ToDeviceSaysWhenThereIsNoCuda) {
  pack(Path("g.tsar"), std::vector<std::pair<std::string, at::Tensor>>{{"x", at::ones({2})}});
  const Archive a = Archive::open(Path("g.tsar"));
  if (at::hasCUDA()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_TRUE(Throws([&] { to_device(a, c10::Device(c10::kCUDA, 0)); }, ErrorCode::kUnsupported,
                     "without CUDA"));
  EXPECT_TRUE(at::equal(to_device(a, c10::Device(c10::kCPU))["x"], at::ones({2})));
}

}  // namespace
}  // namespace tsar
