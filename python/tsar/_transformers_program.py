"""``tsar.transformers.pack(..., program=)``: a transformers model exported
once at pack time, so that a server loads it with torch alone (issue 60).

The model is loaded from the archive just written (zero copy), its class
swapped for a subclass whose ``forward(input_ids, attention_mask)`` calls the
model's own with ``return_dict=False`` (and ``use_cache=False`` where it
takes one) and returns the first output: the logits of a ``*ForCausalLM``,
the last hidden state of a base model. The parameters keep their names, so
the program binds the archive's tensors as they are. It is exported with the
batch and sequence dimensions dynamic, and stored in the archive
(:mod:`tsar._programs`) as ``model`` (``program="exported"``) or compiled
with :func:`tsar.compile_aoti` and stored as ``model`` (``program="aoti"``:
both are then stored, the exported one as ``model`` and the compiled one as
``model_aoti``).
"""
from __future__ import annotations

import inspect
import os
import tempfile

import torch

from ._errors import Error, ErrorCode

PROGRAMS = ("exported", "aoti")
EXAMPLE = (2, 8)  # batch, sequence of the example inputs: both dimensions stay dynamic


def _flat(model):
    """``model`` with a forward of plain tensors in and one tensor out."""
    base = type(model)
    accepted = inspect.signature(base.forward).parameters
    # return_dict: transformers 5 takes it through **kwargs (can_return_tuple).
    extra = {"return_dict": False, **({"use_cache": False} if "use_cache" in accepted else {})}

    def forward(self, input_ids, attention_mask):
        return base.forward(self, input_ids=input_ids, attention_mask=attention_mask, **extra)[0]

    model.__class__ = type(base.__name__, (base,), {"forward": forward,
                                                     "__module__": base.__module__})
    return base


def export(model, where):
    config = model.config
    vocab = int(getattr(config, "vocab_size", 2) or 2)
    longest = int(getattr(config, "max_position_embeddings", 0) or 0) or 4096
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, EXAMPLE, generator=g)
    mask = torch.ones_like(ids)
    batch = torch.export.Dim("batch", min=1, max=1024)
    seq = torch.export.Dim("sequence", min=2, max=max(longest, 3) - 1)
    base = _flat(model)
    try:
        with torch.no_grad():
            return torch.export.export(model, (ids, mask), dynamic_shapes=(
                {0: batch, 1: seq}, {0: batch, 1: seq}), strict=False)
    except Exception as e:  # noqa: BLE001  (export raises many kinds)
        raise Error(f"{where}: torch {torch.__version__} cannot export {base.__name__}: "
                    f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                    ErrorCode.UNSUPPORTED, str(where)) from None
    finally:
        model.__class__ = base


def pack(model_dir, dst, program, pack_one, load_model):
    """Packs with ``pack_one(model_dir, path)`` (tsar.transformers.pack's own
    path), loads it with ``load_model`` (tsar.transformers.load_model), exports
    it, and writes ``dst`` with the program(s)."""
    import tsar

    if program not in PROGRAMS:
        raise Error(f"{dst}: program={program!r}: expected one of {PROGRAMS} (or None)",
                    ErrorCode.INVALID_ARGUMENT, os.fspath(dst))
    dst = os.fspath(dst)
    directory = os.path.dirname(os.path.abspath(dst))
    fd, plain = tempfile.mkstemp(prefix=".tsar-unexported-", suffix=".tsar", dir=directory)
    os.close(fd)
    package = plain + ".aoti.pt2"
    try:
        summary = pack_one(model_dir, plain)
        with tsar.open(plain) as archive:
            entry = archive.entries[0] if len(archive.entries) == 1 else "model"
            model = load_model(archive)
            ep = export(model, model_dir)
            programs = {"model": ep}
            if program == "aoti":
                tsar.compile_aoti(ep, package)
                programs["model_aoti"] = package
            done = tsar.pack(plain, dst, programs=programs, program_entry=entry)
        return type(summary)(summary.tensors, summary.entries, summary.nbytes,
                             list(summary.notes) + list(done.notes))
    finally:
        for p in (plain, package):
            if os.path.exists(p):
                os.unlink(p)
