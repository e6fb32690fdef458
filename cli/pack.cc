// `tsar pack INPUT... -o OUTPUT`: its command line (RunPack, in
// cli/pack_run.cc, imports the inputs and writes the archive).
#include <cstdlib>

#include "cli/commands.h"
#include "cli/torch_side.h"

namespace tsar::cli {

Run AddPack(CLI::App& app) {
  auto args = std::make_shared<PackArgs>();
  CLI::App* sub =
      app.add_subcommand("pack", "Pack model weights into a .tsar archive (atomically)");
  sub->add_option("inputs", args->inputs,
                  "Input files, detected by content: torch.save (.pt/.pth/.bin), TorchScript,\n"
                  "safetensors (or a sharded *.safetensors.index.json), HDF5 (h5py), a directory\n"
                  "written by TensorDict's memmap() (nested keys joined with '.'), a directory\n"
                  "written by transformers' save_pretrained (see below), or a tsar archive\n"
                  "(repacked: flattened, rebased, converted with --dtype)");
  sub->add_option("-o,--output", args->output,
                  "Archive to write; replaced atomically, never half-written")
      ->required();
  // One value per --entry/--meta: `--entry a=x.pt y.pt` leaves y.pt an input.
  sub->add_option("--entry", args->entries, "NAME=FILE: pack FILE as the entry NAME (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--meta", args->meta,
                  "KEY=VALUE archive metadata; integers and floats are typed (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--only", args->only,
                  "ENTRY: pack only this entry (repeatable), by its name in the archive:\n"
                  "model, optimizer.state.0, or ck.model for --entry ck=FILE")
      ->allow_extra_args(false);
  sub->add_option("--exclude", args->exclude, "ENTRY: leave this entry out (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--strip-prefix", args->strip_prefix,
                  "PREFIX: take PREFIX off every tensor name that starts with it (DDP's\n"
                  "module., Lightning's model.); bind can match such names too (BindOptions)");
  sub->add_option("--dtype", args->dtype,
                  "float16|bfloat16|float32: store every floating-point tensor as this dtype\n"
                  "(integer, bool and complex tensors as they are; shared storages stay shared)")
      ->check(CLI::IsMember({"float16", "bfloat16", "float32"}));
  sub->add_option("--arch", args->arch,
                  "FILE: for a TorchScript input, also write its architecture without weight\n"
                  "bytes (each weight a stride-0 view of one zero) to FILE: what a server\n"
                  "loads with torch::jit::load before tsar::bind points it at the archive");
  sub->add_option("--align", args->align,
                  "Alignment of storages of at least this size (power of two, >= 64)")
      ->default_val(4096)
      ->check(CLI::Validator(
          [](const std::string& v) -> std::string {
            char* end = nullptr;
            const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
            const bool ok = *end == '\0' && n >= 64 && n <= (1u << 30) && (n & (n - 1)) == 0;
            return ok ? "" : "expected a power of two in [64, 2^30], found " + v;
          },
          "POW2"));
  auto* base = sub->add_option(
      "--base", args->base,
      "BASE.tsar: write a layer over this archive: storages whose bytes equal one of\n"
      "BASE's (compared byte for byte) are not written but taken from BASE, whose\n"
      "pages every process opening any layer over it shares. The layer records\n"
      "BASE's path relative to OUTPUT and BASE's identity: it opens only with\n"
      "exactly that file (found there, or in TSAR_BASE_PATH directories)");
  sub->add_option("--tp", args->tp,
                  "W: lay the archive out for W tensor-parallel ranks (format 1.4): each tensor\n"
                  "a --shard pattern matches is split into W equal slices along its DIM, stored\n"
                  "so that each rank's slice is one contiguous, page-aligned run of the file;\n"
                  "every other tensor is stored once for all ranks. Defaults --align to 2097152:\n"
                  "the kernel maps the cached pages around a fault (fault-around, large folios\n"
                  "of up to 2 MiB), so a rank whose slices start on 2 MiB maps no page of its\n"
                  "neighbours' (P15: 1.01x of its bytes, 1.07x at 4096; the padding is zeros\n"
                  "that no process reads)")
      ->check(CLI::Range(2, 65536));
  sub->add_option("--shard", args->shard,
                  "PATTERN=DIM: split the tensors whose names match PATTERN (a glob; '*' also\n"
                  "matches dots) along DIM (-1 = last). Repeatable; the first match decides.\n"
                  "Column-parallel weights (q/k/v, gate/up) split on 0, row-parallel (o, down)\n"
                  "on 1. A pattern that matches nothing, a size not divisible by W is an error")
      ->allow_extra_args(false);
  sub->add_option("--shard-plan", args->shard_plan,
                  "FILE: the patterns as JSON, {\"tp\": W, \"shard\": {\"PATTERN\": DIM, ...}},\n"
                  "after any --shard (samples/tp/llama.plan.json: a LLaMA-style decoder)");
  sub->add_flag("--flatten", args->flatten,
                "Inputs are tsar archives (layers): write them standalone, with every\n"
                "storage of their bases copied in (the default for an archive input without\n"
                "--base; the flag says so and checks it)")
      ->excludes(base);
  sub->add_flag("--strict", args->strict,
                "Refuse what cannot be kept as it is: objects of a torch.save file that would\n"
                "be kept as opaque pickle fragments (classes, numpy, Path...), HDF5 and\n"
                "safetensors values that metadata cannot hold (default: keep fragments, never\n"
                "running them; skip the rest with a note)");
  sub->add_flag("--follow-symlinks", args->follow_symlinks,
                "Below an input directory (TensorDict's, a safetensors index's shards) follow\n"
                "symbolic links wherever they point. Default: a link that leaves the directory\n"
                "is refused, naming it and its target (links that stay inside are followed),\n"
                "so that packing a directory one was handed never reads the host's files; a\n"
                "Hugging Face cache snapshot, whose files link to ../../blobs, needs this flag");
  sub->add_flag("-q,--quiet", args->quiet, "No progress bar, notes or summary");
  sub->footer(
      "Examples:\n"
      "  tsar pack resnet.pt -o resnet.tsar\n"
      "  tsar pack --entry model=sd.pt --entry ema=ema.pt --meta step=1000 -o ckpt.tsar\n"
      "  tsar pack model.safetensors.index.json -o llm.tsar   # all shards into one archive\n"
      "  tsar pack ckpt.pt --only model --strip-prefix module. -o model.tsar\n"
      "  tsar pack model.safetensors --dtype bfloat16 -o model-bf16.tsar\n"
      "  tsar pack model_ts.pt -o model.tsar --arch model_arch.pt   # for a C++ server\n"
      "  tsar pack finetuned.pt --base base.tsar -o finetuned.tsar   # a layer\n"
      "  tsar pack --flatten finetuned.tsar -o finetuned-full.tsar\n"
      "  tsar pack llama.safetensors --tp 4 --shard-plan llama.plan.json -o llama-tp4.tsar\n"
      "  tsar pack ./my-model -o my-model.tsar   # a save_pretrained directory, see below\n"
      "A torch.save dict like {\"model\": sd, \"ema\": sd2, \"step\": 10} becomes entries\n"
      "model and ema and the metadata step=10. Nothing in the input is ever executed.\n"
      "A transformers directory (config.json and model.safetensors, or a sharded\n"
      "model.safetensors.index.json) becomes one archive: the weights as entry model,\n"
      "and its files named *.json, *.txt, *.model, *.jinja, *.tiktoken (config,\n"
      "generation config, tokenizer, chat templates; also additional_chat_templates/)\n"
      "up to 64 MiB each, byte for byte, as attached files (metadata \"file:NAME\",\n"
      "spec 4.7.1; tsar inspect lists them). Other files are skipped with a note.\n"
      "In Python: model = tsar.transformers.load_model(\"my-model.tsar\") and\n"
      "tokenizer = tsar.transformers.load_tokenizer(\"my-model.tsar\").");
  return [args, sub] {
    // §4.12: a tensor-parallel archive defaults to 2 MiB alignment (see --tp).
    if (args->tp != 0 && sub->get_option("--align")->count() == 0) args->align = 2u << 20;
    return RunPack(*args);
  };
}

}  // namespace tsar::cli
