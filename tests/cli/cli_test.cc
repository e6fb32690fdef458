// The tsar command line: exit codes, one-line errors, --json schema, pack
// fidelity against Python (tests/cli/check_pack.py), determinism, atomicity
// under SIGKILL, verify naming damaged tensors.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tests/cli/cli_fixture.h"

namespace tsar {
namespace {

using testing::Fixture;

using testing::OneErrorLine;
using testing::Result;
using testing::Sh;
using testing::WriteAll;

const std::string kTsar = TSAR_CLI;
const std::string kSource = TSAR_SOURCE_DIR;

using CliTest = testing::CliFixture;

TEST_F(CliTest, HelpVersionAndUsageErrors) {
  Result r = Tsar("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("tsar pack model.pt -o model.tsar"), std::string::npos);
  r = Tsar("pack --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--entry model=sd.pt"), std::string::npos) << r.out;
  r = Tsar("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("(format 1.5)"), std::string::npos) << r.out;
  r = Tsar("");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(r, "a command is required: one of pack, inspect"));
  // Typos are named with the closest command or option, before anything else.
  r = Tsar("inspec x.tsar");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(r, "unknown command `inspec` (did you mean `tsar inspect`?)"));
  r = Tsar("--verison");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(r, "unknown option --verison (did you mean --version?)"));
  r = Tsar("pack m.pt --outptu x.tsar");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(
      r, "pack: unknown option --outptu (did you mean --output?) (see `tsar pack --help`)"));
  r = Tsar("pack -o x.tsar --align 100 --strcit m.pt");
  EXPECT_TRUE(OneErrorLine(r, "unknown option --strcit (did you mean --strict?)"));
  r = Tsar("pack -o x.tsar -x m.pt");
  EXPECT_TRUE(OneErrorLine(r, "pack: unknown option -x (see `tsar pack --help`)"));
  // `tsar help [COMMAND]` is --help; errors point at the command's own help.
  r = Tsar("help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("tsar pack model.pt -o model.tsar"), std::string::npos) << r.out;
  r = Tsar("help export");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("Usage: tsar export"), std::string::npos) << r.out;
  r = Tsar("help expotr");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(r, "did you mean `tsar help export`?"));
  r = Tsar("pack --align 100 -o x.tsar m.pt");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(r, "--align: expected a power of two in [64, 2^30], found 100"));
  r = Tsar("pack " + Fixture("tied_sd.pt"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(r, "--output"));
  r = Tsar("pack --align 100 -o x.tsar " + Fixture("tied_sd.pt"));
  EXPECT_EQ(r.code, 2);
  r = Tsar("frobnicate");
  EXPECT_EQ(r.code, 2);
  // A repeated --meta key is a usage error naming the option, not the output file.
  r = Tsar("pack --meta step=1 --meta step=2 -o " + Path("m.tsar") + " " + Fixture("tied_sd.pt"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(r, "--meta \"step\": given twice"));
  EXPECT_FALSE(Exists(Path("m.tsar")));
  r = Tsar("pack --entry model -o " + Path("m.tsar"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(r, "--entry \"model\": expected NAME=FILE"));
  r = Tsar("pack --meta step -o " + Path("m.tsar") + " " + Fixture("tied_sd.pt"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(r, "--meta \"step\": expected KEY=VALUE"));
}

TEST_F(CliTest, PackedTorchSaveFilesMatchWhatPythonSees) {
  for (const char* f :
       {"resnet18_sd.pt", "tied_sd.pt", "big.pt", "dtypes.pt", "params.pt", "checkpoint.pt"}) {
    const Result r = Tsar("pack -q " + Fixture(f) + " -o " + Path("out.tsar"));
    ASSERT_EQ(r.code, 0) << f << ": " << r.err;
    const Result check = Sh(std::string(TSAR_PYTHON_EXE) + " " + kSource + "/tests/cli/check_pack.py " +
                            Fixture(f) + " " + Path("out.tsar"));
    EXPECT_EQ(check.code, 0) << f << ":\n" << check.out << check.err;
  }
}

TEST_F(CliTest, CheckpointsPackWholeAndStrictRefusesOpaqueFragments) {
  // The optimizer state, param_groups and scalars are kept as the value tree.
  Result r = Tsar("pack " + Fixture("checkpoint.pt") + " -o " + Path("c.tsar"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("note:"), std::string::npos) << r.err;
  r = Tsar("inspect " + Path("c.tsar"));
  EXPECT_NE(r.out.find("tsar format 1.1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"param_groups\": list of 1"), std::string::npos) << r.out;
  r = Tsar("pack --strict " + Fixture("checkpoint.pt") + " -o " + Path("s.tsar"));
  EXPECT_EQ(r.code, 0) << r.err;  // nothing opaque in it
  // os.system(...) packs as an opaque fragment, never run; --strict refuses it.
  r = Tsar("pack " + Fixture("evil.pt") + " -o " + Path("e.tsar"));
  EXPECT_EQ(r.code, 0) << r.err;
  r = Tsar("pack --strict " + Fixture("evil.pt") + " -o " + Path("e2.tsar"));
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(OneErrorLine(r,
                           "system object would be kept as an opaque pickle fragment, which "
                           "--strict refuses"));
  EXPECT_FALSE(Exists(Path("e2.tsar")));
  r = Tsar("pack --quiet " + Fixture("checkpoint.pt") + " -o " + Path("q.tsar"));
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out + r.err, "");
}

TEST_F(CliTest, PackIsDeterministic) {
  ASSERT_EQ(Tsar("pack -q " + Fixture("resnet18_sd.pt") + " -o " + Path("a.tsar")).code, 0);
  ASSERT_EQ(Sh("cd " + dir_ + " && cp " + Fixture("resnet18_sd.pt") + " copy.pt && " + kTsar +
               " pack -q copy.pt -o b.tsar")
                .code,
            0);
  EXPECT_TRUE(testing::ReadAll(Path("a.tsar")) == testing::ReadAll(Path("b.tsar")))
      << "same input, different path and directory: the bytes must not differ";
}

TEST_F(CliTest, EntriesAndMetadataFromFlags) {
  const Result r = Tsar("pack --entry model=" + Fixture("tied_sd.pt") +
                        " --entry net=" + Fixture("resnet18_sd.pt") +
                        " --meta step=10 --meta lr=0.5 --meta name=run1 -o " + Path("m.tsar"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("packed 127 tensors in 2 entries"), std::string::npos) << r.out;
  const Result j = Tsar("inspect --json " + Path("m.tsar"));
  ASSERT_EQ(j.code, 0);
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["format_version"], "1.0");
  EXPECT_EQ(doc["entries"], nlohmann::json::array({"model", "net"}));
  EXPECT_EQ(doc["metadata"]["step"], 10);
  EXPECT_EQ(doc["metadata"]["lr"], 0.5);
  EXPECT_EQ(doc["metadata"]["name"], "run1");
  ASSERT_EQ(doc["tensors"].size(), 127u);
  // The tied module: emb.weight and head.weight share a storage; tr is a transposed view.
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& t : doc["tensors"])
    by_name[t["entry"].get<std::string>() + "/" + t["name"].get<std::string>()] = t;
  for (const char* key : {"name", "dtype", "shape", "strides", "storage_offset", "storage", "entry",
                          "role", "requires_grad"}) {
    EXPECT_TRUE(doc["tensors"][0].contains(key)) << key;
  }
  EXPECT_EQ(by_name["model/emb.weight"]["storage"], by_name["model/head.weight"]["storage"]);
  EXPECT_EQ(by_name["model/tr"]["strides"], nlohmann::json::array({1, 4}));
  EXPECT_EQ(by_name["model/part"]["storage_offset"], 4);
  EXPECT_EQ(by_name["net/conv1.weight"]["dtype"], "float32");
  EXPECT_EQ(by_name["net/bn1.num_batches_tracked"]["dtype"], "int64");
  for (const auto& s : doc["storages"]) {
    EXPECT_TRUE(s.contains("id") && s.contains("offset") && s.contains("nbytes") &&
                s.contains("xxh3"));
  }
  const Result human = Tsar("inspect " + Path("m.tsar"));
  EXPECT_NE(human.out.find("[4, 3] strides [1, 4]"), std::string::npos) << human.out;
}

TEST_F(CliTest, BadInputsExitThreeWithOneLineAndNoOutput) {
  struct Case {
    const char* file;
    const char* needle;
  } cases[] = {
      {"garbage.bin", "expected a torch.save zip, a TorchScript archive"},
      {"truncated.pt", "not a readable torch.save zip file"},
      {"int_requires_grad.pt",
       "tensor \"x\": requires_grad: expected a floating-point or complex dtype, found int64"},
      {"no-such-file.pt", "No such file or directory"},
  };
  for (const auto& c : cases) {
    const Result r = Tsar("pack " + Fixture(c.file) + " -o " + Path("out.tsar"));
    EXPECT_EQ(r.code, 3) << c.file;
    EXPECT_TRUE(OneErrorLine(r, c.needle)) << c.file;
    EXPECT_TRUE(OneErrorLine(r, c.file)) << c.file;
    EXPECT_FALSE(Exists(Path("out.tsar"))) << c.file;
  }
  const std::string imports = TSAR_IMPORT_FIXTURES_DIR;
  const Case other_formats[] = {
      {"bad_duplicate.safetensors", "appears twice"},
      {"bad_overlap.safetensors", "overlap"},
      {"bad_length.safetensors", "data_offsets: expected"},
  };
  for (const auto& c : other_formats) {
    const Result r = Tsar("pack " + imports + "/" + c.file + " -o " + Path("out.tsar"));
    EXPECT_EQ(r.code, 3) << c.file;
    EXPECT_TRUE(OneErrorLine(r, c.needle)) << c.file;
    EXPECT_TRUE(OneErrorLine(r, c.file)) << c.file;
    EXPECT_FALSE(Exists(Path("out.tsar"))) << c.file;
  }
  const Result sharded =
      Tsar("pack -q " + imports + "/sharded/model.safetensors.index.json -o " + Path("s.tsar"));
  EXPECT_EQ(sharded.code, 0) << sharded.err;
  const Result r = Tsar("pack " + Fixture("tied_sd.pt") + " -o " + Path("no/such/dir/out.tsar"));
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(OneErrorLine(r, "cannot create a file in directory"));
  const Result twice = Tsar("pack " + Fixture("tied_sd.pt") + " " + Fixture("tied_sd.pt") + " -o " +
                            Path("out.tsar"));
  EXPECT_EQ(twice.code, 2);
  EXPECT_TRUE(OneErrorLine(twice, "entry \"model\" comes from " + Fixture("tied_sd.pt") +
                                      " already; give the inputs entry names of their own"));
  EXPECT_FALSE(Exists(Path("out.tsar")));
  const Result named_twice = Tsar("pack --entry a=" + Fixture("tied_sd.pt") +
                                  " --entry a=" + Fixture("big.pt") + " -o " + Path("out.tsar"));
  EXPECT_EQ(named_twice.code, 2);
  EXPECT_TRUE(OneErrorLine(named_twice, "--entry a is given twice (" + Fixture("tied_sd.pt") +
                                            " and " + Fixture("big.pt") + ")"));
  // --entry takes one value: the file after it is an input of its own.
  const Result mixed = Tsar("pack -q --entry a=" + Fixture("tied_sd.pt") + " " + Fixture("big.pt") +
                            " -o " + Path("out.tsar"));
  EXPECT_EQ(mixed.code, 0) << mixed.err;
  EXPECT_NE(Tsar("inspect " + Path("out.tsar")).out.find("in 2 entries"), std::string::npos);
  // A string dataset is skipped with one note that names the file once;
  // --strict refuses it.
  const Result strings = Tsar("pack " + imports + "/strings.h5 -o " + Path("h.tsar"));
  EXPECT_EQ(strings.code, 0) << strings.err;
  EXPECT_EQ(strings.err, "tsar: note: " + imports +
                             "/strings.h5: dataset \"/meta/names\": a string dataset is not a "
                             "numeric dataset\n");
  const Result strict = Tsar("pack --strict " + imports + "/strings.h5 -o " + Path("h2.tsar"));
  EXPECT_EQ(strict.code, 3);
  EXPECT_TRUE(OneErrorLine(strict, "expected a numeric dataset, found a string dataset"));
}

TEST_F(CliTest, KillingThePackerNeverLeavesAHalfWrittenArchive) {
  ASSERT_EQ(Tsar("pack -q " + Fixture("tied_sd.pt") + " -o " + Path("out.tsar")).code, 0);
  const std::string old = testing::ReadAll(Path("out.tsar"));
  std::mt19937 rng(42);
  int replaced = 0;
  for (int i = 0; i < 12; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      execl(kTsar.c_str(), "tsar", "pack", "-q", Fixture("big.pt").c_str(), "-o",
            Path("out.tsar").c_str(), nullptr);
      _exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 400));
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    const std::string now = testing::ReadAll(Path("out.tsar"));
    if (now == old) continue;
    ++replaced;
    // Not the old file: then a complete, valid new archive.
    const Result v = Tsar("verify " + Path("out.tsar"));
    EXPECT_EQ(v.code, 0) << v.out << v.err;
    break;
  }
  const Result ls = Sh("ls -A " + dir_);
  EXPECT_EQ(ls.out, "out.tsar\n") << "temporary files left behind";
  (void)replaced;
}

