// bias_backward and segment_sum_squares against sums in double on the host. Scratch and
// outputs poisoned, dbias pre-filled (accumulation), two runs bitwise.
//
// Tolerances: fp32 sums of exactly the host's inputs, in another order: 1e-5 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "ops/cuda/ops.cuh"

namespace {

using namespace gpu_test;
namespace cu = myriad::cuda;

struct BiasCase {
  int N, OC;
};

class BiasBackward : public ::testing::TestWithParam<BiasCase> {};

TEST_P(BiasBackward, MatchesHost) {
  const auto [N, OC] = GetParam();
  std::mt19937_64 gen(seed() + N * 3 + OC);
  const auto dout = round_bf16(randn(size_t(N) * OC, gen, 1.0f, 0.1f));
  const auto db0 = randn(OC, gen, 1.0f);
  std::vector<float> want(OC);
  for (int j = 0; j < OC; ++j) {
    double s = db0[j];
    for (int n = 0; n < N; ++n) s += dout[size_t(n) * OC + j];
    want[j] = static_cast<float>(s);
  }
  Dev<bf16> d(dout.size());
  d.upload(to_bf16(dout));
  Dev<float> db(OC), scratch(cu::bias_scratch_floats(N, OC));
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    db.upload(db0);
    scratch.poison();
    cu::bias_backward(db.p, scratch.p, d.p, N, OC, 0);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = db.download();
    if (run == 0) {
      const double e = rel_err(got, want);
      std::printf("  bias_backward N=%d OC=%d: %.2e\n", N, OC, e);
      EXPECT_LT(e, 1e-5);
      first = got;
    } else {
      EXPECT_EQ(got, first);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BiasBackward,
                         ::testing::Values(BiasCase{333, 768}, BiasCase{333, 136}, BiasCase{333, 2304},
                                           BiasCase{333, 100}, BiasCase{4096, 3072}, BiasCase{1, 8},
                                           BiasCase{7, 5}),
                         [](const ::testing::TestParamInfo<BiasCase>& i) {
                           return "N" + std::to_string(i.param.N) + "_OC" + std::to_string(i.param.OC);
                         });

// Segments of awkward sizes: empty ones, one element, several spanning chunk boundaries, ends
// not multiples of 4; run on an aligned base (vector path) and one offset by a float (scalar).
TEST(SegmentSumSquares, MatchesHost) {
  const std::vector<int64_t> sizes = {5, 0, 2 * 16384 + 3, 768, 1, 0, 100000, 7, 16384, 0};
  std::vector<int64_t> segments{0};
  for (int64_t s : sizes) segments.push_back(segments.back() + s);
  const int count = static_cast<int>(sizes.size());
  const int64_t total = segments.back();
  std::mt19937_64 gen(seed() + 99);
  const auto x = randn(total + 1, gen, 1.0f);
  Dev<float> dx(total + 1), out(count), scratch(cu::sumsq_scratch_floats(total, count));
  Dev<int64_t> dseg(segments.size());
  dx.upload(x), dseg.upload(segments);
  for (int off = 0; off < 2; ++off) {
    std::vector<float> want(count);
    for (int i = 0; i < count; ++i) {
      double s = 0;
      for (int64_t j = segments[i]; j < segments[i + 1]; ++j) s += double(x[off + j]) * x[off + j];
      want[i] = static_cast<float>(s);
    }
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      out.poison(), scratch.poison();
      cu::segment_sum_squares(out.p, scratch.p, dx.p + off, dseg.p, count, total, 0);
      CUDA_OK(cudaDeviceSynchronize());
      const auto got = out.download();
      if (run == 0) {
        double worst = 0;
        for (int i = 0; i < count; ++i) {
          if (sizes[i] == 0) {
            EXPECT_EQ(got[i], 0.0f) << "segment " << i;
            continue;
          }
          const double e = std::fabs(got[i] - want[i]) / want[i];
          worst = std::max(worst, e);
          EXPECT_LT(e, 1e-5) << "segment " << i << " offset " << off;
        }
        std::printf("  segment_sum_squares offset %d: worst %.2e\n", off, worst);
        first = got;
      } else {
        EXPECT_EQ(got, first);
      }
    }
  }
}

}  // namespace
