// tsar::load_aoti (issue 60): an AOTInductor program stored in an archive,
// its constants the archive's tensors. Fixtures: tests/fixtures/make_aoti_fixtures.py.
#include "tsar/aoti.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/sub.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "tsar/archive.h"
#include "tsar/error.h"

namespace {

std::string Fixture(const std::string& name) {
  const char* dir = std::getenv("TSAR_AOTI_FIXTURES");
  return std::string(dir ? dir : "/nonexistent-TSAR_AOTI_FIXTURES") + "/" + name;
}

// The fixture script writes unsupported.txt instead of archives beside a
// torch too old for programs (torch 2.7: no user-managed constants).
#define SKIP_IF_UNSUPPORTED()                                           \
  do {                                                                  \
    std::ifstream why(Fixture("unsupported.txt"));                      \
    std::string reason;                                                 \
    if (why && std::getline(why, reason)) GTEST_SKIP() << reason;       \
  } while (0)

template <class F>
tsar::Error Throws(F&& f) {
  try {
    f();
  } catch (const tsar::Error& e) {
    return e;
  }
  ADD_FAILURE() << "no tsar::Error";
  return tsar::Error(tsar::ErrorCode::kIo, "", std::nullopt, "none");
}

TEST(LoadAoti, RunsTheCompiledCodeOnTheArchivesWeights) {
  SKIP_IF_UNSUPPORTED();
  const auto expected = tsar::Archive::open(Fixture("expected.tsar"));
  const auto archive = tsar::Archive::open(Fixture("aoti.tsar"));
  EXPECT_EQ(tsar::program_names(archive), (std::vector<std::string>{"model", "model_aoti"}));
  const tsar::AotiProgram program = tsar::load_aoti(archive);  // the only AOTInductor one
  EXPECT_EQ(program.name(), "model_aoti");
  auto bound = program.bound();
  std::sort(bound.begin(), bound.end());
  EXPECT_EQ(bound, (std::vector<std::string>{"m.0.bias", "m.0.weight", "m.2.bias", "m.2.weight",
                                             "m.scale"}));
  EXPECT_EQ(program.private_constant_bytes(), 16);  // freq: 4 floats, the program's own
  at::NoGradGuard no_grad;
  const auto out = program.run({expected.tensor("x")});
  ASSERT_EQ(out.size(), 1u);
  // The same compiled code and the same weights as Python's tsar.load_aoti.
  EXPECT_TRUE(at::equal(out[0], expected.tensor("y")));
}

TEST(LoadAoti, TheConstantsAreTheMappedTensorsNotCopies) {
  SKIP_IF_UNSUPPORTED();
  tsar::OpenOptions options;
  options.mode = tsar::MapMode::kCopyOnWrite;  // private pages this test may write
  const auto archive = tsar::Archive::open(Fixture("aoti.tsar"), options);
  const auto x = tsar::Archive::open(Fixture("expected.tsar")).tensor("x");
  const tsar::AotiProgram program = tsar::load_aoti(archive);
  at::NoGradGuard no_grad;
  const auto before = program.run({x})[0].clone();
  // Writing the archive's tensor changes what the compiled code computes:
  // it reads the mapping itself. m.2.bias is 4 elements, which inductor
  // inlines into its code unless tsar.compile_aoti keeps it a constant.
  archive.tensor("m.2.bias").add_(1.0);
  const auto after = program.run({x})[0];
  EXPECT_TRUE(at::allclose(at::sub(after, before), at::arange(4.0).expand_as(before)));
}

TEST(LoadAoti, ChecksTheTorchReleaseItWasCompiledWith) {
  SKIP_IF_UNSUPPORTED();
  const auto archive = tsar::Archive::open(Fixture("old_torch.tsar"));
  const auto e = Throws([&] { tsar::load_aoti(archive); });
  EXPECT_EQ(e.code(), tsar::ErrorCode::kUnsupported);
  EXPECT_NE(std::string(e.what()).find("compiled with torch 1.0.0"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("program 'model_aoti'"), std::string::npos) << e.what();
}

TEST(LoadAoti, RefusesWeightsThatDoNotMatchBeforeLoadingCode) {
  SKIP_IF_UNSUPPORTED();
  const auto archive = tsar::Archive::open(Fixture("mismatch.tsar"));
  const auto e = Throws([&] { tsar::load_aoti(archive); });
  EXPECT_EQ(e.code(), tsar::ErrorCode::kBindMismatch);
  const std::string what = e.what();
  EXPECT_NE(what.find("m.2.weight: shape [4, 32] expected, found [8, 32]"), std::string::npos) << what;
  EXPECT_NE(what.find("m.scale"), std::string::npos) << what;
}

TEST(LoadAoti, NamesWhatIsMissingOrOfAnotherKind) {
  SKIP_IF_UNSUPPORTED();
  const auto none = tsar::Archive::open(Fixture("no_programs.tsar"));
  EXPECT_EQ(Throws([&] { tsar::load_aoti(none); }).code(), tsar::ErrorCode::kNotFound);
  const auto archive = tsar::Archive::open(Fixture("aoti.tsar"));
  tsar::AotiOptions options;
  options.name = "model";  // the exported program: Python's tsar.load_program
  const auto e = Throws([&] { tsar::load_aoti(archive, options); });
  EXPECT_EQ(e.code(), tsar::ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("tsar.load_program"), std::string::npos) << e.what();
  options.name = "absent";
  EXPECT_EQ(Throws([&] { tsar::load_aoti(archive, options); }).code(), tsar::ErrorCode::kNotFound);
}

}  // namespace
