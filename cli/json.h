// patchstore/cli/json.h — JSON strings for --json output.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace patchstore::cli {

// Length of the valid UTF-8 sequence at s[i] (as Python's strict decoder
// accepts: no overlong forms, no surrogates, nothing above U+10FFFF), or 0.
inline size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

// A JSON string of `s`. Valid UTF-8 is written as is (so ids and field names
// read back as the same text); each byte that is not part of valid UTF-8 is
// written as the lone surrogate \udcXX, which is what Python's
// surrogateescape gives: json.loads(...) == id.decode("utf-8",
// "surrogateescape"), the str patchstore's Python API uses for that id.
inline std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char buf[8];
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      default: break;
    }
    if (c < 0x20 || c == 0x7f) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      ++i;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
    } else if (size_t n = Utf8SequenceLength(s, i); n > 0) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      std::snprintf(buf, sizeof buf, "\\udc%02x", c);
      out += buf;
      ++i;
    }
  }
  return out + "\"";
}

// A JSON number, or null for NaN and infinities (which JSON cannot write).
inline std::string JsonNumber(double v) {
  if (v != v || v - v != 0) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);  // as std::ostream writes doubles by default
  return buf;
}

}  // namespace patchstore::cli
