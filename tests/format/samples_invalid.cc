// The invalid samples (tests/format/samples_invalid.h).
#include "tests/format/samples_invalid.h"

#include "tests/format/samples_draft.h"

namespace tsar::testing::samples {

std::vector<Invalid> InvalidCatalogue(const std::string& minimal, const std::string& shared,
                                      const std::string& meta, const std::string& sparse,
                                      const std::string& aligned, const std::string& empty_views,
                                      const std::string& tree, const std::string& layer,
                                      const std::string& tp, const std::string& groups) {
  auto fixed = [](uint64_t o) { return [o](const std::string&) { return o; }; };
  auto tensor0 = [](uint64_t field) {
    return [field](const std::string& f) { return Table(f, 2) + field; };
  };
  auto with = [](std::string base, std::function<void(std::string&)> edit, bool refix) {
    return [base, edit, refix]() {
      std::string f = base;
      edit(f);
      if (refix) Refix(f);
      return f;
    };
  };
  const uint64_t ih = format::kHeaderSize;
  std::vector<Invalid> v = {
      {"empty_file", [] { return std::string(); }, ErrorCode::kBadMagic, fixed(0), "zero bytes"},
      {"bad_magic",
       with(
           minimal, [](std::string& f) { f[1] = 't'; }, false),
       ErrorCode::kBadMagic, fixed(0), "magic byte 1 is 't'"},
      {"text_mode_crlf",
       with(
           minimal, [](std::string& f) { f.erase(5, 1); }, false),
       ErrorCode::kBadMagic, fixed(0), "the CR of the magic was stripped in transit"},
      {"truncated_header", [minimal] { return minimal.substr(0, 40); }, ErrorCode::kTruncated,
       fixed(0), "only 40 bytes of the header"},
      {"truncated_data", [minimal] { return minimal.substr(0, minimal.size() - 1); },
       ErrorCode::kTruncated, fixed(format::kOffFileSize), "the last data byte is missing"},
      {"trailing_byte", [minimal] { return minimal + std::string(1, '\0'); },
       ErrorCode::kInvalidValue, fixed(format::kOffFileSize), "one byte past file_size"},
      {"major_2",
       with(
           minimal, [](std::string& f) { Put16(f, format::kOffMajor, 2); }, false),
       ErrorCode::kUnsupportedVersion, fixed(format::kOffMajor), "a future major version"},
      {"header_size_72",
       with(
           minimal, [](std::string& f) { Put32(f, format::kOffHeaderSize, 72); }, false),
       ErrorCode::kInvalidValue, fixed(format::kOffHeaderSize), "minor 0 with a 72-byte header"},
      {"index_size_huge",
       with(
           minimal, [](std::string& f) { Put64(f, format::kOffIndexSize, uint64_t{1} << 40); },
           false),
       ErrorCode::kInvalidValue, fixed(format::kOffIndexSize), "index_size of 1 TiB"},
      {"data_offset_wrong",
       with(
           minimal, [](std::string& f) { Put64(f, format::kOffDataOffset, 128); }, false),
       ErrorCode::kInvalidValue, fixed(format::kOffDataOffset), "data_offset inside the index"},
      {"alignment_100",
       with(
           minimal, [](std::string& f) { Put32(f, format::kOffAlignment, 100); }, false),
       ErrorCode::kInvalidValue, fixed(format::kOffAlignment), "alignment not a power of two"},
      {"flags_set",
       with(
           minimal, [](std::string& f) { Put32(f, format::kOffFlags, 1); }, false),
       ErrorCode::kReservedNonZero, fixed(format::kOffFlags), "a reserved header flag"},
      {"index_checksum",
       with(
           minimal, [](std::string& f) { f[Table(f, 6)] ^= 0x20; }, false),
       ErrorCode::kChecksumMismatch, fixed(format::kOffIndexXxh3),
       "a name byte changed, checksum not updated"},
      {"index_padding_nonzero",
       with(
           minimal, [](std::string& f) { f[U64At(f, format::kOffDataOffset) - 1] = 1; }, true),
       ErrorCode::kReservedNonZero,
       [](const std::string& f) { return U64At(f, format::kOffDataOffset) - 1; },
       "a non-zero byte between index and data"},
      {"index_reserved",
       with(
           minimal, [ih](std::string& f) { f[ih + 40] = 1; }, true),
       ErrorCode::kReservedNonZero, fixed(ih + 40), "a reserved index header byte"},
      {"tensor_count_huge",
       with(
           minimal, [ih](std::string& f) { Put32(f, ih + 8, 0xFFFFFFFFu); }, true),
       ErrorCode::kOutOfBounds, fixed(ih + 8), "4 billion tensors in a 182-byte index"},
      {"blob_size_huge",
       with(
           minimal, [ih](std::string& f) { Put64(f, ih + 24, UINT64_MAX); }, true),
       ErrorCode::kOutOfBounds, fixed(ih + 24), "blob_size near 2^64"},
      {"entry_partition",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 0) + 8, 1); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 0) + 8; },
       "entry #0 does not start at tensor 0"},
      {"storage_misaligned",
       with(
           minimal,
           [](std::string& f) {
             Put64(f, Table(f, 1), U64At(f, Table(f, 1)) + 8);
             Put64(f, Table(f, 1) + 8, 0);
           },
           true),
       ErrorCode::kMisaligned, [](const std::string& f) { return Table(f, 1); },
       "storage offset off by 8"},
      {"storage_hole",
       with(
           shared,
           [](std::string& f) { Put64(f, Table(f, 1) + 32, U64At(f, Table(f, 1) + 32) + 64); },
           true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 1) + 32; },
       "a 64-byte hole before storage #1"},
      {"storage_out_of_bounds",
       with(
           minimal, [](std::string& f) { Put64(f, Table(f, 1) + 8, 16); }, true),
       ErrorCode::kOutOfBounds, [](const std::string& f) { return Table(f, 1) + 8; },
       "storage nbytes past the end of the file"},
      {"storage_nbytes_overflow",
       with(
           minimal, [](std::string& f) { Put64(f, Table(f, 1) + 8, UINT64_MAX - 100); }, true),
       ErrorCode::kOutOfBounds, [](const std::string& f) { return Table(f, 1) + 8; },
       "storage nbytes near 2^64"},
      {"storage_overlap",
       with(
           shared, [](std::string& f) { Put64(f, Table(f, 1) + 32, U64At(f, Table(f, 1))); }, true),
       ErrorCode::kOverlap, [](const std::string& f) { return Table(f, 1) + 32; },
       "storage #1 starts where storage #0 does"},
      {"name_out_of_blob",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2), 0x7FFFFFF0u); }, true),
       ErrorCode::kOutOfBounds, tensor0(0), "tensor name_offset past the blob"},
      {"name_empty",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2) + 4, 0); }, true),
       ErrorCode::kInvalidValue, tensor0(4), "an empty tensor name"},
      {"name_not_utf8",
       with(
           minimal, [](std::string& f) { f[Table(f, 6) + U32At(f, Table(f, 2))] = '\xff'; }, true),
       ErrorCode::kInvalidValue, tensor0(0), "tensor name byte 0xff"},
      {"tensor_storage_index",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2) + 8, 5); }, true),
       ErrorCode::kOutOfBounds, tensor0(8), "tensor refers to storage #5 of 1"},
      {"tensor_bad_dtype",
       with(
           minimal, [](std::string& f) { Put16(f, Table(f, 2) + 12, 99); }, true),
       ErrorCode::kBadDtype, tensor0(12), "dtype code 99"},
      {"tensor_dtype_needs_1_3",
       with(
           minimal, [](std::string& f) { Put16(f, Table(f, 2) + 12, 19); }, true),
       ErrorCode::kBadDtype, tensor0(12),
       "dtype code 19 (float8_e4m3fnuz, added by format 1.3) in a minor 0 archive"},
      {"tensor_bad_role",
       with(
           minimal, [](std::string& f) { f[Table(f, 2) + 14] = 9; }, true),
       ErrorCode::kInvalidValue, tensor0(14), "role 9"},
      {"tensor_flags_reserved",
       with(
           minimal, [](std::string& f) { f[Table(f, 2) + 15] = '\x80'; }, true),
       ErrorCode::kReservedNonZero, tensor0(15), "tensor flag bit 7"},
      {"requires_grad_int",
       with(
           aligned, [](std::string& f) { f[Table(f, 2) + 15] = 1; }, true),
       ErrorCode::kInvalidValue, tensor0(15), "requires_grad on an int64 tensor"},
      {"tensor_ndim_65",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2) + 16, 65); }, true),
       ErrorCode::kBadShape, tensor0(16), "65 dimensions"},
      {"tensor_dims_out_of_table",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2) + 20, 1); }, true),
       ErrorCode::kOutOfBounds, tensor0(20), "sizes and strides past the dims table"},
      {"tensor_extent",
       with(
           minimal, [](std::string& f) { Put64(f, Table(f, 5), 3); }, true),
       ErrorCode::kOutOfBounds, tensor0(24), "3 floats in an 8-byte storage"},
      {"tensor_storage_offset",
       with(
           minimal, [](std::string& f) { Put64(f, Table(f, 2) + 24, 1); }, true),
       ErrorCode::kOutOfBounds, tensor0(24), "storage_offset 1 pushes the view past its storage"},
      {"tensor_size_negative",
       with(
           minimal, [](std::string& f) { Put64(f, Table(f, 5), UINT64_MAX); }, true),
       ErrorCode::kBadShape, [](const std::string& f) { return Table(f, 5); }, "size -1 (2^64-1)"},
      {"tensor_extent_overflow",
       with(
           minimal,
           [](std::string& f) {
             Put64(f, Table(f, 5), uint64_t{1} << 62);
             Put64(f, Table(f, 5) + 8, uint64_t{1} << 62);
           },
           true),
       ErrorCode::kOverflow, [](const std::string& f) { return Table(f, 5) + 8; },
       "size and stride 2^62: the last element offset overflows at the stride"},
      {"tensor_numel_overflow",
       with(
           shared,
           [](std::string& f) {
             // Tensor #1 ("part"): sizes [2^62, 3], strides [0, 0].
             const uint64_t dims = Table(f, 5) + 8 * uint64_t{U32At(f, Table(f, 2) + 48 + 20)};
             Put64(f, dims, uint64_t{1} << 62);
             Put64(f, dims + 8, 3);
             Put64(f, dims + 16, 0);
             Put64(f, dims + 24, 0);
           },
           true),
       ErrorCode::kOverflow,
       [](const std::string& f) {
         return Table(f, 5) + 8 * uint64_t{U32At(f, Table(f, 2) + 48 + 20)} + 8;
       },
       "sizes [2^62, 3] with zero strides: 3 * 2^62 elements, above 2^63-1, at size 1"},
      {"empty_numel_overflow",
       with(
           empty_views,
           [](std::string& f) {
             // Tensor #1 ("huge"): sizes [2^62, 2^62, 0], which LibTorch refuses.
             const uint64_t dims = Table(f, 5) + 8 * uint64_t{U32At(f, Table(f, 2) + 48 + 20)};
             Put64(f, dims, uint64_t{1} << 62);
             Put64(f, dims + 8, uint64_t{1} << 62);
             Put64(f, dims + 16, 0);
           },
           true),
       ErrorCode::kOverflow,
       [](const std::string& f) {
         return Table(f, 5) + 8 * uint64_t{U32At(f, Table(f, 2) + 48 + 20)} + 8;
       },
       "empty, but sizes [2^62, 2^62, 0]: the non-zero sizes multiply past 2^63-1 at size 1"},
      {"tensor_sparse_without_role",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2) + 32, 0); }, true),
       ErrorCode::kInvalidValue, tensor0(32), "sparse index on a dense parameter"},
      {"tensor_device_type",
       with(
           minimal, [](std::string& f) { f[Table(f, 2) + 36] = 7; }, true),
       ErrorCode::kInvalidValue, tensor0(36), "device_type 7"},
      {"tensor_reserved",
       with(
           minimal, [](std::string& f) { f[Table(f, 2) + 44] = 1; }, true),
       ErrorCode::kReservedNonZero, tensor0(44), "a reserved tensor byte"},
      {"duplicate_tensor_name",
       with(
           shared,
           [](std::string& f) {
             const uint64_t t0 = Table(f, 2);
             Put32(f, t0 + 48, U32At(f, t0));  // tensor #1 takes tensor #0's name
             Put32(f, t0 + 48 + 4, U32At(f, t0 + 4));
           },
           true),
       ErrorCode::kDuplicateName, [](const std::string& f) { return Table(f, 2) + 48; },
       "two tensors named alike in one entry"},
      {"metadata_bad_type",
       with(
           meta, [](std::string& f) { f[Table(f, 4) + 8] = 9; }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 4) + 8; },
       "metadata type 9"},
      {"metadata_unsorted",
       with(
           meta,
           [](std::string& f) {
             const uint64_t m = Table(f, 4);
             std::string a = f.substr(m, 32);
             f.replace(m, 32, f.substr(m + 32, 32));
             f.replace(m + 32, 32, a);
           },
           true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 4) + 32; },
       "metadata records out of (entry, key) order"},
      {"sparse_bad_layout",
       with(
           sparse, [](std::string& f) { f[Table(f, 3) + 12] = 4; }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 3) + 12; },
       "sparse layout 4"},
      {"sparse_component_elsewhere",
       with(
           sparse, [](std::string& f) { Put32(f, Table(f, 2) + 48 + 32, 1); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 2) + 48 + 32; },
       "the first component of sparse #0 names sparse #1"},
      // Format 1.1 (§4.10, R79-R93).
      {"flags_unknown_feature",
       with(
           minimal,
           [](std::string& f) {
             Put16(f, format::kOffMinor, 2);
             Put32(f, format::kOffFlags, 4);
           },
           false),
       ErrorCode::kUnsupportedVersion, fixed(format::kOffFlags),
       "minor 2 with feature bit 2, which format 1.2 does not define"},
      {"value_kind_bad",
       with(
           tree, [](std::string& f) { f[ValuesAt(f) + 32] = 99; }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return ValuesAt(f) + 32; },
       "value #1 has kind 99"},
      {"value_link_backward",
       with(
           tree, [](std::string& f) { Put32(f, LinksAt(f), 0); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return LinksAt(f); },
       "the root's first link names the root itself"},
      {"value_two_parents",
       with(
           tree, [](std::string& f) { Put32(f, LinksAt(f) + 8, U32At(f, LinksAt(f))); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return LinksAt(f) + 8; },
       "two links of the root name value #1"},
      {"value_orphan",
       with(
           tree,
           [](std::string& f) {
             // The last list ("tail": ["x", "y"]) loses its last link: value
             // "y" is left without a parent. The link table gets 4 bytes
             // shorter, the index too; data_offset does not move.
             const uint32_t values = U32At(f, ih + 32), links = U32At(f, ih + 36);
             const uint64_t list = ValuesAt(f) + uint64_t{values - 3} * format::kValueRecordSize;
             Put32(f, list + 4, 1);
             for (uint32_t i = values - 2; i < values; ++i)
               Put32(f, ValuesAt(f) + uint64_t{i} * format::kValueRecordSize + 8, links - 1);
             Put32(f, LinksAt(f) + uint64_t{links - 1} * 4, 0);
             Put32(f, ih + 36, links - 1);
             Put64(f, format::kOffIndexSize, U64At(f, format::kOffIndexSize) - 4);
           },
           true),
       ErrorCode::kInvalidValue,
       [](const std::string& f) {
         return ValuesAt(f) + uint64_t{U32At(f, ih + 32) - 1} * format::kValueRecordSize;
       },
       "value \"y\" is named by no link"},
      {"layer_reserved",
       with(
           layer, [](std::string& f) { f[LayerAt(f) + 40] = 1; }, true),
       ErrorCode::kReservedNonZero, [](const std::string& f) { return LayerAt(f) + 40; },
       "a reserved byte of the layer record"},
      {"layer_depth_0",
       with(
           layer, [](std::string& f) { Put32(f, LayerAt(f) + 28, 0); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return LayerAt(f) + 28; },
       "a layer of depth 0 (a layer lies over at least one base)"},
      {"layer_path_absolute",
       with(
           layer, [](std::string& f) { f[Table(f, 6) + U32At(f, LayerAt(f) + 32)] = '/'; }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return LayerAt(f) + 32; },
       "the base path \"/hared.tsar\" is absolute"},
      {"layer_tables_past_the_index",
       with(
           layer, [](std::string& f) { Put32(f, ih + 40, 1000); }, true),
       ErrorCode::kOutOfBounds, fixed(ih + 40),
       "base_storage_count 1000: a base storage table that does not fit in the index"},
      {"layer_base_storage_reserved",
       with(
           layer, [](std::string& f) { f[BaseStoragesAt(f) + 24] = 1; }, true),
       ErrorCode::kReservedNonZero, [](const std::string& f) { return BaseStoragesAt(f) + 24; },
       "a reserved byte of base storage #0"},
      {"layer_base_storage_out_of_range",
       with(
           layer, [](std::string& f) { Put32(f, BaseStoragesAt(f), 99); }, true),
       ErrorCode::kOutOfBounds, [](const std::string& f) { return BaseStoragesAt(f); },
       "base storage #0 names storage #99 of a base of 4 storages"},
      // Format 1.4 (§4.12, R100-R110), mutations of valid/tensor_parallel.
      {"tp_world_1",
       with(
           tp, [](std::string& f) { Put32(f, ih + 44, 1); }, true),
       ErrorCode::kInvalidValue, fixed(ih + 44), "a tensor-parallel archive for 1 rank"},
      {"shard_unsorted",
       with(
           tp, [](std::string& f) { Put32(f, ShardsAt(f) + 8, 0); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return ShardsAt(f) + 8; },
       "shard #1 names tensor #0 again"},
      {"shard_dim_out_of_range",
       with(
           tp, [](std::string& f) { Put32(f, ShardsAt(f) + 4, 5); }, true),
       ErrorCode::kBadShape, [](const std::string& f) { return ShardsAt(f) + 4; },
       "shard #0 splits the 2-d \"q.weight\" along dim 5"},
      {"shard_not_divisible",
       with(
           tp, [](std::string& f) { Put32(f, ShardsAt(f) + 4, 1); }, true),
       ErrorCode::kBadShape, [](const std::string& f) { return ShardsAt(f); },
       "shard #0 splits \"q.weight\" [4, 3] along dim 1, whose size 3 is not a multiple of 2"},
      {"shard_storage_nbytes",
       with(
           tp, [](std::string& f) { Put32(f, ih + 44, 4); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return ShardsAt(f); },
       "tp_world 4 in an archive laid out for 2: storage #0 is not 4 slices long"},
      {"shard_tied_unsharded",
       with(
           tp, [](std::string& f) { Put32(f, ShardsAt(f) + 3 * 8 + 4, 1); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 2) + 3 * 48 + 8; },
       "\"head.weight\" shares \"emb.weight\"'s storage but is split along dim 1, not 0"},
      // Format 1.5 (§4.13, R111, R112 and the group forms of R56-R62).
      {"group_dtype_bad",
       with(
           groups, [](std::string& f) { Put16(f, Table(f, 3) + 14, 99); }, true),
       ErrorCode::kBadDtype, [](const std::string& f) { return Table(f, 3) + 14; },
       "group \"0.weight\" has outer dtype code 99"},
      {"group_no_members",
       with(
           groups, [](std::string& f) { Put32(f, Table(f, 3) + 28, 0); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 3) + 28; },
       "group \"0.weight\" has component_count 0"},
      {"group_without_description",
       with(
           groups,
           [](std::string& f) {
             const size_t at = f.find("group:0.weight");
             f[at + 13] = 'u';  // the key becomes "group:0.weighu"
           },
           true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 3); },
       "no metadata record \"group:0.weight\" describes group \"0.weight\""},
  };
  return v;
}

}  // namespace tsar::testing::samples
