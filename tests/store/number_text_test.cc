// Numbers in store metadata and messages are written and read the same way
// whatever locale the process has set (store/numbers.h): a training script
// that sets a German or French locale must neither write "0,5" or "1.234.567"
// into a store nor fail to read one.
#include <gtest/gtest.h>
#include <locale.h>
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <locale>
#include <sstream>
#include <string>

#include "patchstore/store/format.h"
#include "store/numbers.h"
#include "test_util.h"

namespace patchstore {
namespace {

// A decimal comma and '.' between groups of three digits, as de_DE has. Made
// from a facet: the machine running the test may have no locale installed.
struct DecimalComma : std::numpunct<char> {
  char do_decimal_point() const override { return ','; }
  char do_thousands_sep() const override { return '.'; }
  std::string do_grouping() const override { return "\3"; }
};

// Sets the global C++ locale for one test and puts the previous one back.
class GlobalLocale {
 public:
  explicit GlobalLocale(const std::locale& l) : previous_(std::locale::global(l)) {}
  ~GlobalLocale() { std::locale::global(previous_); }

 private:
  std::locale previous_;
};

// The C locale's numbers (setlocale: printf, strtod, Python's
// locale.setlocale) with a decimal comma, for one test: de_DE.UTF-8, made
// with localedef into a scratch folder (LOCPATH) where it is not installed.
// ok() is false where neither works (no localedef or locale sources).
class DecimalCommaCLocale {
 public:
  DecimalCommaCLocale() {
    if (::setlocale(LC_NUMERIC, "de_DE.UTF-8") != nullptr) {
      ok_ = true;
      return;
    }
    testing::RunCommand("localedef -i de_DE -f UTF-8 " + dir_ / "de_DE.UTF-8");
    ::setenv("LOCPATH", dir_.path().c_str(), 1);
    ok_ = ::setlocale(LC_NUMERIC, "de_DE.UTF-8") != nullptr;
  }
  ~DecimalCommaCLocale() {
    ::setlocale(LC_NUMERIC, "C");
    ::unsetenv("LOCPATH");
  }
  bool ok() const { return ok_; }

