// `tsar pack`: imports torch.save, TorchScript, safetensors and HDF5 files
// (detected by content) and writes one archive atomically. `tsar` runs it
// itself, without LibTorch, unless an input is TorchScript or --arch is
// given: those go to tsar-torch (cli/torch_side.h).
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>

#include "cli/common.h"
#include "cli/tensor_parallel.h"
#include "cli/torch_side.h"
#include "format/reader.h"
#include "writer/detect.h"
#include "writer/pack_files.h"

namespace tsar::cli {
namespace {

// Thrown by the lean tsar's TorchScript importer: the pack goes to tsar-torch.
struct NeedsLibTorch {
  std::string input;
};

std::pair<std::string, std::string> SplitPair(const std::string& s, const char* flag) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                std::string(flag) + " " + format::Quote(s) + ": expected " +
                    (std::string(flag) == "--entry" ? "NAME=FILE" : "KEY=VALUE"));
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

int Pack(const PackArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<PackSource> sources;
  for (const auto& p : a.inputs) sources.push_back({"", p});
  for (const auto& e : a.entries) {
    auto [name, file] = SplitPair(e, "--entry");
    sources.push_back({name, file});
  }
  PackFilesOptions options;
  options.pack.alignment = a.align;
  options.strict = a.strict;
  options.only = a.only;
  options.exclude = a.exclude;
  options.strip_prefix = a.strip_prefix;
  options.follow_symlinks = a.follow_symlinks;
  options.architecture = a.arch;
  options.pack.base = a.base;
  ApplyShardArgs(a.tp, a.shard, a.shard_plan, &options.pack);
  if (a.flatten) {
    for (const PackSource& s : sources) {
      if (importer::DetectByBytes(s.path) != importer::InputKind::kTsar) {
        throw Error(ErrorCode::kInvalidArgument, s.path, std::nullopt,
                    "--flatten: expected a tsar archive (a layer to write standalone), found " +
                        std::string(importer::InputKindName(importer::Detect(s.path))) + " input");
      }
    }
  }
  if (!a.dtype.empty()) options.pack.dtype = DTypeFromName(a.dtype);
  if (const TorchSide* torch = LinkedTorchSide()) {
    options.torch = torch->pack;
  } else {
    if (!a.arch.empty()) ForwardToTorchSide("pack", "--arch");
    // A TorchScript input is found when it is imported, before anything is
    // written. Among several inputs, look first: the notes of the inputs
    // before it would be printed twice.
    if (sources.size() > 1) {
      for (const PackSource& s : sources) {
        importer::InputKind kind = importer::InputKind::kUnknown;
        try {
          kind = importer::Detect(s.path);
        } catch (const Error&) {  // PackFiles says what is wrong with it
        }
        if (kind == importer::InputKind::kTorchScript) throw NeedsLibTorch{s.path};
      }
    }
    options.torch.import_torchscript = [](const std::string& path,
                                          const importer::ImportOptions&) -> importer::Imported {
      throw NeedsLibTorch{path};
    };
  }
  std::unique_ptr<Progress> progress;
  options.pack.progress = [&](uint64_t done, uint64_t all) {
    if (!progress) progress = std::make_unique<Progress>("packing", all, !a.quiet);
    progress->Update(done);
  };
  if (!a.quiet) {
    options.note = [](const std::string& line) {
      std::fprintf(stderr, "tsar: note: %s\n", line.c_str());
    };
  }
  for (const auto& m : a.meta) {
    auto [k, v] = SplitPair(m, "--meta");
    for (const auto& [seen, unused] : options.metadata) {
      if (seen == k) {
        throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                    "--meta " + format::Quote(k) + ": given twice; each key takes one value");
      }
    }
    options.metadata.emplace_back(k, ParseMeta(v));
  }
  const PackSummary summary = PackFiles(sources, a.output, options);
  if (progress) progress->Done();
  if (!a.quiet) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const size_t n = summary.entries.size();
    std::printf("packed %zu tensors in %zu entr%s (%s of data) into %s in %.2f s\n",
                summary.tensors, n, n == 1 ? "y" : "ies", HumanBytes(summary.nbytes).c_str(),
                a.output.c_str(), secs);
  }
  return kExitOk;
}

}  // namespace

int RunPack(const PackArgs& a) {
  try {
    return Pack(a);
  } catch (const NeedsLibTorch& n) {
    ForwardToTorchSide("pack", n.input + " is a TorchScript archive: reading it");
  }
}

}  // namespace tsar::cli
