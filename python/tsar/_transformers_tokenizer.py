"""tsar.transformers.load_tokenizer: the stored tokenizer, made by
transformers' own classes from the files they read, and nothing else.

What an archive could otherwise make AutoTokenizer do (issue 56): import an
attached ``evil.py`` through an ``auto_map`` (after asking on stdin), or
return a model loaded with ``torch.load`` of an attached pickle when
``tokenizer_class`` names ``AutoModelForCausalLM``. Here the class names are
resolved among transformers' tokenizer classes first (anything else refused),
``auto_map`` is dropped from the files written, the config is built here and
passed in, ``trust_remote_code`` is False, and only the files the candidate
classes read are written out.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Dict, List

import transformers as _tf

from . import _archive
from ._errors import Error, ErrorCode
from ._transformers_archive import (_as_archive, _config_dict, _config_of, _content, _error,
                                    _json, _note_auto_map, _short)

# Read by every tokenizer class's from_pretrained (tokenization_utils_base.py:
# additional_files_names), whatever its vocab_files_names.
_COMMON = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
           "tokenizer.json", "chat_template.jinja")
_TEMPLATES = "additional_chat_templates/"  # CHAT_TEMPLATE_DIR: *.jinja, one level
# What from_pretrained looks for where tokenizer.json is absent (its
# "other_pattern"): Mistral's and tiktoken's vocabularies, data all.
_ALTERNATIVES = re.compile(r"(tekken\.json|tiktoken\.model|tokenizer\.model(\.[A-Za-z0-9]+)*)")
_VERSIONED = re.compile(r"tokenizer\.[^/]+\.json")  # fast_tokenizer_files (get_fast_tokenizer_file)
# Never written, whatever a class lists: code and pickles.
_NEVER = (".py", ".pyc", ".pyo", ".so", ".dll", ".dylib", ".bin", ".pkl", ".pickle", ".pt",
          ".pth", ".ckpt", ".joblib", ".npy", ".npz")


def _tokenizer_class(archive, where: str, name, refuse: bool = True):
    """transformers' own tokenizer class named ``name`` (as AutoTokenizer
    resolves it: with or without "Fast"), None for no name, a name
    transformers does not know (AutoTokenizer then uses TokenizersBackend) or
    a class that needs a package not installed (AutoTokenizer says which);
    tsar.Error (None where not ``refuse``) for a name that resolves to
    anything else."""
    if name is None:
        return None
    if not isinstance(name, str) or not name.isidentifier() or len(name) > 200:
        raise _error(ErrorCode.BAD_INPUT, archive,
                     f"{where}: expected the name of a tokenizer class, found {_short(name)}")
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    with _content(archive, where):
        cls = tokenizer_class_from_name(name)
        if cls is None and not name.endswith("Fast"):
            cls = tokenizer_class_from_name(name + "Fast")
    if cls is None or getattr(cls, "_backends", None):  # a stand-in: a package is missing
        return None
    module = getattr(cls, "__module__", None) or ""
    if (isinstance(cls, type) and issubclass(cls, _tf.PreTrainedTokenizerBase)
            and module.startswith("transformers.")):
        return cls
    if not refuse:
        return None
    why = ("not a tokenizer class" if module.startswith("transformers.")
           else f"{module}.{getattr(cls, '__name__', '?')}, not one of transformers' own")
    raise _error(ErrorCode.UNSUPPORTED, archive,
                 f"{where}: expected one of transformers {_tf.__version__}'s tokenizer "
                 f"classes, found {_short(name)} ({why}); tsar.transformers never loads "
                 f"anything else from an archive")


def _wanted(archive, classes, tok_cfg: dict) -> List[str]:
    """Names of the attached files the tokenizer classes ``classes`` read."""
    names = set(_COMMON)
    for cls in classes:
        for value in (getattr(cls, "vocab_files_names", None) or {}).values():
            if isinstance(value, str):
                names.add(value)
    versioned = tok_cfg.get("fast_tokenizer_files")
    if versioned is not None:
        if not (isinstance(versioned, list) and all(isinstance(v, str) for v in versioned)):
            raise _error(ErrorCode.BAD_INPUT, archive,
                         f"file tokenizer_config.json: fast_tokenizer_files: expected a list of "
                         f"file names, found {_short(versioned)}")
        names.update(v for v in versioned if _VERSIONED.fullmatch(v))
    names.discard("config.json")  # written by load(), without its auto_map
    out = []
    for name in _archive.candidate_file_names(archive):
        wanted = (name in names or _ALTERNATIVES.fullmatch(name)
                  or (name.startswith(_TEMPLATES) and name.endswith(".jinja")
                      and "/" not in name[len(_TEMPLATES):]))
        if wanted and not name.lower().endswith(_NEVER):
            out.append(name)
    return out


def _write(archive, directory: str, name: str, data: bytes) -> None:
    """``data`` as ``directory/name``, created afresh (no link followed)."""
    target = os.path.join(directory, *name.split("/"))
    try:
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError as e:
        raise _error(ErrorCode.BAD_INPUT, archive,
                     f"file {_short(name, 120)}: expected a name that can be written to a "
                     f"temporary directory, found {e.strerror or e}") from None


def _without_auto_map(archive, name: str, value: dict, data: bytes) -> bytes:
    """The bytes to write for JSON object ``value`` (read from ``data``):
    the same bytes, or without its auto_map (noted) where it has one."""
    if "auto_map" not in value:
        return data
    _note_auto_map(archive, name, value, stacklevel=4)  # load, load_tokenizer, the user
    with _content(archive, f"file {name}"):
        return json.dumps({k: v for k, v in value.items() if k != "auto_map"},
                          ensure_ascii=False, indent=2).encode("utf-8")


def load(path, kwargs: Dict):
    kwargs = dict(kwargs)
    if kwargs.pop("trust_remote_code", False):
        raise Error("load_tokenizer: trust_remote_code: expected False, found True: "
                    "tsar.transformers never runs code from an archive", ErrorCode.INVALID_ARGUMENT)
    archive, opened = _as_archive(path)
    directory = None
    try:
        cfg = _config_dict(archive)
        config = kwargs.pop("config", None)
        if config is None:
            config = _config_of(archive, cfg, generic=True)
        raw = archive.file("tokenizer_config.json")
        tok_cfg = _json(archive, "tokenizer_config.json", raw) if raw is not None else {}
        model_type = cfg.get("model_type")
        tokenizer_type = kwargs.get("tokenizer_type")
        from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

        named = [("file tokenizer_config.json: tokenizer_class", tok_cfg.get("tokenizer_class")),
                 ("file config.json: tokenizer_class", cfg.get("tokenizer_class"))]
        implied = [TOKENIZER_MAPPING_NAMES.get(model_type) if isinstance(model_type, str) else None,
                   TOKENIZER_MAPPING_NAMES.get(tokenizer_type)
                   if isinstance(tokenizer_type, str) else None,
                   "TokenizersBackend"]
        classes = [_tokenizer_class(archive, where, name) for where, name in named]
        classes += [_tokenizer_class(archive, "the tokenizer class of its model_type", name,
                                     refuse=False) for name in implied]
        directory = tempfile.mkdtemp(prefix="tsar-tokenizer-")
        for name in _wanted(archive, [c for c in classes if c is not None], tok_cfg):
            data = archive.file(name)
            if data is None:
                continue
            if name == "tokenizer_config.json":
                data = _without_auto_map(archive, name, tok_cfg, data)
            _write(archive, directory, name, data)
        _write(archive, directory, "config.json",
               _without_auto_map(archive, "config.json", cfg, archive.file("config.json")))
        written = sorted(_walk(directory))
        kwargs["local_files_only"] = True
        try:
            tokenizer = _tf.AutoTokenizer.from_pretrained(directory, config=config,
                                                          trust_remote_code=False, **kwargs)
        except Error:
            raise
        except Exception:
            _name_bad_json(archive, directory, written)  # raises where one is not JSON
            with _content(archive, f"tokenizer files ({', '.join(written)})"):
                raise
        if not isinstance(tokenizer, _tf.PreTrainedTokenizerBase):
            raise _error(ErrorCode.UNSUPPORTED, archive,
                         f"tokenizer files: expected a tokenizer, found {type(tokenizer).__name__}")
        return tokenizer
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        if opened:
            archive.close()


def _name_bad_json(archive, directory: str, written: List[str]) -> None:
    """After transformers failed: tsar.Error naming the first written .json
    file that is not JSON Python can read (too deep, say), if any. Done only
    on failure, so a good tokenizer.json is parsed once, by transformers."""
    for name in written:
        if name.endswith(".json"):
            with open(os.path.join(directory, *name.split("/")), "rb") as f:
                _json(archive, name, f.read(), object)


def _walk(directory: str) -> List[str]:
    """The files under ``directory``, '/'-separated relative names."""
    out = []
    for root, _, files in os.walk(directory):
        rel = os.path.relpath(root, directory)
        out += [f if rel == "." else f"{rel}/{f}" for f in files]
    return out
