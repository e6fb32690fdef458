// tsar::PackFiles (writer/pack_files.h): imports, then one Writer.
#include "writer/pack_files.h"

#include <algorithm>
#include <deque>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "format/encode.h"
#include "format/reader.h"
#include "loader/value_tree.h"
#include "writer/archive_writer.h"
#include "writer/importer.h"
#include "writer/tensor_parallel.h"

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

// What the archive cannot hold, or the tensor-parallel plan cannot split, in
// an input's entry: a bad input naming that input (exit 3), not a misuse of
// the writer naming the output (the writer would find it only at finish()).
void CheckInputTensors(const std::string& input, const importer::Imported::Entry& e,
                       const PackOptions& pack) {
  std::unordered_set<std::string_view> names;
  names.reserve(e.tensors.size());
  std::deque<std::string> owned;  // group and member names
  const bool plan = pack.tp >= 2 && pack.tp <= format::kMaxWorld && !pack.shard.empty();
  for (const auto& g : e.groups) {
    const std::string what = "group " + format::Quote(g.name);
    if (g.group.sizes.size() > format::kMaxNdim) {
      throw Error(ErrorCode::kBadInput, input, std::nullopt,
                  what + ": ndim: expected at most " + std::to_string(format::kMaxNdim) +
                      " (what an archive holds), found " + std::to_string(g.group.sizes.size()));
    }
    // The names stay in `owned` while `names` views them.
    owned.push_back(g.name);
    for (const auto& [suffix, part] : g.group.components) owned.push_back(g.name + suffix);
    for (size_t k = owned.size() - 1 - g.group.components.size(); k < owned.size(); ++k) {
      const std::string& n = owned[k];
      if (!names.insert(n).second) {
        throw Error(ErrorCode::kBadInput, input, std::nullopt,
                    what + ": expected the names of the group and its members (" +
                        format::Quote(n) + ") unique in entry " + format::Quote(e.name) +
                        ", found one twice");
      }
    }
  }
  for (const auto& t : e.tensors) {
    const std::string what = "tensor " + format::Quote(t.name);
    if (t.tensor.sizes.size() > format::kMaxNdim) {
      throw Error(ErrorCode::kBadInput, input, std::nullopt,
                  what + ": ndim: expected at most " + std::to_string(format::kMaxNdim) +
                      " (what an archive holds), found " + std::to_string(t.tensor.sizes.size()));
    }
    if (!names.insert(t.name).second) {
      throw Error(ErrorCode::kBadInput, input, std::nullopt,
                  what + ": expected a name unique in entry " + format::Quote(e.name) +
                      ", found it twice" +
                      (t.name.find('.') != std::string::npos
                           ? " (nested keys are joined with '.': a key holding a '.' can name "
                             "the same tensor as a nested one)"
                           : ""));
    }
    if (!plan) continue;
    const size_t p = writer::MatchShardPattern(t.name, pack.shard);
    if (p == pack.shard.size()) continue;
    try {
      writer::ShardDimOf(t.name, t.tensor, t.role == Role::kSparseComponent, pack.tp,
                         pack.shard[p]);
    } catch (const Error& err) {
      throw Error(ErrorCode::kBadInput, input, std::nullopt, err.what());
    }
  }
}

using RenameTensor = std::function<std::string(const std::string&, const std::string&)>;

