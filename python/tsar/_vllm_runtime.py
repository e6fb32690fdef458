"""Runtime-layout archives for vLLM (issue 59, item 2): vLLM's own parameters,
bound in place, so that replicas share one copy of the weights.

A plain archive (``tsar pack MODEL_DIR``) holds the checkpoint's tensors:
vLLM copies them into its own parameters (fused qkv and gate/up, narrowed for
the tensor-parallel rank), and each replica holds a copy. A **runtime-layout
archive** holds what those parameters are after vLLM's ``load_weights`` and
before ``process_weights_after_loading``: vLLM's names, fused layout and
dtype, one entry per tensor-parallel rank (``rank0``, ``rank1``...), and a
**stamp**, the archive-level string metadata ``vllm.runtime``: JSON of the
vLLM version, architectures, dtype, quantization and tensor-parallel size it
was made with. ``tsar-vllm pack MODEL_DIR -o OUT`` (:mod:`tsar._vllm_cli`)
makes one: it starts vLLM once with the load format ``tsar_pack``
(:func:`pack_loader_class`), whose ranks load the directory as vLLM does and each
save their parameters, and then writes the entries, the stamp and the
directory's config and tokenizer files (attached, spec §4.7.1) into one
archive.

The load format ``tsar`` (:mod:`tsar.vllm`) binds such an archive
(:func:`load_model`): it checks the stamp against the running vLLM before
anything is built, builds the model with ``tsar.empty_parameters()``, binds
its rank's entry with ``tsar.load_into`` over a copy-on-write mapping (vLLM
writes a few buffers, attention's scales, while it processes the weights:
those pages become private, every other page stays the page cache's, shared
by every replica), and runs vLLM's ``process_weights_after_loading``. On the
CPU that step would repack every linear weight (and the LM head) into oneDNN
handles, private copies; by default the loader asks vLLM's own per-layer
switch (``_cpu_skip_gemm_dispatch``) to keep the weights as they are and use
``torch.nn.functional.linear``; ``"repack": True`` in
``model_loader_extra_config`` keeps vLLM's repack (faster matmuls, one copy
per replica).
"""
from __future__ import annotations

import json
import os
from typing import Optional

import torch

from ._errors import Error, ErrorCode

STAMP_KEY = "vllm.runtime"
STAMP_FORMAT = "tsar-vllm-runtime/1"
PACK_FORMAT = "tsar_pack"  # the load format the pack command starts vLLM with
# What must equal between the stamp and the running vLLM (the version apart:
# see version_match).
_CHECKED = ("architectures", "dtype", "quantization", "tensor_parallel_size")
VERSION_MATCHES = ("exact", "release", "any")


def _error(path, code, message) -> Error:
    return Error(f"{path}: {message}", code, str(path))


def entry_name(rank: int) -> str:
    return f"rank{rank}"


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def stamp_of(vllm_config) -> dict:
    """The stamp of a runtime-layout archive made by this vLLM with ``vllm_config``."""
    import vllm

    mc = vllm_config.model_config
    pc = vllm_config.parallel_config
    return {
        "format": STAMP_FORMAT,
        "vllm_version": vllm.__version__,
        "architectures": list(getattr(mc.hf_config, "architectures", None) or []),
        "dtype": _dtype_name(mc.dtype),
        "quantization": mc.quantization,
        "tensor_parallel_size": int(pc.tensor_parallel_size),
        "torch_version": torch.__version__.split("+")[0],
    }


def read_stamp(archive) -> Optional[dict]:
    """The archive's stamp (a dict), None for a plain archive; BAD_INPUT for a
    stamp that is not a JSON object of this format."""
    value = archive.metadata().get(STAMP_KEY)
    if value is None:
        return None
    path = archive.path
    if not isinstance(value, str):
        raise _error(path, ErrorCode.BAD_INPUT,
                     f"metadata {STAMP_KEY!r}: expected a string (JSON), found "
                     f"{type(value).__name__}")
    try:
        stamp = json.loads(value)
    except ValueError as e:
        raise _error(path, ErrorCode.BAD_INPUT,
                     f"metadata {STAMP_KEY!r}: expected JSON, found {value[:80]!r} ({e})") from None
    if not isinstance(stamp, dict) or stamp.get("format") != STAMP_FORMAT:
        raise _error(path, ErrorCode.BAD_INPUT,
                     f"metadata {STAMP_KEY!r}: expected a JSON object with \"format\": "
                     f"{STAMP_FORMAT!r}, found {value[:120]!r}")
    return stamp


