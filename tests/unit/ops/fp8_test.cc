// The host emulation of FP8 (ops/fp8.h) against the OCP FP8 specification, written out here
// independently: the decoded values by the spec's landmarks, and encode against a brute-force
// search for the nearest representable value over all 256 bytes (Debian's PyTorch 1.13 has no
// float8 dtypes to compare with).
#include <gtest/gtest.h>

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
