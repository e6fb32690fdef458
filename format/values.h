// The value tree of format 1.1 (spec/FORMAT.md §4.10): the typed structure of
// the object a checkpoint file held (dicts, lists, tuples, scalars, strings,
// bytes, tensors, opaque pickle fragments). Its records decoded and checked
// (rules R82-R93 of §6.3), and its encoding. Pure C++: no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/reader.h"
#include "format/spec.h"

namespace tsar::format {

// §4.10, decoded. `value` is the bool, the int's i64 bits, the float's f64
// bits, the tensor index or the entry index; `bytes` the blob bytes of a str,
// bytes, bigint or opaque label.
struct ValueRecord {
  ValueKind kind = ValueKind::kNone;
  uint8_t flags = 0;
  uint32_t count = 0;       // links of this value
  uint32_t first_link = 0;  // position of its first link in the link table
  uint64_t value = 0;
  std::string_view bytes;
};

// What the value rules check against outside the value tables.
struct ValueScope {
  uint64_t blob = 0;  // offset of the blob in the reader's bytes
  uint64_t blob_size = 0;
  uint32_t entry_count = 0;
  uint64_t link_count_offset = 0;  // of the index header field, for R86's message
  std::vector<bool> component;     // per tensor record: role 3 (a sparse component)
};

// Decodes and checks the value table (value_count records at values_off) and
// the link table (link_count u32 at links_off) inside `r`'s bytes: R82-R93 in
// order. Fills `values` and `links`. Throws tsar::Error at the first rule
// broken, with the absolute offset of the field.
void DecodeValues(const ByteReader& r, uint64_t values_off, uint32_t value_count,
                  uint64_t links_off, uint32_t link_count, const ValueScope& scope,
                  std::vector<ValueRecord>* values, std::vector<uint32_t>* links);

// One value to encode: what a ValueRecord holds, with its bytes owned and its
// links (value indices) listed.
struct ValueSpec {
  ValueKind kind = ValueKind::kNone;
  uint8_t flags = 0;
  uint64_t value = 0;
  std::string bytes;
  std::vector<uint32_t> links;
};

// Whether `value` and `value_length` of a record of this kind are a range of
// the blob (str, bytes, bigint, opaque label) rather than a number.
bool ValueHasBytes(ValueKind kind);

// The name of a kind as messages, inspect and the spec spell it ("dict").
const char* ValueKindName(ValueKind kind);

}  // namespace tsar::format
