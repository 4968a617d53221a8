// store/numbers.h — numbers to text and back without locales or iostreams
// (internal).
//
// std::to_chars, and strtod_l with the "C" locale: the text is the same
// whatever the global C++ locale (std::locale::global: a decimal comma,
// thousands separators) or the C locale (setlocale(LC_NUMERIC, ...), which
// printf and strtod follow) of the process that reads or writes a store, and
// nothing here constructs a stream or a locale facet. Used for the store
// metadata (its text is checksummed and parsed back), the numbers in messages
// of store/ and reader/, and numbers users type (normalisations, byte sizes).
#pragma once

#include <locale.h>
#include <stdlib.h>

#include <charconv>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

namespace patchstore {

// printf("%.*g", precision, v) in the "C" locale: "0.5", "1e+20", "inf",
// "-nan". REQUIRES: 0 < precision <= 40.
inline std::string FormatG(double v, int precision = 6) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, precision);
  return r.ec == std::errc() ? std::string(buf, r.ptr) : std::string("?");
}
// The same for a float32 (its exact value, as printf prints it promoted to double).
inline std::string FormatG(float v, int precision) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, precision);
  return r.ec == std::errc() ? std::string(buf, r.ptr) : std::string("?");
}

// The "C" locale as a locale_t, for strtod_l: created once, never freed.
inline locale_t CNumericLocale() {
  static const locale_t c = ::newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(0));
  return c;
}

// The whole of `s` (at most 64 characters) as strtod reads it in the "C"
// locale: "0.5", "-1e-07", "inf", "nan", " +2"; a magnitude beyond the double
// range reads as inf or 0, as strtod gives it. False when `s` is empty,
// longer, or not wholly such a number.
inline bool ParseDouble(std::string_view s, double* out) {
  if (s.empty() || s.size() > 64) return false;
  char buf[65];
  std::memcpy(buf, s.data(), s.size());
  buf[s.size()] = '\0';
  char* end = nullptr;
  const double v = ::strtod_l(buf, &end, CNumericLocale());
  if (end != buf + s.size()) return false;
  *out = v;
  return true;
}
// The same for a float32 (strtof).
inline bool ParseFloat(std::string_view s, float* out) {
  if (s.empty() || s.size() > 64) return false;
  char buf[65];
  std::memcpy(buf, s.data(), s.size());
  buf[s.size()] = '\0';
  char* end = nullptr;
  const float v = ::strtof_l(buf, &end, CNumericLocale());
  if (end != buf + s.size()) return false;
  *out = v;
  return true;
}

}  // namespace patchstore
