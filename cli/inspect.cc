// `tsar inspect ARCHIVE [--json]`: what an archive holds, for people and scripts.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/describe.h"
#include "cli/groups.h"
#include "cli/tensor_parallel.h"
#include "format/attached_file.h"
#include "format/reader.h"
#include "tsar/archive_file.h"
#include "writer/json_util.h"

namespace tsar::cli {
namespace {

bool Contiguous(const TensorInfo& t) {
  int64_t expect = 1;
  for (size_t i = t.sizes.size(); i-- > 0;) {
    if (t.sizes[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.sizes[i];
  }
  return true;
}

// Logical bytes (numel x element size). The spec bounds numel by 2^63 - 1,
// not numel x element size: a broadcast view such as expand(2^31, 2^31) of a
// float has 2^64 logical bytes while its storage holds 4. Exact in 128 bits.
unsigned __int128 Numel(const TensorInfo& t) {
  unsigned __int128 n = 1;
  for (int64_t s : t.sizes) n *= static_cast<uint64_t>(s);
  return n;
}
unsigned __int128 TensorBytes(const TensorInfo& t) { return Numel(t) * ElementSize(t.dtype); }

// Text columns, each as wide as its widest cell: Fit every row first, then
// Print. Columns marked 'r' in `align` are right-aligned; a left-aligned last
// column is not padded.
class Columns {
 public:
  explicit Columns(std::string align) : align_(std::move(align)), width_(align_.size()) {}
  void Fit(const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) width_[i] = std::max(width_[i], cells[i].size());
  }
  void Print(const std::vector<std::string>& cells) const {
    std::string line;
    for (size_t i = 0; i < cells.size(); ++i) {
      const size_t pad = width_[i] - cells[i].size();
      const bool right = align_[i] == 'r';
      line += "  ";  // an indent, then between columns
      if (right) line.append(pad, ' ');
      line += cells[i];
      if (!right && i + 1 < cells.size()) line.append(pad, ' ');
    }
    std::printf("%s\n", line.c_str());
  }

 private:
  std::string align_;
  std::vector<size_t> width_;
};

// "11,689,512": decimal with thousands separators, exact past 64 bits.
std::string Grouped(unsigned __int128 n) {
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(n % 10)));
    n /= 10;
  } while (n);
  for (size_t i = digits.size(); i > 3; i -= 3) digits.insert(i - 3, ",");
  return digits;
}

// The archive's sums: elements by role, and per dtype the tensors, their
// elements and the bytes of the storages they use (each storage counted once,
// under the dtype of its first tensor).
struct Totals {
  unsigned __int128 elements = 0, parameters = 0, buffers = 0;
  struct PerDtype {
    size_t tensors = 0;
    unsigned __int128 elements = 0;
    uint64_t stored_bytes = 0;
  };
  std::map<std::string, PerDtype> dtypes;
};

Totals Sum(const std::vector<TensorInfo>& infos, const std::vector<StorageInfo>& storages) {
  Totals t;
  std::vector<bool> counted(storages.size());
  for (const auto& i : infos) {
    const unsigned __int128 n = Numel(i);
    t.elements += n;
    if (i.role == Role::kParameter) t.parameters += n;
    if (i.role == Role::kBuffer) t.buffers += n;
    auto& d = t.dtypes[std::string(DTypeName(i.dtype))];
    ++d.tensors;
    d.elements += n;
    if (!counted[i.storage]) {
      counted[i.storage] = true;
      d.stored_bytes += storages[i.storage].nbytes;
    }
  }
  return t;
}

// As a JSON number: an integer when it fits 64 bits, else a double.
nlohmann::ordered_json JsonBytes(unsigned __int128 n) {
  if (n <= UINT64_MAX) return static_cast<uint64_t>(n);
  return static_cast<double>(n);
}

