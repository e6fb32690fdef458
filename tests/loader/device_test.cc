// tsar::to_device and bind(..., {.device = cuda}) (issue 29). Needs no
// fixtures, so scripts/gpu-check.sh builds and runs it on a GPU machine that
// has torch but none of the other test inputs. Without a GPU the GPU cases
// skip saying so, and the refusals are checked instead.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/loader/test_helpers.h"
#include "tsar/tsar.h"

namespace tsar {
namespace {

using testing::Throws;

// A module with a tied weight (head.weight is emb's tensor) and a buffer, on
// cpu or on meta (a C++ module on meta registers meta tensors itself).
struct TiedImpl : torch::nn::Module {
  explicit TiedImpl(torch::Device device = torch::kCPU) {
    const auto o = torch::TensorOptions().device(device);
    emb = register_parameter("emb", torch::randn({64, 16}, o));
    register_module("head", std::make_shared<torch::nn::Module>())->register_parameter("weight", emb);
    w = register_parameter("w", torch::randn({16, 16}, o));
    scale = register_buffer("scale", torch::full({16}, 0.5, o));
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    return torch::matmul(torch::relu(torch::embedding(emb, ids).matmul(w)) * scale, emb.t());
  }
  torch::Tensor emb, w, scale;
};
TORCH_MODULE(Tied);

class DeviceTest : public testing::TempDirTest {
 protected:
  bool gpu() const { return at::hasCUDA(); }
};

TEST_F(DeviceTest, WithoutCudaBindOntoAGpuIsRefusedAndChangesNothing) {
  if (gpu()) GTEST_SKIP() << "a CUDA device is present: the GPU cases run instead";
  torch::manual_seed(0);
  Tied src;
  pack(Path("m.tsar"), *src);
  const Archive a = Archive::open(Path("m.tsar"));
  Tied m;
  const void* before = m->w.data_ptr();
  BindOptions o;
  o.device = c10::Device(c10::kCUDA, 0);
  EXPECT_TRUE(Throws([&] { tsar::bind(*m, a, o); }, ErrorCode::kUnsupported, "bind: this LibTorch"));
  EXPECT_EQ(m->w.data_ptr(), before);
  o.device = c10::Device(c10::kCUDA, 0);
  o.staging.buffers = 0;  // checked before anything else, GPU or not
  EXPECT_TRUE(Throws([&] { tsar::bind(*m, a, o); }, ErrorCode::kInvalidArgument,
                     "bind: staging: expected at least 1 buffer"));
  EXPECT_EQ(m->w.data_ptr(), before);
  o.staging = DeviceOptions{};
  o.device = c10::Device(c10::kMeta);
  EXPECT_TRUE(Throws([&] { tsar::bind(*m, a, o); }, ErrorCode::kUnsupported,
                     "only cpu and cuda devices are supported, found meta"));
  EXPECT_EQ(m->w.data_ptr(), before);
}

TEST_F(DeviceTest, ToDeviceKeepsTiesAndViewsAsOneDeviceStorage) {
  if (!gpu()) GTEST_SKIP() << "no CUDA device here: the GPU path is built and linked, not run";
  const at::Tensor emb = torch::randn({16, 8});
  const at::Tensor bf = torch::randn({4, 1000}).to(torch::kBFloat16);
  pack(Path("v.tsar"), std::vector<std::pair<std::string, at::Tensor>>{
                           {"emb", emb}, {"head", emb}, {"part", emb.narrow(0, 2, 4)}, {"bf", bf}});
  const Archive a = Archive::open(Path("v.tsar"));
  for (const uint64_t pinned : {uint64_t{64} << 10, uint64_t{64} << 20}) {
    DeviceOptions o;
    o.pinned_bytes = pinned;
    DeviceStats st;
    o.stats = &st;
    const auto sd = to_device(a, c10::Device(c10::kCUDA, 0), "", o);
    EXPECT_EQ(st.bytes, uint64_t(emb.nbytes() + bf.nbytes()));  // the tie and the view once
    EXPECT_EQ(st.bytes_direct, 0u);
    EXPECT_EQ(st.bytes_from_file, st.bytes) << "staged from the file (stage_from_file)";
    EXPECT_GT(st.pinned_bytes, 0u);
    EXPECT_LE(st.pinned_bytes, pinned);
    EXPECT_TRUE(sd["emb"].is_cuda());
    EXPECT_TRUE(torch::equal(sd["emb"].cpu(), emb));
    EXPECT_TRUE(torch::equal(sd["part"].cpu(), emb.narrow(0, 2, 4)));
    EXPECT_TRUE(torch::equal(sd["bf"].cpu().view(torch::kInt16), bf.view(torch::kInt16)));
    EXPECT_TRUE(sd["head"].storage().is_alias_of(sd["emb"].storage()));
    EXPECT_TRUE(sd["part"].storage().is_alias_of(sd["emb"].storage()));
  }
}

// Staging from the mapping instead of the file, and from a copy-on-write
// archive whose mapping this process wrote to: the bytes the mapping shows
// arrive (the write included), none read from the file.
TEST_F(DeviceTest, ToDeviceStagesFromMemoryWhereAskedOrWhereTheMappingIsPrivate) {
  if (!gpu()) GTEST_SKIP() << "no CUDA device here: the GPU path is built and linked, not run";
  const at::Tensor w = torch::randn({300, 700});
  pack(Path("c.tsar"), std::vector<std::pair<std::string, at::Tensor>>{{"w", w}});
  DeviceOptions o;
  DeviceStats st;
  o.stats = &st;
  o.stage_from_file = false;
  const Archive shared = Archive::open(Path("c.tsar"));
  EXPECT_TRUE(torch::equal(to_device(shared, c10::Device(c10::kCUDA, 0), "", o)["w"].cpu(), w));
  EXPECT_EQ(st.bytes, uint64_t(w.nbytes()));
  EXPECT_EQ(st.bytes_from_file, 0u);
  OpenOptions cow;
  cow.mode = MapMode::kCopyOnWrite;
  const Archive written = Archive::open(Path("c.tsar"), cow);
  written.tensor("w").fill_(2.5f);
  o.stage_from_file = true;
  const at::Tensor got = to_device(written, c10::Device(c10::kCUDA, 0), "", o)["w"].cpu();
  EXPECT_TRUE(torch::equal(got, torch::full({300, 700}, 2.5f))) << "the process's own write";
  EXPECT_EQ(st.bytes_from_file, 0u);
}

TEST_F(DeviceTest, BindOntoAGpuMovesAModuleBuiltOnMetaWithItsTies) {
  if (!gpu()) GTEST_SKIP() << "no CUDA device here: the GPU path is built and linked, not run";
  torch::manual_seed(0);
  Tied src;
  src->eval();
  pack(Path("m.tsar"), *src);
  const Archive a = Archive::open(Path("m.tsar"));
  Tied m(torch::kMeta);
  m->eval();
  const c10::TensorImpl* impl = m->w.unsafeGetTensorImpl();
  BindOptions o;
  o.device = c10::Device(c10::kCUDA, 0);
  o.staging.pinned_bytes = 64 << 10;
  const BindReport r = tsar::bind(*m, a, o);
  EXPECT_EQ(r.bound.size(), src->named_parameters().size() + src->named_buffers().size());
  EXPECT_EQ(m->w.unsafeGetTensorImpl(), impl);  // in place
  for (const auto& p : m->named_parameters()) EXPECT_TRUE(p.value().is_cuda()) << p.key();
  for (const auto& b : m->named_buffers()) EXPECT_TRUE(b.value().is_cuda()) << b.key();
  EXPECT_EQ(m->emb.data_ptr(), m->named_parameters()["head.weight"].data_ptr());
  // The weights, byte for byte; the forward, GPU against GPU (a GPU forward
  // and a CPU one run other kernels, with other rounding).
  for (const auto& p : src->named_parameters()) {
    EXPECT_TRUE(torch::equal(m->named_parameters()[p.key()].cpu(), p.value())) << p.key();
  }
  for (const auto& b : src->named_buffers()) {
    EXPECT_TRUE(torch::equal(m->named_buffers()[b.key()].cpu(), b.value())) << b.key();
  }
  torch::NoGradGuard g;
  const at::Tensor ids = torch::tensor({1, 5, 63}).cuda();
  src->to(c10::Device(c10::kCUDA, 0));
  EXPECT_TRUE(torch::equal(m->forward(ids), src->forward(ids)));
}

}  // namespace
}  // namespace tsar
