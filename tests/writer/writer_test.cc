// tsar::Writer guarantees: deterministic bytes, atomic publication, clear
// refusals of what it cannot pack, and alignment of what it writes.
#include <ATen/ATen.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "format/index.h"
#include "tests/loader/test_helpers.h"
#include "tsar/tsar.h"
#include "writer/archive_writer.h"
#include "writer/atomic_file.h"
#include "writer/exporter.h"
#include "writer/import_transformers.h"
#include "writer/pack_files.h"
#include "writer/torchscript.h"

namespace tsar {
namespace {

using testing::Throws;

class WriterTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::TempDir(); }
  void TearDown() override { std::system(("chmod -R u+w " + dir_ + "; rm -rf " + dir_).c_str()); }
  std::string Path(const std::string& n) const { return dir_ + "/" + n; }
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    DIR* d = opendir(dir_.c_str());
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
    }
    closedir(d);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string dir_;
};

std::vector<std::pair<std::string, at::Tensor>> Model(uint64_t seed) {
  at::manual_seed(seed);
  const at::Tensor w = at::randn({300, 200});
  return {{"w", w},
          {"w_t", w.t()},
          {"b", at::randn({300}, at::kDouble)},
          {"step", at::scalar_tensor(5, at::kLong)}};
}

TEST_F(WriterTest, SameInputGivesTheSameBytes) {
  PackOptions o;
  pack(Path("a.tsar"), Model(1), o);
  pack(Path("b.tsar"), Model(1), o);  // equal tensors in different memory
  EXPECT_EQ(testing::ReadAll(Path("a.tsar")), testing::ReadAll(Path("b.tsar")));
  pack(Path("c.tsar"), Model(2), o);
  EXPECT_NE(testing::ReadAll(Path("a.tsar")), testing::ReadAll(Path("c.tsar")));
}

TEST_F(WriterTest, LargeStoragesArePageAlignedAndSmallOnesPackTightly) {
  std::vector<std::pair<std::string, at::Tensor>> v;
  for (int i = 0; i < 50; ++i) v.push_back({"small" + std::to_string(i), at::full({16}, float(i))});
  v.push_back({"big", at::ones({20000})});  // 80,000 bytes
  pack(Path("al.tsar"), v);
  const Archive a = Archive::open(Path("al.tsar"));
  for (const auto& s : a.storages())
    EXPECT_EQ(s.offset % (s.nbytes >= 4096 ? 4096 : 64), 0u) << s.id;
  // No page per small tensor: data + index (< 8 KiB) + at most one page of padding.
  EXPECT_LT(a.file_size(), 50 * 64 + 80000 + 8192 + 4096);
  PackOptions o;
  o.alignment = 1 << 16;
  pack(Path("al64k.tsar"), v, o);
  EXPECT_EQ(Archive::open(Path("al64k.tsar")).alignment(), 1u << 16);
  EXPECT_EQ(Archive::open(Path("al64k.tsar")).storages().back().offset % (1 << 16), 0u);
}

