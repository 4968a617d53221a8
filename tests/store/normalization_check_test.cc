// Normalisations whose float32 transform overflows or collapses distinct
// source values are refused with what goes wrong (issue 31, item 2): the
// guard used to check in float64 while the transform runs in float32.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "patchstore/store/format.h"

namespace patchstore {
namespace {

std::string ParseError(const std::string& spec) {
  auto n = ParseNormalization(spec, 255.0);
  return n.ok() ? "" : n.status().message();
}

std::string CheckError(const std::string& spec, SourceType source) {
  auto n = ParseNormalization(spec, SourceMaxValue(source));
  if (!n.ok()) return "parse: " + n.status().message();
  Status st = CheckNormalizationFor(*n, source, spec);
  return st.ok() ? "" : st.message();
}

TEST(NormalizationCheck, AffineParametersOutsideFloat32AreRefusedAtParse) {
  // 1e-47 is 0 in float32 (the smallest float32 is 1.4e-45).
  std::string e = ParseError("affine:1e-47,0");
  EXPECT_NE(e.find("SCALE 1e-47 is 0 in float32"), std::string::npos) << e;
  EXPECT_NE(e.find("maps every value to OFFSET"), std::string::npos) << e;
  e = ParseError("affine:5e38,0");
  EXPECT_NE(e.find("SCALE 5e+38 is beyond the float32 range"), std::string::npos) << e;
  e = ParseError("affine:1,-4e38+clamp:-1,1");
  EXPECT_NE(e.find("OFFSET -4e+38 is beyond the float32 range"), std::string::npos) << e;
  // Small but representable, and the largest float32 itself, still parse.
  EXPECT_EQ(ParseError("affine:3e-44,0"), "");
  EXPECT_EQ(ParseError("affine:3.4e38,0"), "");
}

TEST(NormalizationCheck, OverflowForTheSourceTypeNamesTheValue) {
  // 65535 * 1e36 overflows float32; 255 * 1e36 does not.
  EXPECT_EQ(CheckError("affine:1e36,0", SourceType::kUInt16),
            "normalisation 'affine:1e36,0' maps 65535 (uint16 value) to inf (the float32 transform overflows)");
  EXPECT_EQ(CheckError("affine:1e36,0", SourceType::kUInt8), "");
  // int32's most negative value, scaled: -inf.
  EXPECT_EQ(CheckError("affine:2e29,7", SourceType::kInt32),
            "normalisation 'affine:2e29,7' maps -2147483648 (int32 value) to -inf (the float32 transform overflows)");
  // A clamp keeps the result finite.
  EXPECT_EQ(CheckError("affine:1e36,0+clamp:0,5", SourceType::kUInt16), "");
}

TEST(NormalizationCheck, CollapsingDistinctValuesIsRefused) {
  // float32 spacing at 3e8 is 32: neighbours collide.
  EXPECT_EQ(CheckError("affine:1,3e8", SourceType::kUInt8),
            "normalisation 'affine:1,3e8' maps 0 and 1 (uint8 values) both to 3e+08 (float32 cannot tell "
            "them apart after the transform)");
  // Every int16 value lands on -1: [0, 2e13] is far wider than the type.
  EXPECT_EQ(CheckError("range:0,2e13", SourceType::kInt16),
            "normalisation 'range:0,2e13' maps every int16 value to -1 (float32 cannot tell them apart after the "
            "transform)");
  // 32-bit integers: float32 rounds above 2^24 anyway, so only a transform
  // constant over the whole type is refused.
  EXPECT_EQ(CheckError("affine:1,3e8", SourceType::kInt32), "");
  EXPECT_EQ(CheckError("affine:1,1e30", SourceType::kUInt32),
            "normalisation 'affine:1,1e30' maps every uint32 value to 1e+30 (float32 cannot tell them apart "
            "after the transform)");
}

TEST(NormalizationCheck, RangeWiderThanDoubleSaysWhatIsWrong) {
  // LO < HI holds; HI - LO overflows double. The message used to claim LO < HI was needed.
  EXPECT_EQ(ParseError("range:-1e308,1e308"), "");
  EXPECT_EQ(CheckError("range:-1e308,1e308", SourceType::kUInt8),
            "normalisation 'range:-1e308,1e308' maps every uint8 value to 0 (float32 cannot tell them apart after the "
            "transform)");
  EXPECT_NE(CheckError("range:-1.5e308,1.7e308", SourceType::kFloat32).find("maps every float32 value to -0.0625"),
            std::string::npos);
  // float64 data can span it: accepted, and applied without overflow.
  EXPECT_EQ(CheckError("range:-1e308,1e308", SourceType::kFloat64), "");
  auto n = ParseNormalization("range:-1e308,1e308", 0);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->Apply(5e307), 0.5f);
  EXPECT_EQ(n->Apply(-1e308), -1.0f);
  EXPECT_EQ(n->Invert(0.5f, 0), 5e307);
}

TEST(NormalizationCheck, NumbersWithAnExponentSignParse) {
  // Python's repr and printf's %g write 1.5e+305; '+' also joins +clamp.
  auto r = ParseNormalization("range:-3e+305,1.5e+305", 0);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->scale, -3e305);
  EXPECT_EQ(r->offset, 1.5e305);
  auto a = ParseNormalization("affine:2.5e+1,-1e+0+clamp:-4e+0,7.5e+0", 0);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->scale, 25.0);
  EXPECT_EQ(a->offset, -1.0);
  EXPECT_TRUE(a->clamp);
  EXPECT_EQ(a->clamp_lo, -4.0);
  EXPECT_EQ(a->clamp_hi, 7.5);
  EXPECT_NE(ParseError("affine:1,2+clmp:0,1").find("needs two finite numbers"), std::string::npos);
}

