"""The three model layouts of issue 28, each at a named size: (a) a ResNet-50
style torchvision model, (b) a LLaMA-style decoder from transformers with tied
embeddings, in bf16, (c) a mixture-of-experts layout with a given number of
small tensors. ``spec(kind, size)`` returns a ModelSpec whose ``make(meta)``
builds the architecture (on the meta device, or on the CPU with its own
initialisation) and whose ``reference()`` builds the weights every peer is given.

Sizes: "tiny" (the tests), "small" (a quick benchmark), "bench" (issue 28's
sizes: (a) resnet50, 25.6 M parameters, 320 tensors, 98 MiB of float32;
(b) 1.1 G parameters, 290 tensors, 2.06 GiB of bf16; (c) 100,000 tensors of
4 KiB each, 391 MiB of bf16)."""
import contextlib
from typing import Callable, Dict

import torch
from torch import nn

KINDS = ("a", "b", "c")
SIZES = ("tiny", "small", "bench")


class ModelSpec:
    """One model at one size. ``make(meta)`` returns a new module in eval mode:
    with meta=True every parameter and persistent buffer is on the meta device
    (no weight memory) and the buffers a checkpoint does not hold (non-persistent
    ones, such as rotary frequencies) are computed on the CPU, so that binding
    the checkpoint's tensors is all that is left to do; with meta=False the
    module is on the CPU with its own initial weights. ``reference()`` is the
    module whose state_dict every peer gets, with deterministic weights."""

    def __init__(self, kind: str, size: str, title: str, build: Callable[[], nn.Module],
                 example: Callable[[], torch.Tensor], seed: int = 0,
                 after_meta: Callable[[nn.Module], None] = None,
                 output: Callable[[object], torch.Tensor] = None, hf_class=None):
        self.kind, self.size, self.title, self.seed = kind, size, title, seed
        self._build, self._example, self._after_meta = build, example, after_meta
        self._output = output or (lambda y: y)
        self.hf_class = hf_class  # set for a transformers model: from_pretrained applies

    def make(self, meta: bool) -> nn.Module:
        if meta:
            with torch.device("meta"):
                module = self._build()
            if self._after_meta:
                self._after_meta(module)
        else:
            module = self._build()
        return module.eval()

    def reference(self) -> nn.Module:
        torch.manual_seed(self.seed)
        module = self.make(meta=False)
        _make_every_value_distinct(module, self.seed)
        return module

    def example_input(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed + 1)
        return self._example(g)

    def forward(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self._output(module(x))

    def __repr__(self):
        return f"ModelSpec({self.kind!r}, {self.size!r}: {self.title})"


def spec(kind: str, size: str = "tiny") -> ModelSpec:
    if kind not in _MAKERS:
        raise ValueError(f"model kind: expected one of {', '.join(KINDS)}, found {kind!r}")
    if size not in SIZES:
        raise ValueError(f"model size: expected one of {', '.join(SIZES)}, found {size!r}")
    return _MAKERS[kind](size)


def _make_every_value_distinct(module: nn.Module, seed: int) -> None:
    """Freshly initialised models hold constant tensors (norm weights of 1,
    BatchNorm's running stats of 0 and 1, a step count of 0): a loader that
    bound the wrong tensor of the same shape would still compare equal. Add
    small deterministic noise to every constant floating tensor and a step count
    to integer buffers, keeping variances positive."""
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, t in module.state_dict().items():
            if t.is_floating_point() and t.numel() > 1 and bool((t == t.reshape(-1)[0]).all()):
                noise = torch.randn(t.shape, generator=g, dtype=torch.float32) * 0.05
                t.add_(noise.to(t.dtype))
            elif not t.is_floating_point() and t.numel() == 1:
                t.fill_(1000 + seed)


@contextlib.contextmanager
def _default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


# --- (a) ResNet-50 style --------------------------------------------------------------
def _resnet(size: str) -> ModelSpec:
    from torchvision.models.resnet import Bottleneck, ResNet

    shapes = {
        "tiny": dict(layers=[1, 1, 1, 1], width_per_group=16, num_classes=10, image=32),
        "small": dict(layers=[2, 2, 2, 2], width_per_group=32, num_classes=100, image=64),
        "bench": dict(layers=[3, 4, 6, 3], width_per_group=64, num_classes=1000, image=224),
    }[size]
    image = shapes.pop("image")

    def build():
        return ResNet(Bottleneck, **shapes)

    return ModelSpec("a", size, f"torchvision ResNet (Bottleneck {shapes['layers']}), float32",
                     build, lambda g: torch.randn(1, 3, image, image, generator=g))


# --- (b) LLaMA-style decoder ---------------------------------------------------------
_LLAMA = {
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    "small": dict(vocab_size=8000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=2),
    # Tensor-parallel slices of 1-2.75 MiB for 4 ranks (P15's small case).
    "tp-small": dict(vocab_size=8000, hidden_size=2048, intermediate_size=2816,
                     num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8),
    "bench": dict(vocab_size=32000, hidden_size=2048, intermediate_size=3584, num_hidden_layers=32,
                  num_attention_heads=16, num_key_value_heads=4),
}


def llama_config(size: str):
    import transformers

    return transformers.LlamaConfig(
        **_LLAMA[size], max_position_embeddings=256, tie_word_embeddings=True,
        dtype="bfloat16", attn_implementation="sdpa")


def _rebuild_rotary_on_cpu(module: nn.Module) -> None:
    """The rotary frequencies are non-persistent buffers computed at
    construction: no checkpoint holds them, so a module built on meta gets them
    computed on the CPU, as from_pretrained does."""
    for name, sub in list(module.named_modules()):
        if type(sub).__name__.endswith("RotaryEmbedding"):
            with torch.device("cpu"):
                fresh = type(sub)(config=sub.config)
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner), leaf, fresh)