// `v` with every entry name n (of tensors and state_dicts) replaced by
// rename(n), and each loose tensor's name by rename_tensor(entry, name) when
// given.
Value RenameEntries(const Value& v, const std::function<std::string(const std::string&)>& rename,
                    const RenameTensor& rename_tensor = nullptr) {
  using K = Value::Kind;
  Value out;
  switch (v.kind()) {
    case K::kTensor:
      return Value::Tensor(rename(v.entry()),
                           rename_tensor ? rename_tensor(v.entry(), v.name()) : v.name());
    case K::kEntry:
      out = Value::Entry(rename(v.entry()), v.ordered());
      break;
    case K::kList:
    case K::kTuple: {
      std::vector<Value> items;
      for (const auto& x : v.items()) items.push_back(RenameEntries(x, rename, rename_tensor));
      return v.is(K::kList) ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
    }
    case K::kDict: {
      std::vector<std::pair<Value, Value>> pairs;
      for (const auto& [k, x] : v.pairs())
        pairs.emplace_back(RenameEntries(k, rename, rename_tensor),
                           RenameEntries(x, rename, rename_tensor));
      out = Value::Dict(std::move(pairs), v.ordered());
      break;
    }
    case K::kOpaque: {
      std::vector<Value> items;
      for (const auto& x : v.items()) items.push_back(RenameEntries(x, rename, rename_tensor));
      return Value::Opaque(v.bytes(), v.segments(), std::move(items));
    }
    default:
      return v;
  }
  if (const Value* a = v.attributes()) out.set_attributes(RenameEntries(*a, rename, rename_tensor));
  return out;
}

// Whether the archive must store `in`'s tree (spec §4.10.3): unless the
// entries and metadata it will hold imply exactly that tree, a reader could
// not give the input back without it.
bool NeedsTree(const importer::Imported& in,
               const std::vector<std::pair<std::string, MetadataValue>>& extra) {
  if (!in.value) return false;
  // Export to .pt writes a one-entry archive without a tree as that entry's
  // state_dict (spec §4.10.3): a checkpoint that is more than a state_dict
  // ({"model": sd, "epoch": 3}) keeps its tree to come back whole.
  if (in.entries.size() == 1 && !in.value->is(Value::Kind::kEntry)) return true;
  std::vector<std::string> entries;
  for (const auto& e : in.entries) entries.push_back(e.name);
  std::vector<std::pair<std::string, MetadataValue>> top = extra;
  for (const auto& m : in.metadata) {
    if (m.entry.empty()) top.emplace_back(m.key, m.value);
  }
  std::stable_sort(top.begin(), top.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::unordered_map<std::string, std::string> torch_metadata;  // entry -> JSON
  for (const auto& m : in.metadata) {
    if (m.key == "torch._metadata" && !m.entry.empty())
      if (const auto* s = std::get_if<std::string>(&m.value)) torch_metadata.emplace(m.entry, *s);
  }
  const Value implied = ImpliedValue(
      entries,
      [&](const std::string& entry) -> std::optional<std::string> {
        auto it = torch_metadata.find(entry);
        if (it == torch_metadata.end()) return std::nullopt;
        return it->second;
      },
      top);
  return implied != *in.value;
}

// Whether entries and metadata alone hold everything of `v` but the types of
// its dicts and the order of its keys: a state_dict, or a dict of state_dicts
// and numbers, strings or bytes under str keys. Inputs packed together must
// be, since their archive is a dict of entries (spec §4.10.3).
bool FitsEntries(const Value& v) {
  using K = Value::Kind;
  if (v.is(K::kEntry)) return true;
  if (!v.is(K::kDict) || v.attributes()) return false;
  for (const auto& [k, x] : v.pairs()) {
    if (!k.is(K::kStr)) return false;
    if (!(x.is(K::kEntry) || x.is(K::kInt) || x.is(K::kFloat) || x.is(K::kStr) || x.is(K::kBytes)))
      return false;
  }
  return true;
}

// True when `in` has floating-point tensors and every one of them is a
// broadcast view (a stride of 0 over a dimension longer than 1): what a
// weightless architecture (torch.jit.save of a module whose weights were
// expanded from one element, or made on the meta device and expanded) looks
// like. Packing it gives an archive of repeated zeros.
bool AllFloatingBroadcast(const importer::Imported& in) {
  size_t floating = 0;
  for (const auto& e : in.entries) {
    for (const auto& t : e.tensors) {
      if (!t.tensor.is_floating_point()) continue;
      ++floating;
      bool broadcast = false;
      for (size_t d = 0; d < t.tensor.sizes.size(); ++d) {
        broadcast = broadcast || (t.tensor.strides[d] == 0 && t.tensor.sizes[d] > 1);
      }
      if (!broadcast) return false;
    }
  }
  return floating > 0;
}

// --only / --exclude: drops the entries of `in` they leave out, with their
// metadata; records in `matched` the names they matched and in `seen` every
// entry name. Returns whether an entry was dropped.
bool SelectEntries(importer::Imported& in, const PackFilesOptions& options,
                   std::unordered_set<std::string>& matched, std::vector<std::string>& seen) {
  auto listed = [](const std::vector<std::string>& v, const std::string& n) {
    return std::find(v.begin(), v.end(), n) != v.end();
  };
  std::vector<importer::Imported::Entry> kept;
  std::unordered_set<std::string> dropped;
  for (auto& e : in.entries) {
    seen.push_back(e.name);
    const bool only = listed(options.only, e.name), exclude = listed(options.exclude, e.name);
    if (only || exclude) matched.insert(e.name);
    if ((options.only.empty() || only) && !exclude) {
      kept.push_back(std::move(e));
    } else {
      dropped.insert(e.name);
    }
  }
  in.entries = std::move(kept);
  std::vector<importer::Imported::Meta> meta;
  for (auto& m : in.metadata) {
    if (!dropped.count(m.entry)) meta.push_back(std::move(m));
  }
  in.metadata = std::move(meta);
  return !dropped.empty();
}

// --strip-prefix: takes `prefix` off every tensor name of `in` (and of its
// tree's loose tensors) that starts with it. Returns how many it changed.
size_t StripPrefix(importer::Imported& in, const std::string& prefix) {
  auto strip = [&](const std::string& name) {
    return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0
               ? name.substr(prefix.size())
               : name;
  };
  size_t stripped = 0;
  for (auto& e : in.entries) {
    for (auto& t : e.tensors) {
      std::string n = strip(t.name);
      stripped += n.size() != t.name.size();
      t.name = std::move(n);
    }
    for (auto& g : e.groups) {  // its members are named after it
      std::string n = strip(g.name);
      stripped += n.size() != g.name.size();
      g.name = std::move(n);
    }
  }
  if (in.value) {
    in.value = RenameEntries(
        *in.value, [](const std::string& n) { return n; },
        [&](const std::string&, const std::string& n) { return strip(n); });
  }
  return stripped;
}

}  // namespace