// The decimal text of a bigint (little-endian two's complement).
std::string BigIntText(const std::string& le) {
  std::vector<uint8_t> mag(le.begin(), le.end());
  const bool negative = !mag.empty() && (mag.back() & 0x80);
  if (negative) {  // magnitude = two's complement negated
    bool carry = true;
    for (auto& b : mag) {
      b = static_cast<uint8_t>(~b);
      if (carry) carry = ++b == 0;
    }
  }
  std::string digits;
  for (bool zero = false; !zero;) {  // divide by 10 until the magnitude is 0
    unsigned rem = 0;
    zero = true;
    for (size_t i = mag.size(); i-- > 0;) {
      const unsigned cur = (rem << 8) | mag[i];
      mag[i] = static_cast<uint8_t>(cur / 10);
      rem = cur % 10;
      zero = zero && mag[i] == 0;
    }
    digits.insert(digits.begin(), static_cast<char>('0' + rem));
  }
  return (negative ? "-" : "") + digits;
}

size_t OpaqueBytes(const Value& v) {
  size_t n = 0;
  for (const auto& s : v.segments()) n += s.size();
  return n;
}

// One line for a value: scalars in full, containers by kind and size.
std::string ValueLine(const Value& v) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kNone:
      return "None";
    case K::kBool:
      return v.as_bool() ? "True" : "False";
    case K::kInt:
      return std::to_string(v.as_int());
    case K::kBigInt:
      return BigIntText(v.bytes());
    case K::kFloat:
      return FloatText(v.as_float());
    case K::kStr:
      return format::Quote(v.bytes());
    case K::kBytes:
      return "b" + format::Quote(v.bytes()) + " (" + std::to_string(v.bytes().size()) + " bytes)";
    case K::kList:
    case K::kTuple:
      return std::string(ValueKindName(v.kind())) + " of " + std::to_string(v.items().size());
    case K::kDict:
      return std::string(v.ordered() ? "OrderedDict" : "dict") + " of " +
             std::to_string(v.pairs().size()) + (v.attributes() ? ", with attributes" : "");
    case K::kTensor:
      return "tensor " + Printable(v.entry()) + "/" + Printable(v.name());
    case K::kEntry:
      return std::string(v.ordered() ? "OrderedDict" : "dict") + ": the tensors of entry \"" +
             Printable(v.entry()) + "\"" + (v.attributes() ? ", with attributes" : "");
    case K::kOpaque:
      return "opaque " + Printable(v.bytes()) + " (" + std::to_string(OpaqueBytes(v)) +
             " bytes of pickle, never run by tsar; " + std::to_string(v.items().size()) +
             " tensors)";
  }
  return "";
}

// The tree as indented lines, at most `budget` of them.
void PrintValue(const Value& v, const std::string& label, int depth, size_t& budget) {
  if (budget == 0) return;
  --budget;
  std::printf("%*s%s%s\n", 2 + 2 * depth, "", label.empty() ? "" : (label + ": ").c_str(),
              ValueLine(v).c_str());
  using K = Value::Kind;
  if (v.is(K::kList) || v.is(K::kTuple) || v.is(K::kOpaque)) {
    for (size_t k = 0; k < v.items().size(); ++k)
      PrintValue(v.items()[k], std::to_string(k), depth + 1, budget);
  } else if (v.is(K::kDict)) {
    for (const auto& [k, x] : v.pairs()) PrintValue(x, ValueLine(k), depth + 1, budget);
  }
  if (const Value* a = v.attributes()) PrintValue(*a, "(attributes)", depth + 1, budget);
}

