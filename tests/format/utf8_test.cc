// IsValidUtf8 (format/reader.h), the check of R24, R73 and R88: every
// well-formed and ill-formed sequence of RFC 3629 at every offset of an ASCII
// run, so each byte position of its eight-byte ASCII steps is crossed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "format/reader.h"

namespace tsar::format {
namespace {

struct Case {
  std::string bytes;
  bool valid;
};

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {"", true},
      {"\x7f", true},
      {"\xc2\x80", true},          // U+0080, the first two-byte
      {"\xdf\xbf", true},          // U+07FF
      {"\xe0\xa0\x80", true},      // U+0800
      {"\xed\x9f\xbf", true},      // U+D7FF, below the surrogates
      {"\xee\x80\x80", true},      // U+E000, above them
      {"\xef\xbf\xbf", true},      // U+FFFF
      {"\xf0\x90\x80\x80", true},  // U+10000
      {"\xf4\x8f\xbf\xbf", true},  // U+10FFFF, the last
      {"\xc3\xa9t\xc3\xa9", true},  // "été"
      {"\x80", false},              // a continuation byte alone
      {"\xbf", false},
      {"\xc0\x80", false},          // overlong NUL
      {"\xc1\xbf", false},          // overlong U+007F
      {"\xe0\x9f\xbf", false},      // overlong U+07FF
      {"\xf0\x8f\xbf\xbf", false},  // overlong U+FFFF
      {"\xed\xa0\x80", false},      // U+D800, a surrogate
      {"\xed\xbf\xbf", false},      // U+DFFF
      {"\xf4\x90\x80\x80", false},  // U+110000
      {"\xf8\x88\x80\x80\x80", false},  // five bytes
      {"\xfe", false},
      {"\xff", false},
      {"\xc2", false},              // cut short
      {"\xe0\xa0", false},
      {"\xf0\x90\x80", false},
      {"\xc2\x41", false},          // a lead byte then ASCII
      {"\xe0\xa0\x41", false},
  };
  return cases;
}

TEST(Utf8, EverySequenceAtEveryOffsetOfAnAsciiRun) {
  for (const Case& c : Cases()) {
    for (size_t before = 0; before <= 17; ++before) {
      for (size_t after : {0, 1, 7, 8, 9, 16}) {
        const std::string s = std::string(before, 'a') + c.bytes + std::string(after, 'b');
        EXPECT_EQ(IsValidUtf8(s), c.valid)
            << "sequence #" << (&c - Cases().data()) << " after " << before << " ASCII bytes, "
            << after << " after it";
      }
    }
  }
}

TEST(Utf8, AnInvalidByteFarIntoALongAsciiString) {
  std::string s(4096, 'x');
  EXPECT_TRUE(IsValidUtf8(s));
  for (size_t at : {0, 7, 8, 4088, 4095}) {
    std::string bad = s;
    bad[at] = '\xff';
    EXPECT_FALSE(IsValidUtf8(bad)) << "0xff at " << at;
    bad[at] = '\0';  // NUL is valid UTF-8 here; R24's own rules refuse it where they must
    EXPECT_TRUE(IsValidUtf8(bad)) << "NUL at " << at;
  }
}

TEST(Utf8, TheCheckReadsOnlyTheView) {
  // A view into a longer buffer: a bad byte just past its end is not read as its.
  const std::string buffer = std::string(12, 'a') + "\xff";
  EXPECT_TRUE(IsValidUtf8(std::string_view(buffer.data(), 12)));
  EXPECT_FALSE(IsValidUtf8(buffer));
}

}  // namespace
}  // namespace tsar::format
