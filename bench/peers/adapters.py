"""One adapter per peer loader of issue 28, all driven the same way:

    source = Source(spec, spec.reference(), workdir)   # the tensors every peer gets
    path = adapter.prepare(source)                       # the file format the peer is built for
    module = adapter.load(path, spec.make)               # warm open + bind ("P9")

``load`` goes from the file to a module whose parameters and buffers hold the
file's tensors. Every adapter that can fill a module built elsewhere builds it
on the meta device (``meta = True``, no weight memory allocated before the load)
and binds with its own call; ``bind(path, module)`` is that step alone, for
timing it apart from the construction. transformers' from_pretrained builds its
own architecture (``builds_architecture = True``, on meta inside transformers 5).

An adapter that cannot run here says why: ``unavailable()`` returns
"not measurable here: <reason>" (package not installed, no CUDA device), and
``applies(spec)`` returns a reason when the peer does not take that model
(from_pretrained needs a transformers model). Nothing is dropped silently:
``ADAPTERS`` lists every peer, runnable or not.

Where the tensors live after a load is part of each peer's contract and is
declared in ``maps_file``: True for the peers that map the file (their tensors
are the file's pages, faulted in on first touch), False for those that read
it into memory they allocate (fastsafetensors, the Run:ai streamer: every byte
is copied during the load). ``direct_io`` marks peers that bypass the page
cache (O_DIRECT) by default; each has a "buffered" twin that uses it.
"""
import contextlib
import importlib
import importlib.metadata
import os
from typing import Callable, Dict, Iterable, List, Optional

import torch
from torch import nn

NOT_MEASURABLE = "not measurable here"


# --- the tensors every peer gets, and the files made from them -----------------------
class Source:
    """The reference module of one ModelSpec and its state_dict; ``file(fmt)``
    writes the file of format ``fmt`` into ``workdir`` once and returns its path
    (a directory for "tensordict" and "hf")."""

    def __init__(self, spec, module: nn.Module, workdir: str):
        self.spec, self.module, self.workdir = spec, module, workdir
        self.state_dict = module.state_dict()
        self._files: Dict[str, str] = {}

    def file(self, fmt: str) -> str:
        if fmt not in self._files:
            if self.state_dict is None:
                raise RuntimeError(f"{self.spec}: {fmt} was not written before release()")
            self._files[fmt] = WRITERS[fmt](self, os.path.join(self.workdir, fmt))
        return self._files[fmt]

    def release(self) -> None:
        """Drops the reference weights; the files already written stay usable."""
        self.module = self.state_dict = None


