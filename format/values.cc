// The value and link tables of spec/FORMAT.md §4.10, checked by rules
// R82-R93 of §6.3 in the order §6.3 lists them.
#include "format/values.h"

namespace tsar::format {
namespace {

std::string Dec(uint64_t v) { return std::to_string(v); }

// "a dict", "an int": the kind with its article, for messages.
std::string AKind(ValueKind k) {
  const std::string name = ValueKindName(k);
  return (name[0] == 'i' || name[0] == 'e' || name[0] == 'o' ? "an " : "a ") + name;
}

bool HasLinks(ValueKind k) {
  return k == ValueKind::kList || k == ValueKind::kTuple || k == ValueKind::kDict ||
         k == ValueKind::kEntry || k == ValueKind::kOpaque;
}

// A bigint is the shortest little-endian two's complement of a value outside
// the int64 range: at least 9 bytes, and its last byte is needed (it is not a
// sign extension of the byte before).
bool CanonicalBigInt(std::string_view b) {
  if (b.size() < 9) return false;
  const auto last = static_cast<uint8_t>(b.back());
  const bool prev_negative = static_cast<uint8_t>(b[b.size() - 2]) & 0x80;
  return !(last == 0x00 && !prev_negative) && !(last == 0xFF && prev_negative);
}

}  // namespace

bool ValueHasBytes(ValueKind k) {
  return k == ValueKind::kStr || k == ValueKind::kBytes || k == ValueKind::kBigInt ||
         k == ValueKind::kOpaque;
}

const char* ValueKindName(ValueKind kind) {
  static constexpr const char* kNames[] = {"invalid", "none",   "bool",  "int",   "bigint",
                                           "float",   "str",    "bytes", "list",  "tuple",
                                           "dict",    "tensor", "entry", "opaque"};
  const auto k = static_cast<uint8_t>(kind);
  return k <= kValueKindMax ? kNames[k] : "invalid";
}

void DecodeValues(const ByteReader& r, uint64_t values_off, uint32_t value_count,
                  uint64_t links_off, uint32_t link_count, const ValueScope& scope,
                  std::vector<ValueRecord>* values_out, std::vector<uint32_t>* links_out) {
  const uint8_t* const base = r.data();
  std::vector<ValueRecord>& values = *values_out;
  values.assign(value_count, ValueRecord{});
  uint64_t next_link = 0;
  for (uint32_t i = 0; i < value_count; ++i) {
    const uint64_t off = values_off + uint64_t{i} * kValueRecordSize;
    const auto field = [i](const char* f) { return "value #" + Dec(i) + " " + f; };
    ValueRecord& v = values[i];
    const uint8_t kind = base[off];
    if (kind == 0 || kind > kValueKindMax) {  // R82
      r.Fail(ErrorCode::kInvalidValue, off, field("kind"), "1-" + Dec(kValueKindMax), Dec(kind));
    }
    v.kind = static_cast<ValueKind>(kind);
    for (uint64_t z :
         {uint64_t{2}, uint64_t{3}, uint64_t{12}, uint64_t{13}, uint64_t{14}, uint64_t{15}}) {
      if (base[off + z] != 0) {  // R83
        r.Fail(ErrorCode::kReservedNonZero, off + z, field("reserved"), "0",
               "0x" + HexBytes(base + off + z, 1));
      }
    }
    v.flags = base[off + 1];
    const bool dictlike = v.kind == ValueKind::kDict || v.kind == ValueKind::kEntry;
    const uint8_t allowed = dictlike ? (kValueFlagOrdered | kValueFlagAttributes) : 0;
    if ((v.flags & ~allowed) != 0) {  // R84
      r.Fail(ErrorCode::kInvalidValue, off + 1, field("flags"),
             dictlike ? "bits 0-1 only" : "0 for " + AKind(v.kind), Dec(v.flags));
    }
    v.count = LoadU32(base + off + 4);
    v.first_link = LoadU32(base + off + 8);
    if (v.first_link != next_link) {  // R85
      r.Fail(ErrorCode::kInvalidValue, off + 8, field("first_link"),
             Dec(next_link) + " (values partition the link table in order)", Dec(v.first_link));
    }
    next_link += v.count;
    if (next_link > link_count) {  // R86
      r.Fail(ErrorCode::kOutOfBounds, off + 4, field("count"),
             "at most " + Dec(link_count - v.first_link) + " (the links left)", Dec(v.count));
    }
    const uint32_t attr = (v.flags & kValueFlagAttributes) ? 1 : 0;
    const bool count_ok = !HasLinks(v.kind) ? v.count == 0
                          : v.kind == ValueKind::kDict
                              ? v.count >= attr && (v.count - attr) % 2 == 0
                          : v.kind == ValueKind::kEntry  ? v.count == attr
                          : v.kind == ValueKind::kOpaque ? v.count % 2 == 1
                                                         : true;
    if (!count_ok) {  // R86
      const char* want = !HasLinks(v.kind)             ? "0"
                         : v.kind == ValueKind::kDict  ? "2 per key/value pair, +1 for attributes"
                         : v.kind == ValueKind::kEntry ? "1 with attributes, else 0"
                                                       : "an odd count (segments around holes)";
      r.Fail(ErrorCode::kInvalidValue, off + 4, field("count"),
             std::string(want) + " for " + AKind(v.kind), Dec(v.count));
    }
    v.value = LoadU64(base + off + 16);
    const uint64_t length = LoadU64(base + off + 24);
    if (ValueHasBytes(v.kind)) {
      if (v.value > scope.blob_size || length > scope.blob_size - v.value) {  // R87
        r.Fail(ErrorCode::kOutOfBounds, off + 16, field("value"),
               "a range inside the blob of " + Dec(scope.blob_size) + " bytes",
               "offset " + Dec(v.value) + " length " + Dec(length));
      }
      v.bytes = std::string_view(reinterpret_cast<const char*>(base + scope.blob + v.value),
                                 static_cast<size_t>(length));
      if (v.kind == ValueKind::kStr && !IsValidUtf8(v.bytes)) {  // R88
        r.Fail(ErrorCode::kInvalidValue, off + 16, field("value"), "valid UTF-8", Quote(v.bytes));
      }
      if (v.kind == ValueKind::kBigInt && !CanonicalBigInt(v.bytes)) {  // R88
        r.Fail(ErrorCode::kInvalidValue, off + 16, field("value"),
               "the shortest two's complement of an integer outside int64 (9 bytes or more)",
               HexBytes(reinterpret_cast<const uint8_t*>(v.bytes.data()),
                        v.bytes.size() < 16 ? v.bytes.size() : 16));
      }
      if (v.kind == ValueKind::kOpaque &&
          (v.bytes.empty() || v.bytes.size() > kMaxNameLength || !IsValidUtf8(v.bytes))) {  // R88
        r.Fail(ErrorCode::kInvalidValue, off + 16, field("value"),
               "a label of 1 to 65535 bytes of UTF-8", Quote(v.bytes));
      }
      continue;
    }
    if (length != 0) {  // R87
      r.Fail(ErrorCode::kInvalidValue, off + 24, field("value_length"), "0 for " + AKind(v.kind),
             Dec(length));
    }
    switch (v.kind) {
      case ValueKind::kBool:
        if (v.value > 1)  // R87
          r.Fail(ErrorCode::kInvalidValue, off + 16, field("value"), "0 or 1", Dec(v.value));
        break;
      case ValueKind::kTensor:
        if (v.value >= scope.component.size()) {  // R87
          r.Fail(ErrorCode::kOutOfBounds, off + 16, field("value"),
                 "a tensor index below tensor_count " + Dec(scope.component.size()), Dec(v.value));
        }
        if (scope.component[v.value]) {  // R87
          r.Fail(ErrorCode::kInvalidValue, off + 16, field("value"),
                 "a tensor that is not a sparse component", "tensor #" + Dec(v.value));
        }
        break;
      case ValueKind::kEntry:
        if (v.value >= scope.entry_count) {  // R87
          r.Fail(ErrorCode::kOutOfBounds, off + 16, field("value"),
                 "an entry index below entry_count " + Dec(scope.entry_count), Dec(v.value));
        }
        break;
      case ValueKind::kInt:
      case ValueKind::kFloat:
        break;               // any bits
      default:               // none, list, tuple, dict: no value
        if (v.value != 0) {  // R87
          r.Fail(ErrorCode::kInvalidValue, off + 16, field("value"), "0 for " + AKind(v.kind),
                 Dec(v.value));
        }
    }
  }
  if (next_link != link_count) {  // R86: every link belongs to a value
    r.Fail(ErrorCode::kInvalidValue, scope.link_count_offset, "link_count",
           Dec(next_link) + " (the sum of the values' count)", Dec(link_count));
  }

  // The links: R89-R92 in link order, then R93. Links point forward and each
  // value has one parent, so the values form a tree rooted at value #0 and
  // depths are known before they are needed.
  std::vector<uint32_t>& links = *links_out;
  links.resize(link_count);
  std::vector<uint8_t> depth(value_count, 0);
  std::vector<bool> has_parent(value_count, false);
  for (uint32_t i = 0; i < value_count; ++i) {
    const ValueRecord& v = values[i];
    const bool attr = (v.flags & kValueFlagAttributes) != 0;
    for (uint32_t k = 0; k < v.count; ++k) {
      const uint64_t pos = uint64_t{v.first_link} + k;
      const uint64_t off = links_off + pos * kLinkSize;
      const uint32_t t = LoadU32(base + off);
      const auto field = [&] { return "link #" + Dec(pos) + " (value #" + Dec(i) + ")"; };
      if (t >= value_count) {  // R89
        r.Fail(ErrorCode::kOutOfBounds, off, field(),
               "a value index below value_count " + Dec(value_count), Dec(t));
      }
      if (t <= i || has_parent[t]) {  // R90
        r.Fail(ErrorCode::kInvalidValue, off, field(),
               "a value after #" + Dec(i) + " that no other link names (values form a tree)",
               Dec(t) + (t > i && has_parent[t] ? " (named before)" : ""));
      }
      has_parent[t] = true;
      const ValueKind tk = values[t].kind;
      const bool is_attr = attr && k + 1 == v.count;
      const char* want = nullptr;  // R91
      if (is_attr && tk != ValueKind::kDict) {
        want = "a dict (the attributes)";
      } else if (!is_attr && v.kind == ValueKind::kDict && k % 2 == 0 &&
                 (tk == ValueKind::kList || tk == ValueKind::kDict || tk == ValueKind::kEntry)) {
        want = "a hashable key (not a list, dict or entry)";
      } else if (v.kind == ValueKind::kOpaque && k % 2 == 0 && tk != ValueKind::kBytes) {
        want = "a bytes value (a pickle segment)";
      }
      if (want) {
        r.Fail(ErrorCode::kInvalidValue, off, field(), want,
               "value #" + Dec(t) + " of kind " + ValueKindName(tk));
      }
      if (depth[i] + 1u > kMaxValueDepth) {  // R92
        r.Fail(ErrorCode::kInvalidValue, off, field(),
               "a tree at most " + Dec(kMaxValueDepth) + " levels deep", "a deeper one");
      }
      depth[t] = static_cast<uint8_t>(depth[i] + 1);
      links[pos] = t;
    }
  }
  for (uint32_t i = 1; i < value_count; ++i) {
    if (!has_parent[i]) {  // R93
      r.Fail(ErrorCode::kInvalidValue, values_off + uint64_t{i} * kValueRecordSize,
             "value #" + Dec(i), "a value that a link names (every value but #0 has a parent)",
             "none");
    }
  }
}

}  // namespace tsar::format
