// The host emulation of FP8 (ops/fp8.h) against the OCP FP8 specification, written out here
// independently: the decoded values by the spec's landmarks, and encode against a brute-force
// search for the nearest representable value over all 256 bytes (Debian's PyTorch 1.13 has no
// float8 dtypes to compare with).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/config.h"
#include "ops/fp8.h"

using namespace myriad::fp8;

namespace {

const char* name(Format f) { return f == Format::e4m3 ? "e4m3" : "e5m2"; }

// Every finite byte's value, and the byte: the reference's table.
struct Finite {
  float value;
  uint8_t byte;
};
std::vector<Finite> finite_values(Format f) {
  std::vector<Finite> v;
  for (int b = 0; b < 256; ++b)
    if (std::isfinite(decode(uint8_t(b), f))) v.push_back({decode(uint8_t(b), f), uint8_t(b)});
  return v;
}

// The reference rounding: the nearest finite value; of two equally near, the one whose byte is
// even (its mantissa's last bit clear); saturating past the largest. Zero keeps x's sign.
uint8_t nearest(float x, const std::vector<Finite>& table, Format f) {
  if (std::fabs(x) >= max_finite(f)) return encode(std::copysign(max_finite(f), x), f);
  const Finite* best = nullptr;
  double best_d = INFINITY;
  for (const Finite& t : table) {
    if (t.value == 0 && std::signbit(t.value) != std::signbit(x)) continue;
    const double d = std::fabs(double(x) - double(t.value));
    if (d < best_d || (d == best_d && (t.byte & 1) == 0)) best = &t, best_d = d;
  }
  return best->byte;
}

}  // namespace

TEST(Fp8, DecodeHasTheSpecificationsLandmarks) {
  // e4m3 (fn): bias 7, no infinities, 0x7f NaN; largest 448 = 1.75 x 2^8; smallest normal 2^-6;
  // smallest subnormal 2^-9.
  EXPECT_EQ(decode(0x7e, Format::e4m3), 448.0f);
  EXPECT_EQ(decode(0xfe, Format::e4m3), -448.0f);
  EXPECT_TRUE(std::isnan(decode(0x7f, Format::e4m3)));
  EXPECT_EQ(decode(0x08, Format::e4m3), std::ldexp(1.0f, -6));
  EXPECT_EQ(decode(0x01, Format::e4m3), std::ldexp(1.0f, -9));
  EXPECT_EQ(decode(0x38, Format::e4m3), 1.0f);
  EXPECT_EQ(decode(0x78, Format::e4m3), 256.0f);
  // e5m2: bias 15, 0x7c infinity, 0x7d-0x7f NaN; largest 57344 = 1.75 x 2^15; smallest subnormal
  // 2^-16.
  EXPECT_EQ(decode(0x7b, Format::e5m2), 57344.0f);
  EXPECT_EQ(decode(0x7c, Format::e5m2), INFINITY);
  EXPECT_EQ(decode(0xfc, Format::e5m2), -INFINITY);
  EXPECT_TRUE(std::isnan(decode(0x7d, Format::e5m2)));
  EXPECT_EQ(decode(0x3c, Format::e5m2), 1.0f);
  EXPECT_EQ(decode(0x01, Format::e5m2), std::ldexp(1.0f, -16));
  EXPECT_EQ(max_finite(Format::e4m3), 448.0f);
  EXPECT_EQ(max_finite(Format::e5m2), 57344.0f);
  // e4m3: 256 bytes less the two NaNs; e5m2: less 2 infinities and 6 NaNs.
  EXPECT_EQ(finite_values(Format::e4m3).size(), 254u);
  EXPECT_EQ(finite_values(Format::e5m2).size(), 248u);
}

TEST(Fp8, EncodeIsTheNearestValueTiesToEvenSaturating) {
  std::mt19937 rng(7);
  for (Format f : {Format::e4m3, Format::e5m2}) {
    const std::vector<Finite> table = finite_values(f);
    std::vector<float> xs;
    // Every finite value, the midpoints between neighbours (the ties) and points just beside them.
    for (size_t i = 0; i < table.size(); ++i) {
      xs.push_back(table[i].value);
      for (size_t j = 0; j < table.size(); ++j) {
        const float a = table[i].value, b = table[j].value;
        if (a < b && std::nextafter(a, INFINITY) <= b) {
          bool neighbours = true;
          for (const Finite& t : table) neighbours &= !(t.value > a && t.value < b);
          if (!neighbours) continue;
          const float mid = 0.5f * (a + b);
          xs.insert(xs.end(), {mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY)});
        }
      }
    }
    // Random magnitudes over the whole range, past it, and below the smallest subnormal.
    std::uniform_real_distribution<float> e(-24, 20), m(1, 2);
    for (int i = 0; i < 20000; ++i) xs.push_back((i % 2 ? -1 : 1) * m(rng) * std::exp2(e(rng)));
    xs.insert(xs.end(), {0.0f, -0.0f, 1e30f, -1e30f, INFINITY, -INFINITY, 464.0f, 463.99f, 61440.0f});
    for (float x : xs) {
      const uint8_t got = encode(x, f), want = nearest(x, table, f);
      ASSERT_EQ(int(got), int(want)) << name(f) << " x " << x << ": " << decode(got, f) << " against "
                                     << decode(want, f);
    }
    EXPECT_EQ(encode(NAN, f) & 0x7f, 0x7f) << name(f);
    EXPECT_TRUE(std::isnan(decode(encode(NAN, f), f))) << name(f);
  }
}

