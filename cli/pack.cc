// `tsar pack INPUT... -o OUTPUT`: import torch.save, TorchScript, safetensors
// and HDF5 files (detected by content) and write one archive atomically.
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "cli/commands.h"
#include "cli/common.h"
#include "format/reader.h"
#include "tsar/writer.h"
#include "writer/importer.h"

namespace tsar::cli {
namespace {

struct PackArgs {
  std::vector<std::string> inputs;
  std::vector<std::string> entries;  // NAME=FILE
  std::vector<std::string> meta;     // KEY=VALUE
  std::string output;
  uint32_t align = 4096;
  bool strict = false;
  bool quiet = false;
};

std::pair<std::string, std::string> SplitPair(const std::string& s, const char* flag) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                std::string(flag) + " " + format::Quote(s) + ": expected NAME=VALUE");
  }
  return {s.substr(0, eq), s.substr(eq + 1)};
}

// --meta values: an integer if the whole value parses as one, else a float,
// else the string itself.
MetadataValue ParseMeta(const std::string& v) {
  if (!v.empty()) {
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(v.c_str(), &end, 10);
    if (errno == 0 && *end == '\0') return int64_t{i};
    const double d = std::strtod(v.c_str(), &end);
    if (*end == '\0') return d;
  }
  return v;
}

int RunPack(const PackArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  struct Source {
    std::string rename;  // --entry NAME, or "" for positional inputs
    std::string path;
  };
  std::vector<Source> sources;
  for (const auto& p : a.inputs) sources.push_back({"", p});
  for (const auto& e : a.entries) {
    auto [name, file] = SplitPair(e, "--entry");
    sources.push_back({name, file});
  }
  if (sources.empty())
    throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                "pack: expected at least one INPUT or --entry NAME=FILE");

  PackOptions options;
  options.alignment = a.align;
  uint64_t total = 0;
  std::unique_ptr<Progress> progress;
  options.progress = [&](uint64_t done, uint64_t all) {
    if (!progress) progress = std::make_unique<Progress>("packing", all, !a.quiet);
    progress->Update(done);
    total = all;
  };
  Writer writer(a.output, options);
  std::vector<importer::Imported> imported;  // keeps the input mappings alive until finish()
  std::vector<std::string> entry_names;
  size_t tensors = 0;
  for (const Source& s : sources) {
    importer::ImportOptions io;
    io.strict = a.strict;
    if (!s.rename.empty()) io.default_entry = s.rename;
    importer::Imported in = importer::Import(s.path, io);
    for (auto& e : in.entries) {
      if (!s.rename.empty() && in.entries.size() > 1) e.name = s.rename + "." + e.name;
      for (const auto& n : entry_names) {
        if (n == e.name) {
          throw Error(ErrorCode::kInvalidArgument, s.path, std::nullopt,
                      "entry " + format::Quote(e.name) +
                          " already comes from another input; name entries with --entry NAME=FILE");
        }
      }
      entry_names.push_back(e.name);
      writer.add_entry(e.name);
      for (const auto& t : e.tensors) writer.add(t.name, t.tensor, t.role);
      tensors += e.tensors.size();
    }
    for (auto& m : in.metadata) {
      if (!m.entry.empty() && !s.rename.empty() && in.entries.size() > 1)
        m.entry = s.rename + "." + m.entry;
      writer.add_metadata(m.key, m.value, m.entry);
    }
    if (!a.quiet) {
      for (const auto& line : in.skipped)
        std::fprintf(stderr, "tsar: note: %s: %s\n", s.path.c_str(), line.c_str());
    }
    imported.push_back(std::move(in));
  }
  for (const auto& m : a.meta) {
    auto [k, v] = SplitPair(m, "--meta");
    writer.add_metadata(k, ParseMeta(v));
  }
  writer.finish();
  if (progress) progress->Done();
  if (!a.quiet) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("packed %zu tensors in %zu entr%s (%s of data) into %s in %.2f s\n", tensors,
                entry_names.size(), entry_names.size() == 1 ? "y" : "ies",
                HumanBytes(total).c_str(), a.output.c_str(), secs);
  }
  return kExitOk;
}

}  // namespace

Run AddPack(CLI::App& app) {
  auto args = std::make_shared<PackArgs>();
  CLI::App* sub =
      app.add_subcommand("pack", "Pack model weights into a .tsar archive (atomically)");
  sub->add_option("inputs", args->inputs,
                  "Input files, detected by content: torch.save (.pt/.pth/.bin), TorchScript,\n"
                  "safetensors (or a sharded *.safetensors.index.json), HDF5 (h5py)");
  sub->add_option("-o,--output", args->output,
                  "Archive to write; replaced atomically, never half-written")
      ->required();
  sub->add_option("--entry", args->entries, "NAME=FILE: pack FILE as the entry NAME (repeatable)");
  sub->add_option("--meta", args->meta,
                  "KEY=VALUE archive metadata; integers and floats are typed (repeatable)");
  sub->add_option("--align", args->align,
                  "Alignment of storages of at least this size (power of two, >= 64)")
      ->default_val(4096)
      ->check(CLI::Range(64u, 1u << 30));
  sub->add_flag("--strict", args->strict,
                "Refuse inputs holding values other than tensors, numbers and strings\n(default: "
                "skip them with a note)");
  sub->add_flag("-q,--quiet", args->quiet, "No progress bar, notes or summary");
  sub->footer(
      "Examples:\n"
      "  tsar pack resnet.pt -o resnet.tsar\n"
      "  tsar pack --entry model=sd.pt --entry ema=ema.pt --meta step=1000 -o ckpt.tsar\n"
      "  tsar pack model.safetensors.index.json -o llm.tsar   # all shards into one archive\n"
      "A torch.save dict like {\"model\": sd, \"ema\": sd2, \"step\": 10} becomes entries\n"
      "model and ema and the metadata step=10. Nothing in the input is ever executed.");
  return [args] { return RunPack(*args); };
}

}  // namespace tsar::cli
