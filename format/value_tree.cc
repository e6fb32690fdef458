// tsar::Value and its encoding as the value and link tables of spec §4.10.
#include "format/value_tree.h"

#include <cstring>

#include "format/endian.h"
#include "format/reader.h"
#include "tsar/error.h"

namespace tsar {

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.i_ = b ? 1 : 0;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::BigInt(std::string twos_complement_le) {
  Value v;
  v.kind_ = Kind::kBigInt;
  v.s_ = std::move(twos_complement_le);
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.i_ = static_cast<int64_t>(format::DoubleToBits(f));
  return v;
}
double Value::as_float() const { return format::BitsToDouble(static_cast<uint64_t>(i_)); }
Value Value::Str(std::string s) {
  Value v;
  v.kind_ = Kind::kStr;
  v.s_ = std::move(s);
  return v;
}
Value Value::Bytes(std::string b) {
  Value v;
  v.kind_ = Kind::kBytes;
  v.s_ = std::move(b);
  return v;
}
Value Value::List(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kList;
  v.items_ = std::move(items);
  return v;
}
Value Value::Tuple(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kTuple;
  v.items_ = std::move(items);
  return v;
}
Value Value::Dict(std::vector<std::pair<Value, Value>> pairs, bool ordered) {
  Value v;
  v.kind_ = Kind::kDict;
  v.pairs_ = std::move(pairs);
  v.ordered_ = ordered;
  return v;
}
Value Value::Tensor(std::string entry, std::string name) {
  Value v;
  v.kind_ = Kind::kTensor;
  v.entry_ = std::move(entry);
  v.name_ = std::move(name);
  return v;
}
Value Value::Entry(std::string entry, bool ordered) {
  Value v;
  v.kind_ = Kind::kEntry;
  v.entry_ = std::move(entry);
  v.ordered_ = ordered;
  return v;
}
Value Value::Opaque(std::string label, std::vector<std::string> segments,
                    std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kOpaque;
  v.s_ = std::move(label);
  v.segments_ = std::move(segments);
  v.items_ = std::move(items);
  return v;
}

void Value::set_attributes(Value dict) {
  attrs_.clear();
  attrs_.push_back(std::move(dict));
}

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : pairs_) {
    if (k.kind_ == Kind::kStr && k.s_ == key) return &v;
  }
  return nullptr;
}

bool Value::operator==(const Value& o) const {
  return kind_ == o.kind_ && ordered_ == o.ordered_ && i_ == o.i_ && s_ == o.s_ &&
         entry_ == o.entry_ && name_ == o.name_ && items_ == o.items_ && pairs_ == o.pairs_ &&
         attrs_ == o.attrs_ && segments_ == o.segments_;
}

const char* ValueKindName(Value::Kind kind) noexcept {
  return format::ValueKindName(static_cast<format::ValueKind>(kind));
}

namespace format {
namespace {

[[noreturn]] void Misuse(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "", std::nullopt, "value tree: " + message);
}

struct Encoder {
  const TensorLookup& tensor;
  const EntryLookup& entry;
  std::vector<ValueSpec> out;

