"""tsar.vllm: vLLM loads a model from a tsar archive (issue 59; docs/vllm.md).

``pip install tsar`` into a vLLM environment declares the entry point
``tsar = "tsar.vllm:register"`` in the group ``vllm.general_plugins``, which
vLLM runs in every one of its processes (the front end, the engine core and
each worker, where the model is loaded). :func:`register` adds:

- the load format ``"tsar"`` (:class:`TsarModelLoader`): the weights come from
  the archive, fed to the model's own ``load_weights`` as from safetensors;
- the config format ``"tsar"``: the model's config from the ``config.json``
  attached to the archive;
- the tokenizer mode ``"tsar"``: the tokenizer from the attached tokenizer
  files (:func:`tsar.transformers.load_tokenizer`: transformers' own classes
  only, nothing from the archive runs).

With tsar installed, a directory that transformers' ``save_pretrained``
wrote and its archive (``tsar pack MODEL_DIR -o model.tsar``) run as::

    LLM(model=MODEL_DIR, load_format="tsar",
        model_loader_extra_config={"archive": "model.tsar"})

``LLM(model="model.tsar", load_format="tsar", config_format="tsar",
tokenizer_mode="tsar")``, the archive alone, does not start in vLLM 0.32.0:
its ``EngineArgs.create_engine_config`` reads ``config.json`` from ``model``
(``maybe_override_with_speculators``) before any config format is asked. With
that probe skipped by hand it ran, tokens equal; tsar does not patch vLLM.

Before any weight is loaded the archive is checked: it opens (a file that is
not an archive, or whose header is damaged, is refused by tsar.open), every
storage's checksum holds (``"verify": False`` in ``model_loader_extra_config``
skips that read of the whole file), it has a ``config.json`` attached, and its
``architectures`` and the shape fields of its config equal those of the
config vLLM runs. Each is a :class:`tsar.Error` naming the archive.

A plain archive's weights are copied into vLLM's own parameters (vLLM fuses
qkv and gate/up and narrows for the tensor-parallel rank in each parameter's
``weight_loader``): replicas do not share them. A **runtime-layout archive**
(``tsar-vllm pack MODEL_DIR -o OUT``: vLLM's own parameters, one entry per
rank, stamped with the vLLM set-up that made it) is bound in place instead, so
every replica on a host shares one copy: :mod:`tsar._vllm_runtime`.
``model_loader_extra_config`` for those: ``repack`` (default False: the CPU
keeps the weights where they are mapped instead of repacking them into
private oneDNN handles) and ``version_match`` ("exact", the default,
"release" or "any": how the stamp's vLLM version must match the running one).

Needs vLLM (``import tsar`` never imports this module).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time

import torch.nn as nn

from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.transformers_utils.config import register_config_parser
from vllm.transformers_utils.config_parser_base import ConfigParserBase

from . import _archive, _vllm_runtime
from ._errors import Error, ErrorCode

__all__ = ["register", "engine_args", "TsarModelLoader", "TsarConfigParser", "TsarTokenizer"]

NAME = "tsar"
_EXTRA_KEYS = ("archive", "entry", "verify", "repack", "version_match")
# Config fields that fix the shapes of the weights: an archive whose config
# differs in one of them holds another model than the one vLLM builds.
_SHAPE_FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                 "tie_word_embeddings")

logger = logging.getLogger("vllm.tsar")
_registered = False


def register() -> None:
    """The ``vllm.general_plugins`` entry point: registers the load format,
    config format and tokenizer mode ``"tsar"``, and the load format
    ``"tsar_pack"`` that ``tsar-vllm pack`` runs. Safe to call more than once."""
    global _registered
    if _registered:
        return
    _registered = True
    register_model_loader(NAME)(TsarModelLoader)
    register_model_loader(_vllm_runtime.PACK_FORMAT)(_vllm_runtime.pack_loader_class())
    register_config_parser(NAME)(TsarConfigParser)
    from vllm.tokenizers.registry import TokenizerRegistry

    TokenizerRegistry.register(NAME, __name__, "TsarTokenizer")
    # A tokenizer mode also names the renderer (chat templates, prompts): the
    # tokenizer is a Hugging Face one, so vLLM's HF renderer.
    from vllm.renderers.registry import RENDERER_REGISTRY

    RENDERER_REGISTRY.register(NAME, "vllm.renderers.hf", "HfRenderer")


def engine_args(archive, **kwargs) -> dict:
    """Keyword arguments of ``vllm.LLM`` (or ``EngineArgs``) that run the
    archive alone: ``model`` is a directory of its attached config and
    tokenizer files (:func:`tsar._vllm_cli.model_dir`, made once, cached),
    ``load_format="tsar"`` reads the weights from the archive. ``kwargs`` are
    vLLM's others; a ``model_loader_extra_config`` of theirs is merged::

        llm = LLM(**tsar.vllm.engine_args("model.vllm.tsar", max_model_len=4096))
    """
    from ._vllm_cli import model_dir

    if kwargs.get("trust_remote_code"):
        raise _error(archive, ErrorCode.INVALID_ARGUMENT,
                     "trust_remote_code: expected False, found True: tsar never runs code "
                     "from an archive")
    extra = dict(kwargs.pop("model_loader_extra_config", None) or {})
    extra["archive"] = os.path.abspath(os.fspath(archive))
    return dict(kwargs, model=model_dir(archive), load_format=NAME,
                model_loader_extra_config=extra)


def _error(path, code, message) -> Error:
    return Error(f"{path}: {message}", code, str(path))


def _archive_config(archive) -> dict:
    from ._transformers_archive import _config_dict  # needs transformers: vLLM has it

    return _config_dict(archive)


def _text_config(cfg: dict) -> dict:
    sub = cfg.get("text_config")
    return sub if isinstance(sub, dict) else cfg


class TsarConfigParser(ConfigParserBase):
    """``config_format="tsar"``: vLLM's config from the archive's attached
    ``config.json``, parsed by vLLM's own HF parser (its model-type registry
    included) from a private temporary directory holding that one file,
    without its ``auto_map`` and with ``trust_remote_code`` False."""

    def parse(self, model, trust_remote_code: bool, revision=None, code_revision=None,
              **kwargs):
        from vllm.transformers_utils.config import HFConfigParser

        if trust_remote_code or kwargs.get("trust_remote_code"):
            raise _error(model, ErrorCode.INVALID_ARGUMENT,
                         "trust_remote_code: expected False, found True: tsar never runs "
                         "code from an archive")
        path = os.fspath(model)
        if os.path.isdir(path):  # model=DIR: the directory's own config.json
            return HFConfigParser().parse(model, False, revision, code_revision, **kwargs)
        archive = _archive.open(path)
        try:
            cfg = _archive_config(archive)
        finally:
            archive.close()
        if "auto_map" in cfg:
            logger.warning("%s: config.json: auto_map ignored: tsar never runs code from an "
                           "archive", path)
            cfg = {k: v for k, v in cfg.items() if k != "auto_map"}
        directory = tempfile.mkdtemp(prefix="tsar-vllm-config-")
        try:
            with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
                json.dump(cfg, f)
            kwargs.pop("trust_remote_code", None)
            config_dict, config = HFConfigParser().parse(directory, False, None, None,
                                                         **kwargs)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        config.name_or_path = path
        return config_dict, config


class TsarTokenizer:
    """``tokenizer_mode="tsar"``: the tokenizer stored with the model
    (:func:`tsar.transformers.load_tokenizer`), cached as vLLM caches its
    Hugging Face tokenizers."""

    @classmethod
    def from_pretrained(cls, path_or_repo_id, *args, trust_remote_code: bool = False,
                        revision=None, download_dir=None, **kwargs):
        import tsar.transformers
        from vllm.tokenizers.hf import get_cached_tokenizer

        if trust_remote_code:
            raise _error(path_or_repo_id, ErrorCode.INVALID_ARGUMENT,
                         "trust_remote_code: expected False, found True: tsar never runs "
                         "code from an archive")
        if args:
            raise _error(path_or_repo_id, ErrorCode.INVALID_ARGUMENT,
                         f"tokenizer_mode='tsar': unexpected positional arguments {args!r}")
        kwargs.pop("mistral_format", None)
        kwargs.pop("config", None)  # vLLM's config of the path: built from the archive here
        path = os.fspath(path_or_repo_id)
        if os.path.isdir(path):
            raise _error(path, ErrorCode.INVALID_ARGUMENT,
                         "tokenizer_mode='tsar': expected a .tsar archive, found a directory "
                         "(use the default tokenizer_mode for a model directory)")
        tokenizer = tsar.transformers.load_tokenizer(path, **kwargs)
        return get_cached_tokenizer(tokenizer)


class TsarModelLoader(BaseModelLoader):
    """``load_format="tsar"``: the weights of a tsar archive, checked before
    any is loaded, then fed to the model's ``load_weights`` as safetensors'
    are, or, for a runtime-layout archive, bound in place
    (:func:`tsar._vllm_runtime.load_model`). ``model_loader_extra_config``:
    ``archive`` (the archive's path; by default vLLM's ``model``), ``entry``
    (a plain archive's; default: its first), ``verify`` (default True: every
    checksum before loading), ``repack`` and ``version_match`` (runtime
    layout only)."""

    def __init__(self, load_config):
        super().__init__(load_config)
        extra = dict(load_config.model_loader_extra_config or {})
        unknown = sorted(set(extra) - set(_EXTRA_KEYS))
        if unknown:
            raise ValueError(f"load_format='tsar': model_loader_extra_config: unexpected keys "
                             f"{unknown}; expected some of {list(_EXTRA_KEYS)}")
        self._path = extra.get("archive")
        self._entry = extra.get("entry")
        self._verify = bool(extra.get("verify", True))
        self._repack = bool(extra.get("repack", False))
        self._checked = None  # the archive load_model opened and checked
        self._version_match = str(extra.get("version_match", "exact"))
        if self._version_match not in _vllm_runtime.VERSION_MATCHES:
            raise ValueError(f"load_format='tsar': model_loader_extra_config: version_match: "
                             f"expected one of {list(_vllm_runtime.VERSION_MATCHES)}, found "
                             f"{self._version_match!r}")

    def _archive_path(self, model_config) -> str:
        path = os.fspath(self._path) if self._path is not None else os.fspath(model_config.model)
        if os.path.isdir(path):
            raise _error(path, ErrorCode.INVALID_ARGUMENT,
                         "load_format='tsar': expected a .tsar archive, found a directory: pass "
                         "the archive as model_loader_extra_config={'archive': 'model.tsar'} "
                         "(or run it alone: tsar.vllm.engine_args, tsar-vllm serve)")
        return path

    def _open_checked(self, model_config, vllm_config=None):
        """The archive, opened, matched against vLLM's config, then verified,
        and its runtime-layout stamp (None for a plain archive), checked
        against ``vllm_config`` where given; tsar.Error before any weight is
        loaded where anything differs."""
        path = self._archive_path(model_config)
        # Copy-on-write: a runtime-layout archive's buffers are written while
        # vLLM processes them (private pages); unwritten pages stay shared.
        archive = _archive.open(path, mode="copy_on_write")
        try:
            entries = list(archive.entries)
            if self._entry is not None and self._entry not in entries:
                raise _error(path, ErrorCode.NOT_FOUND,
                             f"entry {self._entry!r}: expected one of {entries}")
            cfg = _archive_config(archive)  # NOT_FOUND: not packed from a model directory
            self._match(path, cfg, model_config)
            stamp = _vllm_runtime.read_stamp(archive)
            if stamp is not None and self._entry is not None:
                raise _error(path, ErrorCode.INVALID_ARGUMENT,
                             "model_loader_extra_config 'entry': a runtime-layout archive "
                             "binds each tensor-parallel rank's own entry; leave it out")
            if stamp is not None and vllm_config is not None:  # before reading the whole file
                _vllm_runtime.check_stamp(path, stamp, vllm_config, self._version_match)
            if self._verify:
                archive.verify()  # CHECKSUM_MISMATCH naming the damaged tensors
        except BaseException:
            archive.close()
            raise
        return archive, stamp

    @staticmethod
    def _match(path, cfg: dict, model_config) -> None:
        hf = model_config.hf_config
        want = list(getattr(hf, "architectures", None) or [])
        have = cfg.get("architectures")
        if want and have is not None and list(have) != want:
            raise _error(path, ErrorCode.BIND_MISMATCH,
                         f"config.json: architectures: expected {want} (the model vLLM runs), "
                         f"found {have}")
        text_cfg = _text_config(cfg)
        hf_text = model_config.hf_text_config
        diffs = []
        for key in _SHAPE_FIELDS:
            if key not in text_cfg or not hasattr(hf_text, key):
                continue
            mine, theirs = text_cfg[key], getattr(hf_text, key)
            if mine is not None and theirs is not None and mine != theirs:
                diffs.append(f"{key}: expected {theirs!r}, found {mine!r}")
        if diffs:
            raise _error(path, ErrorCode.BIND_MISMATCH,
                         "config.json: not the model vLLM runs (" + "; ".join(diffs) + ")")

    def download_model(self, model_config) -> None:
        self._open_checked(model_config)[0].close()

    def load_model(self, vllm_config, model_config, prefix: str = ""):
        """A plain archive: vLLM's own load_model (build, then load_weights
        copies). A runtime-layout archive: bound in place."""
        archive, stamp = self._open_checked(model_config, vllm_config)
        if stamp is None:
            self._checked = archive  # load_weights takes it: one verify, not two
            try:
                return super().load_model(vllm_config, model_config, prefix)
            finally:
                if self._checked is not None:
                    self._checked.close()
                    self._checked = None
        try:  # the archive stays open: the model's weights are its mapping
            return _vllm_runtime.load_model(self, archive, vllm_config, model_config, prefix,
                                            self._repack, logger)
        except BaseException:
            archive.close()
            raise

    def load_weights(self, model: nn.Module, model_config) -> None:
        start = time.perf_counter()
        archive, stamp, self._checked = self._checked, None, None
        if archive is None:  # called without load_model (a reload)
            archive, stamp = self._open_checked(model_config)
        path = archive.path
        checked = time.perf_counter()
        try:
            if stamp is not None:
                raise _error(path, ErrorCode.UNSUPPORTED,
                             "a runtime-layout archive holds vLLM's processed names and "
                             "layout: it is bound when the model is loaded, not fed to "
                             "load_weights")
            weights = archive.state_dict(self._entry)
            loaded = model.load_weights(weights.items())
        finally:
            archive.close()
        logger.info("tsar: checking %s took %.2f seconds, loading its weights %.2f seconds",
                    path, checked - start, time.perf_counter() - checked)
        if loaded is not None and model_config.quantization is None:
            missing = {n for n, _ in model.named_parameters()} - set(loaded)
            if missing:
                raise _error(path, ErrorCode.BIND_MISMATCH,
                             f"weights the archive did not provide: {sorted(missing)[:20]}")