nlohmann::ordered_json ValueJson(const Value& v) {
  using K = Value::Kind;
  nlohmann::ordered_json j;
  j["kind"] = ValueKindName(v.kind());
  switch (v.kind()) {
    case K::kNone:
      break;
    case K::kBool:
      j["value"] = v.as_bool();
      break;
    case K::kInt:
      j["value"] = v.as_int();
      break;
    case K::kBigInt:
      j["value"] = BigIntText(v.bytes());
      break;
    case K::kFloat:
      if (std::isfinite(v.as_float())) {
        j["value"] = v.as_float();
      } else {
        j["value"] = FloatText(v.as_float());
      }
      break;
    case K::kStr:
      j["value"] = format::IsValidUtf8(v.bytes()) ? v.bytes() : std::string();
      break;
    case K::kBytes: {
      std::string hex;
      char b[3];
      for (unsigned char c : v.bytes()) {
        std::snprintf(b, sizeof b, "%02x", c);
        hex += b;
      }
      j["hex"] = hex;
      break;
    }
    case K::kList:
    case K::kTuple: {
      auto& items = j["items"] = nlohmann::ordered_json::array();
      for (const auto& x : v.items()) items.push_back(ValueJson(x));
      break;
    }
    case K::kDict: {
      j["ordered"] = v.ordered();
      auto& items = j["items"] = nlohmann::ordered_json::array();
      for (const auto& [k, x] : v.pairs())
        items.push_back(nlohmann::ordered_json::array({ValueJson(k), ValueJson(x)}));
      break;
    }
    case K::kTensor:
      j["entry"] = v.entry();
      j["name"] = v.name();
      break;
    case K::kEntry:
      j["entry"] = v.entry();
      j["ordered"] = v.ordered();
      break;
    case K::kOpaque: {
      j["label"] = v.bytes();
      j["pickle_bytes"] = OpaqueBytes(v);
      auto& items = j["items"] = nlohmann::ordered_json::array();
      for (const auto& x : v.items()) items.push_back(ValueJson(x));
      break;
    }
  }
  if (const Value* a = v.attributes()) j["attributes"] = ValueJson(*a);
  return j;
}

// One JSON object on stdout, byte for byte as nlohmann's dump(2) writes it,
// written a member (or an array item) at a time.
class JsonStream {
 public:
  JsonStream() { buf_ = "{"; }
  void Member(const std::string& key, const nlohmann::ordered_json& value) {
    Key(key);
    Put(value, 1);
  }
  void BeginArray(const std::string& key) {
    Key(key);
    buf_ += '[';
    items_ = 0;
  }
  void Item(const nlohmann::ordered_json& value) {
    buf_ += items_++ ? ",\n    " : "\n    ";
    Put(value, 2);
    if (buf_.size() > (1 << 20)) Flush();
  }
  // A tensor as Item() writes its object, without building one: at 100,000
  // tensors the objects and their dump() were most of inspect --json.
  void TensorItem(const TensorInfo& t, bool shared) {
    buf_ += items_++ ? ",\n    {" : "\n    {";
    Field("name"), String(t.name);
    Field("entry"), String(t.entry);
    Field("dtype"), String(DTypeName(t.dtype));
    Field("shape"), Integers(t.sizes);
    Field("strides"), Integers(t.strides);
    Field("storage_offset"), Integer(t.storage_offset);
    Field("storage"), Integer(t.storage);
    Field("shared"), buf_ += shared ? "true" : "false";
    const unsigned __int128 nbytes = TensorBytes(t);
    Field("nbytes");
    if (nbytes <= UINT64_MAX) {
      Integer(static_cast<uint64_t>(nbytes));
    } else {
      buf_ += JsonBytes(nbytes).dump();
    }
    Field("role"), String(RoleName(t.role));
    Field("requires_grad"), buf_ += t.requires_grad ? "true" : "false";
    if (t.shard_dim >= 0) Field("shard_dim"), Integer(static_cast<uint64_t>(t.shard_dim));
    buf_ += "\n    }";
    if (buf_.size() > (1 << 20)) Flush();
  }
  void EndArray() { buf_ += items_ ? "\n  ]" : "]"; }
  void End() {
    buf_ += members_ ? "\n}\n" : "}\n";
    Flush();
  }