TEST(Fp8, ScaleIsTheLargestPowerOfTwoThatFits) {
  for (Format f : {Format::e4m3, Format::e5m2}) {
    for (float amax : {1e-30f, 3e-5f, 0.0123f, 1.0f, 3.0f, 447.9f, 448.0f, 449.0f, 57344.0f, 1e6f, 3e38f}) {
      const float s = scale_for(amax, f);
      int e = 0;
      EXPECT_EQ(std::frexp(s, &e), 0.5f) << "a power of two: " << s;
      EXPECT_LE(double(amax) * s, max_finite(f)) << name(f) << " amax " << amax;
      if (s < std::ldexp(1.0f, 126)) {
        EXPECT_GT(double(amax) * s * 2, max_finite(f)) << name(f) << " amax " << amax;
      }
    }
    EXPECT_EQ(scale_for(0.0f, f), 1.0f);
    // A tensor holding an infinity or a NaN: every element becomes NaN (not a saturated finite
    // value), so the step's gradient check sees it.
    EXPECT_TRUE(std::isnan(scale_for(NAN, f)));
    EXPECT_TRUE(std::isnan(scale_for(INFINITY, f)));
    EXPECT_TRUE(std::isnan(decode(encode(1.0f * scale_for(INFINITY, f), f), f)));
  }
  // The tensor's largest value lands in the format's top binade.
  EXPECT_EQ(scale_for(1.0f, Format::e4m3), 256.0f);
  EXPECT_EQ(scale_for(448.0f, Format::e4m3), 1.0f);
  EXPECT_EQ(scale_for(449.0f, Format::e4m3), 0.5f);
}

TEST(Fp8, QuantizeScalesThenRounds) {
  const std::vector<float> x = {0.5f, -3.0f, 1e-4f, 700.0f};
  std::vector<uint8_t> q(x.size());
  quantize(q.data(), x.data(), int64_t(x.size()), 0.5f, Format::e4m3);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(q[i], encode(x[i] * 0.5f, Format::e4m3));
  EXPECT_EQ(decode(q[3], Format::e4m3), 352.0f);  // 350: e4m3 steps by 32 in [256, 512)
}

TEST(Fp8, OnlyHopperAndLaterTrainInFp8) {
  EXPECT_EQ(gpu_refusal(9, 0), "");
  EXPECT_EQ(gpu_refusal(10, 0), "");
  EXPECT_NE(gpu_refusal(8, 0).find("compute capability is 8.0"), std::string::npos) << gpu_refusal(8, 0);
  EXPECT_NE(gpu_refusal(8, 9).find("Hopper"), std::string::npos);
  EXPECT_NE(gpu_refusal(8, 0).find("use train.precision = \"bf16\""), std::string::npos) << gpu_refusal(8, 0);
  // Block scaling's GEMMs are Hopper's only (Blackwell scales blocks of 32 in e8m0 instead).
  EXPECT_EQ(gpu_refusal(9, 0, Scaling::block), "");
  const std::string b = gpu_refusal(10, 0, Scaling::block);
  EXPECT_NE(b.find("compute capability 10.0"), std::string::npos) << b;
  EXPECT_NE(b.find("use train.fp8_scaling = \"tensor\""), std::string::npos) << b;
  EXPECT_NE(gpu_refusal(8, 0, Scaling::block).find("needs a Hopper GPU"), std::string::npos);
}

// What a run logs at its start: the formats the GEMMs use, and where the LM head computes.
TEST(Fp8, TheRecipeComesFromTheConfigAndNamesItself) {
  myriad::TrainConfig t;
  t.precision = "fp8";
  Recipe r = recipe_of(t);
  EXPECT_EQ(r.forward, Format::e4m3);
  EXPECT_EQ(r.gradient, Format::e5m2);
  EXPECT_FALSE(r.fast_accum);
  EXPECT_FALSE(r.lm_head);
  const std::string block = describe(r);
  EXPECT_NE(block.find("activations and weights e4m3, gradients e5m2"), std::string::npos) << block;
  EXPECT_NE(block.find("per-tensor current scaling"), std::string::npos) << block;
  EXPECT_NE(block.find("no fast accumulation"), std::string::npos) << block;
  EXPECT_NE(block.find("the LM head in bf16"), std::string::npos) << block;
  t.fp8_gradients = "e4m3", t.fp8_fast_accum = true, t.fp8_lm_head = true;
  r = recipe_of(t);
  EXPECT_EQ(r.gradient, Format::e4m3);
  EXPECT_TRUE(r.fast_accum);
  const std::string head = describe(r);
  EXPECT_NE(head.find("and the LM head's in FP8"), std::string::npos) << head;
  EXPECT_NE(head.find("gradients e4m3"), std::string::npos) << head;
  EXPECT_NE(head.find("fast accumulation in the forward"), std::string::npos) << head;
  EXPECT_EQ(head.find("the LM head in bf16"), std::string::npos) << head;
}

