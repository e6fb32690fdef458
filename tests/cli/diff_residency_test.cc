// `tsar diff` (equal by value whatever the layout; every kind of difference
// named, in text and JSON) and `tsar residency` (page cache and the Rss/Pss of
// the processes that map an archive, checked against workers we start).
#include <ATen/ATen.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/wait.h>

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "tests/cli/cli_fixture.h"
#include "tsar/tsar.h"

namespace tsar {
namespace {

using Json = nlohmann::json;

using testing::Finish;
using testing::Line;
using testing::OneErrorLine;
using testing::Result;
using testing::Sh;
using testing::Worker;

const std::string kWorker = TSAR_TEST_WORKER;

bool Has(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

using DiffResidencyTest = testing::CliFixture;

std::set<std::string> Strings(const Json& array) {
  std::set<std::string> out;
  for (const auto& s : array) out.insert(s.get<std::string>());
  return out;
}

// ---------------------------------------------------------------- diff

TEST_F(DiffResidencyTest, DiffOfTheSameTensorsInAnotherLayoutIsEqual) {
  at::manual_seed(7);
  const at::Tensor base = at::randn({300, 200});
  const at::Tensor nan = at::full({5}, std::numeric_limits<float>::quiet_NaN());
  const at::Tensor row = at::arange(6, at::kLong);
  {
    Writer w(Path("a.tsar"));
    w.add("w", base);
    w.add("w_t", base.t());                   // transposed view: strides [1, 200]
    w.add("cols", base.slice(1, 10, 50, 3));  // strided slice of the same storage
    w.add("rep", row.expand({4, 6}));         // stride 0
    w.add("nan", nan);                        // NaN: equal bytes, although NaN != NaN
    w.add("half", base.slice(0, 0, 8).to(at::kHalf));
    w.add("scalar", at::scalar_tensor(3, at::kLong));
    w.add("empty", at::empty({0, 3}));
    w.add_metadata("step", int64_t{10});
    w.finish();
  }
  {
    // The same values, every tensor a dense copy in a different order, at
    // another alignment.
    Writer w(Path("b.tsar"), PackOptions{64});
    w.add("scalar", at::scalar_tensor(3, at::kLong));
    w.add("empty", at::empty({0, 3}));
    w.add("half", base.slice(0, 0, 8).to(at::kHalf).clone());
    w.add("nan", nan.clone());
    w.add("rep", row.expand({4, 6}).contiguous());
    w.add("cols", base.slice(1, 10, 50, 3).contiguous());
    w.add("w_t", base.t().contiguous());
    w.add("w", base.clone());
    w.add_metadata("step", int64_t{10});
    w.finish();
  }
  // The layouts do differ.
  const auto ia = nlohmann::json::parse(Tsar("inspect --json " + Path("a.tsar")).out);
  const auto ib = nlohmann::json::parse(Tsar("inspect --json " + Path("b.tsar")).out);
  auto strides = [](const Json& doc, const std::string& name) {
    for (const auto& t : doc["tensors"]) {
      if (t["name"] == name) return t["strides"];
    }
    return Json();
  };
  EXPECT_EQ(strides(ia, "w_t"), Json::array({1, 200}));
  EXPECT_EQ(strides(ib, "w_t"), Json::array({300, 1}));
  EXPECT_EQ(strides(ia, "rep"), Json::array({0, 1}));
  EXPECT_NE(ia["storages"].size(), ib["storages"].size());

  Result r = Tsar("diff " + Path("a.tsar") + " " + Path("a.tsar"));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.out, "same: " + Path("a.tsar") + " and " + Path("a.tsar") +
                       " hold the same 8 tensors in 1 entry and 1 metadata key\n");
  r = Tsar("diff " + Path("a.tsar") + " " + Path("b.tsar"));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out.rfind("same: ", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  r = Tsar("diff --json " + Path("b.tsar") + " " + Path("a.tsar"));
  EXPECT_EQ(r.code, 0);
  const auto j = Json::parse(r.out);
  EXPECT_EQ(j["equal"], true);
  EXPECT_EQ(j["added"], Json::array());
  EXPECT_EQ(j["removed"], Json::array());
  EXPECT_EQ(j["changed"], Json::array());
  EXPECT_EQ(j["metadata"]["changed"], Json::array());

  // One element of the transposed view changed: found through the strides.
  {
    Writer w(Path("c.tsar"));
    w.add("w", base);
    at::Tensor t = base.t().contiguous();
    t[150][250] = 42;
    w.add("w_t", t);
    w.add("cols", base.slice(1, 10, 50, 3));
    w.add("rep", row.expand({4, 6}));
    w.add("nan", nan);
    w.add("half", base.slice(0, 0, 8).to(at::kHalf));
    w.add("scalar", at::scalar_tensor(3, at::kLong));
    w.add("empty", at::empty({0, 3}));
    w.add_metadata("step", int64_t{10});
    w.finish();
  }
  r = Tsar("diff " + Path("a.tsar") + " " + Path("c.tsar"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("changed model/w_t: 1 of 60000 elements differs, max |a - b| "),
            std::string::npos)
      << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
}

TEST_F(DiffResidencyTest, DiffComparesRandomViewsElementByElement) {
  // Permuted, sliced with steps, expanded views of one storage in several
  // dtypes (element sizes 1 to 16) against dense copies, then against dense
  // copies with one element changed in every other tensor.
  at::manual_seed(11);
  std::mt19937 rng(11);
  const at::Tensor base = at::randn({5, 6, 7, 8});
  const at::ScalarType types[] = {at::kFloat, at::kDouble, at::kHalf, at::kByte,
                                  at::kComplexDouble};
  Writer views(Path("views.tsar")), dense(Path("dense.tsar")), changed(Path("changed.tsar"));
  std::set<std::string> expect_changed;
  for (int i = 0; i < 40; ++i) {
    std::vector<int64_t> perm = {0, 1, 2, 3};
    std::shuffle(perm.begin(), perm.end(), rng);
    at::Tensor v = base.permute(perm);
    const int64_t d = rng() % 4, size = v.size(d);
    const int64_t start = rng() % size, step = 1 + rng() % 3;
    v = v.slice(d, start, size, step);
    if (i % 5 == 0) v = v.select(rng() % 4, 0).unsqueeze(1).expand({-1, 3, -1, -1});
    const at::ScalarType type = types[i % 5];
    if (type == at::kComplexDouble)
      v = at::complex(v.to(at::kDouble), v.to(at::kDouble) * 2);
    else if (type != at::kFloat)
      v = (type == at::kByte ? v * 40 + 100 : v).to(type);
    const std::string name = "v" + std::to_string(i);
    views.add(name, v);
    dense.add(name, v.contiguous().clone());
    at::Tensor c = v.contiguous().clone();
    if (i % 2 == 1) {
      const int64_t k = rng() % c.numel();
      c.view(-1)[k] = c.view(-1)[k] + 1;
      expect_changed.insert("model/" + name);
    }
    changed.add(name, c);
  }
  views.finish();
  dense.finish();
  changed.finish();
  const auto layouts = Json::parse(Tsar("inspect --json " + Path("views.tsar")).out);
  EXPECT_LT(layouts["storages"].size(), 40u) << "the views share storages";

  Result r = Tsar("diff " + Path("views.tsar") + " " + Path("dense.tsar"));
  EXPECT_EQ(r.code, 0) << r.out;
  r = Tsar("diff --json " + Path("views.tsar") + " " + Path("changed.tsar"));
  EXPECT_EQ(r.code, 1);
  std::set<std::string> got;
  const auto doc = Json::parse(r.out);
  for (const auto& c : doc["changed"]) {
    got.insert(c["name"].get<std::string>());
    // One element changed by +1 in each (half precision may round it).
    EXPECT_EQ(c["differing_elements"], 1) << c.dump();
    EXPECT_NEAR(c["max_abs_diff"].get<double>(), 1.0, 0.01) << c.dump();
  }
  EXPECT_EQ(got, expect_changed) << r.out;
}

TEST_F(DiffResidencyTest, DiffNamesEveryKindOfDifference) {
  at::manual_seed(8);
  const at::Tensor w0 = at::randn({4, 3}), b0 = at::randn({3}), s0 = at::randn({2, 2}),
                   d0 = at::randn({3});
  {
    Writer w(Path("a.tsar"));
    w.add("w", w0);
    w.add("b", b0);
    w.add("s", s0);
    w.add("both", s0);
    w.add("d", d0);
    w.add("p", d0, Role::kParameter);
    w.add("g", d0);
    w.add("gone", at::zeros({2}));
    w.add_metadata("step", int64_t{10});
    w.add_metadata("name", std::string("run1"));
    w.add_metadata("epoch", int64_t{1}, "model");
    w.finish();
  }
  {
    Writer w(Path("b.tsar"));
    at::Tensor w1 = w0.clone();
    w1[2][1] = w1[2][1] + 1;
    w.add("w", w1);
    w.add("b", b0.to(at::kDouble));
    w.add("s", s0.reshape({4}));
    w.add("both", s0.reshape({4}).to(at::kHalf));
    w.add("d", d0);
    w.add("p", d0, Role::kBuffer);
    w.add("g", d0.clone().set_requires_grad(true));
    w.add("new", at::ones({5}));
    w.add_metadata("step", int64_t{11});
    w.add_metadata("lr", 0.5);
    w.add_metadata("epoch", int64_t{2}, "model");
    w.add_entry("ema");
    w.add("x", at::ones({2, 2}, at::kInt));
    w.finish();
  }
  const Result r = Tsar("diff " + Path("a.tsar") + " " + Path("b.tsar"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* line : {
           "added entry \"ema\"",
           "removed model/gone: float32 [2]",
           "added model/new: float32 [5]",
           "added ema/x: int32 [2, 2]",
           "changed model/w: 1 of 12 elements differs, max |a - b| 1",
           "changed model/b: dtype float32 -> float64",
           "changed model/s: shape [2, 2] -> [4]",
           "changed model/both: dtype float32 -> float16; shape [2, 2] -> [4]",
           "changed model/p: role parameter -> buffer",
           "changed model/g: requires_grad false -> true",
           "changed metadata step: 10 (int) -> 11 (int)",
           "removed metadata name = \"run1\" (string)",
           "added metadata lr = 0.5 (float)",
           "changed metadata epoch (entry \"model\"): 1 (int) -> 2 (int)",
       }) {
    EXPECT_TRUE(Has(r.out, line)) << line << "\n" << r.out;
  }
  EXPECT_EQ(r.out.find("model/d"), std::string::npos) << r.out;
  const std::string summary =
      "differ: " + Path("a.tsar") + " and " + Path("b.tsar") +
      ": 2 tensors added, 1 tensor removed, 6 tensors changed, 1 entry added, "
      "1 metadata key added, 1 metadata key removed, 2 metadata keys changed\n";
  ASSERT_GE(r.out.size(), summary.size());
  EXPECT_EQ(r.out.substr(r.out.size() - summary.size()), summary) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 15)
      << "one line per difference, then the summary";

  const Result jr = Tsar("diff --json " + Path("a.tsar") + " " + Path("b.tsar"));
  EXPECT_EQ(jr.code, 1);
  const auto j = Json::parse(jr.out);
  EXPECT_EQ(j["equal"], false);
  EXPECT_EQ(Strings(j["added"]), (std::set<std::string>{"model/new", "ema/x"}));
  EXPECT_EQ(j["removed"], Json::array({"model/gone"}));
  std::map<std::string, Json> changed;
  for (const auto& c : j["changed"]) changed[c["name"]] = c["what"];
  EXPECT_EQ(changed.size(), 6u);
  EXPECT_EQ(changed["model/w"], Json::array({"1 of 12 elements differs, max |a - b| 1"}));
  EXPECT_EQ(changed["model/b"], Json::array({"dtype float32 -> float64"}));
  EXPECT_EQ(changed["model/s"], Json::array({"shape [2, 2] -> [4]"}));
  EXPECT_EQ(changed["model/both"],
            Json::array({"dtype float32 -> float16", "shape [2, 2] -> [4]"}));
  EXPECT_EQ(changed["model/p"], Json::array({"role parameter -> buffer"}));
  EXPECT_EQ(changed["model/g"], Json::array({"requires_grad false -> true"}));
  EXPECT_EQ(j["metadata"]["added"], Json::parse(R"([{"key": "lr", "value": 0.5}])"));
  EXPECT_EQ(j["metadata"]["removed"], Json::parse(R"([{"key": "name", "value": "run1"}])"));
  EXPECT_EQ(j["metadata"]["changed"], Json::parse(R"([{"key": "step", "from": 10, "to": 11},
                                                     {"key": "epoch", "entry": "model", "from": 1, "to": 2}])"));
  EXPECT_EQ(j["entries"]["added"], Json::array({"ema"}));
  EXPECT_EQ(j["entries"]["removed"], Json::array());

  // The other way round, what was added is removed.
  const auto back = Json::parse(Tsar("diff --json " + Path("b.tsar") + " " + Path("a.tsar")).out);
  EXPECT_EQ(Strings(back["removed"]), (std::set<std::string>{"model/new", "ema/x"}));
  EXPECT_EQ(back["added"], Json::array({"model/gone"}));
  EXPECT_EQ(back["entries"]["removed"], Json::array({"ema"}));
  EXPECT_EQ(back["changed"].size(), 6u);
}

TEST_F(DiffResidencyTest, DiffOfAnInvalidArchiveExitsThreeWithOneLine) {
  pack(Path("ok.tsar"), std::vector<std::pair<std::string, at::Tensor>>{{"x", at::ones({4})}});
  const std::string bytes = testing::ReadAll(Path("ok.tsar"));
  testing::WriteAll(Path("short.tsar"), bytes.substr(0, 100));
  testing::WriteAll(Path("garbage.tsar"), std::string(200, 'x'));
  struct Case {
    std::string args, needle;
  } cases[] = {
      {Path("ok.tsar") + " " + Path("short.tsar"), "short.tsar: offset"},
      {Path("garbage.tsar") + " " + Path("ok.tsar"), "garbage.tsar: offset 0 (0x0): magic"},
      {Path("ok.tsar") + " " + Path("missing.tsar"),
       "missing.tsar: cannot open: No such file or directory"},
      {Path("ok.tsar") + " " + dir_, "not a regular file"},
      {"--json " + Path("ok.tsar") + " " + Path("short.tsar"), "short.tsar: offset"},
  };
  for (const auto& c : cases) {
    const Result r = Tsar("diff " + c.args);
    EXPECT_EQ(r.code, 3) << c.args;
    EXPECT_EQ(r.out, "") << c.args;
    EXPECT_TRUE(OneErrorLine(r, c.needle)) << c.args;
  }
  EXPECT_EQ(Tsar("diff " + Path("ok.tsar")).code, 2);
}

// ---------------------------------------------------------------- residency

Worker Start(const std::string& archive) { return testing::Start({kWorker, archive, "--hold"}); }

TEST_F(DiffResidencyTest, ResidencyShowsTheWorkersSharingOneCopyAndEviction) {
  const std::string path = Path("model.tsar");
  std::vector<std::pair<std::string, at::Tensor>> v;
  at::manual_seed(3);
  for (int i = 0; i < 4; ++i)
    v.push_back({"layer" + std::to_string(i), at::randn({1024, 1024})});  // 16 MiB
  pack(path, v);  // durable: flushed, so its pages are clean and can be evicted
  const uint64_t file_size = testing::ReadAll(path).size();
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t pages = (file_size + page - 1) / page;

  std::vector<Worker> ws = {Start(path), Start(path)};
  for (auto& w : ws)
    ASSERT_EQ(Line(w).rfind("ok ", 0), 0u) << "the worker maps and touches every page";
  Result r = Tsar("residency --json " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  Json j = Json::parse(r.out);
  EXPECT_EQ(j["path"], path);
  EXPECT_EQ(j["file_size"], file_size);
  EXPECT_EQ(j["pages"], pages);
  EXPECT_EQ(j["resident_pages"], pages) << "the workers touched every page";
  std::set<long> pids;
  uint64_t pss_sum = 0;
  for (const auto& p : j["processes"]) {
    pids.insert(p["pid"].get<long>());
    const uint64_t rss = p["rss_bytes"], pss = p["pss_bytes"];
    EXPECT_GE(rss, file_size * 95 / 100) << p.dump();
    EXPECT_LE(rss, pages * page) << p.dump();
    EXPECT_GT(pss, 0u) << p.dump();
    EXPECT_LE(pss, rss * 6 / 10) << "two processes share the pages: " << p.dump();
    EXPECT_EQ(p["private_dirty_bytes"], 0) << p.dump();
    EXPECT_EQ(p["comm"].get<std::string>().rfind("tsar_test_work", 0), 0u) << p.dump();
    pss_sum += pss;
  }
  EXPECT_EQ(pids, (std::set<long>{ws[0].pid, ws[1].pid}))
      << "the workers, and not tsar itself: " << r.out;
  EXPECT_EQ(j["total_pss_bytes"], pss_sum);
  EXPECT_GE(pss_sum, file_size * 95 / 100) << "one copy in all";
  EXPECT_LE(pss_sum, pages * page);

  r = Tsar("residency " + path);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.rfind(path + ": " + std::to_string(pages) + " of " + std::to_string(pages) +
                            " pages (100.0%) in page cache",
                        0),
            0u)
      << r.out;
  EXPECT_NE(r.out.find(std::to_string(ws[0].pid) + "  tsar_test_work"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\ntotal: Pss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" in 2 processes"), std::string::npos) << r.out;

  for (auto& w : ws) EXPECT_EQ(Finish(w), 0);
  struct statfs fs;
  ASSERT_EQ(statfs(dir_.c_str(), &fs), 0);
  if (fs.f_type == TMPFS_MAGIC) GTEST_SKIP() << "tmpfs pages cannot be evicted";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  close(fd);
  r = Tsar("residency --json " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  j = Json::parse(r.out);
  EXPECT_LE(j["resident_pages"].get<uint64_t>(), pages / 10)
      << "evicted; residency itself reads nothing in";
  EXPECT_EQ(j["processes"], Json::array());
  EXPECT_EQ(j["total_pss_bytes"], 0);
  r = Tsar("residency " + path);
  EXPECT_NE(r.out.find("\nno process maps it\n"), std::string::npos) << r.out;
}

TEST_F(DiffResidencyTest, ResidencyOfAnInvalidArchiveExitsThree) {
  testing::WriteAll(Path("garbage.tsar"), std::string(5000, 'x'));
  Result r = Tsar("residency " + Path("garbage.tsar"));
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(OneErrorLine(r, "garbage.tsar: offset 0 (0x0): magic"));
  r = Tsar("residency --json " + Path("missing.tsar"));
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(OneErrorLine(r, "cannot open: No such file or directory"));
  r = Tsar("residency " + dir_);
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(OneErrorLine(r, "not a regular file"));
}

}  // namespace
}  // namespace tsar