 private:
  void Key(const std::string& key) {
    buf_ += members_++ ? ",\n  " : "\n  ";
    buf_ += nlohmann::ordered_json(key).dump() + ": ";
  }
  // `value` as dump(2) writes it `depth` levels deep (its strings hold no
  // raw newline: dump escapes them).
  void Put(const nlohmann::ordered_json& value, int depth) {
    const std::string pad(2 * static_cast<size_t>(depth), ' ');
    for (char c : value.dump(2)) {
      buf_ += c;
      if (c == '\n') buf_ += pad;
    }
  }
  // Members of a TensorItem, three levels deep, as dump(2) writes them.
  std::string& Field(const char* key) {
    buf_ += buf_.back() == '{' ? "\n      \"" : ",\n      \"";
    buf_ += key;
    buf_ += "\": ";
    return buf_;
  }
  void String(std::string_view v) {
    // dump() escapes '"', '\\' and control characters and writes the rest
    // as is (the names were checked UTF-8 when the archive was opened).
    const bool plain = std::none_of(v.begin(), v.end(), [](char c) {
      return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
    });
    if (plain) {
      buf_ += '"';
      buf_ += v;
      buf_ += '"';
    } else {
      buf_ += nlohmann::ordered_json(std::string(v)).dump();
    }
  }
  template <typename T>
  void Integer(T v) {
    char text[24];
    buf_.append(text, std::to_chars(text, text + sizeof text, v).ptr);
  }
  void Integers(const std::vector<int64_t>& v) {
    if (v.empty()) {
      buf_ += "[]";
      return;
    }
    for (size_t i = 0; i < v.size(); ++i) {
      buf_ += i ? ",\n        " : "[\n        ";
      Integer(v[i]);
    }
    buf_ += "\n      ]";
  }
  void Flush() {
    std::fwrite(buf_.data(), 1, buf_.size(), stdout);
    buf_.clear();
  }
  std::string buf_;
  size_t members_ = 0, items_ = 0;
};

// Where a storage's bytes are, for the STORAGE column: "" in this file.
std::string LayerNote(uint32_t layer) {
  if (layer == 0) return "";
  return layer == 1 ? " base" : " base" + std::to_string(layer);
}

// §4.7.1: the archive-level metadata that is an attached file (a bytes
// value under "file:" + a valid name), and the rest.
struct ArchiveMetadata {
  std::vector<std::pair<std::string, uint64_t>> files;  // name, size
  std::vector<std::pair<std::string, MetadataValue>> other;
};

ArchiveMetadata SplitMetadata(const ArchiveFile& a) {
  ArchiveMetadata m;
  for (auto& [k, v] : a.metadata_items()) {
    const std::string_view name = format::AttachedFileName(k);
    if (const auto* b = std::get_if<Bytes>(&v); b && !name.empty()) {
      m.files.emplace_back(std::string(name), b->data.size());
    } else {
      m.other.emplace_back(k, std::move(v));
    }
  }
  return m;
}

// §4.13: a tensor group, as one line and its attributes.
void PrintGroup(const GroupInfo& g) {
  const GroupSummary s = Summarize(g);
  std::string members;
  for (size_t k = 0; k < g.members.size(); ++k) {
    members += (k ? ", " : "") + (s.valid ? Printable(s.members[k].first) + " " : std::string()) +
               Printable(g.members[k]);
  }
  std::printf("  group %s: %s %s %s, of %s\n", Printable(g.name).c_str(),
              s.valid ? (Printable(s.library) + " " + Printable(s.cls) + " (" +
                         Printable(s.version) + ")")
                            .c_str()
                      : "a group whose description tsar cannot read,",
              std::string(DTypeName(g.dtype)).c_str(), Dims(g.sizes).c_str(), members.c_str());
  if (s.valid) std::printf("    attributes %s\n", Printable(s.attributes).c_str());
}

