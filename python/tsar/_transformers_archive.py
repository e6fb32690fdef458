"""A packed save_pretrained directory as tsar.transformers reads it: its
attached files (config.json and the JSON beside it), the config, and the
empty model that config describes. Shared by tsar/transformers.py (the public
calls) and the modules it loads on demand (_transformers_tokenizer,
_transformers_pack), so that none of them imports another back."""
from __future__ import annotations

import collections
import contextlib
import json
import warnings

import torch
import transformers as _tf

from . import _archive
from ._errors import Error, ErrorCode


def _error(code, archive, message):
    return Error(f"{archive.path}: {message}", code, archive.path)


def _short(value, most: int = 80) -> str:
    """repr(value), cut to ``most`` characters (a hostile value may be huge)."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"a {type(value).__name__} nested too deeply to print"
    return text if len(text) <= most else text[:most] + "..."


@contextlib.contextmanager
def _content(archive, what: str, code=ErrorCode.BAD_INPUT):
    """Turns what json or transformers raise over the archive's content
    ``what`` ("file config.json") into tsar.Error naming the archive and it:
    bad content in an archive must never escape as RecursionError, TypeError,
    KeyError, IndexError, AttributeError or OSError. tsar.Error passes."""
    try:
        yield
    except Error:
        raise
    except ImportError as e:  # a class that needs a package this environment lacks
        raise _error(ErrorCode.UNSUPPORTED, archive,
                     f"{what}: expected what transformers {_tf.__version__} can read here, "
                     f"found {type(e).__name__}: {_cut(e)}") from e
    except Exception as e:
        raise _error(code, archive, f"{what}: expected what transformers {_tf.__version__} can "
                                    f"read, found {type(e).__name__}: {_cut(e)}") from e


def _cut(e, most: int = 300) -> str:
    text = str(e)
    return text if len(text) <= most else text[:most] + "..."


def _as_archive(path):
    """(archive, whether this call opened it)."""
    if isinstance(path, _archive.Archive):
        return path, False
    return _archive.open(path), True


def _json(archive, name: str, data: bytes, expect=dict):
    """The JSON of attached file ``name``; BAD_INPUT unless it is UTF-8 JSON
    of type ``expect``, nested no deeper than Python's recursion limit."""
    what = f"file {name}"
    try:
        value = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise _error(ErrorCode.BAD_INPUT, archive,
                     f"{what}: expected JSON nested less deeply than Python's recursion limit, "
                     f"found deeper nesting") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise _error(ErrorCode.BAD_INPUT, archive,
                     f"{what}: expected JSON, found {_cut(e)}") from None
    if not isinstance(value, expect):
        raise _error(ErrorCode.BAD_INPUT, archive,
                     f"{what}: expected a JSON {'object' if expect is dict else expect.__name__}, "
                     f"found a JSON {_json_type(value)}")
    return value


def _json_type(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _config_dict(archive) -> dict:
    """config.json's object: one lookup, no other attached file read."""
    data = archive.file("config.json")
    if data is None:
        names = ", ".join(archive.file_names()) or "none"
        raise _error(ErrorCode.NOT_FOUND, archive,
                     f"config.json: expected an attached file (an archive packed "
                     f"from a transformers save_pretrained directory: tsar pack MODEL_DIR -o "
                     f"ARCHIVE.tsar), found attached files: {names}")
    return _json(archive, "config.json", data)


def _note_auto_map(archive, name: str, cfg: dict, stacklevel: int) -> None:
    """Warns that ``cfg``'s auto_map (custom code) is ignored; ``stacklevel``
    as warnings.warn's, counted from the caller (the user's call)."""
    auto_map = cfg.get("auto_map")
    if auto_map is not None:
        warnings.warn(f"{archive.path}: file {name}: auto_map {_short(auto_map, 200)} ignored: "
                      f"tsar.transformers never imports or runs code from an archive, only "
                      f"transformers' own classes", UserWarning, stacklevel=stacklevel + 1)


def _check_dtype(archive, cfg: dict) -> None:
    """config.json's dtype (torch_dtype) names a torch dtype, or is absent."""
    for key in ("dtype", "torch_dtype"):
        value = cfg.get(key)
        if value is None or value == "auto":
            continue
        if not (isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype)):
            raise _error(ErrorCode.BAD_INPUT, archive,
                         f"file config.json: {key}: expected the name of a torch dtype "
                         f"(\"float32\", \"bfloat16\"...), found {_short(value)}")


