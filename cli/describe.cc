// Value formatting of the tsar command line (cli/describe.h).
#include "cli/describe.h"

#include <sys/stat.h>

#include <charconv>
#include <cstdio>
#include <sstream>

#include "writer/detect.h"

namespace tsar::cli {

void ExplainNotAnArchive(const std::string& path, const Error& e) {
  struct stat st;
  const bool directory = stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (e.code() != ErrorCode::kBadMagic && !directory) return;
  importer::InputKind kind = importer::InputKind::kUnknown;
  try {
    kind = importer::Detect(path);
  } catch (const Error&) {
  }
  // Any JSON text is taken for an index by content; only one named like
  // an index is called one here.
  const bool index_name =
      path.size() > 11 && path.compare(path.size() - 11, 11, ".index.json") == 0;
  if (kind == importer::InputKind::kUnknown ||
      (kind == importer::InputKind::kSafetensorsIndex && !index_name))
    return;
  throw Error(ErrorCode::kBadMagic, path, std::nullopt,
              std::string("this is ") + (kind == importer::InputKind::kHdf5 ? "an " : "a ") +
                  importer::InputKindName(kind) + (directory ? " directory" : " file") +
                  ", not a tsar archive; pack it first: tsar pack " + path +
                  " -o ARCHIVE.tsar");
}

std::string Printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  char buf[8];
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const bool c1 = c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(s[i + 1]) <= 0x9f;
    if (c < 0x20 || c == 0x7f) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (c1) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(s[++i]));
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string Dims(const std::vector<int64_t>& v) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
  o << "]";
  return o.str();
}

std::string Hex(const std::string& bytes, size_t max) {
  std::string out;
  char buf[4];
  for (size_t i = 0; i < bytes.size() && i < max; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char>(bytes[i]));
    out += buf;
  }
  if (bytes.size() > max) out += "...";
  return out;
}

std::string FloatText(double d) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);  // shortest round trip
  std::string s = ec == std::errc() ? std::string(buf, end) : std::string("?");
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";  // 100.0, not 100 (an int)
  return s;
}

nlohmann::ordered_json MetaJson(const MetadataValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* d = std::get_if<double>(&v)) return *d;
  return {{"bytes_hex", Hex(std::get<Bytes>(v).data, SIZE_MAX)}};
}

std::string MetaText(const MetadataValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) {
    std::string q = "\"";
    char buf[8];
    for (size_t i = 0; i < s->size() && i < 80; ++i) {
      const auto c = static_cast<unsigned char>((*s)[i]);
      if (c == '"' || c == '\\') {
        q += '\\';
        q += static_cast<char>(c);
      } else if (c < 0x20 || c == 0x7f) {
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        q += buf;
      } else {
        q += static_cast<char>(c);
      }
    }
    return q + (s->size() > 80 ? "\"... (string)" : "\" (string)");
  }
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i) + " (int)";
  if (const auto* d = std::get_if<double>(&v)) return FloatText(*d) + " (float)";
  const std::string& b = std::get<Bytes>(v).data;
  return Hex(b, 16) + " (bytes, " + std::to_string(b.size()) + ")";
}

}  // namespace tsar::cli
