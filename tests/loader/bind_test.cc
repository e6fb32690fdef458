// tsar::bind into torch::nn::Module and TorchScript modules: outputs equal,
// parameters inside the mapping, tied weights tied, strict errors complete.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "tests/loader/test_helpers.h"
#include "tsar/tsar.h"

namespace tsar {
namespace {

using testing::Fixture;
using testing::InRanges;
using testing::MappedRanges;
using testing::Throws;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(32, 64));
    bn = register_module("bn", torch::nn::BatchNorm1d(64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 8));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

class BindTest : public testing::TempDirTest {
 protected:
  // Puts `trained` in eval mode, packs it to net.tsar and returns its output on x.
  torch::Tensor PackNet(Net& trained, const torch::Tensor& x) {
    trained->eval();
    const auto out = trained->forward(x);
    Writer w(Path("net.tsar"));
    w.add_module(*trained);
    w.finish();
    return out;
  }
};

TEST_F(BindTest, CppModulePackedAndBoundIntoAFreshInstanceGivesTheSameOutputs) {
  torch::manual_seed(1);
  Net trained;
  {
    torch::NoGradGuard g;
    trained->bn->running_mean.uniform_(-1, 1);
    trained->bn->running_var.uniform_(0.5, 2);
  }
  const auto x = torch::randn({4, 32});
  const auto want = PackNet(trained, x);

  Net fresh;
  fresh->eval();
  const c10::TensorImpl* fc1_impl = fresh->fc1->weight.unsafeGetTensorImpl();
  BindReport r;
  {
    const Archive a = Archive::open(Path("net.tsar"));
    EXPECT_EQ(a.info("fc1.weight").role, Role::kParameter);
    EXPECT_EQ(a.info("bn.running_mean").role, Role::kBuffer);
    r = tsar::bind(*fresh, a);
  }  // the Archive object is gone; the module's tensors keep the mapping
  EXPECT_EQ(r.bound.size(), 9u);  // 6 parameters + 3 BatchNorm buffers
  EXPECT_TRUE(torch::equal(fresh->forward(x), want));
  EXPECT_EQ(fresh->fc1->weight.unsafeGetTensorImpl(), fc1_impl) << "bind must rebind in place";
  EXPECT_TRUE(fresh->fc1->weight.requires_grad());
  const auto ranges = MappedRanges(Path("net.tsar"));
  for (const auto& p : fresh->named_parameters())
    EXPECT_TRUE(InRanges(p.value().data_ptr(), ranges)) << p.key();
  for (const auto& b : fresh->named_buffers())
    EXPECT_TRUE(InRanges(b.value().data_ptr(), ranges)) << b.key();
}

// Net's tensors, registered on the meta device (LibTorch's Module::to(kMeta)
// refuses: set_data() will not change a tensor's type, so a C++ module on
// meta registers meta tensors itself).
struct MetaNetImpl : torch::nn::Module {
  MetaNetImpl() {
    const auto meta = torch::TensorOptions().device(torch::kMeta);
    auto* fc1 = register_module("fc1", std::make_shared<torch::nn::Module>()).get();
    w1 = fc1->register_parameter("weight", torch::empty({64, 32}, meta));
    b1 = fc1->register_parameter("bias", torch::empty({64}, meta));
    auto* bn = register_module("bn", std::make_shared<torch::nn::Module>()).get();
    gamma = bn->register_parameter("weight", torch::empty({64}, meta));
    beta = bn->register_parameter("bias", torch::empty({64}, meta));
    mean = bn->register_buffer("running_mean", torch::empty({64}, meta));
    var = bn->register_buffer("running_var", torch::empty({64}, meta));
    bn->register_buffer("num_batches_tracked", torch::empty({}, meta.dtype(torch::kLong)));
    auto* fc2 = register_module("fc2", std::make_shared<torch::nn::Module>()).get();
    w2 = fc2->register_parameter("weight", torch::empty({8, 64}, meta));
    b2 = fc2->register_parameter("bias", torch::empty({8}, meta));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::linear(x, w1, b1);
    h = torch::batch_norm(h, gamma, beta, mean, var, false, 0.1, 1e-5, false);
    return torch::linear(torch::relu(h), w2, b2);
  }
  torch::Tensor w1, b1, gamma, beta, mean, var, w2, b2;
};
TORCH_MODULE(MetaNet);

TEST_F(BindTest, AModuleOnMetaIsBoundInPlaceAndRunsOnCpu) {
  torch::manual_seed(2);
  Net trained;
  {
    torch::NoGradGuard g;
    trained->bn->running_mean.uniform_(-1, 1);
  }
  const auto x = torch::randn({4, 32});
  const auto want = PackNet(trained, x);

  MetaNet fresh;
  fresh->eval();
  ASSERT_TRUE(fresh->w1.is_meta());
  const c10::TensorImpl* w1_impl = fresh->w1.unsafeGetTensorImpl();
  const BindReport r = tsar::bind(*fresh, Archive::open(Path("net.tsar")));
  EXPECT_EQ(r.bound.size(), 9u);
  // The member handles forward() uses are the bound tensors: the same
  // TensorImpl, now a CPU tensor over the mapping.
  EXPECT_EQ(fresh->w1.unsafeGetTensorImpl(), w1_impl);
  EXPECT_TRUE(fresh->w1.device().is_cpu());
  EXPECT_TRUE(fresh->w1.requires_grad());
  const auto ranges = MappedRanges(Path("net.tsar"));
  for (const auto& t : fresh->named_parameters()) {
    EXPECT_FALSE(t.value().is_meta()) << t.key();
    EXPECT_TRUE(InRanges(t.value().data_ptr(), ranges)) << t.key();
  }
  for (const auto& t : fresh->named_buffers()) EXPECT_FALSE(t.value().is_meta()) << t.key();
  EXPECT_TRUE(torch::equal(fresh->forward(x), want));
}

// A parameter on another device: a TensorImpl that says cuda:0 (no GPU is
// needed to make one, only to give it memory).
struct OnCudaImpl : torch::nn::Module {
  OnCudaImpl() {
    auto impl = c10::make_intrusive<c10::TensorImpl>(
        c10::DispatchKeySet(c10::DispatchKey::CUDA), caffe2::TypeMeta::Make<float>(),
        c10::Device(c10::kCUDA, 0));
    impl->set_sizes_contiguous({3, 4});
    weight = register_parameter("weight", at::Tensor(std::move(impl)), /*requires_grad=*/false);
    bias = register_parameter("bias", torch::zeros({3}));
  }
  torch::Tensor weight, bias;
};
TORCH_MODULE(OnCuda);

// §4.12 from C++: PackOptions::tp/shard, Archive::shard, BindOptions{rank, world}.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t world) {
    up = register_module("up", torch::nn::Linear(torch::nn::LinearOptions(16, 32 / world).bias(false)));
    down = register_module("down",
                           torch::nn::Linear(torch::nn::LinearOptions(32 / world, 16).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) { return down(torch::relu(up(x))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(Mlp);

TEST_F(BindTest, TensorParallelRanksBindTheirSlicesAndSumToTheFullLayer) {
  torch::manual_seed(3);
  Mlp full(1);
  full->eval();
  PackOptions o;
  o.tp = 2;
  o.alignment = 2u << 20;
  o.shard = {{"up.*", 0}, {"down.*", -1}};
  Writer w(Path("tp.tsar"), o);
  w.add_module(*full);
  w.finish();
  const Archive a = Archive::open(Path("tp.tsar"));
  EXPECT_EQ(a.tp_world(), 2u);
  EXPECT_EQ(a.format_minor(), 4);
  EXPECT_EQ(a.info("down.weight").shard_dim, 1);
  const auto x = torch::randn({3, 16});
  torch::Tensor sum;
  for (int64_t rank = 0; rank < 2; ++rank) {
    const at::Tensor slice = a.shard("down.weight", rank, 2);
    EXPECT_TRUE(torch::equal(slice, full->down->weight.chunk(2, 1)[rank]));
    EXPECT_TRUE(slice.is_contiguous());
    EXPECT_TRUE(InRanges(slice.data_ptr(), MappedRanges(Path("tp.tsar"))));
    Mlp part(2);
    part->eval();
    BindOptions b;
    b.rank = rank;
    b.world = 2;
    EXPECT_EQ(tsar::bind(*part, a, b).bound.size(), 2u);
    EXPECT_EQ(part->down->weight.data_ptr(), slice.data_ptr()) << "the rank's own run";
    const auto y = part->forward(x);
    sum = rank == 0 ? y : sum + y;
  }
  EXPECT_TRUE(torch::allclose(sum, full->forward(x), 1e-5, 1e-5));
  // The full module binds too: sharded weights as copies with the full values.
  Mlp whole(1);
  whole->eval();
  tsar::bind(*whole, a);
  EXPECT_TRUE(torch::equal(whole->down->weight, full->down->weight));
  Mlp wrong(4);
  wrong->eval();
  BindOptions b;
  b.rank = 0;
  b.world = 2;
  EXPECT_TRUE(Throws([&] { tsar::bind(*wrong, a, b); }, ErrorCode::kBindMismatch,
                     "up.weight: shape [8, 16] vs [16, 16], rank 0's slice of archive [32, 16]"));
}

TEST_F(BindTest, ATensorOnAnotherDeviceIsRefusedBeforeAnythingChanges) {
  Writer w(Path("lin.tsar"));
  torch::nn::Linear lin(4, 3);
  w.add_module(*lin);
  w.finish();
  OnCuda m;
  m->eval();
  const void* bias = m->bias.data_ptr();
  EXPECT_TRUE(Throws([&] { tsar::bind(*m, Archive::open(Path("lin.tsar"))); },
                     ErrorCode::kInvalidArgument, "\"weight\" is on cuda:0"));
  EXPECT_EQ(m->bias.data_ptr(), bias) << "nothing may change";
  EXPECT_TRUE(m->weight.is_cuda());
}

TEST_F(BindTest, AMetaTensorTheArchiveLacksIsRefusedEvenNonStrict) {
  Writer w(Path("lin.tsar"));
  torch::nn::Linear lin(4, 3);
  w.add_module(*lin);
  w.finish();
  MetaNet m;  // fc1, bn, fc2: none of them in the archive
  m->eval();
  BindOptions o;
  o.strict = false;
  EXPECT_TRUE(Throws([&] { tsar::bind(*m, Archive::open(Path("lin.tsar")), o); },
                     ErrorCode::kBindMismatch, "meta device"));
  EXPECT_TRUE(m->w1.is_meta());
}

TEST_F(BindTest, StrictModeListsEveryMismatchAndChangesNothing) {
  torch::manual_seed(2);
  Net net;
  Writer w(Path("odd.tsar"));
  w.add("fc1.weight", torch::zeros({64, 16}));            // wrong shape
  w.add("fc1.bias", torch::zeros({64}, torch::kDouble));  // wrong dtype
  w.add("extra.weight", torch::zeros({3}));               // not in the module
  w.finish();
  net->eval();
  const auto before = net->fc1->weight.clone();
  const Archive a = Archive::open(Path("odd.tsar"));
  try {
    tsar::bind(*net, a);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kBindMismatch);
    for (const char* s :
         {"missing in archive: bn.weight", "fc2.weight", "bn.num_batches_tracked",
          "not in module: extra.weight", "fc1.weight: shape [64, 32] vs archive [64, 16]",
          "fc1.bias: dtype float32 vs archive float64"}) {
      EXPECT_NE(m.find(s), std::string::npos) << "lacks \"" << s << "\": " << m;
    }
  }
  EXPECT_TRUE(torch::equal(net->fc1->weight, before));
  BindOptions loose;
  loose.strict = false;
  Writer w2(Path("part.tsar"));
  w2.add("fc2.bias", torch::full({8}, 3.0));
  w2.add("nope", torch::zeros({1}));
  w2.finish();
  const BindReport r = tsar::bind(*net, Archive::open(Path("part.tsar")), loose);
  EXPECT_EQ(r.bound, std::vector<std::string>{"fc2.bias"});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"nope"});
  EXPECT_EQ(r.missing.size(), 8u);
  EXPECT_EQ(net->fc2->bias.sum().item<float>(), 24.0f);
}

// bind tries the record after the last match before the name table, and reads
// a module's parameters in place: a module that lists its tensors in another
// order than the archive, and one with an undefined parameter (a Linear
// without bias registers one), bind exactly as state_dict() names them.
TEST_F(BindTest, ModulesInAnotherOrderAndUndefinedParametersBindByName) {
  struct Reversed : torch::nn::Module {
    Reversed() {
      bn = register_module("bn", torch::nn::BatchNorm1d(64));
      fc2 = register_module("fc2", torch::nn::Linear(64, 8));
      fc1 = register_module("fc1", torch::nn::Linear(32, 64));
    }
    torch::nn::Linear fc1{nullptr}, fc2{nullptr};
    torch::nn::BatchNorm1d bn{nullptr};
  };
  torch::manual_seed(3);
  Net trained;
  trained->eval();
  Writer w(Path("net.tsar"));
  w.add_module(*trained);
  w.finish();
  Reversed fresh;
  fresh.eval();
  const Archive a = Archive::open(Path("net.tsar"));
  const BindReport r = tsar::bind(fresh, a);
  EXPECT_EQ(r.bound.size(), 9u);
  EXPECT_EQ(r.bound.front(), "bn.weight");
  EXPECT_TRUE(r.missing.empty() && r.unexpected.empty() && r.mismatched.empty());
  EXPECT_TRUE(torch::equal(fresh.fc1->weight, trained->fc1->weight));
  EXPECT_TRUE(torch::equal(fresh.fc2->bias, trained->fc2->bias));
  EXPECT_TRUE(torch::equal(fresh.bn->running_var, trained->bn->running_var));
  EXPECT_EQ(fresh.fc1->weight.data_ptr(), a.tensor("fc1.weight").data_ptr());

  torch::nn::Linear no_bias(torch::nn::LinearOptions(32, 64).bias(false));
  ASSERT_FALSE(no_bias->bias.defined());
  no_bias->eval();
  Writer w2(Path("w.tsar"));
  w2.add("weight", torch::full({64, 32}, 2.0));
  w2.finish();
  const BindReport r2 = tsar::bind(*no_bias, Archive::open(Path("w.tsar")));
  EXPECT_EQ(r2.bound, std::vector<std::string>{"weight"});
  EXPECT_EQ(no_bias->weight.sum().item<float>(), 2.0f * 64 * 32);
}
TEST_F(BindTest, RefusesATrainingModeModuleOverASharedMapping) {
  Net net;
  Writer w(Path("t.tsar"));
  w.add_module(*net);
  w.finish();
  EXPECT_TRUE(Throws([&] { tsar::bind(*net, Archive::open(Path("t.tsar"))); },
                     ErrorCode::kInvalidArgument, "call module.eval()"));
  OpenOptions cow;
  cow.mode = MapMode::kCopyOnWrite;
  EXPECT_EQ(tsar::bind(*net, Archive::open(Path("t.tsar"), cow)).bound.size(), 9u);
  // Train-mode BatchNorm writes its running stats (private pages), and
  // autograd works through the bound parameters.
  const int64_t version = net->fc1->weight._version();
  net->forward(torch::randn({4, 32})).sum().backward();
  EXPECT_TRUE(net->fc1->weight.grad().defined());
  EXPECT_GT(net->fc1->weight.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(net->fc1->weight._version(), version);
  EXPECT_TRUE(net->fc1->weight.is_leaf());
}

TEST_F(BindTest, TorchScriptResnet18BoundAfterZeroingIsBitIdenticalToPython) {
  torch::jit::Module source = torch::jit::load(Fixture("resnet18_ts.pt"));
  Writer w(Path("resnet18.tsar"));
  w.add_module(source);
  w.finish();

  torch::jit::Module m = torch::jit::load(Fixture("resnet18_ts.pt"));
  m.eval();
  {
    torch::NoGradGuard g;
    for (const auto& p : m.parameters()) p.zero_();
    for (const auto& b : m.buffers()) b.zero_();
  }
  const BindReport r = tsar::bind(m, Archive::open(Path("resnet18.tsar")));
  EXPECT_EQ(r.bound.size(), 122u);
  const auto xv = testing::ReadFloats(Fixture("resnet18_x.bin"));
  const auto yv = testing::ReadFloats(Fixture("resnet18_y.bin"));
  const auto x = torch::from_blob(const_cast<float*>(xv.data()), {2, 3, 64, 64}).clone();
  const auto want = torch::from_blob(const_cast<float*>(yv.data()), {2, 1000}).clone();
  torch::NoGradGuard g;
  const auto got = m.forward({x}).toTensor();
  EXPECT_TRUE(torch::equal(got, want)) << "max diff " << (got - want).abs().max().item<float>();
  const auto ranges = MappedRanges(Path("resnet18.tsar"));
  for (const auto& p : m.named_parameters())
    EXPECT_TRUE(InRanges(p.value.data_ptr(), ranges)) << p.name;
  for (const auto& b : m.named_buffers())
    EXPECT_TRUE(InRanges(b.value.data_ptr(), ranges)) << b.name;
}

TEST_F(BindTest, PackOfAModuleKeepsItsBuffersAndRoles) {
  torch::manual_seed(3);
  Net trained;
  {
    torch::NoGradGuard g;
    trained->bn->running_mean.uniform_(-1, 1);
  }
  tsar::pack(Path("module.tsar"), *trained);
  tsar::pack(Path("params.tsar"), trained->named_parameters());
  const Archive a = Archive::open(Path("module.tsar"));
  EXPECT_EQ(a.infos().size(), trained->named_parameters().size() + trained->named_buffers().size());
  EXPECT_EQ(a.info("bn.running_mean").role, Role::kBuffer);
  EXPECT_EQ(a.info("fc1.weight").role, Role::kParameter);
  EXPECT_TRUE(torch::equal(a.tensor("bn.running_mean"), trained->bn->running_mean));
  Net fresh;
  fresh->eval();
  EXPECT_EQ(tsar::bind(*fresh, a).bound.size(), a.infos().size());
  EXPECT_TRUE(torch::equal(fresh->bn->running_mean, trained->bn->running_mean));
  // named_parameters() alone leaves the buffers out, and says so at bind.
  Net other;
  other->eval();
  EXPECT_TRUE(Throws([&] { tsar::bind(*other, Archive::open(Path("params.tsar"))); },
                     ErrorCode::kBindMismatch, "bn.running_mean"));

  torch::jit::Module source = torch::jit::load(Fixture("resnet18_ts.pt"));
  tsar::pack(Path("ts.tsar"), source);
  EXPECT_EQ(Archive::open(Path("ts.tsar")).info("bn1.running_var").role, Role::kBuffer);
}

TEST_F(BindTest, PrefixesMatchADdpArchiveAndAWrappedModule) {
  torch::manual_seed(4);
  Net trained;
  trained->eval();
  {  // what DistributedDataParallel's state_dict() names: "module.fc1.weight"
    Writer w(Path("ddp.tsar"));
    for (const auto& p : trained->named_parameters()) w.add("module." + p.key(), p.value());
    for (const auto& b : trained->named_buffers()) w.add("module." + b.key(), b.value());
    w.finish();
  }
  const Archive ddp = Archive::open(Path("ddp.tsar"));
  Net fresh;
  fresh->eval();
  EXPECT_TRUE(Throws([&] { tsar::bind(*fresh, ddp); }, ErrorCode::kBindMismatch,
                     "missing in archive: fc1.weight"));
  BindOptions o;
  o.archive_prefix = "module.";
  EXPECT_EQ(tsar::bind(*fresh, ddp, o).bound.size(), ddp.infos().size());
  EXPECT_TRUE(torch::equal(fresh->fc2->weight, trained->fc2->weight));

  // A module whose names carry a prefix the archive's do not.
  struct WrapImpl : torch::nn::Module {
    WrapImpl() { net = register_module("model", Net()); }
    Net net{nullptr};
  };
  auto wrap = std::make_shared<WrapImpl>();
  wrap->eval();
  tsar::pack(Path("plain.tsar"), *trained);
  BindOptions m;
  m.module_prefix = "model.";
  EXPECT_EQ(tsar::bind(*wrap, Archive::open(Path("plain.tsar")), m).bound.size(),
            ddp.infos().size());
  EXPECT_TRUE(torch::equal(wrap->net->fc1->bias, trained->fc1->bias));
  // Both: archive "module.x" for module "model.x"; a name without the module
  // prefix is missing.
  BindOptions both;
  both.archive_prefix = "module.";
  both.module_prefix = "model.";
  EXPECT_EQ(tsar::bind(*wrap, ddp, both).bound.size(), ddp.infos().size());
  both.module_prefix = "other.";
  EXPECT_TRUE(Throws([&] { tsar::bind(*wrap, ddp, both); }, ErrorCode::kBindMismatch,
                     "missing in archive: model.fc1.weight"));
}

TEST_F(BindTest, AFrozenModuleIsRefusedWithWhatIsWrong) {
  torch::jit::Module m = torch::jit::load(Fixture("resnet18_ts.pt"));
  tsar::pack(Path("r.tsar"), m);
  m.eval();
  torch::jit::Module frozen = torch::jit::freeze(m);
  EXPECT_TRUE(Throws([&] { tsar::bind(frozen, Archive::open(Path("r.tsar"))); },
                     ErrorCode::kBindMismatch,
                     "the module is frozen (torch::jit::freeze): its weights are constants"));
}

TEST_F(BindTest, TiedWeightsAndViewsComeBackTied) {
  torch::jit::Module m = torch::jit::load(Fixture("tied_ts.pt"));
  Writer w(Path("tied.tsar"));
  w.add_module(m);
  w.finish();
  const Archive a = Archive::open(Path("tied.tsar"));
  EXPECT_TRUE(a.tensor("emb.weight").storage().is_alias_of(a.tensor("head.weight").storage()));
  EXPECT_TRUE(a.tensor("full").storage().is_alias_of(a.tensor("tr").storage()));
  EXPECT_EQ(a.info("part").storage_offset, 4u);

  torch::jit::Module fresh = torch::jit::load(Fixture("tied_ts.pt"));
  fresh.eval();
  tsar::bind(fresh, a);
  auto params = fresh.named_parameters();
  std::map<std::string, at::Tensor> p;
  for (const auto& x : params) p[x.name] = x.value;
  EXPECT_EQ(p["emb.weight"].data_ptr(), p["head.weight"].data_ptr());
  const auto yv = testing::ReadFloats(Fixture("tied_y.bin"));
  torch::NoGradGuard g;
  const auto got = fresh.forward({torch::tensor({0, 3, 4})}).toTensor();
  EXPECT_TRUE(torch::equal(got.flatten(), torch::from_blob(const_cast<float*>(yv.data()), {15})));
}

// A C++ module with its head tied to its embedding (one tensor, two names).
struct TiedHeadImpl : torch::nn::Module {
  TiedHeadImpl() {
    emb = register_parameter("emb", torch::randn({6, 4}));
    head = register_parameter("head", emb);
  }
  torch::Tensor emb, head;
};
TORCH_MODULE(TiedHead);

TEST_F(BindTest, ANameTheArchiveLacksBindsThroughItsTieInStrictMode) {
  // The archive stores the tied weight once (as save_pretrained does).
  torch::manual_seed(3);
  const at::Tensor w = torch::randn({6, 4});
  {
    Writer out(Path("once.tsar"));
    out.add("emb", w);
    out.finish();
  }
  TiedHead m;
  m->eval();
  const BindReport r = tsar::bind(*m, Archive::open(Path("once.tsar")));  // strict
  EXPECT_EQ(r.bound, std::vector<std::string>{"emb"});
  EXPECT_EQ(r.tied, std::vector<std::string>{"head"});
  EXPECT_TRUE(r.missing.empty());
  EXPECT_EQ(m->named_parameters()["head"].data_ptr(), m->named_parameters()["emb"].data_ptr());
  EXPECT_TRUE(torch::equal(m->named_parameters()["head"], w));
}

TEST_F(BindTest, OneTensorUnderTwoNamesWithOtherBytesInTheArchiveIsRefused) {
  {
    Writer out(Path("two.tsar"));
    out.add("emb", torch::ones({6, 4}));
    out.add("head", torch::zeros({6, 4}));
    out.finish();
  }
  TiedHead m;
  m->eval();
  const at::Tensor before = m->emb.clone();
  EXPECT_TRUE(Throws([&] { tsar::bind(*m, Archive::open(Path("two.tsar"))); },
                     ErrorCode::kBindMismatch,
                     "head: the same tensor as \"emb\" in the module, but the archive holds "
                     "other values for it"));
  EXPECT_TRUE(torch::equal(m->emb, before));
  // Equal bytes under both names: both bind, still one tensor.
  {
    Writer out(Path("same.tsar"));
    out.add("emb", torch::ones({6, 4}));
    out.add("head", torch::ones({6, 4}));
    out.finish();
  }
  const BindReport r = tsar::bind(*m, Archive::open(Path("same.tsar")));
  EXPECT_EQ(r.bound.size(), 2u);
  EXPECT_EQ(m->named_parameters()["head"].data_ptr(), m->named_parameters()["emb"].data_ptr());
}

}  // namespace
}  // namespace tsar