TEST_F(CliTest, ExportsReadBackExactlyByTorchH5pyAndSafetensors) {
  struct Case {
    const char* fixture;
    const char* ext;
  } cases[] = {
      {"resnet18_sd.pt", "pt"}, {"resnet18_sd.pt", "h5"}, {"resnet18_sd.pt", "safetensors"},
      {"tied_sd.pt", "pt"},     {"tied_sd.pt", "h5"},     {"dtypes.pt", "pt"},
      {"checkpoint.pt", "pt"},  {"params.pt", "pt"}};
  for (const auto& c : cases) {
    ASSERT_EQ(Tsar("pack -q " + Fixture(c.fixture) + " -o " + Path("a.tsar")).code, 0);
    const std::string out = Path(std::string("out.") + c.ext);
    const Result r = Tsar("export -q --materialize-shared " + Path("a.tsar") + " -o " + out);
    ASSERT_EQ(r.code, 0) << c.fixture << " " << c.ext << ": " << r.err;
    const Result check = Sh(std::string(TSAR_PYTHON_EXE) + " " + kSource + "/tests/cli/check_export.py " +
                            Fixture(c.fixture) + " " + out);
    EXPECT_EQ(check.code, 0) << c.fixture << " -> " << c.ext << ":\n" << check.out << check.err;
    // Packing the export again gives the same archive content: for .pt exactly
    // (tensors, roles, metadata); other formats carry less metadata.
    const Result again = Tsar("pack -q " + out + " -o " + Path("b.tsar"));
    EXPECT_EQ(again.code, 0) << again.err;
    if (std::string(c.ext) == "pt") {
      const Result d = Tsar("diff " + Path("a.tsar") + " " + Path("b.tsar"));
      EXPECT_EQ(d.code, 0) << c.fixture << ":\n" << d.out << d.err;
    }
  }
}