def alias_groups(state_dict: Dict[str, torch.Tensor]) -> List[List[str]]:
    """Names that are the same tensor (tied weights): same storage, offset,
    shape, strides and dtype. Each group in state_dict order."""
    groups: Dict[tuple, List[str]] = {}
    for name, t in state_dict.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        groups.setdefault(key, []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def without_aliases(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The state_dict with every tied tensor under its first name only (what
    safetensors' save_model and save_pretrained store; load re-ties)."""
    drop = {name for names in alias_groups(state_dict) for name in names[1:]}
    return {k: v for k, v in state_dict.items() if k not in drop}


def _write_tsar(source: Source, base: str) -> str:
    import tsar

    path = base + ".tsar"
    tsar.save(source.state_dict, path)  # shared storages (tied weights) are stored once
    return path


def _write_pt(source: Source, base: str) -> str:
    path = base + ".pt"
    torch.save(source.state_dict, path)  # torch 2.x zip format; tied weights share one storage
    return path


def _write_safetensors(source: Source, base: str) -> str:
    from safetensors.torch import save_model

    path = base + ".safetensors"
    # save_file refuses tensors that share memory; save_model keeps one name of
    # each tied group and records the others in the metadata.
    save_model(source.module, path)
    return path


# memmap() maps every file it writes and returns the mapped tensordict: more
# than vm.max_map_count (65530 by default) tensors at once fail with ENOMEM.
_MEMMAP_BATCH = 10_000


def _memmap_in_parts(td, prefix: str) -> None:
    """td.memmap(prefix), written subtree by subtree so that no more than
    _MEMMAP_BATCH files are mapped at a time: first this level with every
    nested tensordict empty (its meta.json and its own leaves), then each nested
    one into its directory, which rewrites that directory's meta.json. The
    result is the directory one memmap() call writes."""
    from tensordict import TensorDict, TensorDictBase

    if len(list(td.keys(include_nested=True, leaves_only=True))) <= _MEMMAP_BATCH:
        td.memmap(prefix)
        return
    children = {k: v for k, v in td.items() if isinstance(v, TensorDictBase)}
    level = TensorDict({k: (TensorDict({}, batch_size=[]) if k in children else v) for k, v in td.items()},
                       batch_size=[])
    level.memmap(prefix)
    for k, child in children.items():
        _memmap_in_parts(child, os.path.join(prefix, k))


def _tensordict_tree(source: Source):
    from tensordict import TensorDict

    # Nested as the module nests (the layout TensorDict.from_module(...)
    # .memmap() writes). TensorDict has no notion of tied tensors (it would
    # write two files): aliases dropped, re-tied at load.
    return TensorDict(without_aliases(source.state_dict), batch_size=[]).unflatten_keys(".")


def _write_tensordict(source: Source, base: str) -> str:
    # One MemoryMappedTensor file per tensor, and a meta.json per directory.
    _memmap_in_parts(_tensordict_tree(source), base)
    return base


def _write_tensordict_archive(source: Source, base: str) -> str:
    from tensordict import pack_memmap

    # The same directory packed as one uncompressed zip: tensor payloads
    # aligned to 64 bytes, one mapping of the archive when loaded (what
    # memmap("x.tdz") writes, but that maps all the files first).
    directory = source.file("tensordict")
    return str(pack_memmap(directory, base + ".tdz"))


def _write_hf(source: Source, base: str) -> str:
    import transformers

    transformers.utils.logging.disable_progress_bar()
    # One model.safetensors (tied lm_head not stored), config.json.
    source.module.save_pretrained(base)
    return base


def _write_tsar_hf(source: Source, base: str) -> str:
    import tsar

    # tsar pack of the save_pretrained directory: the weights and config.json in one file.
    path = base + ".tsar"
    tsar.pack(source.file("hf"), path)
    return path


def _write_tensorizer(source: Source, base: str) -> str:
    from tensorizer import TensorSerializer

    # As vLLM's serialize_vllm_model writes: write_module, every parameter
    # and buffer under its state_dict name with its kind (param or buffer).
    # One difference: non-persistent buffers (rotary frequencies) are left
    # out, as state_dict does (vLLM keeps the default, True): the meta-built
    # module computes them, and load_into_module would register them back as
    # persistent buffers. A tied weight is written once per module that
    # holds it (model (b)'s head: twice); the load re-ties.
    # tensorizer 2.12.1 cannot write model (c) (100,000 tensors): its tensor
    # headers hold the module's index in 16 bits (write_module fails past
    # 65,535 modules: "ushort format requires 0 <= number <= 65535"), and the
    # metadata area is a fixed 256 KiB (write_state_dict fails: "Metadata
    # overflow"). Said so, as P9's failed row, before writing anything.
    if _too_many_modules_for_tensorizer(source.module):
        raise RuntimeError(
            "tensorizer cannot write this model: module indices are 16 bits (65,535 modules at most) "
            "and its metadata area is 256 KiB (write_state_dict of 100,000 tensors: Metadata overflow)")
    path = base + ".tensors"
    serializer = TensorSerializer(path)
    serializer.write_module(source.module, include_non_persistent_buffers=False)
    serializer.close()
    return path


def _too_many_modules_for_tensorizer(module: nn.Module) -> bool:
    return sum(1 for _ in module.modules()) > 0xFFFF


WRITERS: Dict[str, Callable[[Source, str], str]] = {
    "tsar": _write_tsar, "pt": _write_pt, "safetensors": _write_safetensors,
    "tensordict": _write_tensordict, "tdz": _write_tensordict_archive, "hf": _write_hf,
    "tsar-hf": _write_tsar_hf, "tensorizer": _write_tensorizer,
}


def files_of(path: str) -> List[str]:
    """The regular files a prepared path consists of (itself, or a directory's)."""
    if os.path.isdir(path):
        return sorted(os.path.realpath(os.path.join(d, f))
                      for d, _, names in os.walk(path) for f in names)
    return [os.path.realpath(path)]


# --- binding a state_dict the way a user of each peer does -------------------------
def tie_groups(module: nn.Module) -> List[List[str]]:
    """Names under which one Parameter object appears (tied weights)."""
    groups: Dict[int, List[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def retie(module: nn.Module, groups: List[List[str]]) -> None:
    """Makes every name of each group the same Parameter object again (an
    assigning load gives each name its own Parameter)."""
    for names in groups:
        first = module.get_parameter(names[0])
        for name in names[1:]:
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner), leaf, first)


def assign_state_dict(module: nn.Module, state_dict: Dict[str, torch.Tensor]) -> nn.Module:
    """``load_state_dict(assign=True, strict=True)``, then tied weights re-tied:
    the tensors become the module's parameters and buffers without a copy. A
    tied name the file does not hold (safetensors, TensorDict) takes the tensor
    of the name it is tied to."""
    groups = tie_groups(module)
    state_dict = dict(state_dict)
    for names in groups:
        held = [n for n in names if n in state_dict]
        for name in names:
            if held and name not in state_dict:
                state_dict[name] = state_dict[held[0]]
    module.load_state_dict(state_dict, strict=True, assign=True)
    retie(module, groups)
    return module


@contextlib.contextmanager
def environment(**values: str):
    """Sets environment variables for the duration (the streaming peers read
    their I/O strategy from the environment when a load starts)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- the adapters ------------------------------------------------------------------
class Adapter:
    name = ""
    dist = ""  # the PyPI distribution whose version is reported
    module_name = ""  # what must import for the peer to run
    fmt = ""  # the Source format it reads
    calls = ""  # the exact API calls, for the report
    meta = True  # fills a module built on the meta device
    builds_architecture = False  # constructs the module itself (from_pretrained)
    maps_file = True  # tensors are mappings of the file (else copies in its own memory)
    direct_io = False  # reads with O_DIRECT, bypassing the page cache
    needs_cuda = False

    @property
    def version(self) -> str:
        try:
            return importlib.metadata.version(self.dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    def unavailable(self) -> Optional[str]:
        """None if the peer can run on this machine, else "not measurable here: why"."""
        try:
            importlib.import_module(self.module_name)
        except ImportError as e:
            return (f"{NOT_MEASURABLE}: {self.dist} is not installed ({e}; "
                    f"pip install -r scripts/requirements-peers.txt)")
        if self.needs_cuda and not torch.cuda.is_available():
            return f"{NOT_MEASURABLE}: needs a CUDA device (torch.cuda.is_available() is False)"
        return None

    def applies(self, spec) -> Optional[str]:
        """None if the peer takes this model, else why not."""
        return None

    def prepare(self, source: Source) -> str:
        return source.file(self.fmt)

    def load(self, path: str, make: Callable[[bool], nn.Module]) -> nn.Module:
        """From the file to the module: build the architecture (on meta where
        the peer allows it) and bind the file's tensors into it."""
        return self.bind(path, make(self.meta))

    def bind(self, path: str, module: nn.Module) -> nn.Module:
        """The open + bind alone, into a module built beforehand."""
        return assign_state_dict(module, self.state_dict(path))

    def state_dict(self, path: str) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def __repr__(self):
        return f"<{self.name} {self.version}>"


class Tsar(Adapter):
    name, dist, module_name, fmt = "tsar", "tsar", "tsar", "tsar"
    calls = "tsar.load_into(module, path)  # open + bind in C++; same Parameter objects, ties kept"

    @property
    def version(self) -> str:
        try:
            import tsar

            return tsar.__version__
        except ImportError:
            return "not installed"

    def unavailable(self):
        try:
            import tsar  # noqa: F401
        except ImportError as e:
            return f"{NOT_MEASURABLE}: the tsar package is not importable ({e}; PYTHONPATH=build/python)"
        return None

    def bind(self, path, module):
        import tsar

        tsar.load_into(module, path)
        return module


class TorchLoadMmap(Adapter):
    name, dist, module_name, fmt = "torch.load(mmap)", "torch", "torch", "pt"
    calls = ("sd = torch.load(path, mmap=True, weights_only=True); "
             "module.load_state_dict(sd, assign=True); re-tie")

    def state_dict(self, path):
        return torch.load(path, mmap=True, weights_only=True)


class SafetensorsLoadFile(Adapter):
    name, dist, module_name, fmt = "safetensors.load_file", "safetensors", "safetensors", "safetensors"
    calls = ("sd = safetensors.torch.load_file(path); "
             "module.load_state_dict(sd + tied names, assign=True); re-tie")

    def state_dict(self, path):
        from safetensors.torch import load_file

        return load_file(path)


class SafetensorsSafeOpen(Adapter):
    name, dist, module_name, fmt = "safetensors.safe_open", "safetensors", "safetensors", "safetensors"
    calls = ("with safe_open(path, framework='pt') as f: sd = {k: f.get_tensor(k) for k in f.keys()}; "
             "module.load_state_dict(sd + tied names, assign=True); re-tie")

    def state_dict(self, path):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}


class TensorDictMemmap(Adapter):
    name, dist, module_name, fmt = "tensordict.load_memmap", "tensordict", "tensordict", "tensordict"
    calls = ("TensorDict.load_memmap(dir).to_module(module, return_swap=False); re-tie "
             "(files mapped MAP_SHARED read-write where writable)")

    def bind(self, path, module):
        from tensordict import TensorDict

        groups = tie_groups(module)
        TensorDict.load_memmap(path).to_module(module, return_swap=False)
        retie(module, groups)  # the aliases were not written: they are still on meta
        return module


class TensorDictArchive(TensorDictMemmap):
    """The directory form maps one file per tensor: 100,000 tensors need more
    mappings than Linux allows by default (vm.max_map_count 65530), so its
    load_memmap fails with ENOMEM there. The archive form maps one file."""
    name, fmt = "tensordict.load_memmap (.tdz)", "tdz"
    calls = ("TensorDict.load_memmap(path.tdz).to_module(module, return_swap=False); re-tie "
             "(one MAP_PRIVATE mapping of the archive)")


class FromPretrained(Adapter):
    name, dist, module_name, fmt = "transformers.from_pretrained", "transformers", "transformers", "hf"
    calls = "cls.from_pretrained(dir, dtype='auto').eval()  # the file's dtype; progress bars off"
    builds_architecture = True
    meta = True  # transformers 5 builds the architecture on meta itself

    def applies(self, spec):
        if spec.hf_class is None:
            return "not applicable: from_pretrained needs a transformers model class"
        return None

    def load(self, path, make):
        import transformers

        transformers.utils.logging.disable_progress_bar()
        cls = self._class_of(path)
        return cls.from_pretrained(path, dtype="auto").eval()

    def bind(self, path, module):
        raise TypeError(f"{self.name} builds its own architecture: use load()")

    @staticmethod
    def _class_of(path):
        import json

        import transformers

        with open(os.path.join(path, "config.json")) as f:
            return getattr(transformers, json.load(f)["architectures"][0])


class TsarTransformers(Tsar):
    """tsar.transformers.load_model: from_pretrained's counterpart, the whole
    load from one archive (config, class, empty parameters, bind, eval)."""
    name, fmt = "tsar.transformers.load_model", "tsar-hf"
    calls = ("tsar.transformers.load_model(path)  # archive of tsar pack MODEL_DIR: "
             "config.json, class, tsar.empty_parameters, load_into, eval()")
    builds_architecture = True

    def unavailable(self):
        reason = super().unavailable()
        if reason is None:
            try:
                import tsar.transformers  # noqa: F401
            except ImportError as e:
                reason = f"{NOT_MEASURABLE}: {e}"
        return reason

    def applies(self, spec):
        return FromPretrained.applies(self, spec)

    def load(self, path, make):
        import tsar.transformers

        return tsar.transformers.load_model(path)

    def bind(self, path, module):
        raise TypeError(f"{self.name} builds its own architecture: use load()")


class FastSafetensors(Adapter):
    """fastsafetensors without GPUDirect Storage: pread into one host buffer per
    file (16 MiB bounce buffers, max_threads=16), then tensors are views of it.
    It opens the file with O_DIRECT on local file systems unless told
    otherwise, so a warm page cache does not help it."""
    name, dist, module_name, fmt = "fastsafetensors", "fastsafetensors", "fastsafetensors", "safetensors"
    maps_file = False
    direct_io = True
    device, nogds = "cpu", True

    @property
    def calls(self):
        env = "" if self.direct_io else "FASTSAFETENSORS_ODIRECT=0; "
        return (f"{env}with fastsafe_open([path], device='{self.device}', nogds={self.nogds}) as f: "
                "sd = {k: f.get_tensor(k) for k in f.keys()}; "
                "module.load_state_dict(sd + tied names, assign=True); re-tie")

    def _env(self):
        return {} if self.direct_io else {"FASTSAFETENSORS_ODIRECT": "0"}

    def state_dict(self, path):
        from fastsafetensors import fastsafe_open

        with environment(**self._env()):
            with fastsafe_open([path], device=self.device, nogds=self.nogds) as f:
                return {k: f.get_tensor(k) for k in f.keys()}


class FastSafetensorsBuffered(FastSafetensors):
    name = "fastsafetensors (buffered)"
    direct_io = False


class FastSafetensorsGds(FastSafetensors):
    """The GPUDirect Storage path: file to GPU memory. Measured by the issue "CUDA"."""
    name = "fastsafetensors (GDS, cuda)"
    device, nogds, needs_cuda = "cuda:0", False, True


class RunaiStreamer(Adapter):
    """Run:ai's SafetensorsStreamer to the CPU: C++ workers read the file in
    chunks (io_uring, O_DIRECT when the mount allows it, which is the default
    "auto" strategy) into buffers it hands to the caller (owned=True)."""
    name, dist, module_name, fmt = ("runai-model-streamer", "runai-model-streamer",
                                    "runai_model_streamer", "safetensors")
    maps_file = False
    direct_io = True
    device = "cpu"

    @property
    def calls(self):
        env = "" if self.direct_io else "RUNAI_STREAMER_FS_STRATEGY=io_uring_buffered; "
        return (f"{env}with SafetensorsStreamer() as s: s.stream_file(path, device='{self.device}'); "
                "sd = dict(s.get_tensors()); module.load_state_dict(sd + tied names, assign=True); re-tie")

    def _env(self):
        return {} if self.direct_io else {"RUNAI_STREAMER_FS_STRATEGY": "io_uring_buffered"}

    def state_dict(self, path):
        from runai_model_streamer import SafetensorsStreamer

        with environment(**self._env()):
            with SafetensorsStreamer() as streamer:
                streamer.stream_file(path, device=self.device)
                return dict(streamer.get_tensors())


class RunaiStreamerBuffered(RunaiStreamer):
    name = "runai-model-streamer (buffered)"
    direct_io = False


class RunaiStreamerCuda(RunaiStreamer):
    """Streaming to a GPU. Measured by the issue "CUDA"."""
    name = "runai-model-streamer (cuda)"
    device, needs_cuda = "cuda:0", True


class Tensorizer(Adapter):
    """CoreWeave's tensorizer (the format of vLLM's ``--load-format
    tensorizer``), the way vLLM loads it: the module built without weights
    (here on meta), then ``load_into_module``. Eager (``lazy_load=False``, the
    default): the constructor reads every tensor with 8 reader threads for a
    local file (``num_readers=None``), each into a buffer it allocates per
    tensor (plain buffered ``readinto``, no mapping); ``load_into_module`` then
    ``register_parameter``/``register_buffer``s them, so the meta module's
    tensors are replaced by name. Every tensor comes back as an
    ``nn.Parameter`` (buffers too, with requires_grad on floating ones:
    tensorizer's ``_to_torch_parameter``); ties are re-tied after, as for the
    other peers whose files hold no ties."""
    name, dist, module_name, fmt = "tensorizer", "tensorizer", "tensorizer", "tensorizer"
    maps_file = False
    device = "cpu"

    @property
    def calls(self):
        return (f"with TensorDeserializer(path, device='{self.device}') as d: d.load_into_module(module); "
                "re-tie  # file: TensorSerializer(path).write_module(m, include_non_persistent_buffers=False)")

    def bind(self, path, module):
        from tensorizer import TensorDeserializer

        groups = tie_groups(module)
        with TensorDeserializer(path, device=self.device) as deserializer:
            deserializer.load_into_module(module)
        retie(module, groups)
        return module


class TensorizerCuda(Tensorizer):
    """tensorizer straight to a GPU: each reader thread reads its tensors one
    by one into a pinned buffer the size of its largest and copies each on a
    CUDA stream of its own. Measured by P8 (p8_gpu.py), on a file written from
    a state_dict."""
    name = "tensorizer (cuda)"
    device, needs_cuda = "cuda:0", True


class TsarPortable(Tsar):
    """tsar's portable path (tsar/_portable.py: no LibTorch, any torch of the
    range): what a process runs when its torch is not the one the package's
    accelerator was built for."""
    name = "tsar (portable)"
    calls = ("tsar.load_into(module, path)  # the portable path (TSAR_PORTABLE=1, or another "
             "torch): the bind in C++ over the Python C API, tensors through DLPack")

    def bind(self, path, module):
        import tsar
        from tsar import _backend

        accelerator, _backend.accelerator = _backend.accelerator, None
        try:
            tsar.load_into(module, path)
        finally:
            _backend.accelerator = accelerator
        return module


ADAPTERS: List[Adapter] = [
    Tsar(), TsarPortable(), TorchLoadMmap(), SafetensorsLoadFile(), SafetensorsSafeOpen(), TensorDictMemmap(),
    TensorDictArchive(), FromPretrained(), TsarTransformers(), FastSafetensors(), FastSafetensorsBuffered(), RunaiStreamer(),
    RunaiStreamerBuffered(), Tensorizer(), FastSafetensorsGds(), RunaiStreamerCuda(), TensorizerCuda(),
]


class TsarWillneed(Tsar):
    """tsar with the whole file read at open by a thread of its own
    (prefetch="willneed": MADV_POPULATE_READ, loader/read_ahead.h), while the
    forward faults pages in order. An experiment (p13_prefetch.py), not a peer."""
    name = "tsar (prefetch=willneed)"
    calls = 'tsar.load_into(module, tsar.open(path, prefetch="willneed"))'

    def bind(self, path, module):
        import tsar

        tsar.load_into(module, tsar.open(path, prefetch="willneed"))
        return module


# Variants of tsar's own options that experiments name; not in the report's tables.
VARIANTS: List[Adapter] = [TsarWillneed()]


def by_name(names: Iterable[str] = ()) -> List[Adapter]:
    """The adapters named (all of ADAPTERS for none), in ADAPTERS order, then VARIANTS'."""
    names = list(names)
    known = {a.name: a for a in ADAPTERS + VARIANTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"peer: expected one of {', '.join(known)}, found {', '.join(unknown)}")
    if not names:
        return list(ADAPTERS)
    return [a for a in ADAPTERS + VARIANTS if a.name in names]


# --- where a loaded module's tensors live ------------------------------------------
def file_mappings(paths: Iterable[str]) -> List[tuple]:
    """(start, end, perms, path) of this process's mappings of the given files."""
    wanted = {os.path.realpath(p) for p in paths}
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].rstrip("\n") in wanted:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                out.append((start, end, fields[1], fields[5].rstrip("\n")))
    return out


def tensors_in_files(module: nn.Module, paths: Iterable[str]) -> Dict[str, bool]:
    """{state_dict name: whether its bytes lie inside a mapping of the files};
    empty tensors count as inside."""
    maps = file_mappings(paths)
    return {name: t.numel() == 0 or any(a <= t.data_ptr() < b for a, b, _, _ in maps)
            for name, t in module.state_dict().items()}


def touch_every_page(module: nn.Module, page: int = 4096) -> int:
    """Reads one byte of every page of every tensor (faults a mapped file in);
    returns a checksum of the bytes read so the reads cannot be skipped."""
    total = 0
    seen = set()
    for t in module.state_dict().values():
        if t.numel() == 0 or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        flat = t.detach().reshape(-1)
        if flat.dtype == torch.bool:
            flat = flat.view(torch.uint8)
        total += int(flat.view(torch.uint8)[::page].sum())
    return total
