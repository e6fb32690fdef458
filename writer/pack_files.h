// tsar::PackFiles: what `tsar pack` does, as a library call shared by the CLI
// and the Python package: import files people have (torch.save, TorchScript,
// safetensors, HDF5; writer/importer.h) and write them as one archive.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tsar/archive_file.h"
#include "tsar/pack_options.h"
#include "writer/importer.h"

namespace tsar {

// What needs LibTorch: reading TorchScript inputs and writing --arch files.
// writer/torchscript.h's LibTorchSupport() fills it where LibTorch is linked
// (tsar-torch, the Python package). Left empty, as in the `tsar` command, a
// TorchScript input or PackFilesOptions::architecture is kUnsupported.
struct TorchSupport {
  importer::ImportFunction import_torchscript;
  // Starts the architecture file of TorchScript file `input` at `output`;
  // the function it returns publishes it (durably when given true).
  std::function<std::function<void(bool)>(const std::string& input, const std::string& output)>
      architecture;
};

struct PackSource {
  std::string entry;  // "" = entry names come from the file (single state_dict: options.pack.entry)
  std::string path;
};

struct PackFilesOptions {
  PackOptions pack;     // alignment, default entry, progress, durability
  bool strict = false;  // refuse opaque pickle fragments and values metadata cannot hold
  std::vector<std::pair<std::string, MetadataValue>> metadata;  // archive-level, added last
  // Entries to keep (empty = all) and to leave out, by their names in the
  // archive ("model", "optimizer.state.0", "ck.model" for --entry ck=FILE).
  // Each name must match an entry of some input. Selecting entries of a
  // checkpoint keeps its entries and metadata, not the rest of its structure.
  std::vector<std::string> only, exclude;
  // Taken off every tensor name that starts with it (DDP's "module.",
  // Lightning's "model."); some tensor must have it.
  std::string strip_prefix;
  // Follow symbolic links below an input directory wherever they point
  // (ImportOptions::follow_symlinks; default: refuse one that leaves it).
  bool follow_symlinks = false;
  // When set: the one input must be a TorchScript file, and its architecture
  // without weight bytes (writer/architecture.h) is written here too, for a
  // server to load before tsar::bind. Both files are published only when both
  // are complete.
  std::string architecture;
  // Called once per value an input held that was skipped ("<input>: <what>").
  std::function<void(const std::string&)> note;
  TorchSupport torch;
};

struct PackSummary {
  size_t tensors = 0;
  std::vector<std::string> entries;  // in file order
  uint64_t nbytes = 0;               // storage bytes written
  std::vector<std::string> notes;    // what was skipped or looks wrong, "<input>: <what>"
};

// Imports every source in order and publishes `output` atomically
// (writer::ArchiveWriter, the Torch-free half of tsar::Writer).
// A source with an entry name and several entries in its file gets entries
// "<entry>.<name>". Throws tsar::Error: kBadInput (an input), kInvalidArgument
// (two inputs giving one entry name, bad options), kUnsupported (TorchScript
// without `torch`), kIo. Not thread-safe.
PackSummary PackFiles(const std::vector<PackSource>& sources, const std::string& output,
                      const PackFilesOptions& options);

}  // namespace tsar