  uint32_t Add(ValueSpec spec) {
    out.push_back(std::move(spec));
    return static_cast<uint32_t>(out.size() - 1);
  }
  // Appends `v` and its subtree in pre-order; returns v's index.
  uint32_t Encode(const Value& v, uint32_t depth) {
    if (depth > kMaxValueDepth)
      Misuse("expected at most " + std::to_string(kMaxValueDepth) + " levels, found more");
    ValueSpec s;
    s.kind = static_cast<ValueKind>(v.kind());
    switch (v.kind()) {
      case Value::Kind::kNone:
        break;
      case Value::Kind::kBool:
        s.value = v.as_bool() ? 1 : 0;
        break;
      case Value::Kind::kInt:
        s.value = static_cast<uint64_t>(v.as_int());
        break;
      case Value::Kind::kFloat:
        s.value = DoubleToBits(v.as_float());
        break;
      case Value::Kind::kBigInt:
      case Value::Kind::kStr:
      case Value::Kind::kBytes:
        s.bytes = v.bytes();
        break;
      case Value::Kind::kTensor: {
        const uint32_t t = tensor(v.entry(), v.name());
        if (t == kNone)
          Misuse("tensor " + Quote(v.entry() + "/" + v.name()) + ": not in the archive");
        s.value = t;
        break;
      }
      case Value::Kind::kEntry: {
        const uint32_t e = entry(v.entry());
        if (e == kNone) Misuse("entry " + Quote(v.entry()) + ": not in the archive");
        s.value = e;
        break;
      }
      case Value::Kind::kList:
      case Value::Kind::kTuple:
      case Value::Kind::kDict:
      case Value::Kind::kOpaque:
        break;
    }
    if (v.kind() == Value::Kind::kOpaque) {
      if (v.segments().size() != v.items().size() + 1)
        Misuse("opaque " + Quote(v.bytes()) + ": expected one segment more than items, found " +
               std::to_string(v.segments().size()) + " and " + std::to_string(v.items().size()));
      s.bytes = v.bytes();
    }
    if ((v.is(Value::Kind::kDict) || v.is(Value::Kind::kEntry)) && v.ordered())
      s.flags |= kValueFlagOrdered;
    if (v.attributes()) s.flags |= kValueFlagAttributes;
    const uint32_t self = Add(std::move(s));
    std::vector<uint32_t> links;
    switch (v.kind()) {
      case Value::Kind::kList:
      case Value::Kind::kTuple:
        for (const auto& x : v.items()) links.push_back(Encode(x, depth + 1));
        break;
      case Value::Kind::kDict:
        for (const auto& [k, x] : v.pairs()) {
          links.push_back(Encode(k, depth + 1));
          links.push_back(Encode(x, depth + 1));
        }
        break;
      case Value::Kind::kOpaque:
        for (size_t k = 0; k < v.segments().size(); ++k) {
          links.push_back(Encode(Value::Bytes(v.segments()[k]), depth + 1));
          if (k < v.items().size()) links.push_back(Encode(v.items()[k], depth + 1));
        }
        break;
      default:
        break;
    }
    if (const Value* a = v.attributes()) {
      if (!v.is(Value::Kind::kDict) && !v.is(Value::Kind::kEntry))
        Misuse(std::string("attributes on a ") + ValueKindName(v.kind()) +
               ": expected them only on a dict or an entry");
      links.push_back(Encode(*a, depth + 1));
    }
    out[self].links = std::move(links);
    return self;
  }
};

Value Decode(const Index& index, uint32_t i) {
  const ValueRecord& r = index.values()[i];
  const uint32_t* links = index.links().data() + r.first_link;
  const bool attr = (r.flags & kValueFlagAttributes) != 0;
  const uint32_t n = r.count - (attr ? 1 : 0);
  Value v;
  switch (r.kind) {
    case ValueKind::kNone:
      break;
    case ValueKind::kBool:
      v = Value::Bool(r.value != 0);
      break;
    case ValueKind::kInt:
      v = Value::Int(static_cast<int64_t>(r.value));
      break;
    case ValueKind::kBigInt:
      v = Value::BigInt(std::string(r.bytes));
      break;
    case ValueKind::kFloat:
      v = Value::Float(BitsToDouble(r.value));
      break;
    case ValueKind::kStr:
      v = Value::Str(std::string(r.bytes));
      break;
    case ValueKind::kBytes:
      v = Value::Bytes(std::string(r.bytes));
      break;
    case ValueKind::kList:
    case ValueKind::kTuple: {
      std::vector<Value> items;
      items.reserve(n);
      for (uint32_t k = 0; k < n; ++k) items.push_back(Decode(index, links[k]));
      v = r.kind == ValueKind::kList ? Value::List(std::move(items))
                                     : Value::Tuple(std::move(items));
      break;
    }
    case ValueKind::kDict: {
      std::vector<std::pair<Value, Value>> pairs;
      pairs.reserve(n / 2);
      for (uint32_t k = 0; k + 1 < n; k += 2)
        pairs.emplace_back(Decode(index, links[k]), Decode(index, links[k + 1]));
      v = Value::Dict(std::move(pairs), (r.flags & kValueFlagOrdered) != 0);
      break;
    }
    case ValueKind::kTensor: {
      const TensorRecord& t = index.tensors()[r.value];
      v = Value::Tensor(std::string(index.entries()[t.entry].name), std::string(t.name));
      break;
    }
    case ValueKind::kEntry:
      v = Value::Entry(std::string(index.entries()[r.value].name),
                       (r.flags & kValueFlagOrdered) != 0);
      break;
    case ValueKind::kOpaque: {
      std::vector<std::string> segments;
      std::vector<Value> items;
      for (uint32_t k = 0; k < n; ++k) {
        if (k % 2 == 0) {
          segments.emplace_back(index.values()[links[k]].bytes);  // R91: a bytes value
        } else {
          items.push_back(Decode(index, links[k]));
        }
      }
      v = Value::Opaque(std::string(r.bytes), std::move(segments), std::move(items));
      break;
    }
  }
  if (attr) v.set_attributes(Decode(index, links[r.count - 1]));
  return v;
}

}  // namespace

std::vector<ValueSpec> EncodeTree(const Value& root, const TensorLookup& tensor,
                                  const EntryLookup& entry) {
  Encoder e{tensor, entry, {}};
  e.Encode(root, 0);
  return std::move(e.out);
}

Value DecodeTree(const Index& index) { return Decode(index, 0); }

}  // namespace format
}  // namespace tsar
