// tsar::PackFiles (writer/pack_files.h): imports, then one Writer.
#include "writer/pack_files.h"

#include "format/encode.h"
#include "format/reader.h"
#include "writer/importer.h"

namespace tsar {
namespace {

// A name read from an input that the format cannot hold (empty, over 65535
// bytes, not UTF-8) is a bad input naming that input, not a misuse of the
// writer naming the output.
void CheckInputName(const std::string& input, const std::string& what, const std::string& name,
                    const char* field = "name") {
  try {
    format::CheckName(what, name, field);
  } catch (const Error& e) {
    throw Error(ErrorCode::kBadInput, input, std::nullopt, e.what());
  }
}

}  // namespace

PackSummary PackFiles(const std::vector<PackSource>& sources, const std::string& output,
                      const PackFilesOptions& options) {
  if (sources.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                "pack: expected at least one INPUT or --entry NAME=FILE");
  }
  PackSummary summary;
  PackOptions pack = options.pack;
  pack.progress = [&](uint64_t done, uint64_t all) {
    summary.nbytes = all;
    if (options.pack.progress) options.pack.progress(done, all);
  };
  Writer writer(output, pack);
  std::vector<importer::Imported> imported;  // keeps the input mappings alive until finish()
  for (const PackSource& s : sources) {
    importer::ImportOptions io;
    io.strict = options.strict;
    io.default_entry = s.entry.empty() ? options.pack.entry : s.entry;
    importer::Imported in = importer::Import(s.path, io);
    const bool prefix = !s.entry.empty() && in.entries.size() > 1;
    for (auto& e : in.entries) {
      if (prefix) e.name = s.entry + "." + e.name;
      CheckInputName(s.path, "entry", e.name);
      for (const auto& t : e.tensors) CheckInputName(s.path, "tensor", t.name);
      for (const auto& n : summary.entries) {
        if (n == e.name) {
          throw Error(ErrorCode::kInvalidArgument, s.path, std::nullopt,
                      "entry " + format::Quote(e.name) +
                          " already comes from another input; name entries with --entry NAME=FILE");
        }
      }
      summary.entries.push_back(e.name);
      writer.add_entry(e.name);
      for (const auto& t : e.tensors) writer.add(t.name, t.tensor, t.role);
      summary.tensors += e.tensors.size();
    }
    for (auto& m : in.metadata) {
      if (!m.entry.empty() && prefix) m.entry = s.entry + "." + m.entry;
      CheckInputName(s.path, "metadata", m.key, "key");
      writer.add_metadata(m.key, m.value, m.entry);
    }
    for (const auto& line : in.skipped) {
      summary.notes.push_back(s.path + ": " + line);
      if (options.note) options.note(summary.notes.back());
    }
    imported.push_back(std::move(in));
  }
  for (const auto& [key, value] : options.metadata) writer.add_metadata(key, value);
  writer.finish();
  return summary;
}

}  // namespace tsar
