// Montage and boxes show exactly the windows the loaders serve.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "patchstore/ingest/montage.h"
#include "patchstore/reader/sampler.h"
#include "patchstore/store/store.h"
#include "test_util.h"

namespace patchstore {
namespace {

using testing::TempDir;

// 8 frames of 24 x 30: "img" (1 channel) and "mask" (sample 2 empty).
std::string MakeFrames(const TempDir& dir) {
  const int64_t H = 24, W = 30;
  const std::string path = dir / "frames.ps";
  std::mt19937 rng(3);
  std::vector<std::vector<float>> masks;
  for (int s = 0; s < 8; ++s) {
    std::vector<float> m(H * W, 0.0f);
    if (s != 2) {
      const int64_t cy = rng() % (H - 6), cx = rng() % (W - 6);  // a 6x6 blob and a few strays
      for (int64_t y = cy; y < cy + 6; ++y)
        for (int64_t x = cx; x < cx + 6; ++x) m[y * W + x] = 1.0f;
      for (int k = 0; k < 4; ++k) m[(rng() % H) * W + rng() % W] = 1.0f;
    }
    masks.push_back(std::move(m));
  }
  testing::StoreSpec spec;
  spec.fields = {testing::StoreField{"img", 1}, testing::StoreField{"mask", 1, /*mask=*/true}};
  spec.ids = testing::NumberedIds(8, "f");
  spec.height = H;
  spec.width = W;
  spec.value = [&](uint64_t s, int f, int64_t, int64_t y, int64_t x) -> double {
    return f == 0 ? static_cast<float>(s * 1000 + y * W + x) / 10000.0f : masks[s][y * W + x];
  };
  spec.batch = 8;
  EXPECT_TRUE(testing::WriteStore(path, spec).ok());
  return path;
}

using Key = std::tuple<uint64_t, int64_t, int64_t, int, int>;
std::vector<Key> Keys(const std::vector<Window>& ws) {
  std::vector<Key> out;
  for (const Window& w : ws) out.emplace_back(w.sample, w.y, w.x, w.flip, w.rot);
  return out;
}

TEST(Montage, ShowsExactlyTheWindowsEachLoaderServes) {
  TempDir dir;
  const std::string path = MakeFrames(dir);
  auto reader = Reader::Open(path).value();
  std::vector<SamplerOptions> variants(4);
  variants[0].patch_size = 8;
  variants[0].min_valid = 3;
  variants[0].require = "mask";
  variants[1].patch_size = 8;
  variants[1].require = "mask";
  variants[1].positive_fraction = 0.3;
  variants[1].flip = variants[1].rot90 = true;
  variants[2].patch_h = 5;
  variants[2].patch_w = 9;
  variants[2].require = "mask";
  variants[2].min_valid = 0.1;
  variants[2].flip = true;
  variants[3].patch_size = 6;
  variants[3].require = "mask";
  variants[3].ids = {"f7", "f2", "f4", "f1"};
  for (size_t v = 0; v < variants.size(); ++v)
    for (LoaderKind kind : {LoaderKind::kSampler, LoaderKind::kBatchLoader, LoaderKind::kPatchDataset}) {
      SamplerOptions so = variants[v];
      so.patches_per_sample = 2;
      so.seed = 21;
      MontageOptions mo;
      mo.store = path;
      mo.count = 30;  // more than one epoch
      mo.sampler = so;
      mo.loader = kind;
      mo.overlay = "mask";
      mo.epoch = 3;
      auto img = RenderMontage(mo);
      ASSERT_TRUE(img.ok()) << img.status().ToString();
      so.fields = {"img", "mask"};
      auto s = PatchSampler::Create(reader, so).value();
      auto want = s->ServedWindows(kind, 3, 0, 30).value();
      EXPECT_EQ(Keys(img->windows), Keys(want)) << "variant " << v << " loader " << LoaderKindName(kind);
      // The empty frame is skipped, and said so once.
      ASSERT_EQ(img->warnings.size(), v == 1 ? 0u : 1u) << "variant " << v;
      if (v != 1) {
        EXPECT_NE(img->warnings[0].find("'f2'"), std::string::npos) << img->warnings[0];
      }
      if (v != 1) {
        for (const Window& w : img->windows) EXPECT_NE(w.sample, 2u);
      }
      // Boxes: the windows of one frame, as served.
      for (uint64_t i = 0; i < 8; ++i) {
        auto boxes = RenderBoxes(mo, "f" + std::to_string(i));
        ASSERT_TRUE(boxes.ok()) << boxes.status().ToString();
        EXPECT_EQ(Keys(boxes->windows), Keys(s->ServedWindowsOfSample(kind, 3, i).value()));
        EXPECT_EQ(boxes->windows.empty(), !s->eligible(i));
        EXPECT_EQ(boxes->warnings.empty(), s->eligible(i)) << "frame " << i;
      }
    }
}

TEST(Montage, RectangularTilesKeepTheirAspect) {
  TempDir dir;
  MontageOptions mo;
  mo.store = MakeFrames(dir);
  mo.count = 4;
  mo.sampler.patch_h = 4;
  mo.sampler.patch_w = 16;
  mo.tile = 32;
  mo.require_overlay = false;
  auto img = RenderMontage(mo);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->width, 2 * (32 + 2) + 2);
  EXPECT_EQ(img->windows.size(), 4u);
  EXPECT_TRUE(img->warnings.empty());
  mo.sampler.rot90 = true;
  EXPECT_EQ(RenderMontage(mo).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace patchstore
