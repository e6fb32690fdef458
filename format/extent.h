// The view arithmetic of spec/FORMAT.md §4.5 (rules R48-R52 and R78 of §6.3): element
// count, last-element offset and byte range of a tensor view, in checked
// 64-bit arithmetic. The decoder (format/index.cc) and the encoder
// (format/encode.cc) both use it, so they accept exactly the same views.
#pragma once

#include <cstdint>
#include <string>

namespace tsar::format {

// The outcome of ComputeViewExtent: either fault == kNone and the derived
// values, or the first rule broken and where (the derived values are then
// meaningless).
struct ViewExtent {
  enum class Fault : uint8_t {
    kNone,
    kSizeNegative,    // R48: sizes[dim] > 2^63-1 (negative as i64)
    kStrideNegative,  // R49: strides[dim] > 2^63-1
    kNumelOverflow,   // R50: sizes[dim] takes numel above 2^63-1; limit = largest allowed size
    kLastOverflow,    // R50: strides[dim] takes last above 2^64-1; limit = largest allowed stride
    kEmptyOverflow,   // R78: in an empty view, sizes[dim] takes the product of the non-zero
                      // sizes above 2^63-1; limit = largest allowed size
    kOffsetOverflow,  // R51: storage_offset * element_size >= 2^64
    kEndOverflow,     // R52: (storage_offset + last + 1) * element_size >= 2^64
  };
  Fault fault = Fault::kNone;
  uint32_t dim = 0;    // the dimension of a R48-R50 or R78 fault
  uint64_t limit = 0;  // for R50, R78 faults: the largest value sizes[dim] / strides[dim] may take
  uint64_t numel = 0;  // product of sizes: 1 for ndim 0, 0 if any size is 0
  uint64_t last = 0;   // Σ (sizes[d] - 1) * strides[d]; 0 for an empty tensor (not computed)
  uint64_t begin = 0;  // storage_offset * element_size
  uint64_t end = 0;    // the left-hand side of the extent rule (R53): bytes from the
                       // storage's first byte to the end of the view
};

// Applies R48-R52 and R78 to a view of `ndim` dims (sizes and strides as
// stored, i64) and returns the first fault in rule order (R48/R49 dim by dim,
// then dim by dim R50 if no size is 0, else R78, then R51, R52). R53 (end <=
// the storage's nbytes) is left to the caller. Pure; never throws.
ViewExtent ComputeViewExtent(const int64_t* sizes, const int64_t* strides, uint32_t ndim,
                             uint64_t storage_offset, uint64_t element_size);

// The parts of the §6.7 message for a fault `v` (fault != kNone) of the view
// passed to ComputeViewExtent: `field` is relative to the tensor ("size 1",
// "stride 0", "storage_offset"). Decoder and encoder word their errors alike.
struct ViewFaultText {
  std::string field;
  std::string expected;
  std::string found;
};
ViewFaultText DescribeViewFault(const ViewExtent& v, const int64_t* sizes, const int64_t* strides,
                                uint64_t storage_offset, uint64_t element_size);

}  // namespace tsar::format