TEST(Fp8, BlockScalingIsNamedAndKeepsItsFormats) {
  myriad::TrainConfig t;
  t.precision = "fp8", t.fp8_scaling = "block";
  const Recipe r = recipe_of(t);
  EXPECT_EQ(r.scaling, myriad::fp8::Scaling::block);
  EXPECT_EQ(r.gradient, Format::e5m2);
  const std::string d = describe(r);
  EXPECT_NE(d.find("block scaling (1 x 128 tiles of activations and gradients, 128 x 128 blocks of weights)"),
            std::string::npos) << d;
  EXPECT_EQ(d.find("per-tensor"), std::string::npos) << d;
  t.fp8_scaling = "tensor";
  EXPECT_EQ(recipe_of(t).scaling, myriad::fp8::Scaling::tensor);
}

// The block cast's host emulation: each tile is quantize() at its own amax's scale, whatever its
// neighbours hold; the inverse scales sit where cuBLASLt reads them, the blocks' rows padded with
// zeros to a multiple of 4; edge tiles are cut short.
TEST(Fp8, TilesAreScaledEachByItsOwnAmax) {
  using myriad::fp8::quantize_tiles;
  using myriad::fp8::tile_scales;
  const int64_t M = 3, K = 272;  // 128 + 128 + 16: the last tile of each row is 16 long
  std::vector<float> x(M * K);
  for (int64_t i = 0; i < M * K; ++i) x[i] = 0.01f * float((i * 37) % 101 - 50);
  x[1 * K + 130] = 900.0f;  // row 1's second tile only
  EXPECT_EQ(tile_scales(M, K, false), 9);
  std::vector<uint8_t> q(M * K);
  std::vector<float> inv(9, -1.0f);
  quantize_tiles(q.data(), inv.data(), x.data(), M, K, false, Format::e4m3);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t kb = 0; kb < 3; ++kb) {
      const int64_t k0 = kb * 128, n = std::min<int64_t>(128, K - k0);
      float amax = 0;
      for (int64_t k = k0; k < k0 + n; ++k) amax = std::max(amax, std::fabs(x[m * K + k]));
      const float s = scale_for(amax, Format::e4m3);
      EXPECT_EQ(inv[kb * M + m], 1.0f / s) << "row " << m << " tile " << kb;  // [k / 128][m]
      std::vector<uint8_t> want(n);
      quantize(want.data(), x.data() + m * K + k0, n, s, Format::e4m3);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), q.begin() + m * K + k0)) << "row " << m << " tile " << kb;
    }
  EXPECT_GT(inv[1 * M + 1], inv[1 * M + 0] * 64) << "the outlier coarsens its own tile only";
  EXPECT_EQ(inv[0 * M + 1], inv[0 * M + 0]);

  // 128 x 128 blocks of a (130, 272) operand: 2 x 3 blocks, each row of blocks padded to 4.
  const int64_t R = 130;
  std::vector<float> w(R * K);
  for (int64_t i = 0; i < R * K; ++i) w[i] = 0.001f * float((i * 13) % 29 - 14);
  w[129 * K + 5] = -3.0f;  // block (1, 0)
  EXPECT_EQ(tile_scales(R, K, true), 2 * 4);
  std::vector<uint8_t> wq(R * K);
  std::vector<float> winv(8, -1.0f);
  quantize_tiles(wq.data(), winv.data(), w.data(), R, K, true, Format::e4m3);
  EXPECT_EQ(winv[1 * 4 + 0], 1.0f / scale_for(3.0f, Format::e4m3));
  EXPECT_EQ(winv[0 * 4 + 0], winv[0 * 4 + 1]);
  EXPECT_EQ(winv[0 * 4 + 3], 0.0f);
  EXPECT_EQ(winv[1 * 4 + 3], 0.0f);
  EXPECT_GT(winv[1 * 4 + 1], 0.0f);
  EXPECT_EQ(wq[129 * K + 5], encode(-3.0f * scale_for(3.0f, Format::e4m3), Format::e4m3));
  // A NaN makes its own tile's scale NaN (the step's check sees it), no other.
  x[2 * K + 3] = NAN;
  quantize_tiles(q.data(), inv.data(), x.data(), M, K, false, Format::e4m3);
  EXPECT_TRUE(std::isnan(inv[0 * M + 2]));
  EXPECT_FALSE(std::isnan(inv[1 * M + 2]));
}
