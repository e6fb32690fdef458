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
  o.staging.windows = 0;
  EXPECT_TRUE(Throws([&] { tsar::bind(*m, a, o); }, ErrorCode::kInvalidArgument,
                     "bind: direct lanes: expected direct_lanes from -1"));
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
    const auto sd = to_device(a, c10::Device(c10::kCUDA, 0), "", o);
    EXPECT_TRUE(sd["emb"].is_cuda());
    EXPECT_TRUE(torch::equal(sd["emb"].cpu(), emb));
    EXPECT_TRUE(torch::equal(sd["part"].cpu(), emb.narrow(0, 2, 4)));
    EXPECT_TRUE(torch::equal(sd["bf"].cpu().view(torch::kInt16), bf.view(torch::kInt16)));
    EXPECT_TRUE(sd["head"].storage().is_alias_of(sd["emb"].storage()));
    EXPECT_TRUE(sd["part"].storage().is_alias_of(sd["emb"].storage()));
  }
}

// The direct lanes (issue 44) on a GPU: windows of the mapping locked in
// place and read by the GPU, beside the staging lane or alone; every byte
// exact, ties still one storage, and what each lane did in DeviceStats.
TEST_F(DeviceTest, DirectLanesReadLockedWindowsOfTheMappingBytesExact) {
  if (!gpu()) GTEST_SKIP() << "no CUDA device here: the GPU path is built and linked, not run";
  torch::manual_seed(3);
  const at::Tensor emb = torch::randn({1024, 1024});  // 4 MiB
  const at::Tensor w = torch::randn({3000, 701}).to(torch::kBFloat16);
  pack(Path("d.tsar"), std::vector<std::pair<std::string, at::Tensor>>{
                           {"emb", emb}, {"head", emb}, {"w", w}, {"small", torch::ones({3})}});
  const Archive a = Archive::open(Path("d.tsar"));
  struct Case {
    const char* what;
    int lanes;
    bool staging;
  };
  for (const Case& c : {Case{"staging alone", -1, true}, Case{"both", 0, true},
                        Case{"direct alone", 1, false}, Case{"two direct lanes", 2, false}}) {
    DeviceOptions o;
    o.direct_lanes = c.lanes;
    o.staging = c.staging;
    o.window_bytes = 1 << 20;
    o.windows = 3;
    DeviceStats st;
    o.stats = &st;
    const auto sd = to_device(a, c10::Device(c10::kCUDA, 0), "", o);
    EXPECT_TRUE(torch::equal(sd["emb"].cpu(), emb)) << c.what;
    EXPECT_TRUE(torch::equal(sd["w"].cpu().view(torch::kInt16), w.view(torch::kInt16))) << c.what;
    EXPECT_TRUE(torch::equal(sd["small"].cpu(), torch::ones({3}))) << c.what;
    EXPECT_TRUE(sd["head"].storage().is_alias_of(sd["emb"].storage())) << c.what;
    EXPECT_EQ(st.bytes, uint64_t(emb.nbytes() + w.nbytes() + 12)) << c.what;
    EXPECT_EQ(st.windows_refused, 0) << c.what;
    if (c.lanes < 0) {
      EXPECT_EQ(st.bytes_direct, 0u) << c.what;
      EXPECT_EQ(st.direct_lanes, 0) << c.what;
    } else {
      EXPECT_GT(st.bytes_direct, 0u) << c.what;
      EXPECT_LE(st.locked_bytes, uint64_t(std::max(c.lanes, 1)) * 3 * (1 << 20)) << c.what;
    }
    if (!c.staging) EXPECT_EQ(st.bytes_direct, st.bytes) << c.what;
  }
  // Nothing left locked: the whole mapping can be locked now.
  EXPECT_TRUE(torch::equal(torch::ones({4}, torch::kCUDA).sum().cpu(), torch::tensor(4.0f)));
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