TEST_F(CliTest, ExportRefusesWhatTheTargetCannotHold) {
  ASSERT_EQ(Tsar("pack -q " + Fixture("tied_sd.pt") + " -o " + Path("t.tsar")).code, 0);
  Result r = Tsar("export " + Path("t.tsar") + " -o " + Path("t.safetensors"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(r, "\"emb.weight\", \"head.weight\""));
  EXPECT_TRUE(OneErrorLine(r, "--materialize-shared"));
  EXPECT_FALSE(Exists(Path("t.safetensors")));
  ASSERT_EQ(Tsar("pack -q " + Fixture("dtypes.pt") + " -o " + Path("d.tsar")).code, 0);
  r = Tsar("export " + Path("d.tsar") + " -o " + Path("d.h5"));
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(OneErrorLine(r, "tensor \"bfloat16\": h5py has no dtype bfloat16"));
  EXPECT_FALSE(Exists(Path("d.h5")));
  const std::string sparse = kSource + "/samples/valid/sparse.tsar";
  r = Tsar("export " + sparse + " -o " + Path("s.h5"));
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(OneErrorLine(r, "holds sparse tensors (components \"adj.indices\""));
  EXPECT_FALSE(Exists(Path("s.h5")));
  r = Tsar("export " + sparse + " -o " + Path("s.pt"));
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.err.find("note: sparse tensors written as their component tensors"),
            std::string::npos)
      << r.err;
  r = Tsar("export " + Path("d.tsar") + " -o " + Path("d.npz"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(OneErrorLine(r, "expected an extension .pt"));
  // A name that is also the dotted prefix of another (a dataset and a group
  // at once), and an empty component: refused before the file is made,
  // whichever comes first in the archive.
  const auto safetensors = [](const std::vector<std::string>& names) {
    std::string header = "{";
    for (size_t i = 0; i < names.size(); ++i) {
      header += (i ? ",\"" : "\"") + names[i] + "\":{\"dtype\":\"F32\",\"shape\":[1]," +
                "\"data_offsets\":[" + std::to_string(4 * i) + "," + std::to_string(4 * i + 4) +
                "]}";
    }
    header += "}";
    header.resize((header.size() + 7) / 8 * 8, ' ');
    std::string file(8, '\0');
    for (int b = 0; b < 8; ++b) file[b] = static_cast<char>((header.size() >> (8 * b)) & 0xff);
    return file + header + std::string(4 * names.size(), '\0');
  };
  struct Tree {
    std::vector<std::string> names;
    const char* error;
  } trees[] = {
      {{"a.b", "a", "c"}, "tensor \"a\" is also the group that holds \"a.b\""},
      {{"x", "a", "a.b.c"}, "tensor \"a\" is also the group that holds \"a.b.c\""},
      {{"a..b"}, "tensor \"a..b\": an empty name component"},
      {{"a."}, "tensor \"a.\": an empty name component"},
  };
  for (const auto& t : trees) {
    WriteAll(Path("n.safetensors"), safetensors(t.names));
    ASSERT_EQ(Tsar("pack -q " + Path("n.safetensors") + " -o " + Path("n.tsar")).code, 0);
    r = Tsar("export " + Path("n.tsar") + " -o " + Path("n.h5"));
    EXPECT_EQ(r.code, 3) << t.error;
    EXPECT_TRUE(OneErrorLine(r, t.error));
    EXPECT_FALSE(Exists(Path("n.h5")));
    EXPECT_EQ(Tsar("export -q " + Path("n.tsar") + " -o " + Path("n.pt")).code, 0);
    std::remove(Path("n.tsar").c_str());
  }
}

TEST_F(CliTest, VerifyNamesDamagedTensorsAndExitsOne) {
  ASSERT_EQ(Tsar("pack -q " + Fixture("tied_sd.pt") + " -o " + Path("t.tsar")).code, 0);
  Result r = Tsar("verify " + Path("t.tsar"));
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.rfind("ok ", 0), 0u) << r.out;
  const auto doc = nlohmann::json::parse(Tsar("inspect --json " + Path("t.tsar")).out);
  uint64_t emb_storage = 0;
  for (const auto& t : doc["tensors"]) {
    if (t["name"] == "emb.weight") emb_storage = t["storage"];
  }
  const uint64_t off = doc["storages"][emb_storage]["offset"];
  std::string bytes = testing::ReadAll(Path("t.tsar"));
  bytes[off + 5] ^= 0x40;
  testing::WriteAll(Path("bad.tsar"), bytes);
  r = Tsar("verify " + Path("t.tsar") + " " + Path("bad.tsar"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("DAMAGED"), std::string::npos);
  EXPECT_NE(r.out.find("\"model/emb.weight\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"model/head.weight\""), std::string::npos) << r.out;
  EXPECT_TRUE(OneErrorLine(r, "fail their XXH3-64 checksum"));
  // export checks first: a damaged archive is refused, naming its tensors,
  // unless --no-verify asks for it as it is.
  r = Tsar("export " + Path("bad.tsar") + " -o " + Path("bad.pt"));
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(OneErrorLine(r, "\"model/emb.weight\""));
  EXPECT_TRUE(OneErrorLine(r, "(export --no-verify writes it as it is)"));
  EXPECT_FALSE(Exists(Path("bad.pt")));
  r = Tsar("export -q --no-verify " + Path("bad.tsar") + " -o " + Path("bad.pt"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(Exists(Path("bad.pt")));
  testing::WriteAll(Path("short.tsar"), bytes.substr(0, 100));
  r = Tsar("verify " + Path("short.tsar"));
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(OneErrorLine(r, "short.tsar: offset"));
  r = Tsar("inspect " + Path("short.tsar"));
  EXPECT_EQ(r.code, 3);
}

}  // namespace
}  // namespace tsar