PackSummary PackFiles(const std::vector<PackSource>& sources, const std::string& output,
                      const PackFilesOptions& options) {
  if (sources.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                "pack: expected at least one INPUT or --entry NAME=FILE");
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (!sources[i].entry.empty() && sources[i].entry == sources[j].entry) {
        throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                    "--entry " + sources[i].entry + " is given twice (" + sources[j].path +
                        " and " + sources[i].path + "); each entry takes one input");
      }
    }
  }
  if (!options.architecture.empty() && sources.size() != 1) {
    throw Error(
        ErrorCode::kInvalidArgument, "", std::nullopt,
        "--arch: expected one input, a TorchScript file, found " + std::to_string(sources.size()));
  }
  PackSummary summary;
  PackOptions pack = options.pack;
  pack.progress = [&](uint64_t done, uint64_t all) {
    // An input truncated while its bytes were read: named, before anything
    // is published (importer::MappedInput).
    importer::CheckInputsUnchanged();
    summary.nbytes = all;
    if (options.pack.progress) options.pack.progress(done, all);
  };
  pack.note = [&](const std::string& line) {
    summary.notes.push_back(line);
    if (options.pack.note) options.pack.note(line);
    if (options.note) options.note(line);
  };
  if (!options.architecture.empty() && !options.torch.architecture) {
    throw Error(ErrorCode::kUnsupported, output, std::nullopt,
                "--arch: only LibTorch writes an architecture file, and no LibTorch support "
                "was given (PackFilesOptions::torch)");
  }
  writer::ArchiveWriter writer(output, pack);
  std::unordered_map<std::string, std::string> entry_inputs;  // entry name: its input
  std::unordered_set<std::string> selectors_matched;          // --only/--exclude names seen
  size_t stripped = 0;                                        // names --strip-prefix changed
  std::vector<std::string> seen_entries;                      // before --only/--exclude
  std::vector<importer::Imported> imported;  // keeps the input mappings alive until finish()
  for (const PackSource& s : sources) {
    importer::ImportOptions io;
    io.strict = options.strict;
    io.default_entry = s.entry.empty() ? options.pack.entry : s.entry;
    io.torchscript = options.torch.import_torchscript;
    io.follow_symlinks = options.follow_symlinks;
    importer::Imported in = importer::Import(s.path, io);
    if (!options.architecture.empty() && in.kind != importer::InputKind::kTorchScript) {
      throw Error(ErrorCode::kInvalidArgument, s.path, std::nullopt,
                  std::string("--arch: this is a ") + importer::InputKindName(in.kind) +
                      " file, which holds weights only; an architecture comes from a "
                      "TorchScript file (torch.jit.script or trace, then torch.jit.save)");
    }
    if (AllFloatingBroadcast(in)) {
      const std::string what =
          "every floating-point tensor is a broadcast view (a stride of 0): this looks like a "
          "weightless architecture, not trained weights";
      if (options.strict) throw Error(ErrorCode::kBadInput, s.path, std::nullopt, what);
      summary.notes.push_back(s.path + ": " + what + " (packed as it is; --strict refuses it)");
      if (options.note) options.note(summary.notes.back());
    }
    // §4.7.1: writers must not write a "file:" key that is not an attached
    // file; an input's (a safetensors __metadata__ key, an older archive's
    // record) stays out, with a note, before the tree is decided on.
    for (auto it = in.metadata.begin(); it != in.metadata.end();) {
      const std::string why = writer::FileKeyRefusal(it->key, it->value, it->entry);
      if (why.empty()) {
        ++it;
        continue;
      }
      summary.notes.push_back(s.path + ": metadata " + format::Quote(it->key) +
                              ": not written: a key starting with \"file:\" names an attached "
                              "file (spec §4.7.1), and this one is not one: " +
                              why);
      if (options.note) options.note(summary.notes.back());
      it = in.metadata.erase(it);
    }
    const bool prefix = !s.entry.empty() && in.entries.size() > 1;
    if (prefix && in.value) {
      in.value = RenameEntries(*in.value, [&](const std::string& n) { return s.entry + "." + n; });
    }
    if (prefix) {
      for (auto& e : in.entries) e.name = s.entry + "." + e.name;
      for (auto& m : in.metadata) {
        if (!m.entry.empty()) m.entry = s.entry + "." + m.entry;
      }
    }
    if ((!options.only.empty() || !options.exclude.empty()) &&
        SelectEntries(in, options, selectors_matched, seen_entries)) {
      // The tree would name what is gone: the kept entries and metadata stay.
      if (in.value && !in.value->is(Value::Kind::kEntry)) {
        summary.notes.push_back(s.path +
                                ": entries selected: the archive keeps their state_dicts and "
                                "metadata, not the rest of the checkpoint's structure");
        if (options.note) options.note(summary.notes.back());
      }
      in.value.reset();
    }
    if (!options.strip_prefix.empty()) stripped += StripPrefix(in, options.strip_prefix);
    // A checkpoint's structure: stored as a tree when the entries and metadata
    // alone would not give it back. Its metadata was derived from it, so only
    // the tree is kept.
    // Several inputs make one dict of entries; each must fit in entries and
    // metadata (the types of its dicts and its key order are not kept).
    const bool tree = sources.size() == 1 && NeedsTree(in, options.metadata);
    if (sources.size() > 1 && in.value && !FitsEntries(*in.value)) {
      throw Error(ErrorCode::kInvalidArgument, s.path, std::nullopt,
                  "holds a checkpoint whose structure (lists, tuples, None, nested dicts, "
                  "objects, tensors outside a state_dict) only a value tree keeps, and a tree "
                  "describes a whole archive: pack this file on its own");
    }
    if (tree) {
      writer.set_value(*in.value);
      if (!in.metadata_beside_tree) in.metadata.clear();
    }
    for (auto& e : in.entries) {
      CheckInputName(s.path, "entry", e.name);
      for (const auto& t : e.tensors) CheckInputName(s.path, "tensor", t.name);
      for (const auto& g : e.groups) {
        CheckInputName(s.path, "group", g.name);
        for (const auto& [suffix, part] : g.group.components)
          CheckInputName(s.path, "tensor", g.name + suffix);
      }
      CheckInputTensors(s.path, e, options.pack);
      if (const auto [it, fresh] = entry_inputs.emplace(e.name, s.path); !fresh) {
        throw Error(ErrorCode::kInvalidArgument, s.path, std::nullopt,
                    "entry " + format::Quote(e.name) + " comes from " + it->second +
                        " already; give the inputs entry names of their own with --entry "
                        "NAME=FILE");
      }
      summary.entries.push_back(e.name);
      writer.add_entry(e.name);
      // Each group where it stands (§4.13: before tensors[before]); the
      // writer keeps the order it is given.
      size_t next_group = 0;
      for (size_t i = 0; i <= e.tensors.size(); ++i) {
        for (; next_group < e.groups.size() && e.groups[next_group].before <= i; ++next_group) {
          const auto& g = e.groups[next_group];
          writer.add_sparse(g.name, g.group);
        }
        if (i < e.tensors.size()) {
          const auto& t = e.tensors[i];
          writer.add(t.name, t.tensor, t.role);
        }
      }
      summary.tensors += e.tensors.size();
      for (const auto& g : e.groups) summary.tensors += g.group.components.size();
    }
    for (auto& m : in.metadata) {
      CheckInputName(s.path, "metadata", m.key, "key");
      // Moved: an attached file's bytes are held once (import_transformers.h).
      writer.add_metadata(m.key, std::move(m.value), m.entry);
    }
    in.metadata.clear();
    for (const auto& line : in.skipped) {
      summary.notes.push_back(s.path + ": " + line);
      if (options.note) options.note(summary.notes.back());
    }
    imported.push_back(std::move(in));
  }
  for (const auto* list : {&options.only, &options.exclude}) {
    for (const auto& name : *list) {
      if (selectors_matched.count(name)) continue;
      std::string all;
      for (const auto& e : seen_entries) all += (all.empty() ? "" : ", ") + format::Quote(e);
      throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                  std::string(list == &options.only ? "--only " : "--exclude ") + name +
                      ": no input has an entry of that name (the entries are " + all + ")");
    }
  }
  if (!options.strip_prefix.empty() && stripped == 0) {
    throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                "--strip-prefix " + format::Quote(options.strip_prefix) +
                    ": no tensor name starts with it");
  }
  for (const auto& [key, value] : options.metadata) writer.add_metadata(key, value);
  std::function<void(bool)> publish_architecture;
  if (!options.architecture.empty()) {
    publish_architecture = options.torch.architecture(sources[0].path, options.architecture);
  }
  try {
    writer.finish();
  } catch (const Error&) {
    // A write from a mapping whose file was truncated fails with EFAULT
    // ("<output>: cannot write: Bad address"): the input is what changed.
    importer::CheckInputsUnchanged(true);
    throw;
  }
  if (publish_architecture) publish_architecture(options.pack.durable);
  return summary;
}

}  // namespace tsar