TEST(NormalizationCheck, OrdinaryNormalisationsPass) {
  for (SourceType t : {SourceType::kUInt8, SourceType::kUInt16})
    for (const char* spec : {"symmetric", "unit", "binary", "none", "affine:0.0039,-0.5", "range:0,1000", "range:10,12",
                             "affine:-2,1+clamp:-1,0"})
      EXPECT_EQ(CheckError(spec, t), "") << spec << " " << SourceTypeName(t);
  for (SourceType t : {SourceType::kInt8, SourceType::kInt16, SourceType::kInt32, SourceType::kUInt64,
                       SourceType::kFloat16, SourceType::kFloat32, SourceType::kFloat64})
    for (const char* spec : {"none", "affine:0.001,-3", "range:-1024,3071", "affine:2,0"})
      EXPECT_EQ(CheckError(spec, t), "") << spec << " " << SourceTypeName(t);
  // The range clamps on purpose: values beyond HI all becoming 1 is no collapse.
  EXPECT_EQ(CheckError("range:0,3", SourceType::kUInt16), "");
}

TEST(NormalizationCheck, AnImagesOwnRangeIsChecked) {
  auto n = ParseNormalization("affine:1e10,0", 0);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(CheckNormalizationOn(*n, -2.5, 3e29, false, "affine:1e10,0", "float32 value of this file").message(),
            "normalisation 'affine:1e10,0' maps 3e+29 (float32 value of this file) to inf (the float32 transform "
            "overflows)");
  EXPECT_TRUE(CheckNormalizationOn(*n, -2.5, 3e27, false, "affine:1e10,0", "x").ok());
  auto r = ParseNormalization("range:0,1e30", 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(CheckNormalizationOn(*r, 0.25, 7000, false, "range:0,1e30", "float32 value of this file").message(),
            "normalisation 'range:0,1e30' maps every float32 value of this file to -1 (float32 cannot tell them "
            "apart after the transform)");
}

}  // namespace
}  // namespace patchstore