nlohmann::ordered_json GroupJson(const GroupInfo& g) {
  const GroupSummary s = Summarize(g);
  nlohmann::ordered_json j = {{"entry", g.entry},       {"name", g.name},
                              {"dtype", DTypeName(g.dtype)}, {"shape", g.sizes},
                              {"strides", g.strides}, {"members", g.members}};
  if (s.valid) {
    j["library"] = s.library;
    j["class"] = s.cls;
    j["version"] = s.version;
    nlohmann::ordered_json roles = nlohmann::ordered_json::array();
    for (const auto& [role, tensor] : s.members) roles.push_back(role);
    j["member_roles"] = roles;
  }
  j["description"] = g.description;
  return j;
}

int RunInspect(const std::string& path, bool json) {
  const ArchiveFile a = OpenArchive(path);
  const ArchiveMetadata archive_meta = SplitMetadata(a);
  const auto infos = a.infos();
  const auto storages = a.storages();
  std::vector<int> users(storages.size());
  for (const auto& t : infos) ++users[t.storage];
  uint64_t data = 0;
  for (const auto& s : storages) data += s.nbytes;
  // §4.11: what each file of a layer chain gives this archive.
  const std::vector<std::string> layers = a.layers();
  std::vector<std::pair<size_t, uint64_t>> per_layer(layers.size());  // storages, bytes
  for (const auto& s : storages) {
    ++per_layer[s.layer].first;
    per_layer[s.layer].second += s.nbytes;
  }

  const TpPlan tp = DescribeTp(a);
  if (json) {
    // Written member by member, as nlohmann's dump(2) of the whole object
    // would write it, but without the object: at 100,000 tensors the DOM
    // cost 440 MB and most of the time.
    JsonStream out;
    out.Member("path", path);
    out.Member("format_version",
               std::to_string(a.format_major()) + "." + std::to_string(a.format_minor()));
    out.Member("file_size", a.file_size());
    out.Member("alignment", a.alignment());
    out.Member("entries", a.entries());
    out.BeginArray("tensors");
    for (const auto& t : infos) out.TensorItem(t, users[t.storage] > 1);
    out.EndArray();
    out.BeginArray("storages");
    for (const auto& s : storages) {
      char hex[24];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(s.xxh3));
      nlohmann::ordered_json item = {
          {"id", s.id}, {"offset", s.offset}, {"nbytes", s.nbytes}, {"xxh3", hex}};
      if (a.is_layer()) {
        item["layer"] = s.layer;
        item["layer_storage"] = s.layer_storage;
      }
      out.Item(item);
    }
    out.EndArray();
    if (a.is_layer()) {  // layer 0 is this file, then its base, the base's base...
      nlohmann::ordered_json chain = nlohmann::ordered_json::array();
      for (size_t i = 0; i < layers.size(); ++i) {
        chain.push_back({{"path", layers[i]},
                         {"storages", per_layer[i].first},
                         {"bytes", per_layer[i].second}});
      }
      out.Member("layers", chain);
    }
    if (tp.world) {  // §4.12
      nlohmann::ordered_json dims = nlohmann::ordered_json::object();
      for (const auto& [d, n] : tp.by_dim) dims[std::to_string(d)] = n;
      out.Member("tensor_parallel", {{"world", tp.world},
                                     {"sharded_tensors", tp.sharded_tensors},
                                     {"by_dim", dims},
                                     {"sharded_bytes", tp.sharded_bytes},
                                     {"replicated_bytes", tp.replicated_bytes},
                                     {"rank_bytes", tp.rank_bytes}});
    }
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : archive_meta.other) json::Append(meta, k, MetaJson(v));
    out.Member("metadata", meta);
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    for (const auto& [name, size] : archive_meta.files) files.push_back({{"name", name}, {"bytes", size}});
    out.Member("files", files);
    nlohmann::ordered_json entry_meta = nlohmann::ordered_json::object();
    for (const auto& e : a.entries()) {
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (const auto& [k, v] : a.metadata_items(e)) json::Append(m, k, MetaJson(v));
      if (!m.empty()) json::Append(entry_meta, e, std::move(m));
    }
    out.Member("entry_metadata", entry_meta);
    nlohmann::ordered_json groups = nlohmann::ordered_json::array();  // §4.13
    for (const auto& e : a.entries()) {
      for (const GroupInfo& g : a.groups(e)) groups.push_back(GroupJson(g));
    }
    out.Member("groups", groups);
    const Totals totals = Sum(infos, storages);
    nlohmann::ordered_json dtypes = nlohmann::ordered_json::object();
    for (const auto& [name, d] : totals.dtypes) {
      json::Append(dtypes, name,
                   {{"tensors", d.tensors},
                    {"elements", JsonBytes(d.elements)},
                    {"stored_bytes", d.stored_bytes}});
    }
    out.Member("totals", {{"elements", JsonBytes(totals.elements)},
                          {"parameters", JsonBytes(totals.parameters)},
                          {"buffers", JsonBytes(totals.buffers)},
                          {"dtypes", std::move(dtypes)}});
    out.Member("value_stored", a.has_value_tree());
    out.Member("value", ValueJson(a.value()));
    out.End();
    return kExitOk;
  }

  std::printf(
      "%s: tsar format %u.%u, %zu tensors in %zu entr%s, %zu storages, %s of data, %s file, "
      "alignment %u\n",
      path.c_str(), a.format_major(), a.format_minor(), infos.size(), a.entries().size(),
      a.entries().size() == 1 ? "y" : "ies", storages.size(), HumanBytes(data).c_str(),
      HumanBytes(a.file_size()).c_str(), a.alignment());
  if (a.is_layer()) {
    std::printf("\nlayers: what each file of the chain gives (storages, bytes)\n");
    for (size_t i = 0; i < layers.size(); ++i) {
      std::printf("  %s %s: %zu storage%s, %s\n",
                  i == 0   ? "this layer"
                  : i == 1 ? "base      "
                           : "base of base",
                  Printable(layers[i]).c_str(), per_layer[i].first,
                  per_layer[i].first == 1 ? "" : "s", HumanBytes(per_layer[i].second).c_str());
    }
  }
  if (tp.world) {
    std::string dims;
    for (const auto& [d, n] : tp.by_dim)
      dims += (dims.empty() ? "" : ", ") + ("dim " + std::to_string(d)) + ": " + std::to_string(n);
    std::printf(
        "\ntensor parallel: %u ranks; %zu tensors split (%s), %s of slices; %s stored whole\n"
        "  each rank reads %s: its slices (%s) and every whole tensor\n",
        tp.world, tp.sharded_tensors, dims.c_str(), HumanBytes(tp.sharded_bytes).c_str(),
        HumanBytes(tp.replicated_bytes).c_str(), HumanBytes(tp.rank_bytes).c_str(),
        HumanBytes(tp.rank_bytes - tp.replicated_bytes).c_str());
  }
  const std::vector<std::string> header = {"NAME", "DTYPE", "SHAPE", "STORAGE", "BYTES", "ROLE"};
  Columns columns("llllrl");  // BYTES right-aligned
  columns.Fit(header);
  std::vector<std::vector<std::string>> rows;
  rows.reserve(infos.size());
  for (const auto& t : infos) {
    std::string shape = Dims(t.sizes);
    if (!Contiguous(t)) shape += " strides " + Dims(t.strides);
    if (t.storage_offset) shape += " +" + std::to_string(t.storage_offset);
    if (t.shard_dim >= 0) shape += " split dim " + std::to_string(t.shard_dim);
    rows.push_back({Printable(t.name), std::string(DTypeName(t.dtype)), shape,
                    "#" + std::to_string(t.storage) + (users[t.storage] > 1 ? " shared" : "") +
                        LayerNote(storages[t.storage].layer),
                    HumanBytes(static_cast<double>(TensorBytes(t))),
                    std::string(RoleName(t.role)) + (t.requires_grad ? " requires_grad" : "")});
    columns.Fit(rows.back());
  }
  // Rows of each entry, in index order.
  std::map<std::string, std::vector<size_t>> by_entry;
  for (size_t i = 0; i < infos.size(); ++i) by_entry[infos[i].entry].push_back(i);
  for (const auto& e : a.entries()) {
    std::printf("\nentry \"%s\"\n", Printable(e).c_str());
    columns.Print(header);
    for (size_t i : by_entry[e]) columns.Print(rows[i]);
    const std::vector<GroupInfo> groups = a.groups(e);
    std::set<std::string> described;  // their "group:" metadata, shown as groups
    for (const GroupInfo& g : groups) {
      described.insert("group:" + g.name);
      PrintGroup(g);
    }
    for (const auto& [k, v] : a.metadata_items(e)) {
      if (described.count(k) == 0)
        std::printf("  metadata %s = %s\n", Printable(k).c_str(), MetaText(v).c_str());
    }
  }
  const Totals totals = Sum(infos, storages);
  std::printf("\ntotals: %s elements in %zu tensors", Grouped(totals.elements).c_str(),
              infos.size());
  if (totals.parameters || totals.buffers) {
    std::printf(" (parameters %s, buffers %s)", Grouped(totals.parameters).c_str(),
                Grouped(totals.buffers).c_str());
  }
  std::printf(", %s stored\n", HumanBytes(data).c_str());
  std::vector<std::vector<std::string>> dtype_rows = {{"DTYPE", "TENSORS", "ELEMENTS", "STORED"}};
  for (const auto& [name, d] : totals.dtypes) {
    dtype_rows.push_back(
        {name, std::to_string(d.tensors), Grouped(d.elements), HumanBytes(d.stored_bytes)});
  }
  Columns dtype_columns("lrrr");
  for (const auto& r : dtype_rows) dtype_columns.Fit(r);
  for (const auto& r : dtype_rows) dtype_columns.Print(r);
  if (!archive_meta.other.empty()) {
    std::printf("\nmetadata\n");
    for (const auto& [k, v] : archive_meta.other)
      std::printf("  %s = %s\n", Printable(k).c_str(), MetaText(v).c_str());
  }
  if (!archive_meta.files.empty()) {  // §4.7.1
    uint64_t total = 0;
    Columns columns("lr");
    std::vector<std::vector<std::string>> rows;
    for (const auto& [name, size] : archive_meta.files) {
      total += size;
      rows.push_back({Printable(name), HumanBytes(size)});
      columns.Fit(rows.back());
    }
    std::printf("\nfiles: %zu attached, %s (tsar.transformers reads them; metadata keys \"file:NAME\")\n",
                rows.size(), HumanBytes(total).c_str());
    for (const auto& r : rows) columns.Print(r);
  }
  if (a.has_value_tree()) {  // format 1.1: what the packed checkpoint was, as a whole
    std::printf("\nvalue (the packed object; tsar export -o FILE.pt gives it back)\n");
    size_t budget = 400;
    PrintValue(a.value(), "", 0, budget);
    if (budget == 0) std::printf("  ... (more in tsar inspect --json)\n");
  }
  return kExitOk;
}

}  // namespace

Run AddInspect(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  CLI::App* sub =
      app.add_subcommand("inspect", "Show the tensors, storages and metadata of an archive");
  sub->add_option("archive", *path, "The .tsar file")->required();
  sub->add_flag("--json", *json, "One JSON object on stdout (schema in docs/cli.md)");
  sub->footer(
      "Examples:\n"
      "  tsar inspect model.tsar\n"
      "  tsar inspect model.tsar --json | jq '.tensors[] | select(.shared) | .name'");
  return [path, json] { return RunInspect(*path, *json); };
}

}  // namespace tsar::cli