 private:
  testing::TempDir dir_;
  bool ok_ = false;
};

StoreMeta MetaWithNumbers() {
  StoreMeta m;
  m.tool_version = "1.2.3";
  m.sample_count = 1234567;
  FieldMeta f;
  f.name = "rgb";
  f.channels = 3;
  f.tile = 256;
  f.norm.kind = NormKind::kUnit;
  f.norm.scale = 255;
  f.norm.offset = 0.5;
  f.norm.clamp = true;
  f.norm.clamp_lo = -1.25;
  f.norm.clamp_hi = 1.0 / 3;
  m.fields.push_back(f);
  FieldMeta mask;
  mask.name = "mask";
  mask.channels = 1;
  mask.is_mask = true;
  mask.norm.kind = NormKind::kBinary;
  mask.mask_blocks = 1024;
  m.fields.push_back(mask);
  return m;
}

TEST(NumberText, FormatGPrintsWhatPrintfPrintsInTheCLocale) {
  const double values[] = {0.0,   -0.0,     0.5,   1.0 / 3, 1.0 / 255, 255,     1e20,   1e-5, 123456789012345678.0,
                           -1.25, 3.4e38,   1e308, 5e-324,  2.5e-308,  1e15,    1e16,   1e17, 0.1,
                           65504, -65504.5, 100,   1e6,     999999.5,  1234567, -1e-300};
  char buf[64];
  for (double v : values)
    for (int p : {1, 2, 6, 9, 17, 20}) {
      std::snprintf(buf, sizeof buf, "%.*g", p, v);
      EXPECT_EQ(FormatG(v, p), buf) << "%." << p << "g";
      const float f = static_cast<float>(v);
      if (std::isfinite(f)) {
        std::snprintf(buf, sizeof buf, "%.*g", p, static_cast<double>(f));
        EXPECT_EQ(FormatG(f, p), buf) << "float %." << p << "g";
      }
    }
  EXPECT_EQ(FormatG(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(FormatG(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(FormatG(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(FormatG(2.5), "2.5");  // precision 6, as %g
}

TEST(NumberText, ParseDoubleReadsWhatStrtodReadsInTheCLocale) {
  double v = 0;
  ASSERT_TRUE(ParseDouble("0.0039215686274509803", &v));
  EXPECT_EQ(v, 1.0 / 255);
  ASSERT_TRUE(ParseDouble(" +2", &v));
  EXPECT_EQ(v, 2);
  ASSERT_TRUE(ParseDouble("-1e-07", &v));
  EXPECT_EQ(v, -1e-07);
  ASSERT_TRUE(ParseDouble("1e999", &v));
  EXPECT_EQ(v, std::numeric_limits<double>::infinity());
  ASSERT_TRUE(ParseDouble("-inf", &v));
  EXPECT_EQ(v, -std::numeric_limits<double>::infinity());
  ASSERT_TRUE(ParseDouble("nan", &v));
  EXPECT_TRUE(std::isnan(v));
  v = 7;
  for (const char* bad : {"", "0,5", "1.5x", "1 ", "x", "."}) EXPECT_FALSE(ParseDouble(bad, &v)) << bad;
  EXPECT_FALSE(ParseDouble(std::string(65, '1'), &v));
  EXPECT_EQ(v, 7);  // untouched by a failed parse
  float f = 0;
  ASSERT_TRUE(ParseFloat("0.1", &f));
  EXPECT_EQ(f, 0.1f);
  EXPECT_FALSE(ParseFloat("0,1", &f));
}

TEST(NumberText, MetadataIgnoresTheGlobalLocale) {
  const std::string in_c = MetaWithNumbers().Encode();
  {
    GlobalLocale de(std::locale(std::locale::classic(), new DecimalComma));
    std::ostringstream probe;  // what a stream would have written
    probe << 1234567 << " " << 0.5;
    ASSERT_EQ(probe.str(), "1.234.567 0,5");

    const std::string text = MetaWithNumbers().Encode();
    EXPECT_EQ(text, in_c);
    EXPECT_NE(text.find("\nsample_count=1234567\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nfield.0.tile=256\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nfield.1.mask_blocks=1024\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nfield.0.norm.offset=0.5\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nfield.0.norm.clamp_lo=-1.25\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nfield.0.norm.clamp_hi=0.33333333333333331\n"), std::string::npos) << text;
    auto back = StoreMeta::Decode(text);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->sample_count, 1234567u);
    EXPECT_TRUE(back->fields[0].norm == MetaWithNumbers().fields[0].norm);
    EXPECT_EQ(back->Encode(), text);

    EXPECT_EQ(MetaWithNumbers().fields[0].norm.ToString(), "unit/255 clamp[-1.25,0.33333333333333331]");
    auto n = ParseNormalization("affine:0.5,1.5+clamp:-1,1", 0);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(n->scale, 0.5);
    EXPECT_EQ(n->ToString(), "affine(0.5,1.5) clamp[-1,1]");
    auto big = ParseNormalization("affine:1e39,0", 0);
    ASSERT_FALSE(big.ok());
    EXPECT_NE(big.status().message().find("SCALE 1e+39 is beyond the float32 range"), std::string::npos)
        << big.status().message();
  }
  EXPECT_EQ(MetaWithNumbers().Encode(), in_c);
}

TEST(NumberText, MetadataIgnoresTheCLocale) {
  StoreMeta m = MetaWithNumbers();
  m.fields[0].norm.kind = NormKind::kAffine;
  m.fields[0].norm.scale = 0.001;
  const std::string in_c = m.Encode();
  DecimalCommaCLocale de;
  if (!de.ok()) GTEST_SKIP() << "no de_DE locale, and localedef could not make one";
  char probe[32];  // what printf would have written
  std::snprintf(probe, sizeof probe, "%g", 0.5);
  ASSERT_STREQ(probe, "0,5");

  EXPECT_EQ(FormatG(0.5), "0.5");
  EXPECT_EQ(FormatG(1e-7, 17), "9.9999999999999995e-08");
  double v = 0;
  ASSERT_TRUE(ParseDouble("0.001", &v));
  EXPECT_EQ(v, 0.001);
  EXPECT_FALSE(ParseDouble("0,001", &v));
  const std::string text = m.Encode();
  EXPECT_EQ(text, in_c);
  EXPECT_NE(text.find("\nfield.0.norm.scale=0.001\n"), std::string::npos) << text;
  auto back = StoreMeta::Decode(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->fields[0].norm.scale, 0.001);
  auto n = ParseNormalization("affine:0.001,-1+clamp:-1,1", 0);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->scale, 0.001);
  EXPECT_EQ(n->ToString(), "affine(0.001,-1) clamp[-1,1]");
}

}  // namespace
}  // namespace patchstore