TEST_F(WriterTest, PublishesAReadOnlyFileAndLeavesNothingElse) {
  pack(Path("m.tsar"), Model(1));
  struct stat st;
  ASSERT_EQ(stat(Path("m.tsar").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0222, 0u) << "archives are published read-only";
  EXPECT_EQ(Files(), std::vector<std::string>{"m.tsar"});
  pack(Path("m.tsar"), Model(2));  // replacing a read-only archive works (rename)
  EXPECT_EQ(Files(), std::vector<std::string>{"m.tsar"});
}

TEST_F(WriterTest, AFailedPackLeavesTheDestinationUntouched) {
  pack(Path("keep.tsar"), Model(1));
  const std::string before = testing::ReadAll(Path("keep.tsar"));
  std::vector<std::pair<std::string, at::Tensor>> dup = {{"x", at::ones({2})},
                                                         {"x", at::zeros({2})}};
  EXPECT_TRUE(Throws([&] { pack(Path("keep.tsar"), dup); }, ErrorCode::kDuplicateName, "\"x\""));
  EXPECT_EQ(testing::ReadAll(Path("keep.tsar")), before);
  EXPECT_EQ(Files(), std::vector<std::string>{"keep.tsar"});
}

TEST_F(WriterTest, RefusesWhatItCannotPackNamingTheTensor) {
  Writer w(Path("r.tsar"));
  EXPECT_TRUE(
      Throws([&] { w.add("q", at::quantize_per_tensor(at::ones({2}), 0.1, 0, at::kQInt8)); },
             ErrorCode::kUnsupported, "quantized"));
  EXPECT_TRUE(Throws([&] { w.add("u", at::Tensor()); }, ErrorCode::kInvalidArgument, "undefined"));
  EXPECT_TRUE(Throws([&] { Writer bad(Path("x.tsar"), PackOptions{100}); },
                     ErrorCode::kInvalidArgument, "alignment"));
  EXPECT_TRUE(
      Throws([&] { w.add_metadata("k", int64_t{1}, "no-such-entry"); }, ErrorCode::kNotFound));
}

TEST_F(WriterTest, DtypeConvertsFloatingStoragesAndSaysWhatItLeft) {
  at::manual_seed(3);
  const at::Tensor w = at::randn({4, 6});
  const at::Tensor raw = at::randn({8});
  PackOptions o;
  o.dtype = DType::kFloat16;
  std::vector<std::string> notes;
  o.note = [&](const std::string& line) { notes.push_back(line); };
  Writer wr(Path("h.tsar"), o);
  wr.add("w", w);
  wr.add("w_t", w.t());
  wr.add("raw", raw);
  wr.add("raw_bits", raw.view(at::kInt));  // one storage, two dtypes: kept
  wr.add("step", at::scalar_tensor(7, at::kLong));
  wr.finish();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("dtype float16: converted 2 floating-point tensors in 1 storage "
                          "(from float32: 2), 96 B -> 48 B"),
            std::string::npos)
      << notes[0];
  EXPECT_NE(notes[0].find("viewed with another dtype: raw"), std::string::npos) << notes[0];
  const Archive a = Archive::open(Path("h.tsar"));
  EXPECT_TRUE(at::equal(a.tensor("w"), w.to(at::kHalf)));
  EXPECT_TRUE(at::equal(a.tensor("w_t"), w.t().to(at::kHalf)));
  EXPECT_EQ(a.info("w").storage, a.info("w_t").storage);
  EXPECT_EQ(a.tensor("raw").scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(a.tensor("raw_bits"), raw.view(at::kInt)));
  EXPECT_EQ(a.tensor("step").item<int64_t>(), 7);
  PackOptions bad;
  bad.dtype = DType::kInt32;
  EXPECT_TRUE(
      Throws([&] { Writer x(Path("x.tsar"), bad); }, ErrorCode::kInvalidArgument,
             "PackOptions::dtype: expected float16, bfloat16, float32 or float64, found int32"));
}

// The packer and exporters are Torch-free; what needs LibTorch comes through
// hooks (ImportOptions::torchscript, PackFilesOptions::torch,
// ExportOptions::torch_save). Without them: kUnsupported naming the file and
// the hook, and nothing written.
TEST_F(WriterTest, WithoutLibTorchHooksTorchScriptArchAndPtAreRefused) {
  const std::string ts = testing::Fixture("tied_ts.pt");
  EXPECT_TRUE(Throws([&] { importer::Import(ts); }, ErrorCode::kUnsupported,
                     ts + ": a TorchScript archive: only LibTorch reads one, and no TorchScript "
                          "reader was given (ImportOptions::torchscript)"));
  importer::ImportOptions io;
  io.torchscript = writer::ImportTorchScript;
  EXPECT_FALSE(importer::Import(ts, io).entries.at(0).tensors.empty());

  PackFilesOptions po;
  po.architecture = Path("arch.pt");
  EXPECT_TRUE(Throws(
      [&] {
        PackFiles({{"", ts}}, Path("m.tsar"), po);
      },
      ErrorCode::kUnsupported,
      Path("m.tsar") + ": --arch: only LibTorch writes an architecture file, and no "
                       "LibTorch support was given (PackFilesOptions::torch)"));
  po.architecture.clear();
  EXPECT_TRUE(Throws(
      [&] {
        PackFiles({{"", ts}}, Path("m.tsar"), po);
      },
      ErrorCode::kUnsupported, "ImportOptions::torchscript"));
  EXPECT_TRUE(Files().empty());

  pack(Path("m.tsar"), Model(1));
  const Archive a = Archive::open(Path("m.tsar"));
  EXPECT_TRUE(
      Throws([&] { exporter::Export(a, Path("m.pt"), exporter::Format::kTorchSave); },
             ErrorCode::kUnsupported,
             Path("m.pt") +
                 ": a torch.save file is written with LibTorch's zip writer, and none was given "
                 "(ExportOptions::torch_save)"));
  EXPECT_EQ(Files(), std::vector<std::string>{"m.tsar"});
}

