"""tsar-vllm: makes a runtime-layout archive for vLLM (issue 59, item 2).

``tsar-vllm pack MODEL_DIR -o OUT`` starts vLLM once on MODEL_DIR (a directory
that transformers' ``save_pretrained`` wrote) with tsar's load format
``tsar_pack``: each tensor-parallel rank loads the weights as vLLM does and
saves its parameters as they are before vLLM processes them. The ranks' files
become one archive: entries ``rank0``... , the stamp ``vllm.runtime`` (this
vLLM's version, the architectures, dtype, quantization, tensor-parallel size),
and MODEL_DIR's config and tokenizer files, attached as ``tsar pack`` attaches
them. The archive is published atomically (``OUT`` is the old file or the
complete new one). See docs/vllm.md.
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
Make one archive per set-up you serve."""

# What tsar pack attaches of a transformers directory (spec §4.7.1): names
# ending in these, at the top or under additional_chat_templates/, up to 64 MiB.
_ATTACHED_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken")
_ATTACHED_MOST = 64 << 20


def _attached_files(model_dir: str) -> dict:
    files = {}
    for sub in ("", "additional_chat_templates"):
        d = os.path.join(model_dir, sub)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            real = os.path.realpath(p)
            if (name.startswith(".") or not name.endswith(_ATTACHED_SUFFIXES)
                    or name.endswith(".safetensors.index.json") or not os.path.isfile(p)
                    or os.path.commonpath([real, os.path.realpath(model_dir)])
                    != os.path.realpath(model_dir)
                    or os.path.getsize(p) > _ATTACHED_MOST):
                continue
            with open(p, "rb") as f:
                files["file:" + (f"{sub}/{name}" if sub else name)] = f.read()
    return files


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
    return parser


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
        metadata = {_vllm_runtime.STAMP_KEY: json.dumps(stamp, sort_keys=True)}
        metadata.update(_attached_files(model_dir))
        summary = tsar_pack(ranks, output, metadata=metadata)
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
