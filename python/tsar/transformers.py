"""tsar.transformers: a transformers model, and its tokenizer, from one archive.

Pack the directory ``save_pretrained`` wrote (``tsar pack MODEL_DIR -o
model.tsar``, or ``tsar.pack(MODEL_DIR, "model.tsar")``): the weights, and
``config.json``, ``generation_config.json`` and the tokenizer files attached
byte for byte (spec/FORMAT.md §4.7.1). Then, in every worker::

    import tsar.transformers
    model = tsar.transformers.load_model("model.tsar")       # zero copy, eval()
    tokenizer = tsar.transformers.load_tokenizer("model.tsar")

The weights are views of the archive's mapping, shared by every process that
maps it. Nothing is read from the network or from the model directory.

Needs ``transformers`` (``import tsar`` itself never imports it).
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import tempfile
from typing import Any, Dict, Optional

try:
    import transformers as _tf
except ImportError as _e:  # also when sys.modules["transformers"] is None
    raise ImportError(
        "tsar.transformers needs the transformers package: pip install transformers "
        f"({_e})") from _e

import torch

from . import _archive
from ._errors import Error, ErrorCode

__all__ = ["load_config", "load_model", "load_tokenizer"]


def _error(code, archive, message):
    return Error(f"{archive.path}: {message}", code, archive.path)


def _as_archive(path):
    """(archive, whether this call opened it)."""
    if isinstance(path, _archive.Archive):
        return path, False
    return _archive.open(path), True


def _files(archive) -> Dict[str, bytes]:
    files = archive.files()
    if "config.json" not in files:
        names = ", ".join(sorted(files)) or "none"
        raise _error(ErrorCode.NOT_FOUND, archive,
                     f"config.json: expected an attached file (an archive packed "
                     f"from a transformers save_pretrained directory: tsar pack MODEL_DIR -o "
                     f"ARCHIVE.tsar), found attached files: {names}")
    return files


def _config_of(archive, files):
    try:
        cfg = json.loads(files["config.json"].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _error(ErrorCode.BAD_INPUT, archive,
                     f"file config.json: expected JSON, found {e}") from None
    if not isinstance(cfg, dict):
        raise _error(ErrorCode.BAD_INPUT, archive, f"file config.json: expected a JSON "
                                                 f"object, found {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise _error(ErrorCode.UNSUPPORTED, archive,
                     f"file config.json: model_type: expected a model type this "
                     f"transformers {_tf.__version__} knows, found {model_type!r} (a model with "
                     f"custom code, or a newer transformers)")
    # As from_pretrained builds it, from the stored dict: no hub, no files.
    config = CONFIG_MAPPING[model_type].from_dict(cfg)
    config._name_or_path = archive.path  # where from_pretrained names its directory
    return config, cfg


def load_config(path):
    """The model's ``PretrainedConfig``, from the ``config.json`` attached to
    the archive at ``path`` (a path or a :class:`tsar.Archive`).

    Raises tsar.Error: NOT_FOUND (no config.json attached), BAD_INPUT (not a
    JSON object), UNSUPPORTED (a model_type this transformers does not know).
    """
    archive, opened = _as_archive(path)
    try:
        return _config_of(archive, _files(archive))[0]
    finally:
        if opened:
            archive.close()


def _model_class(archive, config, cfg):
    archs = cfg.get("architectures") or []
    if archs:
        cls = getattr(_tf, str(archs[0]), None)
        if isinstance(cls, type) and issubclass(cls, _tf.PreTrainedModel):
            return cls
        raise _error(ErrorCode.UNSUPPORTED, archive,
                     f"file config.json: architectures: expected a model class "
                     f"of transformers {_tf.__version__}, found {archs[0]!r} (a model with custom "
                     f"code?); pass model_class=")
    mapping = _tf.AutoModel._model_mapping
    if type(config) not in mapping:
        raise _error(ErrorCode.UNSUPPORTED, archive,
                     f"file config.json: no architectures, and AutoModel has no "
                     f"class for {type(config).__name__}; pass model_class=")
    return mapping[type(config)]


def _stored_dtype(archive, entry):
    """The floating dtype most of the archive's floating tensors have (None
    without any): the dtype the model is built in, so its parameters match."""
    counts = collections.Counter(i.dtype for i in archive.infos()
                                 if (entry is None or i.entry == entry) and i.dtype.is_floating_point)
    return counts.most_common(1)[0][0] if counts else None


def load_model(path, *, device=None, dtype=None, model_class=None, **load_into_kwargs):
    """The model the archive at ``path`` holds, ready for inference.

    ``path`` is an archive packed from a directory that transformers'
    ``save_pretrained`` wrote (``tsar pack MODEL_DIR -o model.tsar``), or an
    open :class:`tsar.Archive`. The class comes from the attached
    ``config.json``: its ``architectures[0]`` (``model_class=`` overrides it,
    e.g. ``transformers.AutoModel`` for the base model; without
    ``architectures``, AutoModel's class for the config). The model is built
    under :func:`tsar.empty_parameters` (parameters on meta, so no weight
    memory is allocated; buffers computed; the constructor's ties kept), in
    the dtype of the archive's floating-point tensors, then bound by
    :func:`tsar.load_into` (strict by default; tied weights such as
    ``lm_head.weight`` count as bound), given the attached
    ``generation_config.json`` where the model generates, and put in
    ``eval()`` mode. Its logits are bit-exact with
    ``from_pretrained(MODEL_DIR)`` of the same directory on the CPU.

    ``device=None``: the weights are zero-copy, read-only views of the mapping
    (every process mapping the archive shares them; never train them in
    place). ``device="cuda:0"``: copied once to that GPU (see load_into).
    ``dtype``: a torch dtype other than the stored one converts the weights,
    which makes a private copy of every converted tensor (no longer shared,
    no longer zero copy); the stored dtype (or None) keeps them zero copy.
    Other keyword arguments go to :func:`tsar.load_into` (``strict``,
    ``entry``, ``read_ahead``...).

    Raises tsar.Error: NOT_FOUND (no config.json attached: not packed from a
    model directory), BAD_INPUT, UNSUPPORTED (a model type or class this
    transformers does not know, such as custom code), BIND_MISMATCH
    (names or shapes that do not match, listed) and load_into's others.
    """
    import tsar

    archive, opened = _as_archive(path)
    try:
        files = _files(archive)
        config, cfg = _config_of(archive, files)
        cls = model_class if model_class is not None else _model_class(archive, config, cfg)
        built_dtype = _stored_dtype(archive, load_into_kwargs.get("entry")) or config.dtype
        if isinstance(built_dtype, str):
            built_dtype = getattr(torch, built_dtype)
        with tsar.empty_parameters():
            if hasattr(cls, "_from_config"):  # the contexts from_config builds under
                model = cls._from_config(config, dtype=built_dtype)
            elif hasattr(cls, "from_config"):  # an Auto class
                model = cls.from_config(config, dtype=built_dtype)
            else:
                model = cls(config)
        model.eval()
        tsar.load_into(model, archive, device=device, **load_into_kwargs)
        generation = files.get("generation_config.json")
        if generation is not None and getattr(model, "can_generate", lambda: False)():
            model.generation_config = _tf.GenerationConfig.from_dict(
                json.loads(generation.decode("utf-8")))
        if dtype is not None and dtype != built_dtype:
            model.to(dtype)
        return model
    finally:
        if opened:
            archive.close()


def _write_files(files: Dict[str, bytes], directory: str) -> None:
    for name, data in files.items():
        # Archive.files() keeps only names inside the directory (§4.7.1).
        target = os.path.join(directory, *name.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "xb") as f:
            f.write(data)


def load_tokenizer(path, **kwargs: Any):
    """The tokenizer stored with the model: ``AutoTokenizer.from_pretrained``
    of the archive's attached files (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json, vocab/merges files, chat templates, config.json),
    written for that call to a private temporary directory that is removed
    before it returns. Encodes as ``AutoTokenizer.from_pretrained(MODEL_DIR)``
    does. ``kwargs`` go to ``AutoTokenizer.from_pretrained``.

    Raises tsar.Error NOT_FOUND when the archive has no config.json attached;
    what transformers raises when the files make no tokenizer.
    """
    archive, opened = _as_archive(path)
    try:
        files = _files(archive)
    finally:
        if opened:
            archive.close()
    directory = tempfile.mkdtemp(prefix="tsar-tokenizer-")
    try:
        _write_files(files, directory)
        kwargs.setdefault("local_files_only", True)
        return _tf.AutoTokenizer.from_pretrained(directory, **kwargs)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