def _release(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def check_stamp(path, stamp: dict, vllm_config, version_match: str = "exact") -> None:
    """BIND_MISMATCH listing every field where the archive's stamp differs from
    what the running vLLM would make (``stamp_of``); the vLLM version compared
    as ``version_match`` says: "exact", "release" (major.minor) or "any"."""
    if version_match not in VERSION_MATCHES:
        raise ValueError(f"load_format='tsar': version_match: expected one of "
                         f"{list(VERSION_MATCHES)}, found {version_match!r}")
    mine = stamp_of(vllm_config)
    diffs = [f"{key}: archive {stamp.get(key)!r}, this vLLM {mine[key]!r}"
             for key in _CHECKED if stamp.get(key) != mine[key]]
    theirs = str(stamp.get("vllm_version"))
    if (version_match == "exact" and theirs != mine["vllm_version"]) or (
            version_match == "release" and _release(theirs) != _release(mine["vllm_version"])):
        diffs.append(f"vllm_version: archive {theirs!r}, this vLLM {mine['vllm_version']!r} "
                     f"(compared {version_match}; model_loader_extra_config "
                     f"{{'version_match': 'release'}} or 'any' relaxes it)")
    if diffs:
        raise _error(path, ErrorCode.BIND_MISMATCH,
                     "a runtime-layout archive made for another vLLM set-up (remake it with "
                     "tsar-vllm pack, or load the plain archive): " + "; ".join(diffs))


def _rank_and_world():
    from vllm.distributed import (get_tensor_model_parallel_rank,
                                  get_tensor_model_parallel_world_size)

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


def _keep_weights_unpacked(model) -> int:
    """Asks vLLM to keep each unquantized linear weight and LM head as it is
    (``torch.nn.functional.linear`` on it) instead of repacking it into a
    private oneDNN handle on the CPU. Linear layers through vLLM's own
    per-layer switch ``_cpu_skip_gemm_dispatch``; embeddings and the LM head,
    which have no switch, through a method of the same class that sets the
    same function. Returns how many layers."""
    import torch.nn.functional as F
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    class _UnpackedEmbeddingMethod(UnquantizedEmbeddingMethod):
        def process_weights_after_loading(self, layer) -> None:
            layer.cpu_linear = F.linear

    count = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if type(method) is UnquantizedLinearMethod:
            module._cpu_skip_gemm_dispatch = True
            count += 1
        elif type(method) is UnquantizedEmbeddingMethod:
            module.quant_method = _UnpackedEmbeddingMethod()
            count += 1
    return count


def load_model(loader, archive, vllm_config, model_config, prefix: str, repack: bool, logger):
    """The model, its rank's entry of the runtime-layout ``archive`` (whose
    stamp the loader has checked against ``vllm_config``: check_stamp) bound
    in place, processed as vLLM processes loaded weights. Refused before
    anything is built: no entry for this rank, a device other than the CPU."""
    import time

    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    from ._bind import load_into
    from ._empty import empty_parameters

    path = archive.path
    device = torch.device(vllm_config.load_config.device or vllm_config.device_config.device)
    if device.type != "cpu":
        raise _error(path, ErrorCode.UNSUPPORTED,
                     f"a runtime-layout archive binds on the CPU only, not {device}: load the "
                     "plain archive (tsar pack MODEL_DIR) there")
    rank, world = _rank_and_world()
    entry = entry_name(rank)
    if entry not in archive.entries:
        raise _error(path, ErrorCode.NOT_FOUND,
                     f"entry {entry!r} (tensor-parallel rank {rank} of {world}): expected one "
                     f"of {list(archive.entries)}")
    start = time.perf_counter()
    with set_default_torch_dtype(model_config.dtype), device, empty_parameters():
        model = loader.create_model(vllm_config=vllm_config, model_config=model_config,
                                    prefix=prefix)
    built = time.perf_counter()
    report = load_into(model, archive, entry=entry, strict=True)
    bound = time.perf_counter()
    unpacked = 0 if repack else _keep_weights_unpacked(model)
    process_weights_after_loading(model, model_config, device)
    logger.info("tsar: %s entry %s: model built in %.3f s, %d tensors bound in %.3f s, "
                "processed in %.3f s (%s)", path, entry, built - start,
                len(report.bound), bound - built, time.perf_counter() - bound,
                f"{unpacked} layers kept unpacked, shared" if not repack else
                "repacked by vLLM: a private copy")
    return model.eval()


def pack_loader_class():
    """The loader class of ``load_format="tsar_pack"`` (made here: it
    subclasses vLLM's default loader, which needs vLLM imported)."""
    import dataclasses

    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from ._save import save

    class TsarPackLoader(DefaultModelLoader):
        """``load_format="tsar_pack"``: what ``tsar-vllm pack`` starts vLLM
        with. Loads the model directory as the default loader does, then each
        rank saves its parameters and buffers, before vLLM processes them, to
        ``<parts>/rank<R>.tsar`` (``model_loader_extra_config={"parts": DIR}``)."""

        def __init__(self, load_config):
            extra = dict(load_config.model_loader_extra_config or {})
            parts = extra.pop("parts", None)
            if not parts:
                raise ValueError("load_format='tsar_pack' is tsar-vllm pack's: "
                                 "model_loader_extra_config needs 'parts' (a directory)")
            self._parts = os.fspath(parts)
            super().__init__(dataclasses.replace(load_config, load_format="auto",
                                                 model_loader_extra_config=extra))

        def load_weights(self, model, model_config) -> None:
            super().load_weights(model, model_config)
            rank, _ = _rank_and_world()
            name = entry_name(rank)
            save(model, os.path.join(self._parts, f"{name}.tsar"), entry=name)

    TsarPackLoader.__qualname__ = TsarPackLoader.__name__
    return TsarPackLoader
