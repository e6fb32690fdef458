// Constants of the tsar v1 format. Every value cites its section of
// spec/FORMAT.md; reader (format/index.cc) and writer (format/encode.cc) share them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tsar/version.h"

namespace tsar::format {

// §4.1: 0x89 catches 7-bit transports, "TSAR" names the format, CR LF catches
// text-mode line-ending conversion, 0x1A stops `type` on DOS (as PNG's magic).
inline constexpr uint8_t kMagic[8] = {0x89, 'T', 'S', 'A', 'R', 0x0D, 0x0A, 0x1A};

// §7: the version this code reads and writes. It writes minor 0 for an
// archive that uses no feature of a later minor (§7.5), so such archives stay
// byte-identical to what a 1.0 writer makes and readable by 1.0 readers.
inline constexpr uint16_t kMajorVersion = 1;
inline constexpr uint16_t kMinorVersion = 5;
static_assert(kMajorVersion == TSAR_FORMAT_MAJOR && kMinorVersion == TSAR_FORMAT_MINOR,
              "include/tsar/version.h names the format version this code implements");

// §4.1, §7.5: header `flags` are required-feature bits from minor 1 on. A
// reader refuses an archive that sets a bit it does not implement (readers of
// 1.0 refuse every bit, R13). Bit 0 (format 1.1): the index holds a value
// tree (§4.10). Bit 1 (format 1.2): the archive is a layer over a base
// archive (§4.11). Bit 2 (format 1.4): tensors laid out for tensor-parallel
// ranks (§4.12); it is defined only from minor 4 on, so an archive of a lower
// minor that sets it is refused like any bit its format does not define (R79).
// Bit 3 (format 1.5): tensor groups, sparse records of layout kGroup (§4.13).
inline constexpr uint32_t kFeatureValueTree = 0x1;
inline constexpr uint32_t kFeatureLayers = 0x2;
inline constexpr uint32_t kFeatureTensorParallel = 0x4;
inline constexpr uint32_t kFeatureTensorGroups = 0x8;
inline constexpr uint32_t kKnownFeatures =
    kFeatureValueTree | kFeatureLayers | kFeatureTensorParallel | kFeatureTensorGroups;
// R79: the feature bits that format 1.`minor` defines (minor 0 defines none: R13).
inline constexpr uint32_t FeaturesOfMinor(uint16_t minor) {
  return minor >= 5   ? kKnownFeatures
         : minor >= 4 ? kFeatureValueTree | kFeatureLayers | kFeatureTensorParallel
                      : kFeatureValueTree | kFeatureLayers;
}
// §7.5: the lowest minor version that defines every feature in `flags`.
inline constexpr uint16_t MinorForFeatures(uint32_t flags) {
  return (flags & kFeatureTensorGroups)     ? 5
         : (flags & kFeatureTensorParallel) ? 4
         : (flags & kFeatureLayers)       ? 2
         : (flags & kFeatureValueTree)    ? 1
                                          : 0;
}

// §4.1: the v1.0 header is 64 bytes; a later minor may grow it up to 4096.
inline constexpr uint32_t kHeaderSize = 64;
inline constexpr uint32_t kMaxHeaderSize = 4096;

// §4.1 header field offsets.
inline constexpr size_t kOffMagic = 0;
inline constexpr size_t kOffMajor = 8;
inline constexpr size_t kOffMinor = 10;
inline constexpr size_t kOffHeaderSize = 12;
inline constexpr size_t kOffFileSize = 16;
inline constexpr size_t kOffIndexOffset = 24;
inline constexpr size_t kOffIndexSize = 32;
inline constexpr size_t kOffDataOffset = 40;
inline constexpr size_t kOffAlignment = 48;
inline constexpr size_t kOffFlags = 52;
inline constexpr size_t kOffIndexXxh3 = 56;

// §4.2: the index header and the record size of each table, in table order.
inline constexpr uint64_t kIndexHeaderSize = 64;
inline constexpr uint64_t kEntryRecordSize = 16;
inline constexpr uint64_t kStorageRecordSize = 32;
inline constexpr uint64_t kTensorRecordSize = 48;
inline constexpr uint64_t kSparseRecordSize = 32;
inline constexpr uint64_t kMetadataRecordSize = 32;
inline constexpr uint64_t kDimSize = 8;
// §4.10 (format 1.1): the value and link tables of the index extension.
inline constexpr uint64_t kValueRecordSize = 32;
inline constexpr uint64_t kLinkSize = 4;
// §4.11 (format 1.2): the layer record and the base storage table.
inline constexpr uint64_t kLayerRecordSize = 64;
inline constexpr uint64_t kBaseStorageRecordSize = 32;
// §4.11: a layer's depth is 1 + its base's (a plain archive's is 0); at most
// this many layers lie under an archive, which also rules out cycles.
inline constexpr uint32_t kMaxLayerDepth = 8;
// §4.12 (format 1.4): the shard table of a tensor-parallel archive, and the
// largest number of ranks an archive may be laid out for.
inline constexpr uint64_t kShardRecordSize = 8;
inline constexpr uint32_t kMaxWorld = 65536;

// §4.1 / §4.4: storage alignment. Storages of at least `alignment` bytes start
// on a multiple of `alignment`; all others on a multiple of kMinAlignment.
inline constexpr uint32_t kMinAlignment = 64;
inline constexpr uint32_t kDefaultAlignment = 4096;
inline constexpr uint32_t kMaxAlignment = 1u << 30;

// §6: caps that bound allocations before any is made.
inline constexpr uint64_t kMaxIndexSize = uint64_t{1} << 31;  // 2 GiB
inline constexpr uint32_t kMaxNdim = 64;
inline constexpr uint32_t kMaxNameLength = 65535;

// §4: "no such record" in u32 reference fields.
inline constexpr uint32_t kNone = 0xFFFFFFFFu;

// §4.5 tensor roles.
enum class Role : uint8_t { kTensor = 0, kParameter = 1, kBuffer = 2, kSparseComponent = 3 };
inline constexpr uint8_t kRoleMax = 3;

// §4.5 tensor flags.
inline constexpr uint8_t kTensorFlagRequiresGrad = 0x01;

// §5.1, R37: codes 1-18 exist in every 1.x; codes 19-22 (the float8 fnuz
// variants, float8_e8m0fnu, float4_e2m1fn_x2) were added by format 1.3, so
// they are valid only in an archive whose minor is 3 or more, and an archive
// that uses one is written as minor 3.
inline constexpr uint16_t kLastDTypeCodeOfMinor2 = 18;
inline constexpr uint16_t kFirstMinor3DTypeCode = 19;
inline constexpr uint16_t kLastDTypeCode = 22;
inline constexpr uint16_t MaxDTypeCode(uint16_t minor) {
  return minor >= 3 ? kLastDTypeCode : kLastDTypeCodeOfMinor2;
}

// §4.5 / §5.1, R77: requires_grad is allowed only on the floating-point and
// complex dtypes, codes 7-15 (float16, bfloat16, float32, float64, complex32,
// complex64, complex128, float8_e5m2, float8_e4m3fn) and 19-22 (every dtype
// of format 1.3): LibTorch refuses it on any other dtype ("Only Tensors of
// floating point and complex dtype can require gradients").
inline constexpr bool DTypeCodeMayRequireGrad(uint16_t code) {
  return (code >= 7 && code <= 15) || (code >= 19 && code <= 22);
}

// §4.5 device hint.
enum class DeviceType : uint8_t { kUnspecified = 0, kCpu = 1, kCuda = 2 };
inline constexpr uint8_t kDeviceTypeMax = 2;

// §4.6 sparse layouts and the number of component tensors each has. Layout
// kGroup (format 1.5, header flag kFeatureTensorGroups) is a tensor group
// (§4.13): 1 to kMaxGroupMembers components, an outer dtype in the record's
// bytes 14-15 and outer sizes and strides in the dims table.
enum class SparseLayout : uint8_t { kCoo = 1, kCsr = 2, kCsc = 3, kGroup = 4 };
inline constexpr uint8_t kSparseLayoutMax = 3;  // without kFeatureTensorGroups
inline constexpr uint32_t kMaxGroupMembers = 64;
inline constexpr uint8_t kSparseFlagCoalesced = 0x01;
// §4.13: the metadata key of a group's description is this prefix and its name.
inline constexpr char kGroupKeyPrefix[] = "group:";

// §4.7 metadata value types.
enum class MetaType : uint8_t { kString = 1, kInt = 2, kFloat = 3, kBytes = 4 };
inline constexpr uint8_t kMetaTypeMax = 4;

// §4.10 value kinds and flags (format 1.1).
enum class ValueKind : uint8_t {
  kNone = 1,
  kBool = 2,
  kInt = 3,
  kBigInt = 4,
  kFloat = 5,
  kStr = 6,
  kBytes = 7,
  kList = 8,
  kTuple = 9,
  kDict = 10,
  kTensor = 11,
  kEntry = 12,
  kOpaque = 13,
};
inline constexpr uint8_t kValueKindMax = 13;
inline constexpr uint8_t kValueFlagOrdered = 0x01;     // dict, entry: a collections.OrderedDict
inline constexpr uint8_t kValueFlagAttributes = 0x02;  // dict, entry: last link is its attributes
inline constexpr uint32_t kMaxValueDepth = 100;        // root at depth 0

// x rounded up to a multiple of a (a power of two); false on overflow.
inline bool AlignUp(uint64_t x, uint64_t a, uint64_t* out) {
  const uint64_t mask = a - 1;
  if (x > UINT64_MAX - mask) return false;
  *out = (x + mask) & ~mask;
  return true;
}

}  // namespace tsar::format