TEST_F(WriterTest, SparseTensorsRoundTripAsSparseRecords) {
  at::manual_seed(5);
  const at::Tensor dense = at::randn({6, 5}) * at::bernoulli(at::full({6, 5}, 0.3));
  const at::Tensor coo = dense.to_sparse();      // coalesced
  const at::Tensor raw = at::sparse_coo_tensor(  // not coalesced: a repeated index
      at::tensor({0, 0, 2, 0, 0, 1}, at::kLong).view({2, 3}), at::tensor({1.0f, 2.0f, 3.0f}),
      {3, 2});
  const at::Tensor csr = dense.to_sparse_csr();
  const at::Tensor hybrid = at::randn({4, 3}).to_sparse(1);  // COO with a dense dimension
  Writer w(Path("s.tsar"));
  w.add("w", dense);
  w.add("coo", coo);
  w.add("raw", raw);
  w.add("csr", csr);
  w.add("hybrid", hybrid);
  w.finish();
  const Archive a = Archive::open(Path("s.tsar"));
  EXPECT_EQ(a.names(), (std::vector<std::string>{"w", "coo", "raw", "csr", "hybrid"}));
  EXPECT_TRUE(a.tensor("coo").is_coalesced());
  EXPECT_FALSE(a.tensor("raw").is_coalesced());
  EXPECT_TRUE(at::equal(a.tensor("coo").to_dense(), dense));
  EXPECT_TRUE(at::equal(a.tensor("raw").to_dense(), raw.to_dense()));
  EXPECT_EQ(a.tensor("csr").layout(), at::kSparseCsr);
  EXPECT_TRUE(at::equal(a.tensor("csr").to_dense(), dense));
  EXPECT_TRUE(at::equal(a.tensor("hybrid").to_dense(), hybrid.to_dense()));
  EXPECT_EQ(a.info("coo.values").role, Role::kSparseComponent);
  // The coalesced COO's values share storage with nothing else; the dense w is intact.
  EXPECT_TRUE(at::equal(a.tensor("w"), dense));
}

TEST_F(WriterTest, AnUnwritableDestinationIsAnIoErrorNamingTheDirectory) {
  EXPECT_TRUE(
      Throws([&] { pack(dir_ + "/no/such/dir/m.tsar", Model(1)); }, ErrorCode::kIo, "no/such/dir"));
  EXPECT_TRUE(Throws([&] { pack(dir_, Model(1)); }, ErrorCode::kInvalidArgument, "is a directory"));
}

TEST_F(WriterTest, ProgressReachesTheTotal) {
  PackOptions o;
  uint64_t last = 0, total = 0;
  o.progress = [&](uint64_t done, uint64_t all) {
    EXPECT_GE(done, last);
    last = done;
    total = all;
  };
  pack(Path("p.tsar"), Model(1), o);
  EXPECT_GT(total, 0u);
  EXPECT_EQ(last, total);
}

TEST_F(WriterTest, EveryOutputPassesTheDecoder) {
  pack(Path("v.tsar"), Model(3));
  const std::string bytes = testing::ReadAll(Path("v.tsar"));
  const auto idx =
      format::Index::ParseBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "v");
  EXPECT_EQ(idx.tensors().size(), 4u);
  EXPECT_EQ(idx.storages().size(), 3u);  // w and w_t share one
}

// SequentialWriter gathers small writes into runs: the file gets exactly the
// bytes written, zeros in the small gaps between them, large writes pass
// through, and a write behind the last one is a programming error.
TEST_F(WriterTest, SequentialWriterGivesTheFileExactlyItsWrites) {
  std::string want;
  {
    AtomicFile file(Path("seq"));
    SequentialWriter w(file);
    const auto put = [&](uint64_t offset, const std::string& bytes) {
      want.resize(offset, '\0');  // a gap reads as zeros
      want += bytes;
      w.Write(offset, bytes.data(), bytes.size());
    };
    for (int i = 0; i < 3000; ++i) put(want.size() + (i % 7 == 0 ? 100 : 0), std::to_string(i));
    put(want.size() + 5000, "past a gap larger than a page");
    put(want.size(), std::string(3 << 20, 'x'));  // larger than a run
    put(want.size() + 1, "after it");
    EXPECT_THROW(w.Write(10, "x", 1), std::logic_error);
    w.Flush();
    file.Publish(/*durable=*/false);
  }
  EXPECT_EQ(testing::ReadAll(Path("seq")), want);
}

