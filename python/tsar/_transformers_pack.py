"""tsar.transformers.pack: a save_pretrained directory packed in the layout
this transformers' model class has (python/tsar/transformers.py says what
and why)."""
from __future__ import annotations

import os
import tempfile

import torch

from ._errors import Error, ErrorCode


def pack(model_dir, dst, model_class, pack_kwargs):
    import tsar

    from . import _transformers_archive as tt

    model_dir, dst = os.fspath(model_dir), os.fspath(dst)
    directory = os.path.dirname(os.path.abspath(dst))
    fd, plain = tempfile.mkstemp(prefix=".tsar-unconverted-", suffix=".tsar", dir=directory)
    os.close(fd)
    try:
        # What `tsar pack` makes of the directory, with all its checks: the
        # weights as stored, the attached files.
        summary = tsar.pack(model_dir, plain, **pack_kwargs)
        with tsar.open(plain) as archive:
            model, built_dtype = tt._empty_model(archive, model_class, None, stacklevel=4)
            if not tt._converts_at_load(model) or _binds(model, archive):
                os.replace(plain, dst)
                return summary
            entries = archive.entries
            if len(entries) != 1:
                raise Error(f"{plain}: expected one entry from {model_dir}, found {entries}",
                            ErrorCode.UNSUPPORTED, model_dir)
            metadata = archive.metadata()
            alignment = archive.alignment
            cls = type(model)
        del model
        converted = _converted_state_dict(cls, model_dir, built_dtype)
        tsar.save(converted, dst, metadata=metadata, entry=entries[0], alignment=alignment)
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in converted.values()}
        nbytes = sum(storages.values())
        note = (f"{model_dir}: converted by transformers {tt._tf.__version__} as from_pretrained "
                f"converts it ({len(converted)} tensors in {cls.__name__}'s names and layout, "
                f"from {summary.tensors} stored)")
        return type(summary)(len(converted), list(entries), nbytes, list(summary.notes) + [note])
    finally:
        if os.path.exists(plain):
            os.unlink(plain)


def _binds(model, archive) -> bool:
    """Whether ``model`` (on meta) binds to ``archive`` as load_model binds
    it: then the checkpoint needs no conversion."""
    from . import _transformers_bind

    try:
        _transformers_bind.bind(model, archive, None, {})
    except Error as e:
        if e.code == ErrorCode.BIND_MISMATCH:
            return False
        raise
    return True


def _converted_state_dict(cls, model_dir, dtype):
    """The state_dict of ``cls.from_pretrained(model_dir)``: transformers'
    own conversion, nothing of the directory's but its safetensors and JSON."""
    try:
        model = cls.from_pretrained(model_dir, dtype=dtype, trust_remote_code=False,
                                    local_files_only=True, use_safetensors=True)
    except Exception as e:  # noqa: BLE001 - transformers' many errors, named
        raise Error(f"{model_dir}: {cls.__name__}.from_pretrained could not convert the "
                    f"weights: {type(e).__name__}: {str(e)[:300]}", ErrorCode.BAD_INPUT,
                    model_dir) from None
    sd = model.state_dict()
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
