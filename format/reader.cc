// Helpers for decode error messages and UTF-8 checks (spec/FORMAT.md §6).
#include "format/reader.h"

#include <cstdio>
#include <cstring>

namespace tsar::format {

std::string HexBytes(const uint8_t* p, size_t n) {
  std::string out;
  char buf[4];
  for (size_t i = 0; i < n && i < 16; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", p[i]);
    if (i) out += ' ';
    out += buf;
  }
  return out;
}

std::string Quote(std::string_view s) {
  std::string out = "\"";
  size_t shown = 0;
  for (unsigned char c : s) {
    if (++shown > 80) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out + "\"";
}

std::string HumanBytes(uint64_t n) {
  if (n < 1024) return std::to_string(n) + " B";
  return HumanBytes(static_cast<double>(n));
}

std::string HumanBytes(double n) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"};
  double v = n;
  int u = 0;
  while (v >= 1024 && u < 7) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%.0f B", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  }
  return buf;
}

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII, eight bytes at a time: names and metadata are nearly all ASCII,
    // and this check ran at 1 byte a step inside every open.
    for (uint64_t w; n - i >= 8; i += 8) {
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) != 0) break;
    }
    if (i == n) break;
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (len > n - i) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

bool IsRelativePath(std::string_view s) {
  if (s.empty() || s.front() == '/' || s.back() == '/') return false;
  return s.find('\0') == std::string_view::npos && s.find("//") == std::string_view::npos;
}

}  // namespace tsar::format