// Spec §4.7.1: a key starting with "file:" names an attached file, and
// writers must not write one that is not (issue 56, item 14). Both savers of
// the Python package and `tsar pack` go through writer::ArchiveWriter.
TEST_F(WriterTest, MalformedAttachedFileKeysAreRefusedNamingTheKey) {
  const Bytes one{"1"};
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"file:../../x.json", "a file name with a \"..\" component"},
      {"file:", "an empty file name"},
      {"file:/etc/cron.d/x", "an absolute file name"},
      {"file:a//b", "an empty component"},
      {"file:dir/", "an empty component"},
      {"file:./x", "a file name with a \".\" component"},
      {"file:a/../b", "a file name with a \"..\" component"},
      {std::string("file:a\0b", 8), "a NUL byte"},
  };
  for (const auto& item : bad) {
    const std::string& key = item.first;  // a lambda cannot capture a structured binding (C++17)
    const std::string& why = item.second;
    writer::ArchiveWriter w(Path("k.tsar"), PackOptions{});
    EXPECT_TRUE(Throws([&] { w.add_metadata(key, one); }, ErrorCode::kInvalidValue, why)) << key;
    EXPECT_TRUE(Throws([&] { w.add_metadata(key, one); }, ErrorCode::kInvalidValue,
                       "metadata " + format::Quote(key) + ": key: expected an attached file"))
        << key;
  }
  writer::ArchiveWriter w(Path("k.tsar"), PackOptions{});
  w.add_entry("model");
  EXPECT_TRUE(Throws([&] { w.add_metadata("file:s.txt", std::string("text")); },
                     ErrorCode::kInvalidValue, "a str value"));
  EXPECT_TRUE(Throws([&] { w.add_metadata("file:e.txt", one, "model"); }, ErrorCode::kInvalidValue,
                     "a record of entry \"model\""));
  // What the grammar allows is written, and so is a key that only looks alike.
  w.add_metadata("file:config.json", Bytes{"{}"});
  w.add_metadata("file:additional_chat_templates/tool_use.jinja", one);
  w.add_metadata("files", one);
  w.finish();
  const ArchiveFile a = ArchiveFile::open(Path("k.tsar"));
  EXPECT_EQ(a.metadata_items().size(), 3u);
  // The LibTorch writer refuses the same way.
  Writer t(Path("t.tsar"));
  EXPECT_TRUE(
      Throws([&] { t.add_metadata("file:../x", one); }, ErrorCode::kInvalidValue, "\"file:../x\""));
}

// config.json is what tsar.transformers.load_model builds the model from:
// `tsar pack DIR` refuses one that it could not read (issue 56, item 11).
TEST(ConfigRefusal, SaysWhyAConfigIsUnusable) {
  EXPECT_EQ(importer::ConfigRefusal("{\"model_type\": \"llama\", \"a\": [1, {\"b\": null}]}"), "");
  EXPECT_EQ(importer::ConfigRefusal(" {} \n"), "");
  EXPECT_NE(importer::ConfigRefusal("{\"a\": \"\xff\"}").find("not UTF-8"), std::string::npos);
  EXPECT_NE(importer::ConfigRefusal("{not json").find("not JSON"), std::string::npos);
  EXPECT_NE(importer::ConfigRefusal("").find("not JSON"), std::string::npos);
  EXPECT_NE(importer::ConfigRefusal("{} {}").find("not JSON"), std::string::npos);
  EXPECT_NE(importer::ConfigRefusal(std::string("{}\0", 3)).find("NUL byte at offset 2"),
            std::string::npos);
  EXPECT_NE(importer::ConfigRefusal("\xEF\xBB\xBF{}").find("byte order mark"), std::string::npos);
  EXPECT_EQ(importer::ConfigRefusal("[1, 2]"), "an array, not an object");
  EXPECT_EQ(importer::ConfigRefusal("\"x\""), "a string, not an object");
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "{\"a\":";
  deep += "1" + std::string(100000, '}');
  EXPECT_NE(importer::ConfigRefusal(deep).find("nested deeper than 64"), std::string::npos);
  std::string ok;
  for (int i = 0; i < importer::kMaxConfigDepth; ++i) ok += "{\"a\":";
  ok += "1" + std::string(importer::kMaxConfigDepth, '}');
  EXPECT_EQ(importer::ConfigRefusal(ok), "");
}

}  // namespace
}  // namespace tsar
