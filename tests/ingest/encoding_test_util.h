// Inputs for the encoding and tile tests (tests/ingest/encoding_test.cc,
// encodings_e2e_test.cc): seed-like frames of every image source type.
#pragma once

#include <ImfChannelList.h>
#include <ImfFrameBuffer.h>
#include <ImfHeader.h>
#include <ImfOutputFile.h>
#include <half.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "patchstore/ingest/ingest.h"

namespace patchstore::testing {

namespace fs = std::filesystem;

inline void CheckWrite(bool ok) {
  if (!ok) throw std::runtime_error("writing a test image failed");
}

inline void WriteExr(const std::string& path, const cv::Mat& plane, Imf::PixelType type) {
  const int H = plane.rows, W = plane.cols;
  Imf::Header header(W, H);
  header.channels().insert("Z", Imf::Channel(type));
  std::vector<half> halves;
  Imf::FrameBuffer fb;
  if (type == Imf::HALF) {
    halves.resize(static_cast<size_t>(H) * W);
    for (int i = 0; i < H * W; ++i) halves[i] = half(plane.ptr<float>()[i]);
    fb.insert("Z", Imf::Slice(Imf::HALF, reinterpret_cast<char*>(halves.data()), sizeof(half), sizeof(half) * W));
  } else {
    fb.insert("Z", Imf::Slice(Imf::FLOAT, reinterpret_cast<char*>(const_cast<float*>(plane.ptr<float>())), 4,
                              4 * static_cast<size_t>(W)));
  }
  Imf::OutputFile out(path.c_str(), header);
  out.setFrameBuffer(fb);
  out.writePixels(H);
}

// A manifest of `n` frames of 37 x 50 (not a multiple of any tile edge):
// rgb8 (8-bit RGB PNG), rgb16 (16-bit RGB PNG), mask (8-bit, some empty
// frames), depth (float32 EXR with a NaN), zh (half EXR).
inline std::string MakeFrames(const fs::path& dir, int n) {
  fs::create_directories(dir);
  std::ofstream m(dir / "manifest.csv");
  m << "id,rgb8,rgb16,mask,depth,zh\n";
  cv::RNG rng(7);
  for (int i = 0; i < n; ++i) {
    const int H = 37, W = 50;
    cv::Mat a(H, W, CV_8UC3), b(H, W, CV_16UC3), mask(H, W, CV_8UC1, cv::Scalar(0)), depth(H, W, CV_32F),
        zh(H, W, CV_32F);
    rng.fill(a, cv::RNG::UNIFORM, 0, 256);
    rng.fill(b, cv::RNG::UNIFORM, 0, 65536);
    if (i != 1) rng.fill(mask, cv::RNG::UNIFORM, 0, 3);  // values 0,1,2; frame 1 empty
    rng.fill(depth, cv::RNG::UNIFORM, -50.f, 5000.f);
    depth.at<float>(3, 4) = NAN;
    rng.fill(zh, cv::RNG::UNIFORM, -3.f, 3.f);
    const std::string s = std::to_string(i);
    CheckWrite(cv::imwrite((dir / ("a" + s + ".png")), a));
    CheckWrite(cv::imwrite((dir / ("b" + s + ".png")), b));
    CheckWrite(cv::imwrite((dir / ("m" + s + ".png")), mask));
    WriteExr((dir / ("d" + s + ".exr")), depth, Imf::FLOAT);
    WriteExr((dir / ("h" + s + ".exr")), zh, Imf::HALF);
    m << "f/" << s << ",a" << s << ".png,b" << s << ".png,m" << s << ".png,d" << s << ".exr,h" << s << ".exr\n";
  }
  return (dir / "manifest.csv");
}

inline ImageIngestOptions Options(const std::string& manifest, const std::string& store) {
  ImageIngestOptions o;
  o.manifest = manifest;
  o.store = store;
  o.isolate_decoders = false;
  o.durable = false;
  o.threads = 2;
  o.batch_samples = 2;
  return o;
}

}  // namespace patchstore::testing