def _config_of(archive, cfg: dict, generic: bool = False):
    """The PretrainedConfig of config.json's object ``cfg``, as
    from_pretrained builds it (no hub, no files, no custom code). A
    model_type this transformers does not know is UNSUPPORTED, or with
    ``generic`` a plain PreTrainedConfig (what AutoTokenizer falls back to)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise _error(ErrorCode.BAD_INPUT, archive, f"file config.json: model_type: expected a "
                                                   f"string, found {_short(model_type)}")
    _check_dtype(archive, cfg)
    known = isinstance(model_type, str) and model_type in CONFIG_MAPPING
    if not known and not generic:
        raise _error(ErrorCode.UNSUPPORTED, archive,
                     f"file config.json: model_type: expected a model type this "
                     f"transformers {_tf.__version__} knows, found {_short(model_type)} (a model "
                     f"with custom code, or a newer transformers)")
    with _content(archive, "file config.json"):
        cls = CONFIG_MAPPING[model_type] if known else _tf.PretrainedConfig
        config = cls.from_dict({k: v for k, v in cfg.items() if k != "auto_map"} if generic
                               else cfg)
    dtype = getattr(config, "dtype", None)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise _error(ErrorCode.BAD_INPUT, archive, f"file config.json: dtype: expected the name "
                                                   f"of a torch dtype, found {_short(dtype)}")
    config._name_or_path = archive.path  # where from_pretrained names its directory
    return config


def _model_class(archive, config, cfg):
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise _error(ErrorCode.BAD_INPUT, archive,
                     f"file config.json: architectures: expected a list of class names, found "
                     f"{_short(archs)}")
    if archs:
        name = archs[0]
        cls = getattr(_tf, name, None) if isinstance(name, str) and name.isidentifier() else None
        if isinstance(cls, type) and issubclass(cls, _tf.PreTrainedModel):
            return cls
        raise _error(ErrorCode.UNSUPPORTED, archive,
                     f"file config.json: architectures: expected a model class "
                     f"of transformers {_tf.__version__}, found {_short(name)} (a model with "
                     f"custom code?); pass model_class=")
    mapping = _tf.AutoModel._model_mapping
    if type(config) not in mapping:
        raise _error(ErrorCode.UNSUPPORTED, archive,
                     f"file config.json: no architectures, and AutoModel has no "
                     f"class for {type(config).__name__}; pass model_class=")
    return mapping[type(config)]


def _stored_dtype(archive, entry):
    """The floating dtype most of the archive's floating tensors have (None
    without any): the dtype the model is built in, so its parameters match.
    A quantized weight (a tensor group) counts with its outer dtype (the
    model's: bfloat16 for an int8 weight of a bf16 model), never with its
    inner tensors' (int8 qdata, float32 scales, float8 values)."""
    counts = collections.Counter(i.dtype for i in archive.infos()
                                 if (entry is None or i.entry == entry) and i.dtype.is_floating_point
                                 and i.role != "sparse_component")
    for e in archive.entries if entry is None else [entry]:
        counts.update(g.dtype for g in archive._groups_of(e) if g.dtype.is_floating_point)
    return counts.most_common(1)[0][0] if counts else None


def _empty_model(archive, model_class, entry, stacklevel):
    """(the model of the archive's config.json built under
    tsar.empty_parameters() in eval() mode, the dtype it was built in)."""
    import tsar

    cfg = _config_dict(archive)
    config = _config_of(archive, cfg)
    _note_auto_map(archive, "config.json", cfg, stacklevel=stacklevel)
    cls = model_class if model_class is not None else _model_class(archive, config, cfg)
    built_dtype = _stored_dtype(archive, entry) or config.dtype
    with _content(archive, f"file config.json (building {getattr(cls, '__name__', cls)})"):
        with tsar.empty_parameters():
            if hasattr(cls, "_from_config"):  # the contexts from_config builds under
                model = cls._from_config(config, dtype=built_dtype)
            elif hasattr(cls, "from_config"):  # an Auto class
                model = cls.from_config(config, dtype=built_dtype)
            else:
                model = cls(config)
    return model.eval(), built_dtype


_CONVERT_ADVICE = (
    f"This transformers ({_tf.__version__}) converts this model's checkpoints as it loads them "
    "(renamed tensors, experts fused into one tensor), and the archive holds them as the "
    "directory stores them: pack the directory with tsar.transformers.pack(MODEL_DIR, ARCHIVE) "
    "(python -m tsar.transformers pack MODEL_DIR -o ARCHIVE), which converts them once, so that "
    "every load binds zero copy")


def _converts_at_load(model) -> bool:
    """Whether transformers renames or converts ``model``'s checkpoint
    tensors as from_pretrained loads them (its conversion mapping, the
    legacy renames of every model left out)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
    except ImportError:  # a transformers before 5: loads checkpoints as stored
        return False
    try:
        return bool(get_model_conversion_mapping(model, add_legacy=False))
    except Exception:  # noqa: BLE001 - an internal API: no advice rather than a crash
        return False
