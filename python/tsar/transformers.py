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

An archive is data, never code: nothing here imports, runs or unpickles
anything an archive holds, whoever wrote it (``trust_remote_code`` is always
False; an ``auto_map`` is ignored with a warning; classes are only
transformers' own; an attached ``.py`` or pickle is never written out or
read). Bad content in an archive raises :class:`tsar.Error` naming the archive
and the file. docs/python.md (tsar.transformers) says what this module will
never do.

Needs ``transformers`` (``import tsar`` itself never imports it).
"""
from __future__ import annotations

from typing import Any

try:
    import transformers as _tf
except ImportError as _e:  # also when sys.modules["transformers"] is None
    raise ImportError(
        "tsar.transformers needs the transformers package: pip install transformers "
        f"({_e})") from _e

from ._errors import Error, ErrorCode
from ._transformers_archive import (_CONVERT_ADVICE, _as_archive, _config_dict, _config_of,
                                    _content, _converts_at_load, _empty_model, _json)

__all__ = ["load_config", "load_model", "load_tokenizer", "pack"]


def load_config(path):
    """The model's ``PretrainedConfig``, from the ``config.json`` attached to
    the archive at ``path`` (a path or a :class:`tsar.Archive`). Reads that
    one attached file, no other.

    Raises tsar.Error: NOT_FOUND (no config.json attached), BAD_INPUT (not a
    JSON object, or values transformers cannot read), UNSUPPORTED (a
    model_type this transformers does not know).
    """
    archive, opened = _as_archive(path)
    try:
        return _config_of(archive, _config_dict(archive))
    finally:
        if opened:
            archive.close()


def load_model(path, *, device=None, dtype=None, model_class=None, **load_into_kwargs):
    """The model the archive at ``path`` holds, ready for inference.

    ``path`` is an archive packed from a directory that transformers'
    ``save_pretrained`` wrote (``tsar pack MODEL_DIR -o model.tsar``), or an
    open :class:`tsar.Archive`. The class comes from the attached
    ``config.json``: its ``architectures[0]``, one of transformers' own
    classes (``model_class=`` overrides it, e.g. ``transformers.AutoModel``
    for the base model of a model with a head; without ``architectures``,
    AutoModel's class for the config). The model is built
    under :func:`tsar.empty_parameters` (parameters on meta, so no weight
    memory is allocated; buffers computed; the constructor's ties kept), in
    the dtype of the archive's floating-point tensors, then bound by
    :func:`tsar.load_into`, given the attached ``generation_config.json``
    where the model generates, and put in ``eval()`` mode. Only
    ``config.json`` and ``generation_config.json`` are read of the attached
    files. Its logits are bit-exact with ``from_pretrained(MODEL_DIR)`` of
    the same directory on the CPU.

    Names are matched as ``from_pretrained`` matches them, and every other
    difference is an error (BIND_MISMATCH, listing them; ``strict=False``
    binds what matches and ignores the rest):

    - a stored tensor the model keeps as a non-persistent buffer (BERT's
      ``embeddings.position_ids``, which older checkpoints hold), or whose
      name the class's ``_keys_to_ignore_on_load_unexpected`` matches (as
      do ``position_ids`` and ``rotary_emb.inv_freq`` where the model has
      such buffers), is left unbound: the model keeps the value its
      constructor computed, as from_pretrained does;
    - a tensor the archive lacks whose name the class's
      ``_keys_to_ignore_on_load_missing`` matches keeps its initial value
      (a parameter is made on the CPU and initialized by the class's
      ``_init_weights``, as from_pretrained initializes it);
    - tied weights such as ``lm_head.weight`` count as bound;
    - the base model of a model with a head (``model_class=AutoModel`` of a
      LlamaForCausalLM archive) binds the tensors under the class's
      ``base_model_prefix`` (``model.``) and leaves the head's alone; a model
      with a head over an archive of its base model binds the base under the
      prefix, and its head, which the archive lacks, is missing (unless tied
      to the base, as a tied lm_head is).

    ``device=None``: the weights are zero-copy, read-only views of the mapping
    (every process mapping the archive shares them; never train them in
    place). ``device="cuda:0"``: copied once to that GPU (see load_into).
    ``dtype``: a torch dtype other than the stored one converts the weights,
    which makes a private copy of every converted tensor (no longer shared,
    no longer zero copy); the stored dtype (or None) keeps them zero copy.
    Other keyword arguments go to :func:`tsar.load_into` (``strict``,
    ``entry``, ``read_ahead``, ``archive_prefix``...).

    Raises tsar.Error: NOT_FOUND (no config.json attached: not packed from a
    model directory), BAD_INPUT (config.json or generation_config.json that
    transformers cannot read), UNSUPPORTED (a model type or class this
    transformers does not know, such as custom code), BIND_MISMATCH
    (names or shapes that do not match, listed) and load_into's others.
    """
    archive, opened = _as_archive(path)
    try:
        model, built_dtype = _empty_model(archive, model_class, load_into_kwargs.get("entry"),
                                          stacklevel=3)
        from . import _transformers_bind
        try:
            _transformers_bind.bind(model, archive, device, load_into_kwargs)
        except Error as e:
            if e.code == ErrorCode.BIND_MISMATCH and _converts_at_load(model):
                raise Error(f"{e}. {_CONVERT_ADVICE}", e.code, e.path) from None
            raise
        generation = archive.file("generation_config.json")
        if generation is not None and getattr(model, "can_generate", lambda: False)():
            values = _json(archive, "generation_config.json", generation)
            with _content(archive, "file generation_config.json"):
                model.generation_config = _tf.GenerationConfig.from_dict(values)
        if dtype is not None and dtype != built_dtype:
            model.to(dtype)
        return model
    finally:
        if opened:
            archive.close()


def load_tokenizer(path, **kwargs: Any):
    """The tokenizer stored with the model, as
    ``AutoTokenizer.from_pretrained(MODEL_DIR)`` makes it (it encodes the
    same), and without running anything the archive holds.

    The tokenizer class is resolved from the attached
    ``tokenizer_config.json``'s ``tokenizer_class`` and ``config.json``'s
    ``tokenizer_class`` and ``model_type``, among transformers' own
    tokenizer classes only: a name that is not one (``AutoModelForCausalLM``,
    a class with custom code) is refused, and an ``auto_map`` is ignored
    with a warning. Then only the files those classes read (their
    ``vocab_files_names``: ``tokenizer.json``, ``vocab.txt``,
    ``merges.txt``, ``tokenizer.model``...; ``tokenizer_config.json``,
    ``special_tokens_map.json``, ``added_tokens.json``, the chat templates
    ``chat_template.jinja`` and ``additional_chat_templates/*.jinja``, and
    ``config.json``, without their ``auto_map``) are written to a private
    temporary directory for ``AutoTokenizer.from_pretrained`` with
    ``trust_remote_code=False`` and the config built here; the directory is
    removed before this returns. Never a ``.py`` file, never a pickle; no
    prompt on stdin; no network. ``kwargs`` go to
    ``AutoTokenizer.from_pretrained`` (``trust_remote_code=True`` is
    refused: INVALID_ARGUMENT).

    Raises tsar.Error: NOT_FOUND (no config.json attached), UNSUPPORTED (a
    tokenizer class that is not one of transformers' own, or a result that
    is not a tokenizer), BAD_INPUT (files transformers cannot read, names
    that cannot be written), each naming the archive and the file.
    """
    from . import _transformers_tokenizer
    return _transformers_tokenizer.load(path, kwargs)


def pack(model_dir, dst, *, model_class=None, program=None, **pack_kwargs):
    """``tsar.pack(model_dir, dst)`` of a directory transformers'
    ``save_pretrained`` wrote, with the weights in the names and layout that
    this transformers' model class has: where transformers 5 converts a
    model's checkpoint as ``from_pretrained`` loads it (experts stored one by
    one and fused into one tensor per layer, renamed tensors: Mixtral, Qwen2
    MoE, ...), the conversion is done here, once, by transformers itself, so
    that :func:`load_model` binds every tensor zero copy. A model whose
    checkpoint needs no conversion is packed as ``tsar pack`` packs it (the
    same bytes). The attached files are those ``tsar pack`` attaches.

    Converting loads the model once (its weights in memory, in the stored
    dtype); only transformers' own classes are used (``architectures[0]``,
    or ``model_class=``), with ``trust_remote_code=False`` and safetensors
    only: no code and no pickle from the directory runs. Other keyword
    arguments go to :func:`tsar.pack` (``alignment``, ``dtype``...).
    Returns :class:`tsar.PackSummary` (a note says when it converted).
    Also ``python -m tsar.transformers pack MODEL_DIR -o ARCHIVE``.

    ``program="exported"`` also exports the model once (``torch.export``,
    batch and sequence dimensions dynamic) as ``forward(input_ids,
    attention_mask)`` returning its first output (the logits of a
    ``*ForCausalLM``, the last hidden state of a base model), and stores it in
    the archive without its weights as the program ``model``:
    ``tsar.load_program(ARCHIVE)`` then gives a runnable module bound to the
    mapped weights in a process that imports torch only, not transformers.
    ``program="aoti"`` also compiles it with AOTInductor
    (:func:`tsar.compile_aoti`; minutes for a large model) as the program
    ``model_aoti``, which :func:`tsar.load_aoti` and C++ ``tsar::load_aoti``
    load. docs/programs.md.
    """
    from . import _transformers_pack

    if program is not None:
        from . import _transformers_program

        return _transformers_program.pack(
            model_dir, dst, program,
            lambda d, out: _transformers_pack.pack(d, out, model_class, pack_kwargs),
            lambda archive: load_model(archive, model_class=model_class))
    return _transformers_pack.pack(model_dir, dst, model_class, pack_kwargs)


def _main(argv=None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(
        prog="python -m tsar.transformers",
        description="Packs a transformers save_pretrained directory into one .tsar archive, "
                    "converting the weights once where this transformers converts them at load "
                    "(fused experts, renamed tensors), so that tsar.transformers.load_model binds "
                    "them zero copy.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="pack MODEL_DIR into ARCHIVE",
                       description="tsar.transformers.pack(MODEL_DIR, ARCHIVE)")
    p.add_argument("model_dir", metavar="MODEL_DIR")
    p.add_argument("-o", "--output", required=True, metavar="ARCHIVE")
    p.add_argument("--program", choices=("exported", "aoti"),
                   help="also store the model as a program that runs without transformers: "
                        "'exported' (torch.export; tsar.load_program) or 'aoti' (that, and "
                        "compiled by AOTInductor, for tsar.load_aoti and C++ tsar::load_aoti; "
                        "minutes for a large model)")
    args = ap.parse_args(argv)
    try:
        summary = pack(args.model_dir, args.output, program=args.program)
    except Error as e:
        print(f"tsar: {e}", file=sys.stderr)
        return 3
    for note in summary.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"{args.output}: {summary.tensors} tensors, {summary.nbytes} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