def _llama(size: str) -> ModelSpec:
    import transformers

    config = llama_config(size)

    def build():
        # As from_pretrained(dtype=bfloat16) builds it: parameters in bf16, the
        # rotary frequencies (computed with an explicit float32) in float32.
        with _default_dtype(torch.bfloat16):
            return transformers.LlamaForCausalLM(config)

    vocab, seq = config.vocab_size, 16 if size == "tiny" else 128
    s = ModelSpec("b", size, f"transformers LlamaForCausalLM, {config.num_hidden_layers} layers, "
                  f"hidden {config.hidden_size}, tied embeddings, bf16",
                  build, lambda g: torch.randint(0, vocab, (1, seq), generator=g),
                  after_meta=_rebuild_rotary_on_cpu, output=lambda out: out.logits,
                  hf_class=transformers.LlamaForCausalLM)
    s.config = config
    return s


# --- (c) mixture of experts ----------------------------------------------------------
class Expert(nn.Module):
    """A SwiGLU expert, as in Mixtral or Qwen-MoE: three small matrices."""

    def __init__(self, dim: int, hidden: int, dtype):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(dim, hidden, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(hidden, dim, bias=False, dtype=dtype)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class MoELayer(nn.Module):
    """RMSNorm, a router, and ``experts`` experts of which each token uses ``top_k``."""

    def __init__(self, dim: int, hidden: int, experts: int, top_k: int, dtype):
        super().__init__()
        self.norm = nn.RMSNorm(dim, dtype=dtype)
        self.router = nn.Linear(dim, experts, bias=False, dtype=dtype)
        self.experts = nn.ModuleList(Expert(dim, hidden, dtype) for _ in range(experts))
        self.top_k = top_k

    def forward(self, x):
        h = self.norm(x)
        weights, chosen = self.router(h).float().softmax(-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(x)
        for token in range(x.shape[0]):
            for j in range(self.top_k):
                expert = self.experts[int(chosen[token, j])]
                out[token] += (weights[token, j] * expert(h[token]).float()).to(x.dtype)
        return x + out


class MoE(nn.Module):
    def __init__(self, layers: int, dim: int, hidden: int, experts: int, top_k: int, dtype):
        super().__init__()
        self.layers = nn.ModuleList(MoELayer(dim, hidden, experts, top_k, dtype) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def moe_shape(n_tensors: int, layers: int):
    """Experts per layer so that the model holds n_tensors tensors (each layer:
    a norm, a router and 3 per expert), or the nearest count below it."""
    experts = (n_tensors // layers - 2) // 3
    if experts < 1:
        raise ValueError(f"{n_tensors} tensors in {layers} layers: too few for one expert a layer")
    return experts, layers * (2 + 3 * experts)


def _moe(size: str) -> ModelSpec:
    # bench: a 64x32 bf16 matrix is exactly 4096 bytes, one page.
    n_tensors, layers, dim, hidden = {
        "tiny": (200, 2, 16, 8),
        "small": (10_000, 10, 64, 32),
        "bench": (100_000, 20, 64, 32),
    }[size]
    experts, count = moe_shape(n_tensors, layers)

    def build():
        return MoE(layers, dim, hidden, experts, top_k=2, dtype=torch.bfloat16)

    s = ModelSpec("c", size, f"mixture of experts, {layers} layers x {experts} experts "
                  f"({dim}x{hidden}), {count} tensors, bf16",
                  build, lambda g: torch.randn(4, dim, generator=g).to(torch.bfloat16))
    s.n_tensors = count
    return s


_MAKERS: Dict[str, Callable[[str], ModelSpec]] = {"a": _resnet, "b": _llama, "c": _moe}
